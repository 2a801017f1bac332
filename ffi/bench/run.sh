#!/usr/bin/env bash
# The C boundary benchmark: the same lifecycle through the C ABI (bench/lifecycle.c, linked
# against libkvfence.a, -O2) and natively in Rust (bench/lifecycle.rs, the core crate),
# run alternately ROUNDS times in one invocation, SAMPLES samples of ITERS lifecycles per
# run. Prints the medians (ns per lifecycle), the C/Rust ratio (token form: the same core
# calls; guards: the idiomatic Rust form, for reference) and writes bench/RESULTS.md when
# given --write.
#
#   ffi/bench/run.sh                 # ROUNDS=5 SAMPLES=5 ITERS=100000
#   ffi/bench/run.sh --write         # and record the result
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-5} SAMPLES=${SAMPLES:-5} ITERS=${ITERS:-100000}
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
machine="$(nproc)-core $(uname -m), $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), load $(cut -d' ' -f1-3 /proc/loadavg)"
report=$(cat <<REPORT
| lifecycle (open 16 pages / 8 writers, 2 transfers, abort, 8 ACKs, drain) | median ns | samples |
| --- | ---: | ---: |
| C, through libkvfence.a (token transfers) | $c | $n |
| Rust, core crate, token transfers (the same calls) | $r | $n |
| Rust, core crate, transfer guards (idiomatic) | $g | $n |

C / Rust (tokens): **$ratio** (boundary cost $(awk -v x="$ratio" 'BEGIN {printf "%+.1f%%", (x - 1) * 100}')); C / Rust (guards): $gratio.
$ROUNDS alternating rounds x $SAMPLES samples x $ITERS lifecycles per program; $machine.
REPORT
)
echo "$report"
if [ "${1:-}" = "--write" ]; then
    {
        echo "# C boundary benchmark"
        echo
        echo "Measured $(date -u +%Y-%m-%d) with \`ffi/bench/run.sh --write\` on the project's"
        echo "2-core dev box (shared with other builds: loaded). C: gcc -O2 against libkvfence.a"
        echo "(release profile, no LTO across the boundary); Rust: the same lifecycle on the core"
        echo "crate, release profile. Each sample is the mean of $ITERS lifecycles; the median is over all samples."
        echo
        echo "$report"
    } > ffi/bench/RESULTS.md
    echo "wrote ffi/bench/RESULTS.md"
fi
