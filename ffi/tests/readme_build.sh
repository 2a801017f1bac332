#!/usr/bin/env bash
# Runs the `cc ...` and `./app` lines of ffi/README.md's first ```sh block verbatim against
# an installed prefix (issue 40 item 4: a user's first build must run), with app.c being
# ffi/examples/decode.c and pkg-config pointed at PREFIX. Each built program must run
# without LD_LIBRARY_PATH; the kvfence-static and -static builds must not need
# libkvfence.so.0. Prints one line per command; exit status non-zero on the first failure.
#
#   ffi/tests/readme_build.sh PREFIX
set -euo pipefail
prefix=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/kvfence-readme.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp "$here/examples/decode.c" "$work/app.c"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
unset LD_LIBRARY_PATH
# The block's lines that build or run the app, without their trailing comments.
mapfile -t lines < <(awk '/^```sh/{n++; next} /^```/{if (n==1) exit} n==1' "$here/README.md" |
    grep -E '^(cc |\./app)' | sed 's/[[:space:]]*#.*$//')
[ "${#lines[@]}" -ge 6 ] || { echo "README: expected the cc/./app lines, got ${#lines[@]}"; exit 1; }
cd "$work"
for line in "${lines[@]}"; do
    echo "+ $line"
    if ! out=$(eval "$line" 2>&1); then
        echo "$out" | tail -5
        echo "FAIL: $line"
        exit 1
    fi
    { echo "$out" | grep -v -e 'warning: Using' -e 'in function' | tail -1; } || true
    case "$line" in
    *kvfence-static* | *-static\ *)
        if readelf -d app | grep -q 'NEEDED.*libkvfence'; then
            echo "FAIL: $line: the program needs libkvfence.so"
            exit 1
        fi
        ;;
    cc\ *)
        readelf -d app | grep -q 'NEEDED.*libkvfence.so.0' ||
            { echo "FAIL: $line: not linked against libkvfence.so.0"; exit 1; }
        ;;
    esac
done
echo "readme_build: ${#lines[@]} commands of ffi/README.md ran verbatim from $prefix"
