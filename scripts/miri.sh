#!/usr/bin/env bash
# Runs kvfence's unit tests, integration tests and doctests under Miri (undefined-behaviour
# and data-race checker for the std build of the library).
#
#   scripts/miri.sh                 # everything in the kvfence package
#   scripts/miri.sh --test prop_ops # extra arguments go to `cargo miri test`
#
# Flags: none are needed. Miri's default isolation provides a monotonic clock
# (`Instant`, used by `stats().closing_for`) and emulates the futex under std's Mutex and
# Condvar that `wait_released`/`wait_idle` park on, so `-Zmiri-disable-isolation` is not
# required. The suite is also clean with `MIRIFLAGS="-Zmiri-strict-provenance
# -Zmiri-symbolic-alignment-check"`; pass any MIRIFLAGS you want through the environment.
# tests/prop_ops.rs runs 16 cases of 12 operations under Miri (cfg(miri)).
set -euo pipefail

cd "$(dirname "$0")/.."

if ! cargo +nightly --version >/dev/null 2>&1; then
    printf '\n*** NOTICE: no nightly toolchain: Miri SKIPPED ***\n\n'
    exit 0
fi
# A machine without the components and without access to the toolchain server cannot
# install them: say so plainly instead of failing the whole test run.
if ! rustup component add miri rust-src --toolchain nightly; then
    printf '\n*** NOTICE: could not install the miri component: Miri SKIPPED ***\n\n'
    exit 0
fi
cargo +nightly miri setup

exec cargo +nightly miri test -p kvfence "$@"
