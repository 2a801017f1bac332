"""Two builds of the binding side by side: per-lifecycle time and ratio to the tracker.

    python bench/ab_builds.py DIR_A DIR_B [--pairs 4] [--rounds 15]

Each DIR holds a `kvfence/` package (the Python files and `_kvfence.abi3.so`, e.g. built
with `cargo build --release -p kvfence-python` and copied as `scripts/python.sh
--mutations` does); `installed` means the installed package. The builds run in alternating
subprocesses (A, B, A, B, ...), each timing `--rounds` interleaved rounds of the
per-lifecycle block of `bench_lifecycle.py` (kvfence vs. the tracker), so that both builds
see the same machine. Prints each run's medians and the median over runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import gc, json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import bench_lifecycle as b, kvfence
rounds, n = int(sys.argv[2]), int(sys.argv[3])
b.run_threads(lambda: kvfence.RoomTable(4096), b.lifecycle_kv, 1, 2000)
b.run_threads(b.PyTracker, b.lifecycle_py, 1, 2000)
kv, py = [], []
for _ in range(rounds):
    kv.append(b.run_threads(lambda: kvfence.RoomTable(4096), b.lifecycle_kv, 1, n))
    py.append(b.run_threads(b.PyTracker, b.lifecycle_py, 1, n))
print(json.dumps({"file": kvfence.__file__, "kv_us": 1e6 / statistics.median(kv),
                  "ratio": statistics.median(k / p for k, p in zip(kv, py))}))
"""


def run(build, rounds, n):
    env = dict(os.environ)
    if build != "installed":
        env["PYTHONPATH"] = os.path.abspath(build)
    # cwd: the bench directory, so that python/kvfence (the sources) cannot shadow the build.
    out = subprocess.run([sys.executable, "-c", CHILD, HERE, str(rounds), str(n)], env=env, cwd=HERE,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--n", type=int, default=4000)
    a = ap.parse_args(argv)
    results = {a.a: [], a.b: []}
    for _ in range(a.pairs):
        for build in (a.a, a.b):
            r = run(build, a.rounds, a.n)
            results[build].append(r)
            print(f"{build:>12}: {r['kv_us']:.2f} us/lifecycle, {r['ratio']:.2f}x the tracker  ({r['file']})",
                  flush=True)
    for build, rs in results.items():
        print(f"{build:>12}: median {statistics.median(r['kv_us'] for r in rs):.2f} us/lifecycle, "
              f"{statistics.median(r['ratio'] for r in rs):.2f}x the tracker")
    return 0


if __name__ == "__main__":
    sys.exit(main())
