"""A/B in one process: the kvfence.sglang adapter at commit ``--base`` vs the one in this
checkout, on SGLang 0.5.23's own receivers and queue, alternating per round.

    python e2e/sglang/bench/ab_open_at_abort.py [--rounds 5] [--sizes 10,1000,10000]
                                                [--base faefaf9] [--json]

The base adapter is the package as it was at ``--base`` (``git show``, loaded beside this
one as ``kvfence_base.sglang``: its own wrappers, its own gates; the Rust binding is the
same). Each round installs one variant (the other uninstalled) and runs
``bench_release_path.decode_lifecycle`` (an aborted request: send_metadata + abort + pop
+ first scan + ACK + release) and ``decode_success`` (a successful one: send_metadata +
clear + the next iteration) max(3, 2000 / N) times; per round the median, then the median
over rounds and the median of the per-round ratios head/base. "open" is each variant's
own ``send_metadata`` wrapper around SGLang's own method (to the benchmark's fake socket;
a stub before 2026-12-05). Stock SGLang runs too (the same phases, its method alone) as
the floor both are measured against.

Bases measured (e2e/sglang/bench/RESULTS.md): ``8e43593`` (the room opened at
``send_metadata``) against 14d634d (admitted there, opened at the abort);
``faefaf9`` (that admission) against the adapter that keeps only the writers and holds
at ``send_metadata`` and has no ``_clear`` wrapper; ``70ca365`` (that stash, in two
receiver attributes) against one attribute, an idle iteration that returns at once and a
``send_metadata`` wrapper with SGLang's parameters. Each variant's receivers are of their
own subclass of ``MooncakeKVReceiver`` (``bench_release_path.RECEIVER_CLASS``): one
adapter's attribute names must not change the other's attribute layout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from importlib import import_module
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ["KVFENCE_SGLANG_METRICS"] = "0"  # two adapters, one Prometheus registry
import bench_release_path as b  # noqa: E402  (sets SGLang's environment, patches fakes)


PHASES = ["open", "abort", "lifecycle", "success_clear", "success_drain", "success"]


def load_base(base: str) -> Any:
    """The adapter package at commit ``base``, importable as ``kvfence_base.sglang``."""
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=HERE, check=True,
                          capture_output=True, text=True).stdout.strip()
    names = subprocess.run(["git", "ls-tree", "--name-only", base, "python/kvfence/sglang/"],
                           cwd=root, check=True, capture_output=True, text=True).stdout.split()
    tmp = tempfile.mkdtemp(prefix="kvfence-base-")
    pkg = os.path.join(tmp, "kvfence_base", "sglang")
    os.makedirs(pkg)
    open(os.path.join(tmp, "kvfence_base", "__init__.py"), "w").close()
    for path in names:
        src = subprocess.run(["git", "show", "%s:%s" % (base, path)], cwd=root, check=True,
                             capture_output=True, text=True).stdout
        with open(os.path.join(pkg, os.path.basename(path)), "w") as f:
            f.write(src)
    sys.path.insert(0, tmp)
    import kvfence_base.sglang as base_pkg  # type: ignore[import-not-found]

    return base_pkg


def manager(adapter: Any) -> Any:
    mgr = b.new_decode_manager()
    import_module(adapter.__name__ + ".decode").attach(mgr)
    return mgr


def setup(doc: str, default_base: str) -> Any:
    """The A/B scripts' command line and start: ``(args, sizes, head, base, prefill
    manager)``; the prefill manager is built with the head's gate attached (it also sets
    up torch.distributed's one-rank group SGLang reduces over)."""
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default="10,1000,10000")
    ap.add_argument("--base", default=default_base)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    head = b.ks
    base = load_base(args.base)
    head.install()
    mgr = b.prefill_manager()
    head.uninstall()
    return args, sizes, head, base, mgr


def main() -> int:
    args, sizes, head, base, _ = setup(__doc__ or "", "faefaf9")
    adapters = {"base": base, "head": head}
    mgrs = {"stock": b.new_decode_manager()}
    sends = {"stock": b.send_metadata(False)}
    for v, a in adapters.items():
        a.install()
        mgrs[v] = manager(a)
        sends[v] = import_module(a.__name__ + ".decode")._send_metadata(b._sglang_send_metadata)
        a.uninstall()
    variants = ("stock", "base", "head")
    raw: Dict[int, Dict[str, Dict[str, List[float]]]] = {
        n: {v: {p: [] for p in PHASES} for v in variants} for n in sizes}
    for rnd in range(args.rounds):
        for n in sizes:
            order = variants if rnd % 2 == 0 else variants[::-1]
            for v in order:
                if v != "stock":
                    adapters[v].install()
                b._decode_mgrs[v != "stock"] = mgrs[v]
                b.SEND_METADATA[v != "stock"] = sends[v]
                b.RECEIVER_CLASS[v != "stock"] = b._receiver_class(v)  # its own layout
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
            ratios = [z / e for e, z in zip(r["base"][p], r["head"][p]) if e > 0]
            over = [z / e for e, z in zip(r["stock"][p], r["head"][p]) if e > 0]
            out.append({"in_flight": n, "phase": p,
                        "stock_us": statistics.median(r["stock"][p]) * 1e6,
                        "base_us": statistics.median(r["base"][p]) * 1e6,
                        "head_us": statistics.median(r["head"][p]) * 1e6,
                        "head_over_base": statistics.median(ratios) if ratios else None,
                        "head_over_stock": statistics.median(over) if over else None})
    if args.json:
        print(json.dumps({"rounds": args.rounds, "base": args.base, "results": out}, indent=1))
    else:
        print("%9s  %-13s %9s %9s %9s %10s %11s" % (
            "in flight", "phase", "stock us", "base us", "head us", "head/base", "head/stock"))
        for x in out:
            print("%9d  %-13s %9.2f %9.2f %9.2f %10s %11s" % (
                x["in_flight"], x["phase"], x["stock_us"], x["base_us"], x["head_us"],
                "%.2fx" % x["head_over_base"] if x["head_over_base"] else "-",
                "%.2fx" % x["head_over_stock"] if x["head_over_stock"] else "-"))
    os._exit(0)


if __name__ == "__main__":
    main()
