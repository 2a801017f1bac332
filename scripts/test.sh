#!/usr/bin/env bash
# All tests: the README's test command and what CI runs (.ci/run calls exactly this).
#
#   fmt check, clippy (-D warnings), rustdoc (warnings denied), unit + integration +
#   property + doc tests, the real-thread mutation checks, the loom model suite and its
#   mutation checks, the simulator's checks, the Python package (built with maturin,
#   installed in a venv, tested with pytest), the C ABI (ffi/ci.sh: C and C++ tests under
#   ASan+UBSan, TSan and valgrind), and (when a nightly toolchain is present) a short fuzz
#   smoke, Miri and TSan.
#
# Environment: SKIP_NIGHTLY=1 skips the nightly-only steps (fuzz smoke, Miri, TSan, and
# ffi/ci.sh's TSan run).
set -euo pipefail
cd "$(dirname "$0")/.."

start=$(date +%s)
# Each step's wall time, printed as it ends and summed up at the end (where CI's time goes).
TIMES=()
last_name="" last_t=$start
step() {
    local now
    now=$(date +%s)
    [ -n "$last_name" ] && TIMES+=("$(printf '%6ss  %s' "$((now - last_t))" "$last_name")")
    last_name="$*" last_t=$now
    printf '\n==== [%ss] %s ====\n' "$((now - start))" "$*"
}

step "rustfmt"
cargo fmt --all -- --check

step "clippy (all targets, warnings denied)"
cargo clippy --workspace --all-targets -- -D warnings

step "rustdoc (warnings denied)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps

step "tests: unit, integration, property, doc"
cargo test --workspace

step "mutations only real threads can catch"
bash scripts/mutations.sh

step "loom models, and the mutations they must catch"
bash loom-tests/run.sh

step "verification beyond loom: SPIN protocol models, shuttle schedules"
bash scripts/verify.sh

step "simulator checks"
bash sim/ci.sh

step "Python package: build with maturin, install, pytest; the binding's mutations caught"
bash scripts/python.sh --mutations

step "end to end on Mooncake over TCP (installs libibverbs1 and the wheel; NOTICE if impossible)"
bash e2e/ci.sh

step "end to end on separate hosts: network namespaces, a partition that heals, a -1 recovered (NOTICE where namespaces cannot be made)"
bash e2e/hosts/ci.sh

step "C ABI (ffi/): header fresh, C/C++ tests, ASan+UBSan, TSan, valgrind"
bash ffi/ci.sh

step "kvfence inside SGLang 0.5.23's own PD code (builds the cached SGLang env; NOTICE if a registry refuses)"
bash e2e/sglang/ci.sh

step "vLLM 0.33.0: kvfence's NIXL connectors, their tests vs stock, vLLM's lease/abort/failure tests (env cached; NOTICE if impossible)"
bash e2e/vllm/ci.sh

if [ "${SKIP_NIGHTLY:-0}" = 1 ]; then
    step "nightly steps skipped (SKIP_NIGHTLY=1)"
else
    step "fuzz smoke (nightly)"
    bash scripts/fuzz-smoke.sh
    step "Miri (nightly)"
    bash scripts/miri.sh
    step "ThreadSanitizer (nightly)"
    bash scripts/tsan.sh
fi

step "end"
printf '\n==== time per step ====\n'
printf '%s\n' "${TIMES[@]}"
printf '\nall checks passed in %ss\n' "$(( $(date +%s) - start ))"
