#!/usr/bin/env bash
# Installs the C ABI of kvfence into PREFIX:
#   PREFIX/lib/libkvfence.a, libkvfence.so.<version> (+ libkvfence.so.0, libkvfence.so links)
#   PREFIX/include/kvfence.h, kvfence.hpp
#   PREFIX/lib/pkgconfig/kvfence.pc            -> pkg-config --cflags --libs kvfence
#       (the shared library, with an rpath to PREFIX/lib: the program runs without
#       LD_LIBRARY_PATH or ldconfig)
#   PREFIX/lib/pkgconfig/kvfence-static.pc     -> pkg-config --cflags --libs kvfence-static
#       (libkvfence.a, linked into the program)
#   PREFIX/lib/cmake/kvfence/kvfenceConfig.cmake (+ ConfigVersion) -> find_package(kvfence)
#
# The installed libraries are stripped (the .so of everything but its dynamic symbols, the
# .a of its debug info: 5.2 MB -> ~0.4 MB and 24 MB -> ~13 MB). KVFENCE_DEBUG_INFO=1 keeps
# the debug info next to them instead, as separate files that gdb finds through a
# .gnu_debuglink: PREFIX/lib/debug/libkvfence.so.<version>.debug.
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
so="$prefix/lib/libkvfence.so.$version"
if command -v strip >/dev/null 2>&1; then
    if [ "${KVFENCE_DEBUG_INFO:-0}" = 1 ] && command -v objcopy >/dev/null 2>&1; then
        mkdir -p "$prefix/lib/debug"
        objcopy --only-keep-debug "$so" "$prefix/lib/debug/libkvfence.so.$version.debug"
        strip --strip-unneeded "$so"
        objcopy --add-gnu-debuglink="$prefix/lib/debug/libkvfence.so.$version.debug" "$so"
    else
        strip --strip-unneeded "$so"
    fi
    strip --strip-debug "$prefix/lib/libkvfence.a"
else
    echo "install.sh: no strip: the libraries are installed with their debug info" >&2
fi
ln -sf "libkvfence.so.$version" "$prefix/lib/libkvfence.so.0"
ln -sf "libkvfence.so.0" "$prefix/lib/libkvfence.so"
install -m 644 "$here/include/kvfence.h" "$here/include/kvfence.hpp" "$prefix/include/"
subst() { sed -e "s|@PREFIX@|$prefix|g" -e "s|@VERSION@|$version|g" "$1" > "$2"; }
subst "$here/pkg/kvfence.pc.in" "$prefix/lib/pkgconfig/kvfence.pc"
subst "$here/pkg/kvfence-static.pc.in" "$prefix/lib/pkgconfig/kvfence-static.pc"
subst "$here/pkg/kvfenceConfig.cmake" "$prefix/lib/cmake/kvfence/kvfenceConfig.cmake"
subst "$here/pkg/kvfenceConfigVersion.cmake" "$prefix/lib/cmake/kvfence/kvfenceConfigVersion.cmake"
echo "kvfence $version installed into $prefix"
