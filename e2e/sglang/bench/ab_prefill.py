"""A/B in one process: the prefill's cost per chunk under the kvfence.sglang adapter at
commit ``--base`` vs the one in this checkout, and stock SGLang, alternating per round.

    python e2e/sglang/bench/ab_prefill.py [--rounds 5] [--sizes 10,1000,10000]
                                          [--base a3eb3b8] [--json]

One real prefill ``MooncakeKVManager`` (``bench_release_path.prefill_manager``) carries
one gate per adapter; each round installs one variant (the others uninstalled), puts its
gate on the manager and runs ``bench_release_path.prefill_chunks`` (SGLang's real
``transfer_worker`` draining 2 chunks for each of N open rooms, the engine completing
every write at once; timed from the worker's first ``get`` to its last)
max(3, 2000 / N) times; per round the median, then the median over rounds and the median
of the per-round ratios. The base adapter is loaded as in ``ab_open_at_abort.py``.

Base measured (RESULTS.md): ``a3eb3b8``, whose prefill wrapped every write method and
learned the chunk's room from a thread-local set by a Python wrapper of the queue,
against the native ``kvfence.TransferQueue`` (one transfer per chunk, no write wrapped).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from importlib import import_module
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ["KVFENCE_SGLANG_METRICS"] = "0"  # two adapters, one Prometheus registry
import ab_open_at_abort as ab  # noqa: E402
import bench_release_path as b  # noqa: E402  (sets SGLang's environment, patches fakes)


def main() -> int:
    args, sizes, head, base, mgr = ab.setup(__doc__ or "", "a3eb3b8")
    gates = {"head": mgr._kvfence_gate,
             "base": import_module(base.__name__ + ".prefill").attach(mgr)}
    adapters = {"base": base, "head": head}
    variants = ("stock", "base", "head")
    raw: Dict[int, Dict[str, List[float]]] = {n: {v: [] for v in variants} for n in sizes}
    for rnd in range(args.rounds):
        for n in sizes:
            order = variants if rnd % 2 == 0 else variants[::-1]
            for v in order:
                if v != "stock":
                    adapters[v].install()
                    mgr._kvfence_gate = gates[v]
                xs = [b.prefill_chunks(n, 2, v != "stock") for _ in range(max(3, 2000 // n))]
                raw[n][v].append(statistics.median(xs))
                if v != "stock":
                    adapters[v].uninstall()
        print("round %d done" % (rnd + 1), file=sys.stderr, flush=True)
    out = []
    for n in sizes:
        r = raw[n]

        def ratio(a: str, z: str) -> Any:
            rs = [y / x for x, y in zip(r[a], r[z]) if x > 0]
            return statistics.median(rs) if rs else None

        out.append({"in_flight": n, "phase": "prefill_chunk",
                    "stock_us": statistics.median(r["stock"]) * 1e6,
                    "base_us": statistics.median(r["base"]) * 1e6,
                    "head_us": statistics.median(r["head"]) * 1e6,
                    "head_over_base": ratio("base", "head"),
                    "head_over_stock": ratio("stock", "head"),
                    "base_over_stock": ratio("stock", "base")})
    if args.json:
        print(json.dumps({"rounds": args.rounds, "base": args.base, "results": out}, indent=1))
    else:
        print("%9s %9s %9s %9s %10s %11s %11s" % ("in flight", "stock us", "base us", "head us",
                                                  "head/base", "head/stock", "base/stock"))
        for x in out:
            print("%9d %9.2f %9.2f %9.2f %9.2fx %10.2fx %10.2fx" % (
                x["in_flight"], x["stock_us"], x["base_us"], x["head_us"], x["head_over_base"],
                x["head_over_stock"], x["base_over_stock"]))
    os._exit(0)


if __name__ == "__main__":
    main()
