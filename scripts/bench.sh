#!/usr/bin/env bash
# kvfence benchmark suite: build the criterion bench executables once, run them anywhere
# (no Rust toolchain needed to run), and write a Markdown table of medians and ratios.
#
#   scripts/bench.sh build [BINDIR]              build (cargo bench --no-run, release profile)
#                                                and copy the executables + this script into
#                                                BINDIR (default: bench-bin, git-ignored)
#   scripts/bench.sh run BINDIR LABEL [OUTDIR]   run every executable in BINDIR, write
#                                                OUTDIR/RESULTS-LABEL.md (default OUTDIR:
#                                                benches/ of this repo, or . if absent)
#   scripts/bench.sh all LABEL [OUTDIR]          build into bench-bin, then run
#   scripts/bench.sh table CRITERION_HOME LABEL OUT.md   only (re)write the table
#
# `run` needs bash, coreutils and, for the ratio table, python3; without python3 it writes
# the raw medians (shell tools only). Criterion's data goes to OUTDIR/criterion-LABEL
# (CRITERION_HOME), the full log to OUTDIR/bench-LABEL.log.
#
# The executables are dynamically linked against glibc (>= 2.34 here): build on a machine
# whose glibc is not newer than the one that will run them. `build` strips the copies
# (BENCH_STRIP=0 keeps debug info).
#
# Tunables (environment): BENCH_WARMUP (s, default 1), BENCH_TIME (s, default 3),
# BENCH_SAMPLES (default 20), BENCH_ONLY (space-separated subset of the benches),
# BENCH_TIMEOUT (s per executable, default 300), BENCH_NOTE (a line added to the file).
# With the defaults the suite takes about 4-5 minutes.

set -euo pipefail

BENCHES=(hot_path baseline pages hot_room scaling)
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

die() {
    echo "bench.sh: $*" >&2
    exit 1
}

usage() {
    sed -n '2,26p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 2
}

# The repository root when this script sits in scripts/ of a checkout; empty otherwise.
repo_root() {
    if [[ -f "$HERE/../Cargo.toml" && -d "$HERE/../benches" ]]; then
        (cd "$HERE/.." && pwd)
    fi
}

cmd_build() {
    local bindir="${1:-}" root
    root="$(repo_root)"
    [[ -n "$root" ]] || die "build must run from a kvfence checkout (scripts/bench.sh)"
    command -v cargo >/dev/null || die "build needs cargo; 'run' does not"
    [[ -n "$bindir" ]] || bindir="$root/bench-bin"
    mkdir -p "$bindir"
    bindir="$(cd "$bindir" && pwd)"
    local json
    json="$(mktemp)"
    echo "bench.sh: cargo bench --no-run (release profile) ..." >&2
    (cd "$root" && cargo bench --no-run --message-format=json) >"$json" \
        || { rm -f "$json"; die "cargo bench --no-run failed (run it by hand to see the errors)"; }
    local name exe found=0
    for name in "${BENCHES[@]}"; do
        # The compiler-artifact line of the bench target `name` carries its executable.
        exe="$(grep '"reason":"compiler-artifact"' "$json" \
            | grep "\"kind\":\[\"bench\"\],\"crate_types\":\[\"bin\"\],\"name\":\"$name\"" \
            | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)"
        [[ -n "$exe" && -x "$exe" ]] || die "no executable found for bench '$name'"
        cp -f "$exe" "$bindir/$name"
        # The bench profile keeps debug info (~19 MB per executable); the copies do not need
        # it (~2 MB each), so the folder is small enough to carry to another machine.
        if [[ "${BENCH_STRIP:-1}" != 0 ]] && command -v strip >/dev/null; then
            strip "$bindir/$name" || echo "bench.sh: strip failed, keeping $name unstripped" >&2
        fi
        found=$((found + 1))
    done
    rm -f "$json"
    cp -f "${BASH_SOURCE[0]}" "$bindir/bench.sh"
    chmod +x "$bindir/bench.sh"
    echo "bench.sh: $found executables + bench.sh in $bindir" >&2
    echo "run them with: $bindir/bench.sh run $bindir <label> [outdir]" >&2
}

machine() {
    local model cpus threads cores sockets
    model="$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)"
    [[ -n "$model" ]] || model="$(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo 2>/dev/null | head -n 1)"
    cpus="$(nproc 2>/dev/null || echo '?')"
    threads="$(lscpu 2>/dev/null | sed -n 's/^Thread(s) per core:[[:space:]]*//p' | head -n 1)"
    cores="$(lscpu 2>/dev/null | sed -n 's/^Core(s) per socket:[[:space:]]*//p' | head -n 1)"
    sockets="$(lscpu 2>/dev/null | sed -n 's/^Socket(s):[[:space:]]*//p' | head -n 1)"
    echo "- CPU: ${model:-unknown}"
    echo "- CPUs available (nproc): $cpus; sockets: ${sockets:-?}, cores per socket: ${cores:-?}, threads per core: ${threads:-?}"
    echo "- Kernel: $(uname -sr 2>/dev/null || echo unknown)"
    echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC')"
}

cmd_run() {
    [[ $# -ge 2 ]] || usage
    local bindir="$1" label="$2" outdir="${3:-}"
    [[ "$label" =~ ^[A-Za-z0-9._-]+$ ]] || die "label must be letters, digits, . _ - (got '$label')"
    [[ -d "$bindir" ]] || die "no such directory: $bindir"
    bindir="$(cd "$bindir" && pwd)"
    if [[ -z "$outdir" ]]; then
        local root
        root="$(repo_root)"
        if [[ -n "$root" ]]; then outdir="$root/benches"; else outdir="$PWD"; fi
    fi
    mkdir -p "$outdir"
    outdir="$(cd "$outdir" && pwd)"
    local only=("${BENCHES[@]}")
    if [[ -n "${BENCH_ONLY:-}" ]]; then read -r -a only <<<"$BENCH_ONLY"; fi
    local name
    for name in "${only[@]}"; do
        [[ -x "$bindir/$name" ]] || die "missing executable $bindir/$name (run: scripts/bench.sh build $bindir)"
    done

    local home="$outdir/criterion-$label" log="$outdir/bench-$label.log"
    local results="$outdir/RESULTS-$label.md" meta
    rm -rf "$home"
    mkdir -p "$home"
    meta="$home/machine.md"
    local warm="${BENCH_WARMUP:-1}" time="${BENCH_TIME:-3}" samples="${BENCH_SAMPLES:-20}"
    local limit="${BENCH_TIMEOUT:-300}"
    {
        machine
        echo "- Load average before the run: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"
        echo "- Criterion: warm-up ${warm} s, measurement ${time} s, ${samples} samples per benchmark"
    } >"$meta"
    : >"$log"
    local start=$SECONDS failed=()
    local wrap=()
    if command -v timeout >/dev/null; then wrap=(timeout "$limit"); fi
    for name in "${only[@]}"; do
        echo "bench.sh: [$((SECONDS - start))s] $name ..." >&2
        # Each executable runs in $home so nothing is written elsewhere.
        if ! (cd "$home" && CRITERION_HOME="$home" "${wrap[@]}" "$bindir/$name" --bench \
            --warm-up-time "$warm" --measurement-time "$time" --sample-size "$samples" \
            --noplot) >>"$log" 2>&1; then
            echo "bench.sh: $name FAILED (see $log)" >&2
            failed+=("$name")
        fi
    done
    {
        echo "- Load average after the run: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"
        echo "- Suite wall time: $((SECONDS - start)) s"
        if [[ ${#failed[@]} -gt 0 ]]; then echo "- FAILED benches (see the log): ${failed[*]}"; fi
        if [[ -n "${BENCH_NOTE:-}" ]]; then echo "- Note: $BENCH_NOTE"; fi
    } >>"$meta"
    cmd_table "$home" "$label" "$results"
    echo "bench.sh: wrote $results (log: $log, data: $home) in $((SECONDS - start)) s" >&2
    [[ ${#failed[@]} -eq 0 ]] || die "some benches failed: ${failed[*]}"
}

# Raw medians with shell tools only (no python3): one line per benchmark.
raw_table() {
    local home="$1" f id med
    echo "| benchmark | median (ns) |"
    echo "|---|---:|"
    find "$home" -path '*/new/estimates.json' | sort | while read -r f; do
        id="${f#"$home"/}"
        id="${id%/new/estimates.json}"
        med="$(sed -n 's/.*"median":{"confidence_interval":{[^}]*},"point_estimate":\([-0-9.eE+]*\).*/\1/p' "$f")"
        echo "| $id | ${med:-?} |"
    done
}

cmd_table() {
    [[ $# -eq 3 ]] || usage
    local home="$1" label="$2" out="$3"
    [[ -d "$home" ]] || die "no criterion data in $home"
    {
        echo "# kvfence benchmarks: $label"
        echo
        echo "Produced by \`scripts/bench.sh run <bindir> $label\` (criterion medians; see benches/README.md)."
        echo
        echo "## Machine"
        echo
        if [[ -f "$home/machine.md" ]]; then cat "$home/machine.md"; else machine; fi
        echo
        if command -v python3 >/dev/null; then
            python3 - "$home" <<'PY'
import json, os, sys
from collections import defaultdict

home = sys.argv[1]
med = {}  # (group, function, value or None) -> median ns per iteration
for dirpath, _dirs, files in os.walk(home):
    if os.path.basename(dirpath) != "new" or "estimates.json" not in files:
        continue
    try:
        with open(os.path.join(dirpath, "estimates.json")) as f:
            est = json.load(f)
        with open(os.path.join(dirpath, "benchmark.json")) as f:
            bench = json.load(f)
    except (OSError, ValueError) as e:
        print(f"<!-- skipped {dirpath}: {e} -->")
        continue
    value = bench.get("value_str")
    med[(bench["group_id"], bench.get("function_id"), value)] = est["median"]["point_estimate"]

def get(group, function, value=None):
    return med.get((group, function, None if value is None else str(value)))

def ns(x):
    if x is None:
        return "–"
    if x >= 1e6:
        return f"{x / 1e6:.2f} ms"
    if x >= 1e3:
        return f"{x / 1e3:.2f} µs"
    return f"{x:.1f} ns"

def ratio(a, b):
    return "–" if a is None or b is None or b == 0 else f"{a / b:.2f}x"

def rate(x):
    if x is None or x == 0:
        return "–"
    r = 1e9 / x
    if r >= 1e6:
        return f"{r / 1e6:.2f} M/s"
    return f"{r / 1e3:.1f} k/s"

targets = []  # (target, figure, met)

print("## Single thread: kvfence against the physical limit and the baseline")
print()
print("Median time per operation. `baseline` is the peer-style `Mutex<HashMap>` + `Mutex<Vec>` tracker (benches/common).")
print()
print("| workload | bare atomic pair | bare CAS pair | kvfence | baseline | kvfence / bare pair | baseline / kvfence |")
print("|---|---:|---:|---:|---:|---:|---:|")
rows = [("begin + complete", "begin_complete", None)]
rows += [("quiesce (one ACK)", "quiesce", None), ("abort + 8 ACKs + release", "abort_ack_release", None)]
rows += [(f"open {n} pages + finish + release", "open_finish_release", n) for n in (1, 16, 256)]
for title, group, n in rows:
    kv, base = get(group, "kvfence", n), get(group, "baseline", n)
    bare, cas = get(group, "bare_atomic_pair"), get(group, "bare_cas_pair")
    print(f"| {title} | {ns(bare)} | {ns(cas)} | {ns(kv)} | {ns(base)} | {ratio(kv, bare)} | {ratio(base, kv)} |")
kv, bare = get("begin_complete", "kvfence"), get("begin_complete", "bare_atomic_pair")
if kv and bare:
    targets.append(("uncontended begin+complete <= 1.5x bare fetch_add+fetch_sub",
                    f"{kv / bare:.2f}x ({ns(kv)} vs {ns(bare)})", kv / bare <= 1.5))
print()

threads = sorted({int(v) for (g, f, v) in med if g == "scaling_lifecycle" and v is not None})
if threads:
    print("## Scaling: independent lifecycles on one shared table")
    print()
    print("Each lifecycle: open 16 pages for 8 writer ranks, 2 transfers, abort, 8 ACKs, release. Throughput = total lifecycles/s of all threads.")
    print()
    print("`kvfence private` (diagnostic): each thread on its own table, nothing shared; `shared / private` near 1.00x means the shared table costs nothing.")
    print()
    print("| threads | kvfence | kvfence speedup vs 1 thread | baseline | baseline speedup vs 1 thread | kvfence / baseline throughput | kvfence private | shared / private throughput |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    k1, b1 = get("scaling_lifecycle", "kvfence", 1), get("scaling_lifecycle", "baseline", 1)
    for t in threads:
        kv, base = get("scaling_lifecycle", "kvfence", t), get("scaling_lifecycle", "baseline", t)
        priv = get("scaling_lifecycle", "kvfence_private", t)
        print(f"| {t} | {rate(kv)} | {ratio(k1, kv)} | {rate(base)} | {ratio(b1, base)} | {ratio(base, kv)} | {rate(priv)} | {ratio(priv, kv)} |")
        if kv and k1 and t == 2:
            targets.append(("scaling: 2 threads >= 1.8x of 1 thread (on a machine with >= 2 free cores)",
                            f"{k1 / kv:.2f}x", k1 / kv >= 1.8))
        if kv and k1 and t == 16:
            targets.append(("scaling: 16 threads >= 12x of 1 thread (16-core machine)",
                            f"{k1 / kv:.2f}x", k1 / kv >= 12))
        if kv and base and t == 16:
            targets.append(("scaling: 16 threads >= 50x the baseline",
                            f"{base / kv:.1f}x", base / kv >= 50))
    print()

threads = sorted({int(v) for (g, f, v) in med if g == "hot_room" and v is not None})
if threads:
    print("## Hot room: T threads begin/complete on ONE room vs T threads on one atomic word")
    print()
    print("Wall time per begin/complete pair of the whole machine (lower is better).")
    print()
    print("| threads | bare atomic pair | kvfence | kvfence / bare | bare T / 1 thread | kvfence T / 1 thread |")
    print("|---:|---:|---:|---:|---:|---:|")
    a1, k1 = get("hot_room", "bare_atomic_pair", 1), get("hot_room", "kvfence", 1)
    for t in threads:
        a, kv = get("hot_room", "bare_atomic_pair", t), get("hot_room", "kvfence", t)
        print(f"| {t} | {ns(a)} | {ns(kv)} | {ratio(kv, a)} | {ratio(a, a1)} | {ratio(kv, k1)} |")
    print()

sizes = sorted({int(v) for (g, f, v) in med if g == "pages_claim_free" and v is not None})
if sizes:
    print("## Pages: claim + free a batch (single thread)")
    print()
    print("kvfence: `open(n)` + `abort` (the pool is only reachable through a room, so this also claims/frees a room index and allocates the page list). mutex list: `split_off` + `extend` on a `Mutex<Vec<u32>>`.")
    print()
    print("| batch | kvfence | mutex list | mutex list / kvfence | kvfence per page |")
    print("|---:|---:|---:|---:|---:|")
    for n in sizes:
        kv, ml = get("pages_claim_free", "kvfence", n), get("pages_claim_free", "mutex_list", n)
        print(f"| {n} | {ns(kv)} | {ns(ml)} | {ratio(ml, kv)} | {ns(kv / n if kv else None)} |")
        if kv and ml and n > 1:
            targets.append((f"batch page claim+free of {n} >= 3x the mutex list",
                            f"{ml / kv:.2f}x", ml / kv >= 3))
    print()

threads = sorted({int(v) for (g, f, v) in med if g == "pages_claim_free_threads" and v is not None})
if threads:
    print("## Pages, contended: T threads claim + free batches of 16 on one pool")
    print()
    print("Wall time per batch of the whole machine.")
    print()
    print("| threads | kvfence | mutex list | mutex list / kvfence |")
    print("|---:|---:|---:|---:|")
    for t in threads:
        kv, ml = get("pages_claim_free_threads", "kvfence", t), get("pages_claim_free_threads", "mutex_list", t)
        print(f"| {t} | {ns(kv)} | {ns(ml)} | {ratio(ml, kv)} |")
    print()

if targets:
    print("## Targets (issue 6)")
    print()
    print("| target | measured | |")
    print("|---|---:|---|")
    for t, fig, ok in targets:
        print(f"| {t} | {fig} | {'met' if ok else 'MISSED'} |")
    print()

print("## All medians")
print()
print("<details><summary>raw criterion medians (ns per iteration)</summary>")
print()
print("| group | function | parameter | median (ns) |")
print("|---|---|---:|---:|")
for (g, f, v), x in sorted(med.items(), key=lambda kv: (kv[0][0], kv[0][1] or "", int(kv[0][2]) if (kv[0][2] or "").isdigit() else 0)):
    print(f"| {g} | {f} | {v or ''} | {x:.2f} |")
print()
print("</details>")
PY
        else
            echo "(python3 not found: raw medians only, no ratios)"
            echo
            raw_table "$home"
        fi
    } >"$out.tmp"
    mv -f "$out.tmp" "$out"
}

[[ $# -ge 1 ]] || usage
cmd="$1"
shift
case "$cmd" in
    build) cmd_build "$@" ;;
    run) cmd_run "$@" ;;
    all)
        [[ $# -ge 1 ]] || usage
        root="$(repo_root)"
        [[ -n "$root" ]] || die "all must run from a kvfence checkout"
        cmd_build "$root/bench-bin"
        cmd_run "$root/bench-bin" "$@"
        ;;
    table) cmd_table "$@" ;;
    -h | --help | help) usage ;;
    *) usage ;;
esac
