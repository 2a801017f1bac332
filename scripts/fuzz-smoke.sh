#!/usr/bin/env bash
# Fuzz smoke and mutation check for kvfence.
#
#   scripts/fuzz-smoke.sh                 # mutation check (stable) + fuzz smoke (nightly)
#   scripts/fuzz-smoke.sh --mutations     # only the mutation check
#   scripts/fuzz-smoke.sh --fuzz          # only the fuzz smoke
#
# 1. Mutation check (stable toolchain): builds tests/prop_ops.rs with each sequential
#    test-only mutation of the library (`kvfence_naive_release`: abort frees at once;
#    `kvfence_skip_ack_gen_check`: ACKs ignore the generation;
#    `kvfence_failed_counts_as_drained`: a failed transfer drops its hold;
#    `kvfence_quarantine_frees_pages`: a quarantined room's pages go back;
#    `kvfence_finish_drained_skips_writers`: a successful room waits for ACKs) and requires the
#    comparison with the reference model to FAIL. Exits 1 if a mutated build passes (the
#    tests could not see the bug). One build holds them all (`--cfg kvfence_mutants`, in
#    `$CARGO_TARGET_DIR/mutants`), each run choosing its mutation with KVFENCE_MUTANT. The two concurrent
#    mutations (`kvfence_unserialized_readmit`, `kvfence_racy_queue_pop`) need threads: a
#    sequential model cannot see them (scripts/mutations.sh and the loom/shuttle models do).
# 2. Fuzz smoke: if `cargo +nightly` exists (and cargo-fuzz, which is installed from
#    crates.io when missing), runs each target in fuzz/ for FUZZ_SMOKE_SECS (default 30)
#    seconds, starting from the committed seed corpus in a scratch directory (the committed
#    corpus is not modified). Exits 1 only on a real crash (libFuzzer wrote a crash
#    artifact); a missing toolchain, a failed install or a nightly that cannot build the
#    targets prints a clear NOTICE and does not fail (set FUZZ_SMOKE_STRICT=1 to make a build
#    failure fatal).
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
SECS=${FUZZ_SMOKE_SECS:-30}
MODE=${1:-all}
status=0

notice() { printf '\n*** NOTICE: %s ***\n\n' "$*"; }

mutation_check() {
    # One build holds every mutation (`--cfg kvfence_mutants`, src/mutants.rs): each run
    # picks its own with KVFENCE_MUTANT (the target directory scripts/mutations.sh uses).
    local target="${CARGO_TARGET_DIR:-$ROOT/target}/mutants"
    for cfg in kvfence_naive_release kvfence_skip_ack_gen_check \
        kvfence_failed_counts_as_drained kvfence_quarantine_frees_pages \
        kvfence_finish_drained_skips_writers; do
        echo "== mutation check: KVFENCE_MUTANT=$cfg must make tests/prop_ops.rs fail"
        local log
        log=$(mktemp)
        KVFENCE_MUTANT="$cfg" CARGO_TARGET_DIR="$target" \
            RUSTFLAGS="${RUSTFLAGS:-} --cfg kvfence_mutants" \
            KVFENCE_PROP_CASES=${KVFENCE_PROP_CASES:-10000} \
            cargo test --test prop_ops -- --test-threads=1 >"$log" 2>&1
        local rc=$?
        if [ "$rc" -eq 0 ]; then
            tail -n 20 "$log"
            echo "FAIL: the $cfg mutant PASSED the model comparison: the tests cannot see this bug"
            status=1
        elif grep -qE 'failed \(reproduce:|library .*, model ' "$log"; then
            grep -E '^case [0-9]+ of|called `Result::unwrap\(\)`' "$log" | cut -c1-400
            echo "ok: $cfg caught"
        else
            tail -n 40 "$log"
            echo "FAIL: the $cfg build or test errored without a model divergence (see above)"
            status=1
        fi
        rm -f "$log"
    done
}

fuzz_smoke() {
    if ! cargo +nightly --version >/dev/null 2>&1; then
        notice "no nightly toolchain (cargo +nightly): fuzz smoke SKIPPED. Install one with 'rustup toolchain install nightly' to run it."
        return 0
    fi
    if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
        echo "== cargo-fuzz missing: installing it from crates.io (takes a few minutes)"
        if ! cargo install cargo-fuzz --locked; then
            notice "could not install cargo-fuzz: fuzz smoke SKIPPED"
            return 0
        fi
    fi
    cd "$ROOT/fuzz" || return 1
    echo "== building fuzz targets"
    if ! cargo +nightly fuzz build; then
        if [ "${FUZZ_SMOKE_STRICT:-0}" = 1 ]; then
            echo "FAIL: fuzz targets do not build"
            status=1
        else
            notice "this nightly cannot build the fuzz targets: fuzz smoke SKIPPED (FUZZ_SMOKE_STRICT=1 makes this fatal)"
        fi
        cd "$ROOT" || return 1
        return 0
    fi
    local scratch
    scratch=$(mktemp -d)
    for t in ops wire threads; do
        echo "== fuzz smoke: $t for ${SECS}s"
        mkdir -p "$scratch/$t" "$scratch/artifacts/$t"
        local log="$scratch/$t.log"
        cargo +nightly fuzz run "$t" "$scratch/$t" "corpus/$t" -- \
            -max_total_time="$SECS" -timeout=20 -rss_limit_mb=4096 \
            -artifact_prefix="$scratch/artifacts/$t/" -print_final_stats=1 >"$log" 2>&1
        local rc=$?
        grep -E '^Done [0-9]+ runs|stat::number_of_executed_units|cov: .* DONE|DONE' "$log" | tail -n 2
        if ls "$scratch/artifacts/$t/"* >/dev/null 2>&1; then
            grep -E 'panicked|ERROR|SUMMARY|diverge' "$log" | head -n 20 | cut -c1-600
            mkdir -p "$ROOT/fuzz/artifacts/$t"
            cp "$scratch/artifacts/$t/"* "$ROOT/fuzz/artifacts/$t/"
            echo "FAIL: $t crashed; input saved under fuzz/artifacts/$t/ (reproduce: cd fuzz && cargo +nightly fuzz run $t <file>)"
            status=1
        elif [ "$rc" -ne 0 ]; then
            tail -n 20 "$log"
            notice "$t exited $rc without a crash artifact (tool problem, not a crash)"
        else
            echo "ok: $t"
        fi
    done
    rm -rf "$scratch"
    cd "$ROOT" || return 1
}

case "$MODE" in
    --mutations) mutation_check ;;
    --fuzz) fuzz_smoke ;;
    all) mutation_check; fuzz_smoke ;;
    *) echo "usage: $0 [--mutations|--fuzz]" >&2; exit 2 ;;
esac
exit $status
