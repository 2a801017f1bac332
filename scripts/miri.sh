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
# Miri's build of the crate and its dev-dependencies (a few minutes on 2 cores) lives
# outside the clone, as the engine environments do, so a second clone on the same machine
# reuses it (cargo's fingerprints rebuild whatever changed: this crate, another nightly).
# An explicit CARGO_TARGET_DIR wins.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${KVFENCE_CACHE:-$HOME/.cache/kvfence}/miri-target}"

# The unit tests, the engine behaviours, the no-allocation checks, the property test (16
# cases under Miri) by default; pass targets to choose others (the big
# integration and stress files are left to TSan and the native runs: under Miri's
# interpreter they take far longer than CI has). A time budget (MIRI_BUDGET seconds,
# default 1200) ends a run that outgrows it with a NOTICE, not a failure; UB or a failed
# test is a failure.
status=0
if [ "$#" -eq 0 ]; then
    # The default set, on two lanes (Miri interprets on one core; CI has two): the unit
    # tests and tests/engine.rs on one, tests/no_alloc.rs and tests/prop_ops.rs on the
    # other (about 95 s and 120 s of interpretation each, 2-core box). Built first, so that
    # the lanes only run; each lane's output is printed whole when both have ended.
    cargo +nightly miri test -p kvfence --no-run --lib --test engine --test no_alloc --test prop_ops
    logs=$(mktemp -d)
    timeout "${MIRI_BUDGET:-1200}" cargo +nightly miri test -p kvfence --lib --test engine \
        >"$logs/1" 2>&1 &
    lane1=$!
    timeout "${MIRI_BUDGET:-1200}" cargo +nightly miri test -p kvfence --test no_alloc --test prop_ops \
        >"$logs/2" 2>&1 &
    lane2=$!
    echo "Miri: lane 1 (--lib, --test engine) and lane 2 (--test no_alloc, --test prop_ops) running"
    for pid in $lane1 $lane2; do
        rc=0
        wait "$pid" || rc=$?
        if [ "$rc" -eq 124 ]; then status=124; elif [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
    done
    cat "$logs/1" "$logs/2"
    rm -rf "$logs"
else
    timeout "${MIRI_BUDGET:-1200}" cargo +nightly miri test -p kvfence "$@" || status=$?
fi
if [ "$status" -eq 124 ]; then
    printf '\n*** NOTICE: Miri stopped at its %ss budget (no UB reported before) ***\n\n' \
        "${MIRI_BUDGET:-1200}"
    exit 0
fi
exit "$status"
