#!/usr/bin/env bash
# The C boundary benchmark: the same lifecycle through the C ABI (bench/lifecycle.c, linked
# against libkvfence.a, -O2) and natively in Rust (bench/lifecycle.rs, the core crate), run
# alternately ROUNDS times in one invocation, SAMPLES samples of ITERS lifecycles per run.
# Each sample is the thread's CPU time (CLOCK_THREAD_CPUTIME_ID) per lifecycle, so time the
# scheduler gives other jobs on the shared box is not counted. Prints the medians (ns per
# lifecycle), the C/Rust ratio (token form: the same core calls; guards: the idiomatic Rust
# form, for reference), and, when valgrind is installed (CALLGRIND=0 skips it), the
# instructions per lifecycle of both programs (callgrind: independent of the load). Writes
# bench/RESULTS.md's figures section when given --write.
#
#   ffi/bench/run.sh                 # ROUNDS=21 SAMPLES=3 ITERS=50000
#   ffi/bench/run.sh --write         # and record the result
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-21} SAMPLES=${SAMPLES:-3} ITERS=${ITERS:-50000} CALLGRIND=${CALLGRIND:-1}
cargo build --release -p kvfence-ffi --quiet
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -std=c11 -O2 -Iffi/include ffi/bench/lifecycle.c target/release/libkvfence.a \
    -lpthread -ldl -lm -o "$out/c_bench"
: > "$out/c.txt"; : > "$out/rust.txt"; : > "$out/guards.txt"
for _ in $(seq "$ROUNDS"); do
    "$out/c_bench" "$SAMPLES" "$ITERS" >> "$out/c.txt"
    target/release/kvfence-ffi-bench "$SAMPLES" "$ITERS" >> "$out/rust.txt"
    target/release/kvfence-ffi-bench --guards "$SAMPLES" "$ITERS" >> "$out/guards.txt"
done
median() { sort -g "$1" | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
c=$(median "$out/c.txt"); r=$(median "$out/rust.txt"); g=$(median "$out/guards.txt")
ratio=$(awk -v c="$c" -v r="$r" 'BEGIN {printf "%.3f", c / r}')
gratio=$(awk -v c="$c" -v r="$g" 'BEGIN {printf "%.3f", c / r}')
n=$(wc -l < "$out/c.txt")
# Paired: each round's C median over the same round's Rust median (adjacent in time, so a
# change of the load between rounds cancels out), then the median of those ratios.
paired=$(paste "$out/c.txt" "$out/rust.txt" | awk -v s="$SAMPLES" '
    function med(a, k,   i, j, t) { for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
        return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2 }
    { i = (NR - 1) % s + 1; c[i] = $1; r[i] = $2
      if (i == s) { q[++m] = med(c, s) / med(r, s) } }
    END { print med(q, m) }')
paired=$(awk -v x="$paired" 'BEGIN {printf "%.3f", x}')
machine="$(nproc)-core $(uname -m), $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), load $(cut -d' ' -f1-3 /proc/loadavg)"
report=$(cat <<REPORT
| lifecycle (open 16 pages / 8 writers, 2 transfers, abort, 8 ACKs, drain) | median ns (CPU) | samples |
| --- | ---: | ---: |
| C, through libkvfence.a (token transfers) | $c | $n |
| Rust, core crate, token transfers (the same calls) | $r | $n |
| Rust, core crate, transfer guards (idiomatic) | $g | $n |

C / Rust (tokens): **$ratio** (boundary cost $(awk -v x="$ratio" 'BEGIN {printf "%+.1f%%", (x - 1) * 100}')); median of the $ROUNDS per-round ratios: $paired; C / Rust (guards): $gratio.
$ROUNDS alternating rounds x $SAMPLES samples x $ITERS lifecycles per program; $machine.
REPORT
)
if [ "$CALLGRIND" = 1 ] && command -v valgrind >/dev/null; then
    # 2,000 warm-up + 20,000 measured lifecycles per program; instructions per lifecycle.
    instr() { valgrind --tool=callgrind --callgrind-out-file=/dev/null "$@" 2>&1 >/dev/null |
        awk '/Collected/ {printf "%.0f", $NF / 22000}'; }
    ci=$(instr "$out/c_bench" 1 20000)
    ri=$(instr target/release/kvfence-ffi-bench 1 20000)
    iratio=$(awk -v c="$ci" -v r="$ri" 'BEGIN {printf "%.3f", c / r}')
    report+=$(printf '\n\nInstructions per lifecycle (valgrind --tool=callgrind, 22,000 lifecycles, load-independent): C %s, Rust (tokens) %s: C / Rust **%s**.' "$ci" "$ri" "$iratio")
fi
echo "$report"
if [ "${1:-}" = "--write" ]; then
    # The figures go between the two markers of RESULTS.md; the rest of it is prose.
    awk -v report="$report" -v cmd="ROUNDS=$ROUNDS SAMPLES=$SAMPLES ITERS=$ITERS ffi/bench/run.sh --write" -v date="$(date -u +%Y-%m-%d\ %H:%M)" '
        /^<!-- figures -->$/ { print; print ""; print "Measured " date " UTC with `" cmd "`:"; print ""; print report; print ""; skip = 1; next }
        /^<!-- \/figures -->$/ { skip = 0 }
        !skip { print }' ffi/bench/RESULTS.md > "$out/RESULTS.md"
    cp "$out/RESULTS.md" ffi/bench/RESULTS.md
    echo "wrote ffi/bench/RESULTS.md"
fi
