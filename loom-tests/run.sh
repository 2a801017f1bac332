#!/usr/bin/env bash
# kvfence loom suite + mutation check.
#
#   loom-tests/run.sh            # from anywhere; uses $CARGO_TARGET_DIR (default: target)
#
# 1. Runs the whole model suite with `--cfg loom`: every model must pass.
# 2. Rebuilds with each test-only protocol mutation of the library and runs, one by one and
#    by exact name, the models that must catch it: each must FAIL (by an assertion, a loom
#    data-race report or a loom deadlock report, never by a build error or a timeout).
#      --cfg kvfence_naive_release       (abort releases at once)     -> models 1, 2, 3, 4
#      --cfg kvfence_skip_ack_gen_check  (ACKs ignore the generation) -> model 4
# 3. Reports (informational only) whether the known library issue model still fails.
#
# Each cfg set builds in its own subfolder of the target dir ($BASE/loom, $BASE/loom-naive,
# $BASE/loom-skip-ack), so switching RUSTFLAGS never forces a full rebuild of another set.
# Exit status: 0 only if the suite passed and every expected mutation was caught.
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
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

# build <target-subdir> <rustflags>: build the test binaries of one cfg set (once per run).
declare -A BUILT=()
build() {
    local dir="$1" flags="$2" log="$LOGDIR/build-$1.log"
    [ -n "${BUILT[$dir]:-}" ] && return 0
    echo "== build [$flags] -> $BASE/$dir"
    if ! CARGO_TARGET_DIR="$BASE/$dir" RUSTFLAGS="$flags" \
        cargo test -p "$PKG" --release --no-run >"$log" 2>&1; then
        tail -30 "$log"
        echo "build failed (log: $log)"
        return 1
    fi
    BUILT[$dir]=1
}

# --- 1. the suite -----------------------------------------------------------------------
FLAGS="--cfg loom"
if build loom "$FLAGS"; then
    log="$LOGDIR/suite.log"
    echo "== suite [$FLAGS]"
    start=$(date +%s)
    CARGO_TARGET_DIR="$BASE/loom" RUSTFLAGS="$FLAGS" timeout "$SUITE_TIMEOUT" \
        cargo test -p "$PKG" --release -- --nocapture >"$log" 2>&1
    rc=$?
    secs=$(($(date +%s) - start))
    grep '^loom-model ' "$log" | sed 's/^/   /'
    models=$(grep -c '^loom-model ' "$log")
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
# expect_caught <target-subdir> <rustflags> <label> <required|extra> <test-file>:<test-name>...
expect_caught() {
    local dir="$1" flags="$2" label="$3" need="$4"
    shift 4
    if ! build "$dir" "$flags"; then
        row "(build)" "$label" fail FAIL "build failed: mutation not checked"
        FAILED=1
        return
    fi
    local spec file name log rc reason
    for spec in "$@"; do
        file="${spec%%:*}"
        name="${spec#*:}"
        log="$LOGDIR/$dir-$name.log"
        CARGO_TARGET_DIR="$BASE/$dir" RUSTFLAGS="$flags" timeout "$MODEL_TIMEOUT" \
            cargo test -p "$PKG" --release --test "$file" -- --exact "$name" --nocapture \
            >"$log" 2>&1
        rc=$?
        if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q "^test $name \.\.\. FAILED" "$log"; then
            # What failed: the first panic message of the model.
            reason=$(grep -A2 -m1 'panicked at' "$log" | sed -n '2,3p' | grep -v '^$' | head -1)
            if grep -q 'Causality violation' "$log"; then
                reason="loom data race: $(grep -m1 -o 'Concurrent [a-z ]* accesses to .UnsafeCell.' "$log")"
            elif grep -qi 'deadlock' "$log"; then
                reason="loom deadlock"
            fi
            row "$name" "$label" fail CAUGHT "${reason:0:90}"
        else
            local why="model passed"
            [ "$rc" -eq 124 ] && why="timeout after ${MODEL_TIMEOUT}s"
            [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && why="exit $rc without a model failure"
            if [ "$need" = required ]; then
                row "$name" "$label" fail "NOT-CAUGHT" "$why (log: $log)"
                FAILED=1
            else
                row "$name" "$label" "fail(extra)" "missed" "$why (informational)"
            fi
        fi
    done
}

expect_caught loom-naive "--cfg loom --cfg kvfence_naive_release" naive_release required \
    m1_abort_vs_transfer:m1_abort_vs_transfer_in_flight \
    m2_abort_vs_begin:m2_abort_vs_begin_transfer \
    m3_acks_and_completion:m3_two_acks_and_last_completion \
    m4_late_ack_after_reuse:m4_late_ack_after_reuse
expect_caught loom-skip-ack "--cfg loom --cfg kvfence_skip_ack_gen_check" skip_ack_gen_check \
    required m4_late_ack_after_reuse:m4_late_ack_after_reuse
expect_caught loom-skip-ack "--cfg loom --cfg kvfence_skip_ack_gen_check" skip_ack_gen_check \
    extra m3_acks_and_completion:m3_two_acks_and_last_completion

# --- summary ----------------------------------------------------------------------------
echo
echo "== kvfence loom summary (logs: $LOGDIR)"
printf '%-38s %-28s %-9s %-10s %s\n' check cfg expected result detail
for r in "${ROWS[@]}"; do echo "$r"; done
if [ "$FAILED" -ne 0 ]; then
    echo "RESULT: FAIL (the suite failed or a mutation was not caught)"
    exit 1
fi
echo "RESULT: OK (suite passed, every expected mutation caught)"
