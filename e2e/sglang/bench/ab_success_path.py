"""A/B in one process: a successful request's release-path cost with kvfence's
``finish_drained`` (the adapter now) vs ``finish`` + ``quiesce`` of each writer + the queued
release drained at the next scheduler iteration (the adapter before 2026-12-02), on
SGLang 0.5.23's own receivers and queue, alternating per round.

    python e2e/sglang/bench/ab_success_path.py [--rounds 9] [--sizes 10,1000,10000]

Per round and variant: the median over max(3, 2000 / N) repetitions of
``bench_release_path.decode_success`` (``success_clear`` + ``success_drain``, per
request; the rooms' ``open`` is the same code in both and not timed here), then the
median over rounds and the median of the per-round ratios new/old.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_release_path as b  # noqa: E402  (sets SGLang's environment, patches fakes)

import kvfence  # noqa: E402
from kvfence.sglang import decode as kdec  # noqa: E402

_NEW = kdec.DecodeGate.finish


def _old_finish(self: Any, h: int) -> None:
    """The previous adapter's path: finish, quiesce every writer; the release is queued
    and ``drain()`` (the next ``resolve_deferred_releases``) drops the record."""
    rec = self.records.get(h)
    try:
        self.table.finish(h)
    except (kvfence.RoomClosed, kvfence.StaleHandle):
        return
    for rank in rec.writers if rec is not None else ():
        try:
            self.table.quiesce(h, rank)
        except kvfence.Error:
            pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--sizes", default="10,1000,10000")
    args = ap.parse_args()
    b.ks.install()
    b.prefill_manager()
    sizes = [int(s) for s in args.sizes.split(",")]
    raw: Dict[int, Dict[str, List[float]]] = {n: {"old": [], "new": []} for n in sizes}
    for rnd in range(args.rounds):
        for n in sizes:
            order = ("old", "new") if rnd % 2 == 0 else ("new", "old")
            for v in order:
                kdec.DecodeGate.finish = _NEW if v == "new" else _old_finish  # type: ignore[method-assign]
                per = []
                for _ in range(max(3, 2000 // n)):
                    t = b.decode_success(n, True)
                    per.append(t["success_clear"] + t["success_drain"])
                raw[n][v].append(statistics.median(per))
        print("round %d done" % (rnd + 1), file=sys.stderr, flush=True)
    kdec.DecodeGate.finish = _NEW  # type: ignore[method-assign]
    print("%9s %28s %28s %8s" % ("in flight", "finish+quiesce+drain us", "finish_drained us", "new/old"))
    for n in sizes:
        old, new = raw[n]["old"], raw[n]["new"]
        ratio = statistics.median(x / y for x, y in zip(new, old))
        print("%9d %28.2f %28.2f %7.2fx" % (n, statistics.median(old) * 1e6,
                                            statistics.median(new) * 1e6, ratio))
    os._exit(0)


if __name__ == "__main__":
    main()
