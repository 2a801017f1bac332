#!/usr/bin/env bash
# Regenerates include/kvfence.h from src/lib.rs with cbindgen and fails if the committed
# header differs (CI: a stale header is a failure). `--write` updates the header instead.
#
# cbindgen is pinned (CBINDGEN_VERSION) and installed from crates.io with `cargo install
# --locked` into ${KVFENCE_CACHE:-$HOME/.cache/kvfence}/cbindgen-<version> when missing
# (about 1.5 minutes on 2 cores, once); a marker file is written only after a complete
# install. Exit 0 with a NOTICE if it cannot be installed (no registry).
set -euo pipefail
cd "$(dirname "$0")"
CBINDGEN_VERSION=0.29.4
root="${KVFENCE_CACHE:-$HOME/.cache/kvfence}/cbindgen-$CBINDGEN_VERSION"
if [ ! -f "$root/.complete" ]; then
    rm -rf "$root"
    if ! cargo install cbindgen --version "=$CBINDGEN_VERSION" --locked --root "$root" >"${TMPDIR:-/tmp}/kvfence-cbindgen-install.log" 2>&1; then
        tail -20 "${TMPDIR:-/tmp}/kvfence-cbindgen-install.log"
        printf '\n*** NOTICE: cbindgen %s could not be installed: header freshness NOT checked ***\n\n' "$CBINDGEN_VERSION"
        exit 0
    fi
    touch "$root/.complete"
fi
fresh=$(mktemp)
trap 'rm -f "$fresh"' EXIT
"$root/bin/cbindgen" --quiet --config cbindgen.toml --crate kvfence-ffi --output "$fresh" .
if [ "${1:-}" = "--write" ]; then
    cp "$fresh" include/kvfence.h
    echo "include/kvfence.h regenerated"
    exit 0
fi
if ! diff -u include/kvfence.h "$fresh"; then
    echo "FAIL: ffi/include/kvfence.h is stale: run ffi/check-header.sh --write and commit it" >&2
    exit 1
fi
echo "include/kvfence.h is fresh (cbindgen $CBINDGEN_VERSION)"
