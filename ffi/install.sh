#!/usr/bin/env bash
# Installs the C ABI of kvfence into PREFIX:
#   PREFIX/lib/libkvfence.a, libkvfence.so.<version> (+ libkvfence.so.0, libkvfence.so links)
#   PREFIX/include/kvfence.h, kvfence.hpp
#   PREFIX/lib/pkgconfig/kvfence.pc            -> pkg-config --cflags --libs kvfence
#   PREFIX/lib/cmake/kvfence/kvfenceConfig.cmake (+ ConfigVersion) -> find_package(kvfence)
#
#   ffi/install.sh /usr/local            # builds (cargo build --release -p kvfence-ffi) first
#   KVFENCE_NO_BUILD=1 ffi/install.sh P  # installs what target/release already has
set -euo pipefail
if [ $# -ne 1 ]; then
    echo "usage: ffi/install.sh PREFIX" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
mkdir -p "$1"
prefix=$(cd "$1" && pwd)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$here/Cargo.toml" | head -1)
target="${CARGO_TARGET_DIR:-$root/target}/release"
if [ "${KVFENCE_NO_BUILD:-0}" != 1 ]; then
    (cd "$root" && cargo build --release -p kvfence-ffi --lib)
fi
for f in libkvfence.a libkvfence.so; do
    [ -f "$target/$f" ] || { echo "install.sh: $target/$f is missing (build first)" >&2; exit 1; }
done
mkdir -p "$prefix/lib/pkgconfig" "$prefix/lib/cmake/kvfence" "$prefix/include"
install -m 644 "$target/libkvfence.a" "$prefix/lib/libkvfence.a"
install -m 755 "$target/libkvfence.so" "$prefix/lib/libkvfence.so.$version"
ln -sf "libkvfence.so.$version" "$prefix/lib/libkvfence.so.0"
ln -sf "libkvfence.so.0" "$prefix/lib/libkvfence.so"
install -m 644 "$here/include/kvfence.h" "$here/include/kvfence.hpp" "$prefix/include/"
subst() { sed -e "s|@PREFIX@|$prefix|g" -e "s|@VERSION@|$version|g" "$1" > "$2"; }
subst "$here/pkg/kvfence.pc.in" "$prefix/lib/pkgconfig/kvfence.pc"
subst "$here/pkg/kvfenceConfig.cmake" "$prefix/lib/cmake/kvfence/kvfenceConfig.cmake"
subst "$here/pkg/kvfenceConfigVersion.cmake" "$prefix/lib/cmake/kvfence/kvfenceConfigVersion.cmake"
echo "kvfence $version installed into $prefix"
