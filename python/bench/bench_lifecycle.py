"""One request lifecycle from Python, kvfence vs. a pure-Python tracker shaped like SGLang's.

Lifecycle (decode side, gate mode): open 16 pages written by 8 prefill ranks, 2 transfers
(begin + complete), abort (fan-out of 8), 8 ACKs, drain the release.

The baseline is what SGLang-style schedulers do in Python today: a dict of per-request
state with sets of pending ranks, one lock, and a deferred list scanned each loop.

    python bench/bench_lifecycle.py [--rounds 31] [--n 4000] [--n-threads 20000] [--threads 4] [--out RESULTS.md]

Prints a table of medians and per-round ratios; with --out also writes it as
Markdown. Targets: kvfence >= 3x faster per lifecycle; 4 threads' total throughput no
lower than 1 thread's.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import threading
import time

import kvfence

WRITERS = list(range(8))
PAGES = list(range(16))


# --------------------------------------------------------------------------------------
# The baseline: a pure-Python tracker shaped like SGLang's
# --------------------------------------------------------------------------------------


class PyTracker:
    """dict of per-request state (sets of ranks), one lock, a deferred list scanned each
    loop: the shape of SGLang's decode-side abort bookkeeping."""

    def __init__(self):
        self.lock = threading.Lock()
        self.rooms = {}          # rid -> [gen, pending ranks, acked ranks, transfers, aborted, pages, token]
        self.deferred = []       # rids aborted, waiting for ACKs and transfers
        self.gen = 0

    def open(self, rid, writers, pages, token):
        with self.lock:
            self.gen += 1
            self.rooms[rid] = [self.gen, set(writers), set(), 0, False, list(pages), token]
            return (rid, self.gen)

    def begin_transfer(self, h):
        rid, gen = h
        with self.lock:
            st = self.rooms.get(rid)
            if st is None or st[0] != gen or st[4]:
                raise RuntimeError("closed")
            st[3] += 1

    def complete(self, h):
        rid, gen = h
        with self.lock:
            st = self.rooms.get(rid)
            if st is not None and st[0] == gen:
                st[3] -= 1

    def abort(self, h):
        rid, gen = h
        with self.lock:
            st = self.rooms[rid]
            if st[0] != gen or st[4]:
                return []
            st[4] = True
            self.deferred.append(rid)
            return sorted(st[1] - st[2])

    def ack(self, h, rank):
        rid, gen = h
        with self.lock:
            st = self.rooms.get(rid)
            if st is None or st[0] != gen:
                return "stale"
            if rank in st[2]:
                return "duplicate"
            st[2].add(rank)
            return "recorded"

    def drain(self):
        out = []
        with self.lock:
            keep = []
            for rid in self.deferred:
                st = self.rooms[rid]
                if st[1] <= st[2] and st[3] == 0:
                    del self.rooms[rid]
                    out.append((rid, st[6], st[5]))
                else:
                    keep.append(rid)
            self.deferred = keep
        return out


def lifecycle_py(tr, rid):
    h = tr.open(rid, WRITERS, PAGES, rid)
    for _ in range(2):
        tr.begin_transfer(h)
        tr.complete(h)
    fan = tr.abort(h)
    for rank in fan:
        tr.ack(h, rank)
    tr.drain()          # with threads, another thread's drain may take this release


def lifecycle_kv(t, rid):
    h = t.open(WRITERS, PAGES, rid)
    for _ in range(2):
        t.begin_transfer(h, 0).complete()
    fan = t.abort(h)
    for rank in fan:
        t.quiesce(h, rank)
    t.drain_released()


# --------------------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------------------


def run_threads(make, lifecycle, threads, n):
    """Total lifecycles/s with `threads` threads doing n lifecycles in all on one table.

    The cyclic garbage collector is off while the clock runs (as `timeit` does): neither
    implementation makes cyclic garbage, and a full collection triggered by some earlier
    run's leftovers would land on whichever run happens to be next.
    """
    table = make()
    per = n // threads
    barrier = threading.Barrier(threads + 1)

    def work(i):
        barrier.wait()
        base = i * per
        for k in range(per):
            lifecycle(table, base + k)

    ths = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for th in ths:
        th.start()
    gc.collect()
    gc.disable()
    try:
        barrier.wait()
        t0 = time.perf_counter()
        for th in ths:
            th.join()
        return per * threads / (time.perf_counter() - t0)
    finally:
        gc.enable()


def spread(xs):
    """'median (p10-p90)' of a list of ratios."""
    xs = sorted(xs)
    return f"{statistics.median(xs):.2f}x ({xs[len(xs) // 10]:.2f}x-{xs[(9 * len(xs)) // 10]:.2f}x)"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=31, help="rounds of each block")
    ap.add_argument("--n", type=int, default=4000, help="lifecycles per run, per-lifecycle block")
    ap.add_argument("--n-threads", type=int, default=20000,
                    help="lifecycles per run, threads block (split over the threads)")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--out", help="write the table here (Markdown)")
    ap.add_argument("--machine", default=None, help="machine description for the file")
    a = ap.parse_args(argv)

    make_kv = lambda: kvfence.RoomTable(4096)   # gate mode, release queue (the default)
    make_py = PyTracker

    # Warm up.
    run_threads(make_kv, lifecycle_kv, 1, 2000)
    run_threads(make_py, lifecycle_py, 1, 2000)

    # Every figure is a ratio of runs made side by side in the same round, and the report
    # gives the median over rounds with its p10-p90 spread: on a shared machine the speed
    # drifts by tens of percent within minutes, which a ratio of separately taken medians
    # would turn into a bias either way.
    #
    # Block 1, per lifecycle: kvfence and the tracker, one thread each, alternating.
    kv1, py1 = [], []
    for _ in range(a.rounds):
        kv1.append(run_threads(make_kv, lifecycle_kv, 1, a.n))
        py1.append(run_threads(make_py, lifecycle_py, 1, a.n))
    # Block 2, threads: each implementation with 1 thread and with N, alternating; more
    # lifecycles per run so that starting and joining the threads is noise.
    kv_t1, kv_tn, py_t1, py_tn = [], [], [], []
    for _ in range(a.rounds):
        kv_t1.append(run_threads(make_kv, lifecycle_kv, 1, a.n_threads))
        kv_tn.append(run_threads(make_kv, lifecycle_kv, a.threads, a.n_threads))
        py_t1.append(run_threads(make_py, lifecycle_py, 1, a.n_threads))
        py_tn.append(run_threads(make_py, lifecycle_py, a.threads, a.n_threads))

    per_life = [k / p for k, p in zip(kv1, py1)]
    kv_scale = [m / o for m, o in zip(kv_tn, kv_t1)]
    py_scale = [m / o for m, o in zip(py_tn, py_t1)]
    threaded = [k / p for k, p in zip(kv_tn, py_tn)]
    med = statistics.median
    lines = [
        f"| implementation | us / lifecycle (1 thread) | lifecycles/s, 1 thread | lifecycles/s, {a.threads} threads | {a.threads} threads / 1 thread (per round) |",
        "|---|---:|---:|---:|---:|",
        f"| kvfence | {1e6 / med(kv1):.2f} | {med(kv_t1):,.0f} | {med(kv_tn):,.0f} | {spread(kv_scale)} |",
        f"| python tracker | {1e6 / med(py1):.2f} | {med(py_t1):,.0f} | {med(py_tn):,.0f} | {spread(py_scale)} |",
    ]
    n_met = med(per_life) >= 3
    t_met = med(kv_scale) >= 1
    summary = [
        "",
        f"* kvfence vs. python tracker, per lifecycle (1 thread): **{spread(per_life)}** "
        f"(target >= 3x: {'met' if n_met else 'NOT met'})",
        f"* kvfence vs. python tracker, {a.threads} threads: **{spread(threaded)}**",
        f"* kvfence, {a.threads} threads / 1 thread: **{spread(kv_scale)}** "
        f"(target >= 1.0: {'met' if t_met else 'NOT met'})",
        "",
        "Ratios: median over rounds (p10-p90 in brackets), each from runs made side by side "
        "in one round.",
    ]
    table = "\n".join(lines + summary)
    print(table)
    if a.out:
        machine = a.machine or f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}"
        with open(a.out, "w") as f:
            f.write("# kvfence Python binding: lifecycle benchmark\n\n")
            f.write("`python bench/bench_lifecycle.py` (`python/bench/bench_lifecycle.py`): one request "
                    "lifecycle from Python: open (16 pages, 8 writer ranks, gate mode), 2 transfers, "
                    "abort, 8 ACKs, drain the release; against a pure-Python tracker shaped like "
                    "SGLang's (dict of sets, one lock, a deferred list scanned each loop). "
                    f"{a.rounds} rounds of each block: per lifecycle, {a.n} lifecycles per run; "
                    f"threads, {a.n_threads} lifecycles per run split over {a.threads} Python "
                    "threads sharing one table.\n\n")
            f.write(f"Machine: {machine}.\n")
            f.write(f"Python {platform.python_version()} ({platform.python_implementation()}), kvfence {kvfence.__version__}.\n\n")
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
