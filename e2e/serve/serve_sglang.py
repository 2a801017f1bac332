"""The race and its cure on a real SGLang prefill/decode pair: scenarios, stock vs kvfence.

``python serve_sglang.py MODEL_DIR LOGDIR [--runs N] [--scenarios a,b] [--out F]`` (run by
``e2e/serve/sglang.sh`` in the SGLang server environment). One pair per rule (``stock``,
and ``kvfence`` enabled as a user enables it: ``SGLANG_PLUGINS=kvfence``), both started at
once; every scenario runs on each; every answer is compared token for token with the
``transformers`` reference of ``model.py``.

Scenarios (SGLang pushes: the prefill WRITEs into the decode's pages over Mooncake TCP):

* ``normal``: four requests one after another. The control.
* ``write_failed``: request F's KV write is reported failed (-1) by the transfer call and
  its bytes land later (Mooncake's semantics for a transfer timeout with slices still
  posted). The forcing is a fault injected at ``batch_transfer_sync`` in the prefill
  (``sglang_site/sitecustomize.py``): -1 at once, the same write performed when the
  harness says so. F fails (both rules: its client gets an abort). SGLang's decode holds
  F's pages until the prefill ACKs a drain, which never comes for a failed write, and
  releases them "anyway" at its deadline (shortened to ``RELEASE_TIMEOUT_S``). Then
  requests go through one at a time; each is paused by the decode's scheduler before its
  first decode step (``CTL/pause``), and its KV slots are read from the decode's page log.
  The first request given any of F's slots is the victim: F's late bytes land now, then
  the decode resumes. (With no request given F's slots within two sweeps of the
  allocator, which is what kvfence's hold makes happen, the bytes land during the request
  that completes the second sweep.) Events, not times, order the race: the release is a
  log line, the victim is the request SGLang's allocator gave F's slots, the bytes land
  while it is paused between its KV transfer and its decode. Stock: the victim answers
  wrong from the token where the bytes land, HTTP 200. kvfence: F's room can never be
  ACKed (a -1 write), so its pages stay held (counted: SGLang's own ``kv_used_tokens``
  at idle, kvfence's log) and nobody is given them.

* ``deadline_expired``: F's write held in flight on prefill A, F aborted at the decode;
  later requests through prefill B (see the function).
* ``client_disconnect``: six concurrent clients, every other one hanging up at a random
  point (not forced; see the function).
* ``prefill_killed``: F's write from prefill B on the wire (held there by a packet
  filter, ``inflight.py``) when B is killed -9; the bytes land after SGLang's deadline,
  into a later request's slots under stock (see the function).

Per scenario and rule: requests (F not counted: it is the fault), wrong-token requests,
HTTP errors, p50/p99 latency, the decode's KV slots in use at idle (SGLang's own
``/v1/loads``: ``num_used_tokens``) and its deferred releases by outcome
(``sglang:decode_deferred_kv_release_total``: ``timeout`` = released without proof).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import inflight
import model as _model
import sglang_pair
import tally
from sglang_pair import RELEASE_TIMEOUT_S, Pair

RELEASED_ANYWAY = "releasing anyway"


class Tally(tally.Tally):
    """What one scenario run under one rule saw (tally.Tally, the shape of the vLLM rows,
    and the faults and their victims)."""

    def __init__(self) -> None:
        super().__init__()
        self.faulted = 0
        self.faulted_answered = 0
        self.victims = 0
        self.victim_wrong = 0
        self.overlap: List[int] = []
        self.landed = 0
        self.late_writes_refused = 0  # late writes the decode refused (its engine gone)
        self.cancelled = 0
        self.fenced = 0
        self.slots_read = 0  # faults whose KV slots the page log gave (else no victim can be seen)
        self.notes: List[str] = []

    def row(self) -> Dict[str, Any]:
        return {**super().row(), "faulted": self.faulted,
                "faulted_answered": self.faulted_answered, "victims": self.victims,
                "victim_overlap_slots": self.overlap, "late_writes_landed": self.landed,
                "late_writes_refused": self.late_writes_refused,
                "cancelled": self.cancelled, "fenced": self.fenced,
                "faulted_slots_read": self.slots_read, "notes": self.notes}


def _go(pair: Pair, data: Dict[str, Any], i: int, t: Tally, room: Optional[int] = None,
        res: Optional[Dict[str, Any]] = None, prefill: Any = None) -> None:
    try:
        out, dt, _ = pair.generate(data["prompts"][i], data["max_tokens"], room=room, prefill=prefill)
    except Exception as e:  # an HTTP error / abort: counted, never a wrong answer
        print(f"    request {i}: {e}", file=sys.stderr, flush=True)
        ok = t.check(None, data["tokens"][i], 0.0)
    else:
        ok = t.check(out, data["tokens"][i], dt)
    if res is not None:
        res["ok"] = ok


def normal(pair: Pair, data: Dict[str, Any], t: Tally, run: int) -> None:
    for k in range(4):
        _go(pair, data, (run * 4 + k) % len(data["prompts"]), t)


# sglang_site's page log: "KVFENCE-SERVE-HOOK HH:MM:SS.mmm [decode pid N] pages: room R got ..."
_PAGES = re.compile(r"KVFENCE-SERVE-HOOK [0-9:.]+ \[decode pid \d+\] pages: room (\d+) got \d+ KV slots ([0-9,-]+)")


def slots_of(pair: Pair, room: int) -> Optional[Set[int]]:
    """The KV slots the decode gave ``room`` (its page log), or None."""
    for m in _PAGES.finditer(pair.decode.log_text()):
        if int(m.group(1)) == room:
            out: Set[int] = set()
            for part in m.group(2).split(","):
                a, _, b = part.partition("-")
                out.update(range(int(a), int(b or a) + 1))
            return out
    return None


def _victims(pair: Pair, data: Dict[str, Any], t: Tally, run: int, f_slots: Set[int],
             go: str, done: str, prefill: Any = None,
             land_now: Optional[Callable[[], bool]] = None) -> None:
    """Requests one at a time (through ``prefill``), each paused by the decode before its
    first decode step; the first one SGLang gave any of F's slots is the victim: the
    harness creates CTL/``go`` (F's bytes land) and waits for CTL/``done`` before the
    decode resumes (or calls ``land_now()``, which makes them land and says whether they
    did). With no victim within pool/100 + 1 requests (kvfence holds F's slots), the bytes
    land during the last one."""
    if land_now is None:
        def land_now() -> bool:
            pair.touch(go)
            return pair.wait_ctl(done, 60)
    t.slots_read += bool(f_slots)
    n = len(data["prompts"])
    k = 0
    while True:
        i = (run * 7 + 13 + k) % n
        room = pair.next_room()
        pair.remove("paused")
        pair.touch("pause")
        res: Dict[str, Any] = {}
        th = threading.Thread(target=_go, args=(pair, data, i, t, room, res, prefill))
        th.start()
        if not pair.wait_ctl("paused", 120):
            pair.remove("pause")
            land_now()  # never leave F's write waiting (it would wedge the prefill)
            th.join(300)
            t.notes.append(f"request {i} never reached a decode step")
            break
        mine = slots_of(pair, room) or set()
        hit = len(mine & f_slots)
        land = hit > 0 or k >= pair.decode_tokens // 100 + 1
        if land:
            if not land_now():
                t.notes.append("the late write did not land")
            else:
                t.landed += 1
        pair.remove("pause")
        th.join(300)
        if land:
            if hit:
                t.victims += 1
                t.overlap.append(hit)
            print(f"    [{pair.rule}] F's bytes landed during request {i} (room {room}): "
                  f"{hit} of its slots were F's; answer {'right' if res.get('ok') else 'WRONG'}",
                  flush=True)
            break
        k += 1


def write_failed(pair: Pair, data: Dict[str, Any], t: Tally, run: int) -> None:
    n = len(data["prompts"])
    for f in ("land", "landed", "pause", "paused", "fail_next"):
        pair.remove(f)
    # 1. F: its write returns -1 at the transfer call; its bytes are kept for later.
    f_idx, f_room = (run * 7 + 12) % n, pair.next_room()
    log_mark = len(pair.decode.log_text())
    p_mark = len(pair.prefill.log_text())
    pair.touch("fail_next")
    t.faulted += 1
    try:
        out, _, _ = pair.generate(data["prompts"][f_idx], data["max_tokens"], room=f_room)
        t.faulted_answered += 1
        t.notes.append(f"the failed request answered ({'right' if out == data['tokens'][f_idx] else 'wrong'})")
    except Exception as e:
        print(f"    failed request (expected): {str(e)[:160]}", file=sys.stderr, flush=True)
    if pair.has("fail_next"):
        t.notes.append("the fault was not injected (no write after it was armed)")
        pair.remove("fail_next")
        return
    f_slots = slots_of(pair, f_room) or set()
    # The failed write blacklisted the decode's session on the prefill; SGLang's own probe
    # un-blacklists it (every PROBE_S): wait for that log line, or every request fails.
    if not pair.prefill.wait_log("recovered via probe", 60.0, p_mark):
        t.notes.append("the prefill did not un-blacklist the decode's session")
    # 2. SGLang's deadline: stock logs its release; kvfence holds (both: same wait at most).
    released = pair.decode.wait_log(f"room {f_room} timed out", RELEASE_TIMEOUT_S + 6.0, log_mark)
    print(f"    [{pair.rule}] F (room {f_room}, {len(f_slots)} slots): "
          f"{'released anyway by SGLang' if released else 'still held after its deadline'}", flush=True)
    # 3. Requests one at a time, each paused before its first decode step; the first
    #    one given F's slots is the victim: F's late bytes land while it is paused.
    _victims(pair, data, t, run, f_slots, "land", "landed")
    # Under the reset rule the late write goes to the decode's torn-down engine: refused.
    rc = pair.read_ctl("landed")
    if rc is not None and rc.strip() not in ("0", ""):
        t.late_writes_refused += 1
    for f in ("land", "landed"):
        pair.remove(f)


def _send_held(pair: Pair, data: Dict[str, Any], t: Tally, f_idx: int, f_room: int,
               rid: Optional[str] = None, prefill: Any = None
               ) -> Optional[Tuple[threading.Thread, Dict[str, Any], Set[int]]]:
    """Sends the faulted request F (prompt ``f_idx``, room ``f_room``, through ``prefill``)
    with its KV write held inside the prefill's transfer call (``CTL/hold_next``), on a
    thread; once the hook says ``held``: (the thread, what F got: ``out`` or ``error``, F's
    KV slots). None, F let go and noted, if its write was never held."""
    pair.touch("hold_next")
    t.faulted += 1
    fres: Dict[str, Any] = {}

    def f_request() -> None:
        try:
            fres["out"], _, _ = pair.generate(data["prompts"][f_idx], data["max_tokens"],
                                              room=f_room, rid=rid, prefill=prefill)
        except Exception as e:  # noqa: BLE001 - aborted or its prefill killed: expected
            fres["error"] = str(e)[:160]

    fth = threading.Thread(target=f_request)
    fth.start()
    if not pair.wait_ctl("held", 120):
        t.notes.append("F's write was never held")
        pair.remove("hold_next")
        pair.touch("release")
        fth.join(300)
        return None
    return fth, fres, slots_of(pair, f_room) or set()


def deadline_expired(pair: Pair, data: Dict[str, Any], t: Tally, run: int) -> None:
    n = len(data["prompts"])
    for f in ("hold_next", "held", "release", "held_done", "pause", "paused"):
        pair.remove(f)
    # 1. F through prefill A: its KV write is held inside the transfer call (in flight).
    f_idx, f_room = (run * 7 + 12) % n, pair.next_room()
    rid = f"kvfence-serve-F-{f_room}"
    d_mark = len(pair.decode.log_text())
    held = _send_held(pair, data, t, f_idx, f_room, rid=rid)
    if held is None:
        return
    fth, fres, f_slots = held
    # 2. The decode aborts F while its write is in flight (SGLang's /abort_request, what a
    #    client disconnect does); SGLang waits for prefill A's drain ACK, which comes only
    #    when the write is done, and frees F's slots "anyway" at its deadline.
    code = pair.abort(rid)
    released = pair.decode.wait_log(f"room {f_room} timed out", RELEASE_TIMEOUT_S + 6.0, d_mark)
    fth.join(60)
    if "out" in fres:
        t.faulted_answered += 1
        t.notes.append("the aborted request answered")
    print(f"    [{pair.rule}] F (room {f_room}, {len(f_slots)} slots, abort HTTP {code}): "
          f"{'released anyway by SGLang' if released else 'still held after its deadline'}", flush=True)
    # 3. Later requests through prefill B (its own transfer queue: nothing queues them
    #    behind A's held write); F's write completes while the victim is paused.
    _victims(pair, data, t, run, f_slots, "release", "held_done", prefill=pair.prefill_b)
    for f in ("hold_next", "held", "release", "held_done"):
        pair.remove(f)


def prefill_killed(pair: Pair, data: Dict[str, Any], t: Tally, run: int) -> None:
    """F's KV write from the second prefill instance (B) is on the wire when B is killed -9,
    and lands after SGLang's decode gave up on it.

    1. A request through B, so that B's Mooncake transport to the decode is set up (its
       handshake done; a right answer, counted).
    2. F through B, its write held inside the transfer call (``CTL/hold_next``); the
       harness then holds B's data packets to the decode on the wire (``inflight``: an
       nftables rule on B's cgroup: what a congested link does) and lets the write go, so
       F's bytes sit in B's socket, sent and not acknowledged; B's whole process group is
       killed -9. The kernel keeps retransmitting them for the dead process (an orphan
       socket), and F fails under both rules.
    3. SGLang's decode learns of the death from its heartbeat ("Lost connection with
       prefill instance"). Stock then frees F's slots at its deadline ("releasing
       anyway"); kvfence keeps them held: its teardown proof counts the decode's socket
       from B, whose other end is an orphan full of F's bytes.
    4. Requests through prefill A one at a time, each paused before its first decode step
       (``_victims``): the first one SGLang gave F's slots is the victim; the harness lifts
       the hold and waits until every byte B sent was acknowledged and read by the
       decode (``ss``: no send-q on B's sockets, no recv-q on the decode's), then lets the
       victim decode. Stock: wrong from the token where F's bytes land, HTTP 200.
       kvfence: nobody is given F's slots (the bytes land on held slots), then the
       decode's socket from B closes, kvfence proves the teardown, fences B's ranks and
       frees them: 0 slots left at idle.
    5. B is started again.

    Without the means for step 2 (root, ``nft``, cgroup v2: ``inflight.unavailable``) the
    scenario runs without the race (B killed while its write is still held in the
    transfer call, before a byte of it reaches a socket) and says so: it then checks only
    that a dead writer's pages come back and later requests are right."""
    n = len(data["prompts"])
    b = pair.prefill_b
    assert b is not None, "prefill_killed needs the second prefill instance"
    for f in ("hold_next", "held", "release", "held_done", "pause", "paused"):
        pair.remove(f)
    d_mark = len(pair.decode.log_text())
    raced = pair.b_cgroup is not None
    if raced:
        _go(pair, data, (run * 7 + 3) % n, t, prefill=b)
    f_idx, f_room = (run * 7 + 5) % n, pair.next_room()
    held = _send_held(pair, data, t, f_idx, f_room, prefill=b)
    if held is None:
        return
    fth, fres, f_slots = held
    hold: Optional[inflight.Hold] = None
    sent: Dict[Any, int] = {}
    if raced:
        assert pair.b_cgroup is not None
        ports = inflight.listening_ports(pair.decode.proc.pid) - {pair.decode.port}
        hold = inflight.Hold(pair.b_cgroup, ports)
        pair.touch("release")  # B writes F's KV now; its data segments stay on the wire
        inflight.wait(lambda: bool(inflight.unsent(b.proc.pid, ports)), 30)
        sent = inflight.unsent(b.proc.pid, ports)
        if not sent:
            t.notes.append("F's bytes never queued on B's sockets (the race was not set up)")
    b.signal(signal.SIGKILL)
    fth.join(300)
    if "out" in fres:
        t.faulted_answered += 1
        t.notes.append("F answered although its prefill was killed")
    if hold is None:
        t.notes.append("not raced: " + str(inflight.unavailable()))
        fenced = pair.decode.wait_log("kvfence: fenced prefill", 60.0, d_mark) if pair.rule == "kvfence" else False
        t.fenced += fenced
        print(f"    [{pair.rule}] F (room {f_room}): prefill B killed -9 with its write held in the "
              f"transfer call (not raced: {inflight.unavailable()})", flush=True)
        for k in range(4):
            _go(pair, data, (run * 4 + k + 3) % n, t)
    else:
        lost = pair.decode.wait_log("Lost connection with prefill instance", 60.0, d_mark)
        released = pair.decode.wait_log(f"room {f_room} timed out", RELEASE_TIMEOUT_S + 6.0, d_mark)
        print(f"    [{pair.rule}] F (room {f_room}, {len(f_slots)} slots): prefill B killed -9 with "
              f"{sum(sent.values())} bytes of it on the wire ({hold.dropped()} packets held); "
              f"{'heartbeat lost; ' if lost else ''}"
              f"{'released anyway by SGLang' if released else 'still held after its deadline'}", flush=True)

        def land_now() -> bool:
            assert hold is not None
            hold.lift()
            return inflight.wait(lambda: inflight.delivered(sent), 120.0)

        _victims(pair, data, t, run, f_slots, "", "", land_now=land_now)
        hold.lift()
        if pair.rule == "kvfence":
            fenced = pair.decode.wait_log("kvfence: fenced prefill", 60.0, d_mark)
            t.fenced += fenced
            if not fenced:
                left = inflight.sockets_of(sent)
                print(f"    [{pair.rule}] not fenced 60 s after F's bytes landed; sockets of B's "
                      f"connections left: {left or 'none'}", flush=True)
                t.notes.append(f"not fenced; sockets left: {left}")
    for f in ("hold_next", "held", "release", "held_done"):
        pair.remove(f)
    up = pair.restart_prefill_b()
    print(f"    [{pair.rule}] prefill B up again in {up:.0f} s", flush=True)


def client_disconnect(pair: Pair, data: Dict[str, Any], t: Tally, run: int) -> None:
    """Six concurrent clients on a decode pool with room for two, every other one hanging
    up (both connections closed, as a router does when its client goes) at a point drawn
    from a seeded generator: 0-0.3 s after sending (while queued for the decode's slots or
    while its KV write is in flight), or at a token of its decode. Every answer that arrives is compared; a
    hang-up counts as a request, not an error. Nothing is forced: the race it can hit is an
    abort while a write is in flight (``deadline_expired`` forces that one), so both rules
    must answer right and give every slot back (kvfence once the writes drained)."""
    rng = random.Random(run)
    n = len(data["prompts"])
    threads = []
    for k in range(6):
        i = (run * 6 + k) % n
        # hang up at token 0 (while queued or while the KV write is in flight: 0-0.3 s
        # after sending) or at a token of the decode's stream
        at = None
        if k % 2:
            at = (0, rng.uniform(0.0, 0.3)) if rng.random() < 0.5 else \
                (rng.randrange(1, data["max_tokens"] // 2), 0.0)
        threads.append(threading.Thread(target=_go_or_hang_up, args=(pair, data, i, t, at)))
    for th in threads:
        th.start()
        time.sleep(0.1)
    for th in threads:
        th.join(300)


def _go_or_hang_up(pair: Pair, data: Dict[str, Any], i: int, t: Tally,
                   at: Optional[Tuple[int, float]]) -> None:
    if at is None:
        try:
            out, dt, _ = pair.generate(data["prompts"][i], data["max_tokens"])
        except Exception as e:  # an HTTP error / abort: counted, never a wrong answer
            print(f"    request {i}: {e}", file=sys.stderr, flush=True)
            out, dt = None, 0.0
        with _LOCK:  # six client threads share the tally
            t.check(out, data["tokens"][i], dt)
        return
    seen = pair.hang_up(data["prompts"][i], data["max_tokens"], at[0], at[1])
    with _LOCK:
        t.requests += 1
        t.cancelled += 1
    when = f"at token {at[0]}" if at[0] else f"{at[1]:.2f} s after sending"
    print(f"    [{pair.rule}] request {i} (room {seen['room']}) hung up {when}: "
          f"{seen['chunks']} token(s) streamed{', already finished' if seen['finished'] else ''}",
          flush=True)


_LOCK = threading.Lock()


SCENARIOS = {"normal": normal, "write_failed": write_failed, "deadline_expired": deadline_expired,
             "client_disconnect": client_disconnect, "prefill_killed": prefill_killed}
RACING = {"write_failed", "deadline_expired"}
#: What the ``reset`` rule (kvfence with KVFENCE_SGLANG_RESET=1) runs: the control and the
#: failed write, whose slots it gives back (the other scenarios have no -1: as kvfence).
RESET_SCENARIOS = ("normal", "write_failed")


def idle(pair: Pair, base: int = 0, timeout: float = 10.0) -> Dict[str, Any]:
    """The decode's KV slots in use once idle (SGLang's own scheduler state, polled until
    back to ``base``, what was in use before the scenario, or ``timeout``), and its
    deferred-release counters (``/metrics``)."""
    t0 = time.time()
    while True:
        used = pair.decode.used_tokens()
        if used == base or time.time() - t0 > timeout:
            break
        time.sleep(1)
    m = pair.decode.metrics()
    rel = {k.split('outcome="')[1].split('"')[0]: v for k, v in m.items()
           if k.startswith("sglang:decode_deferred_kv_release_total") and 'outcome="' in k}
    return {"kv_used_tokens_at_idle": used, "kv_total_tokens": pair.decode_tokens,
            "deferred_releases_by_outcome": rel}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("logdir")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--rules", default="stock,kvfence",
                    help="stock, kvfence, reset (kvfence with KVFENCE_SGLANG_RESET=1: runs "
                         "normal and write_failed only)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    data = _model.load(a.model_dir)
    os.makedirs(a.logdir, exist_ok=True)
    rules = a.rules.split(",")
    table: List[Dict[str, Any]] = []
    t_start = time.time()
    # kvfence holds the slots of each failed write for good (100 per run), and those of
    # deadline_expired's F while its write is held: room for them and one more request
    # (100 + 24 + 32 reserved), the same pool for both rules.
    tokens = (sglang_pair.DECODE_TOKENS + (100 * (a.runs - 1) if "write_failed" in a.scenarios else 0)
              + (100 if "deadline_expired" in a.scenarios or "prefill_killed" in a.scenarios else 0))
    two = "deadline_expired" in a.scenarios or "prefill_killed" in a.scenarios
    pairs = {rule: Pair(rule, data["model"], a.logdir, sys.executable, 8300 + 10 * k, tokens, two)
             for k, rule in enumerate(rules)}
    try:
        for rule, pair in pairs.items():
            pair.wait_ready()
        print(f"pairs up in {time.time() - t_start:.0f} s ({', '.join(rules)}, started at once)", flush=True)
        for rule, pair in pairs.items():
            for name in a.scenarios.split(","):
                if rule == "reset" and name not in RESET_SCENARIOS:
                    continue
                t = Tally()
                t0 = time.time()
                before = pair.decode.used_tokens()  # slots an earlier scenario left held
                for run in range(a.runs):
                    SCENARIOS[name](pair, data, t, run)
                racing = name in RACING or (name == "prefill_killed" and pair.b_cgroup is not None)
                row = dict(engine="sglang", scenario=name, rule=rule, racing=racing,
                           kv_used_tokens_before=before,
                           **idle(pair, before or 0), **t.row(), seconds=round(time.time() - t0, 1))
                table.append(row)
                print(f"[{rule}] {name}: {json.dumps(row)}", flush=True)
            dlog, plog = pair.decode.log_text(), pair.prefill.log_text()
            table.append(dict(
                engine="sglang", rule=rule, scenario="(log)",
                released_anyway=dlog.count(RELEASED_ANYWAY),
                injected_failures=plog.count("write_failed: returned -1"),
                transport_resets=dlog.count("kvfence: resetting prefill"),
                resets_torn_down=len(re.findall(r"transport generation \d+ torn down", dlog)),
                kvfence_installed_lines=len(re.findall(r"kvfence\.sglang installed in this process \([^)]*\): True", dlog + plog)),
                kvfence_absent_lines=len(re.findall(r"kvfence\.sglang installed in this process \([^)]*\): False", dlog + plog)),
                standin_called=("KVFENCE-STANDIN-CALLED" in dlog + plog),
            ))
    finally:
        for pair in pairs.values():
            pair.stop()
    calls = os.path.join(a.logdir, "standin-calls.txt")
    table.append(dict(engine="sglang", rule="-", scenario="(stand-in)",
                      sgl_kernel_calls=(open(calls).read().count("\n") if os.path.exists(calls) else 0)))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(table, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
