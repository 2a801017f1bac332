#!/usr/bin/env bash
# kvfence shuttle suite + mutation check.
#
#   scripts/shuttle.sh            # from anywhere; uses $CARGO_TARGET_DIR (default: target)
#
# 1. Runs the whole shuttle suite (shuttle-tests/) with `--cfg shuttle`, release mode: every
#    test must pass under both of its schedulers (random, PCT).
# 2. Builds once more with every test-only protocol mutation of the library in (`--cfg
#    kvfence_mutants`, src/mutants.rs) and runs, with KVFENCE_MUTANT=<cfg> choosing the
#    mutation, the test that must catch it, by exact name: it must FAIL by an assertion/panic found by shuttle (a
#    `shuttle-fail` line from the harness and a `test <name> ... FAILED` line), never by a
#    build error or a timeout.
#      kvfence_unserialized_readmit            -> fence_vs_readmit_then_open
#      kvfence_naive_release                   -> abort_vs_transfer_in_flight
#      kvfence_racy_queue_pop                  -> release_queue_two_drainers
#      kvfence_failed_counts_as_drained        -> failed_transfer_vs_fence
#      kvfence_moving_fenced_set               -> fail_vs_readmit_and_fence_of_other_ranks
#      kvfence_quarantine_mark_first           -> quarantine_vs_last_completion
#
# The two cfg sets build in their own subfolders of the target dir ($BASE/shuttle,
# $BASE/shuttle-mutants), so switching RUSTFLAGS never forces a rebuild of the other.
# Logs: $BASE/shuttle-logs/. KVFENCE_SHUTTLE_SCALE / KVFENCE_SHUTTLE_SEED are passed through
# (see shuttle-tests/README.md). Exit status: 0 only if the suite passed and every mutation
# was caught.
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=lanes.sh
. scripts/lanes.sh
BASE="${CARGO_TARGET_DIR:-target}"
PKG=kvfence-shuttle
SUITE_TIMEOUT="${SHUTTLE_SUITE_TIMEOUT:-900}" # seconds, whole suite
TEST_TIMEOUT="${SHUTTLE_TEST_TIMEOUT:-300}"   # seconds, one mutated test
LOGDIR="$BASE/shuttle-logs"
mkdir -p "$LOGDIR"
# A schedule replayed from a stray variable would not be the suite.
unset SHUTTLE_RANDOM_SEED
export RUST_BACKTRACE=0

T0=$(date +%s)
FAILED=0
ROWS=()
row() { ROWS+=("$(printf '%-30s %-34s %-9s %-11s %s' "$1" "$2" "$3" "$4" "$5")"); }

# build <target-subdir> <rustflags> [cargo args...]: build the test binaries of one cfg set.
build() {
    local dir="$1" flags="$2" log="$LOGDIR/build-$1.log"
    shift 2
    echo "== build [$flags] -> $BASE/$dir"
    if ! CARGO_TARGET_DIR="$BASE/$dir" RUSTFLAGS="$flags" \
        cargo test -p "$PKG" --release --no-run "$@" >"$log" 2>&1; then
        tail -30 "$log"
        echo "build failed (log: $log)"
        return 1
    fi
}

# --- 1. the suite -----------------------------------------------------------------------
FLAGS="--cfg shuttle"
if build shuttle "$FLAGS"; then
    log="$LOGDIR/suite.log"
    echo "== suite [$FLAGS]"
    start=$(date +%s)
    # Two lanes (scripts/lanes.sh): scanners.rs's five tests (about half the suite's time)
    # on one core, the other files on the other.
    CARGO_TARGET_DIR="$BASE/shuttle" RUSTFLAGS="$FLAGS" suite_lanes "$log" "$PKG" shuttle-tests/tests \
        "scanners" "$SUITE_TIMEOUT" --nocapture --test-threads=1
    rc=$?
    secs=$(($(date +%s) - start))
    # (libtest may print "test <name> ... " in front of a test's first line)
    grep -o 'shuttle-test .*' "$log" | sed 's/^/   /'
    runs=$(grep -c 'shuttle-test ' "$log")
    tests=$(grep -o 'test result: ok\. [0-9]* passed' "$log" | awk '{n += $4} END {print n + 0}')
    if [ "$rc" -eq 0 ] && [ "$runs" -gt 0 ]; then
        row "suite ($tests tests, $runs runs)" "$FLAGS" pass PASS "${secs}s"
    else
        grep -E '^shuttle-fail |panicked at|^test .* FAILED' -A2 "$log" | head -40
        why="exit $rc"
        [ "$rc" -eq 124 ] && why="timeout after ${SUITE_TIMEOUT}s"
        row "suite" "$FLAGS" pass FAIL "$why (log: $log)"
        FAILED=1
    fi
else
    row "suite" "$FLAGS" pass FAIL "build failed"
    FAILED=1
fi

# --- 2. mutations -----------------------------------------------------------------------
# expect_caught <mutation cfg> <test-file> <test-name>
# Every mutation is in one build (`--cfg shuttle --cfg kvfence_mutants`, src/mutants.rs),
# chosen per run by KVFENCE_MUTANT: one build instead of one per mutation. Without debug
# info: it recompiles shuttle and its dependencies (RUSTFLAGS apply to every crate).
MUT_DIR=shuttle-mutants
MUT_FLAGS="--cfg shuttle --cfg kvfence_mutants"
MUT_BUILT=""
mutants_build() {
    if [ -z "$MUT_BUILT" ]; then
        CARGO_PROFILE_RELEASE_DEBUG=0 build "$MUT_DIR" "$MUT_FLAGS"
        MUT_BUILT=$?
    fi
    return "$MUT_BUILT"
}

expect_caught() {
    local cfg="$1" file="$2" name="$3"
    local dir="$MUT_DIR" flags="$MUT_FLAGS"
    if ! mutants_build; then
        row "$name" "$cfg" fail FAIL "build failed: mutation not checked"
        FAILED=1
        return
    fi
    local log="$LOGDIR/$dir-${cfg#kvfence_}-$name.log" rc
    KVFENCE_MUTANT="$cfg" CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_TARGET_DIR="$BASE/$dir" \
        RUSTFLAGS="$flags" timeout "$TEST_TIMEOUT" \
        cargo test -p "$PKG" --release --test "$file" -- --exact "$name" --nocapture \
        >"$log" 2>&1
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -qE "^test $name \.\.\. FAILED|^    $name\$" "$log" \
        && grep -q "^shuttle-fail $name:" "$log"; then
        # Where shuttle found it: the scheduler and the iteration (the harness's line)...
        local at
        at=$(grep -m1 "^shuttle-fail $name:" "$log" |
            sed -E 's/.*scheduler=([^ ]+) seed=[0-9]+ failed at iteration=([0-9]+).*/\1 iteration \2/')
        # ...and what failed: the first panic message.
        local reason
        reason=$(grep -A1 -m1 'panicked at' "$log" | sed -n '2p' | cut -c1-80)
        row "$name" "$cfg" fail CAUGHT "$at: $reason"
    else
        local why="test passed"
        [ "$rc" -eq 124 ] && why="timeout after ${TEST_TIMEOUT}s"
        [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && why="exit $rc without a shuttle failure"
        row "$name" "$cfg" fail NOT-CAUGHT "$why (log: $log)"
        FAILED=1
    fi
}

expect_caught kvfence_unserialized_readmit fence_readmit fence_vs_readmit_then_open
expect_caught kvfence_naive_release abort_vs_transfer abort_vs_transfer_in_flight
expect_caught kvfence_racy_queue_pop release_queue release_queue_two_drainers
expect_caught kvfence_failed_counts_as_drained failed_transfer failed_transfer_vs_fence
expect_caught kvfence_moving_fenced_set fenced_set fail_vs_readmit_and_fence_of_other_ranks
expect_caught kvfence_quarantine_mark_first quarantine quarantine_vs_last_completion
expect_caught kvfence_finish_drained_skips_writers scanners finish_drained_vs_fence

# --- summary ----------------------------------------------------------------------------
echo
echo "== kvfence shuttle summary (logs: $LOGDIR; total $(($(date +%s) - T0))s)"
printf '%-30s %-34s %-9s %-11s %s\n' test mutation expected result detail
for r in "${ROWS[@]}"; do echo "$r"; done
if [ "$FAILED" -ne 0 ]; then
    echo "RESULT: FAIL (the suite failed or a mutation was not caught)"
    exit 1
fi
echo "RESULT: OK (suite passed, every mutation caught)"
