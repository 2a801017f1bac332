#!/usr/bin/env bash
# Test-only protocol mutations that the real-thread stress tests must catch.
#
#   scripts/mutations.sh
#
# Each mutation is a `--cfg` of the library that restores a broken rule; the named test of
# tests/scanner_races.rs must FAIL on that build (exit 1 if it passes):
#   kvfence_unserialized_readmit  readmit_rank no longer waits for a running fence scan.
#                                 Loom cannot see it (its model passes under the mutation:
#                                 one "last access" per atomic hides the scan's load).
#   kvfence_racy_queue_pop        the release queue pops with a load + store, not one RMW:
#                                 two drainers can deliver one release twice.
#   kvfence_moving_fenced_set     (issue 18, item 1) readmit moves the fenced set's last
#                                 entry into the removed one's place: a lock-free reader
#                                 misses a rank that stayed fenced, so a failed transfer to
#                                 it is registered instead of dropping its hold.
#   kvfence_quarantine_mark_first (issue 18, item 2) quarantine stores a separate mark
#                                 before its close: a refused quarantine still makes the
#                                 release say Quarantined.
# (The mutations the loom models and the property test catch are checked by
# loom-tests/run.sh and scripts/fuzz-smoke.sh --mutations.)
set -uo pipefail
cd "$(dirname "$0")/.."

status=0
check() {
    local cfg="$1" filter="$2" pattern="$3"
    local target="${CARGO_TARGET_DIR:-target}/mutant-$cfg" log
    log=$(mktemp)
    echo "== mutation check: --cfg $cfg must make tests/scanner_races.rs ($filter) fail"
    CARGO_TARGET_DIR="$target" RUSTFLAGS="${RUSTFLAGS:-} --cfg $cfg" \
        cargo test --release --test scanner_races -- "$filter" >"$log" 2>&1
    local rc=$?
    if grep -q "$pattern" "$log"; then
        grep -m1 "$pattern" "$log" | sed 's/^/   caught: /'
    else
        tail -n 30 "$log"
        echo "FAIL: --cfg $cfg: the mutated build passed or failed for another reason (rc=$rc)"
        status=1
    fi
    rm -f "$log"
}

check kvfence_unserialized_readmit fence_then_readmit "released at once"
check kvfence_racy_queue_pop queue_drainers "lost or delivered twice"
check kvfence_moving_fenced_set failed_transfer_to_a_rank_that_stayed_fenced \
    "registered instead of dropping its hold"
check kvfence_quarantine_mark_first quarantine_vs_last_completion \
    "refused (StaleHandle), yet"

[ "$status" -eq 0 ] && echo "ok: every mutation is caught"
exit "$status"
