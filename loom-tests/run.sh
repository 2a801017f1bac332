#!/usr/bin/env bash
# kvfence loom suite + mutation check.
#
#   loom-tests/run.sh            # from anywhere; uses $CARGO_TARGET_DIR (default: target)
#
# 1. Runs the whole model suite with `--cfg loom`: every model must pass.
# 2. Builds the models once more with every test-only protocol mutation of the library in
#    (`--cfg loom --cfg kvfence_mutants`, src/mutants.rs) and runs, one by one and by exact
#    name, with KVFENCE_MUTANT=<cfg> choosing the mutation, the models that must catch it:
#    each must FAIL (by an assertion, a loom data-race report or a loom deadlock report,
#    never by a build error or a timeout). (`--cfg <cfg>` alone still builds one mutation in.)
#      kvfence_naive_release            (abort releases at once)      -> models 1-4
#      kvfence_skip_ack_gen_check       (ACKs ignore the generation)  -> model 4
#      kvfence_failed_counts_as_drained (failed transfer = drained)   -> model 10
#      kvfence_racy_queue_pop           (queue pop: load + store)     -> model 11
#      kvfence_quarantine_frees_pages   (quarantine frees the pages)  -> model 12
#      kvfence_moving_fenced_set        (readmit moves an entry)      -> model 13
#      kvfence_quarantine_mark_first    (mark, then close)            -> model 14
#      kvfence_racy_summary_take        (pool summary: load + store)  -> model 16
# 3. Informational only (never changes the exit status):
#      kvfence_unserialized_readmit -> m6_fence_vs_readmit_then_open is expected NOT to
#        catch it (loom's one-last-access blind spot; tests/scanner_races.rs catches it).
#
# The two cfg sets build in their own subfolders of the target dir ($BASE/loom,
# $BASE/loom-mutants), so switching RUSTFLAGS never forces a full rebuild of the other.
# Exit status: 0 only if the suite passed and every expected mutation was caught.
set -u -o pipefail
RUN_START=$(date +%s)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=../scripts/lanes.sh
. scripts/lanes.sh
BASE="${CARGO_TARGET_DIR:-target}"
PKG=kvfence-loom
SUITE_TIMEOUT="${LOOM_SUITE_TIMEOUT:-900}" # seconds, whole normal suite
MODEL_TIMEOUT="${LOOM_MODEL_TIMEOUT:-300}" # seconds, one mutated model
LOGDIR="$BASE/loom-logs"
mkdir -p "$LOGDIR"

# The bounds are set per model in code; a stray env var must not change what CI checks.
unset LOOM_MAX_PREEMPTIONS LOOM_MAX_PERMUTATIONS LOOM_MAX_DURATION LOOM_CHECKPOINT_FILE

FAILED=0
ROWS=()
row() { ROWS+=("$(printf '%-38s %-28s %-9s %-10s %s' "$1" "$2" "$3" "$4" "$5")"); }

# build <target-subdir> <rustflags> [test-file...]: build the test binaries of one cfg set
# (all of them, or only the given test files).
build() {
    local dir="$1" flags="$2" log="$LOGDIR/build-$1.log"
    shift 2
    local files=()
    for f in "$@"; do files+=(--test "$f"); done
    echo "== build [$flags] -> $BASE/$dir ${*:-(all models)}"
    if ! CARGO_TARGET_DIR="$BASE/$dir" RUSTFLAGS="$flags" \
        cargo test -p "$PKG" --release --no-run "${files[@]}" >"$log" 2>&1; then
        tail -30 "$log"
        echo "build failed (log: $log)"
        return 1
    fi
}

# --- 1. the suite -----------------------------------------------------------------------
FLAGS="--cfg loom"
if build loom "$FLAGS"; then
    log="$LOGDIR/suite.log"
    echo "== suite [$FLAGS]"
    start=$(date +%s)
    # Two lanes (scripts/lanes.sh): m7's two pool models (about 80% of the suite's time) on
    # one core, every other model on the other.
    CARGO_TARGET_DIR="$BASE/loom" RUSTFLAGS="$FLAGS" suite_lanes "$log" "$PKG" loom-tests/tests \
        "m7_open_release_pool" "$SUITE_TIMEOUT" --nocapture --test-threads=1
    rc=$?
    secs=$(($(date +%s) - start))
    grep -o 'loom-model .*' "$log" | sed 's/^/   /'
    models=$(grep -c 'loom-model ' "$log")
    if [ "$rc" -eq 0 ] && [ "$models" -gt 0 ]; then
        row "suite ($models models)" "$FLAGS" pass PASS "${secs}s"
    else
        grep -E 'panicked at|^test .* FAILED' -A3 "$log" | head -40
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
# run_model <target-subdir> <rustflags> <test-file> <test-name> <log> [extra test args]:
# runs one model by exact name; sets RC and REASON (what failed, if it failed as a model).
run_model() {
    local dir="$1" flags="$2" file="$3" name="$4" log="$5"
    shift 5
    KVFENCE_MUTANT="${MUTANT:-}" CARGO_TARGET_DIR="$BASE/$dir" RUSTFLAGS="$flags" \
        timeout "$MODEL_TIMEOUT" \
        cargo test -p "$PKG" --release --test "$file" -- --exact "$name" --nocapture "$@" \
        >"$log" 2>&1
    RC=$?
    REASON=""
    # A model failure: libtest's FAILED line, or a model panic (assertion / loom report)
    # that aborted the process (a panic in a destructor while another model thread lived).
    if [ "$RC" -ne 0 ] && [ "$RC" -ne 124 ] && { grep -q "^test $name \.\.\. FAILED" "$log" ||
        { grep -q 'panic in a destructor during cleanup' "$log" &&
            grep -qE 'panicked at (loom-tests/tests/|.*loom-0\.7\.[0-9]+/src/rt/location\.rs)' "$log"; }; }; then
        # What failed: the first panic message of the model.
        REASON=$(grep -A2 -m1 'panicked at' "$log" | sed -n '2,3p' | grep -v '^$' | head -1)
        if grep -q 'Causality violation' "$log"; then
            REASON="loom data race: $(grep -m1 -o 'Concurrent [a-z ]* accesses to .UnsafeCell.' "$log")"
        elif grep -qi 'deadlock' "$log"; then
            REASON="loom deadlock"
        fi
        [ -n "$REASON" ] || REASON="failed"
    fi
}

# Every mutation is in one build (`--cfg kvfence_mutants`, src/mutants.rs), chosen per run
# by KVFENCE_MUTANT: one build of the models instead of one per mutation.
MUT_DIR=loom-mutants
MUT_FLAGS="--cfg loom --cfg kvfence_mutants"
MUT_BUILT=""
mutants_build() {
    [ -n "$MUT_BUILT" ] && return "$MUT_BUILT"
    build "$MUT_DIR" "$MUT_FLAGS"
    MUT_BUILT=$?
    return "$MUT_BUILT"
}

# expect_caught <mutation cfg> <required|extra> <test-file>:<test-name>...
expect_caught() {
    local label="${1#kvfence_}" need="$2"
    MUTANT="$1"
    shift 2
    if ! mutants_build; then
        row "(build)" "$label" fail FAIL "build failed: mutation not checked"
        FAILED=1
        return
    fi
    local spec file name log
    for spec in "$@"; do
        file="${spec%%:*}"
        name="${spec#*:}"
        log="$LOGDIR/$MUT_DIR-$label-$name.log"
        run_model "$MUT_DIR" "$MUT_FLAGS" "$file" "$name" "$log"
        if [ -n "$REASON" ]; then
            row "$name" "$label" fail CAUGHT "${REASON:0:90}"
        else
            local why="model passed"
            [ "$RC" -eq 124 ] && why="timeout after ${MODEL_TIMEOUT}s"
            [ "$RC" -ne 0 ] && [ "$RC" -ne 124 ] && why="exit $RC without a model failure"
            if [ "$need" = required ]; then
                row "$name" "$label" fail "NOT-CAUGHT" "$why (log: $log)"
                FAILED=1
            else
                row "$name" "$label" "fail(extra)" "missed" "$why (informational)"
            fi
        fi
    done
}

expect_caught kvfence_naive_release required \
    m1_abort_vs_transfer:m1_abort_vs_transfer_in_flight \
    m1_abort_vs_transfer:m1_gate_queue_abort_vs_transfer \
    m2_abort_vs_begin:m2_abort_vs_begin_transfer \
    m3_acks_and_completion:m3_two_acks_and_last_completion \
    m4_late_ack_after_reuse:m4_late_ack_after_reuse
expect_caught kvfence_skip_ack_gen_check required \
    m4_late_ack_after_reuse:m4_late_ack_after_reuse
expect_caught kvfence_skip_ack_gen_check extra \
    m3_acks_and_completion:m3_two_acks_and_last_completion
expect_caught kvfence_failed_counts_as_drained required \
    m10_failed_transfer:m10_failed_transfer \
    m10_failed_transfer:m10_failed_token_then_fence
expect_caught kvfence_racy_queue_pop required \
    m11_release_queue:m11_release_queue
expect_caught kvfence_quarantine_frees_pages required \
    m12_quarantine:m12_quarantine
expect_caught kvfence_moving_fenced_set required \
    m13_fenced_set_read:m13_fail_vs_readmit_and_fence_of_other_ranks
expect_caught kvfence_quarantine_mark_first required \
    m14_quarantine_vs_completion:m14_quarantine_vs_last_completion
expect_caught kvfence_racy_summary_take required \
    m16_pool_summary:m16_pool_summary_2_threads

# --- 3. informational -------------------------------------------------------------------
# Loom's blind spot: the readmit-vs-running-fence race is not reachable in loom's model of
# the room word (one "last access" per atomic); the real-thread tests catch this mutation.
name=m6_fence_vs_readmit_then_open
MUTANT=kvfence_unserialized_readmit
if mutants_build; then
    run_model "$MUT_DIR" "$MUT_FLAGS" m6_fence_vs_quiesce "$name" \
        "$LOGDIR/$MUT_DIR-unserialized_readmit-$name.log"
    if [ -n "$REASON" ]; then
        row "$name" unserialized_readmit "not caught" "caught" "${REASON:0:70} (informational)"
    else
        row "$name" unserialized_readmit "not caught" "not caught" \
            "expected: loom blind spot; tests/scanner_races.rs catches it (informational)"
    fi
else
    row "$name" unserialized_readmit "not caught" "(build)" "build failed (informational)"
fi

# --- summary ----------------------------------------------------------------------------
echo
echo "== kvfence loom summary (logs: $LOGDIR)"
printf '%-38s %-28s %-9s %-10s %s\n' check cfg expected result detail
for r in "${ROWS[@]}"; do echo "$r"; done
if [ "$FAILED" -ne 0 ]; then
    echo "RESULT: FAIL (the suite failed or a mutation was not caught) after $(($(date +%s) - RUN_START))s"
    exit 1
fi
echo "RESULT: OK (suite passed, every expected mutation caught) in $(($(date +%s) - RUN_START))s"
