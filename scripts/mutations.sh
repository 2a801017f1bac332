#!/usr/bin/env bash
# Test-only protocol mutations that real-thread tests (not loom) must catch.
#
#   scripts/mutations.sh
#
# --cfg kvfence_unserialized_readmit restores the pre-fix readmit_rank (it no longer waits
# for a running fence_rank scan). Loom cannot see that race (its model passes under the
# mutation: one "last access" per atomic hides the scan's load of the room word), so
# tests/scanner_races.rs must FAIL on this build. Exit 1 if it passes.
# (The loom-caught mutations are checked by loom-tests/run.sh and scripts/fuzz-smoke.sh.)
set -uo pipefail
cd "$(dirname "$0")/.."

target="${CARGO_TARGET_DIR:-target}/mutant-readmit"
log=$(mktemp)
echo "== mutation check: --cfg kvfence_unserialized_readmit must make tests/scanner_races.rs fail"
CARGO_TARGET_DIR="$target" RUSTFLAGS="${RUSTFLAGS:-} --cfg kvfence_unserialized_readmit" \
    cargo test --release --test scanner_races -- fence_then_readmit >"$log" 2>&1
rc=$?
if grep -q "released at once" "$log"; then
    grep -m1 "released at once" "$log" | sed 's/^/   caught: /'
    echo "ok: the mutation is caught"
    rm -f "$log"
    exit 0
fi
tail -n 30 "$log"
echo "FAIL: the mutated build passed or failed for another reason (rc=$rc)"
exit 1
