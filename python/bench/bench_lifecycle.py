"""One request lifecycle from Python, kvfence vs. a pure-Python tracker shaped like SGLang's.

Lifecycle (decode side, gate mode): open 16 pages written by 8 prefill ranks, 2 transfers
(begin + complete), abort (fan-out of 8), 8 ACKs, drain the release.

The baseline is what SGLang-style schedulers do in Python today: a dict of per-request
state with sets of pending ranks, one lock, and a deferred list scanned each loop.

    python bench/bench_lifecycle.py [--rounds 7] [--n 20000] [--threads 4] [--out RESULTS.md]

Prints a table of medians (of --rounds rounds) and ratios; with --out also writes it as
Markdown. Targets: kvfence >= 3x faster per lifecycle; 4 threads' total throughput no
lower than 1 thread's.
"""

from __future__ import annotations

import argparse
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
    """Total lifecycles/s with `threads` threads doing n lifecycles in all on one table."""
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
    barrier.wait()
    t0 = time.perf_counter()
    for th in ths:
        th.join()
    return per * threads / (time.perf_counter() - t0)


def median_of(rounds, f):
    return statistics.median(f() for _ in range(rounds))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n", type=int, default=20000, help="lifecycles per round")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--out", help="write the table here (Markdown)")
    ap.add_argument("--machine", default=None, help="machine description for the file")
    a = ap.parse_args(argv)

    make_kv = lambda: kvfence.RoomTable(4096)   # gate mode, release queue (the default)
    make_py = PyTracker

    # Warm up.
    run_threads(make_kv, lifecycle_kv, 1, 2000)
    run_threads(make_py, lifecycle_py, 1, 2000)

    rows = {}
    for name, make, life in (("kvfence", make_kv, lifecycle_kv), ("python tracker", make_py, lifecycle_py)):
        one = median_of(a.rounds, lambda: run_threads(make, life, 1, a.n))
        many = median_of(a.rounds, lambda: run_threads(make, life, a.threads, a.n))
        rows[name] = (one, many)

    kv1, kvn = rows["kvfence"]
    py1, pyn = rows["python tracker"]
    lines = [
        f"| implementation | us / lifecycle (1 thread) | lifecycles/s, 1 thread | lifecycles/s, {a.threads} threads | {a.threads} threads / 1 thread |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, (one, many) in rows.items():
        lines.append(f"| {name} | {1e6 / one:.2f} | {one:,.0f} | {many:,.0f} | {many / one:.2f}x |")
    summary = [
        "",
        f"* kvfence vs. python tracker, 1 thread: **{kv1 / py1:.2f}x** faster per lifecycle (target >= 3x: {'met' if kv1 / py1 >= 3 else 'NOT met'})",
        f"* kvfence vs. python tracker, {a.threads} threads: **{kvn / pyn:.2f}x**",
        f"* kvfence {a.threads} threads / 1 thread: **{kvn / kv1:.2f}x** (target >= 1.0: {'met' if kvn >= kv1 else 'NOT met'})",
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
                    f"Medians of {a.rounds} rounds of {a.n} lifecycles; the threaded runs split "
                    f"the same {a.n} lifecycles over {a.threads} Python threads sharing one table.\n\n")
            f.write(f"Machine: {machine}.\n")
            f.write(f"Python {platform.python_version()} ({platform.python_implementation()}), kvfence {kvfence.__version__}.\n\n")
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
