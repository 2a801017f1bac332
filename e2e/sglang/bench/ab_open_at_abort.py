"""A/B in one process: the decode room opened at ``send_metadata`` (the adapter up to
commit 8e43593, "eager") vs admitted there and opened at the abort (the adapter now,
"lazy"), on SGLang 0.5.23's own receivers and queue, alternating per round.

    python e2e/sglang/bench/ab_open_at_abort.py [--rounds 5] [--sizes 10,1000,10000]
                                                [--base 8e43593] [--json]

The eager adapter is the package as it was at ``--base`` (``git show``, loaded beside
this one as ``kvfence_eager.sglang``: its own wrappers, its own gates; the Rust binding is
the same). Each round installs one variant (the other uninstalled) and runs
``bench_release_path.decode_lifecycle`` (an aborted request: open + abort + pop +
first scan + ACK + release) and ``decode_success`` (a successful one: open + clear + the
next iteration) max(3, 2000 / N) times; per round the median, then the median over
rounds and the median of the per-round ratios lazy/eager. For the eager variant "open"
is its ``open_room`` (what its ``send_metadata`` wrapper ran); for the lazy one
``admit``, the room's open being part of ``abort``. Stock SGLang runs too (the same
phases, no kvfence) as the floor both are measured against.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ["KVFENCE_SGLANG_METRICS"] = "0"  # two adapters, one Prometheus registry
import bench_release_path as b  # noqa: E402  (sets SGLang's environment, patches fakes)

from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager  # noqa: E402

PHASES = ["open", "abort", "lifecycle", "success_clear", "success_drain", "success"]


def load_eager(base: str) -> Any:
    """The adapter package at commit ``base``, importable as ``kvfence_eager.sglang``."""
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=HERE, check=True,
                          capture_output=True, text=True).stdout.strip()
    names = subprocess.run(["git", "ls-tree", "--name-only", base, "python/kvfence/sglang/"],
                           cwd=root, check=True, capture_output=True, text=True).stdout.split()
    tmp = tempfile.mkdtemp(prefix="kvfence-eager-")
    pkg = os.path.join(tmp, "kvfence_eager", "sglang")
    os.makedirs(pkg)
    open(os.path.join(tmp, "kvfence_eager", "__init__.py"), "w").close()
    for path in names:
        src = subprocess.run(["git", "show", "%s:%s" % (base, path)], cwd=root, check=True,
                             capture_output=True, text=True).stdout
        with open(os.path.join(pkg, os.path.basename(path)), "w") as f:
            f.write(src)
    sys.path.insert(0, tmp)
    import kvfence_eager.sglang as eager  # type: ignore[import-not-found]
    from kvfence_eager.sglang import decode as edec  # type: ignore[import-not-found]

    # What its send_metadata wrapper ran, under the name the benchmark calls.
    edec.DecodeGate.admit = lambda self, r, kv, aux, st: self.open_room(r, kv, aux, st) is not None
    edec.DecodeGate.admitted = 0
    return eager


def manager(adapter: Any) -> Any:
    from importlib import import_module

    mgr = MooncakeKVManager.__new__(MooncakeKVManager)
    import_module(adapter.__name__ + ".decode").attach(mgr)
    return mgr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default="10,1000,10000")
    ap.add_argument("--base", default="8e43593")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    lazy = b.ks
    eager = load_eager(args.base)
    lazy.install()
    b.prefill_manager()  # (also sets up torch.distributed's one-rank group SGLang reduces over)
    lazy.uninstall()
    adapters = {"eager": eager, "lazy": lazy}
    mgrs = {"stock": MooncakeKVManager.__new__(MooncakeKVManager)}
    for v, a in adapters.items():
        a.install()
        mgrs[v] = manager(a)
        a.uninstall()
    variants = ("stock", "eager", "lazy")
    raw: Dict[int, Dict[str, Dict[str, List[float]]]] = {
        n: {v: {p: [] for p in PHASES} for v in variants} for n in sizes}
    for rnd in range(args.rounds):
        for n in sizes:
            order = variants if rnd % 2 == 0 else variants[::-1]
            for v in order:
                if v != "stock":
                    adapters[v].install()
                b._decode_mgrs[v != "stock"] = mgrs[v]
                acc: Dict[str, List[float]] = {p: [] for p in PHASES}
                for _ in range(max(3, 2000 // n)):
                    life = b.decode_lifecycle(n, v != "stock")
                    ok = b.decode_success(n, v != "stock")
                    acc["open"].append(life["open"])
                    acc["abort"].append(life["abort"])
                    acc["lifecycle"].append(life["lifecycle"])
                    acc["success_clear"].append(ok["success_clear"])
                    acc["success_drain"].append(ok["success_drain"])
                    acc["success"].append(life["open"] + ok["success_clear"] + ok["success_drain"])
                for p in PHASES:
                    raw[n][v][p].append(statistics.median(acc[p]))
                if v != "stock":
                    adapters[v].uninstall()
        print("round %d done" % (rnd + 1), file=sys.stderr, flush=True)
    out = []
    for n in sizes:
        for p in PHASES:
            r = raw[n]
            ratios = [z / e for e, z in zip(r["eager"][p], r["lazy"][p]) if e > 0]
            out.append({"in_flight": n, "phase": p,
                        "stock_us": statistics.median(r["stock"][p]) * 1e6,
                        "eager_us": statistics.median(r["eager"][p]) * 1e6,
                        "lazy_us": statistics.median(r["lazy"][p]) * 1e6,
                        "lazy_over_eager": statistics.median(ratios) if ratios else None})
    if args.json:
        print(json.dumps({"rounds": args.rounds, "base": args.base, "results": out}, indent=1))
    else:
        print("%9s  %-10s %9s %9s %9s %11s" % ("in flight", "phase", "stock us", "eager us",
                                              "lazy us", "lazy/eager"))
        for x in out:
            print("%9d  %-10s %9.2f %9.2f %9.2f %11s" % (
                x["in_flight"], x["phase"], x["stock_us"], x["eager_us"], x["lazy_us"],
                "%.2fx" % x["lazy_over_eager"] if x["lazy_over_eager"] else "-"))
    os._exit(0)


if __name__ == "__main__":
    main()
