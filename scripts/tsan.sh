#!/usr/bin/env bash
# Runs kvfence's threaded integration tests under ThreadSanitizer (nightly, -Zbuild-std so
# that std itself is instrumented too).
#
#   scripts/tsan.sh                            # the targets in TSAN_TESTS below
#   scripts/tsan.sh -- stress                  # extra arguments go to `cargo test`
#   KVFENCE_TSAN_ARGS="-- --nocapture" scripts/tsan.sh   # same, through the environment
#   KVFENCE_TSAN_TESTS="api" scripts/tsan.sh   # another list of test targets
#
# Exit status: 0 when the tests pass with no TSan report, or when no nightly toolchain (or
# no rust-src component, and it cannot be installed) is available: then a NOTICE says TSan
# was SKIPPED. Non-zero when the build fails, a test fails, or TSan reports a race
# (TSAN_OPTIONS=halt_on_error=1: the test binary stops at the first report, exit code 66).
#
# Shown to fail: a throwaway crate (not committed) where two threads increment a plain u64
# after a Barrier, built with these flags: "data race" reported, exit 66, in 20/20 runs; the
# same code as a temporary tests/tsan_canary.rs run through this script: exit 66.
#
# What TSan covers, and what it does not:
# * It checks real executions only: a race is found when the conflicting accesses actually
#   happen in this run (in any order: it tracks happens-before, not timing). Interleavings
#   the OS scheduler never produced on this machine are not explored; that is loom's job
#   (loom-tests/), and Miri's on the code paths the tests take.
# * It understands std's atomics (each load/store/RMW/CAS with its Ordering creates
#   happens-before edges), Mutex, Condvar, thread spawn/join, and the futex-based waits
#   (their ordering comes from the atomics around them).
# * It does NOT model standalone fences: `std::sync::atomic::fence` compiles to
#   `__tsan_atomic_thread_fence`, which in the LLVM runtime is a real hardware fence but
#   creates no happens-before edge ("FIXME: not implemented" in tsan_interface_atomic.cpp;
#   std's Arc switches its fence(Acquire) to a load under cfg(sanitize = "thread") for this
#   reason). Checked with this nightly (LLVM 22.1.4): message passing that is correct only
#   through fence(Release)/fence(Acquire) around Relaxed accesses is reported as a data race
#   in 20/20 runs. Consequences here: (1) a non-atomic access ordered only by a fence would
#   be a false report (kvfence has none: its UnsafeCell page lists are handed over by
#   Release/Acquire atomics, the room word and the room bitmap); (2) the fence(SeqCst)
#   store-buffer pairs (open vs. fence_rank, wake vs. wait_until) are not checked by TSan:
#   it does not simulate weak memory (it sees only what the hardware did), so removing one
#   of those fences would not make it report anything. The loom models cover them.
# * It does not check logic (lost releases, double reports): the tests' assertions do.
#
# Which tests: the integration targets that spawn real threads. tests/api.rs (18 tests,
# among them the 4-thread stress run of 4000 lifecycles and the wait/wake tests) and, when
# the file exists, tests/scanner_races.rs (real-thread scanner races). Left out:
# tests/prop_ops.rs (single-threaded against a model; its only other thread is a hang
# watchdog) and tests/no_alloc.rs (single-threaded allocation counts). Unit tests and
# doctests are not run (the one threaded doctest, RoomTable::wait_released, runs under
# Miri). RUST_TEST_THREADS (default 2) sets how many tests of
# one binary run at once: every test still runs in the same process, so TSan also sees any
# state shared between tests.
#
# Cost on a 2-core machine: first build 2-2.5 minutes (std, the dev-dependencies and the
# tests, all instrumented; measured 123 s and 147 s), then 5-10 s to run tests/api.rs
# (the stress test at its full 4000 lifecycles; nothing needed scaling down).
set -euo pipefail

cd "$(dirname "$0")/.."

# Integration test targets (tests/<name>.rs) to run; names whose file does not exist are
# skipped, so a target can be listed before it lands.
TSAN_TESTS=${KVFENCE_TSAN_TESTS:-"api scanner_races"}

if ! cargo +nightly --version >/dev/null 2>&1; then
    printf '\n*** NOTICE: no nightly toolchain: ThreadSanitizer SKIPPED ***\n\n'
    exit 0
fi
# -Zbuild-std needs the standard library's source. A machine without access to the
# toolchain server cannot install it: say so plainly instead of failing the whole test run.
if ! rustup component add rust-src --toolchain nightly; then
    printf '\n*** NOTICE: could not install the rust-src component: ThreadSanitizer SKIPPED ***\n\n'
    exit 0
fi

targets=()
for t in $TSAN_TESTS; do
    if [ -f "tests/$t.rs" ]; then
        targets+=(--test "$t")
    else
        echo "tsan: tests/$t.rs does not exist: not run"
    fi
done
if [ ${#targets[@]} -eq 0 ]; then
    echo "tsan: none of the test targets ($TSAN_TESTS) exist" >&2
    exit 1
fi

# -Zbuild-std needs an explicit --target; the host's is the one the tests run on.
host=$(rustc +nightly -vV | sed -n 's/^host: //p')
export RUSTFLAGS="-Zsanitizer=thread ${RUSTFLAGS:-}"
# Later options win, so a caller's TSAN_OPTIONS can still override halt_on_error.
export TSAN_OPTIONS="halt_on_error=1 ${TSAN_OPTIONS:-}"
export RUST_TEST_THREADS=${RUST_TEST_THREADS:-2}
# Tests that cannot work under TSan (an address-space limit: TSan re-execs without it)
# skip themselves when this is set.
export KVFENCE_UNDER_TSAN=1
# No suppression file: std built with -Zbuild-std produced no report in these tests.
# shellcheck disable=SC2206 # word splitting of the extra arguments is intended
extra=(${KVFENCE_TSAN_ARGS:-})
cmd=(cargo +nightly test -Zbuild-std --target "$host" -p kvfence --no-fail-fast "${targets[@]}")

start=$(date +%s)
"${cmd[@]}" --no-run
built=$(date +%s)
status=0
# A time budget for the run (TSAN_BUDGET seconds, default 1200): the instrumented stress
# tests are slow on a small machine. Running out of budget is reported as a NOTICE, not a
# failure (nothing was found wrong); a race or a failed test is a failure.
timeout "${TSAN_BUDGET:-1200}" "${cmd[@]}" "${extra[@]}" "$@" || status=$?
printf '\ntsan: build %ss, run %ss (%s), exit %s\n' \
    "$((built - start))" "$(($(date +%s) - built))" "${targets[*]}" "$status"
if [ "$status" -eq 124 ]; then
    printf '\n*** NOTICE: ThreadSanitizer run stopped at its %ss budget (no race reported before) ***\n\n' \
        "${TSAN_BUDGET:-1200}"
    exit 0
fi
exit "$status"
