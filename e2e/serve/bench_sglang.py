"""SGLang throughput under load with faults: stock and kvfence side by side, alternating rounds.

``python bench_sglang.py MODEL_DIR LOGDIR [--rounds N] [--round-s S] [--rate R] [--out F]``
(run by ``e2e/serve/run --bench``, in the SGLang server environment of ``sglang.sh``).

Both deployments are up at once, each a decode and **two prefill instances** (stock on
ports 8500-8502, kvfence, enabled with ``SGLANG_PLUGINS=kvfence``, on 8510-8512), the
router sending each request to one prefill or the other (a seeded coin, the same for both
rules). Each round runs the same open-loop load (``openloop.py``) on one deployment, then
on the other, the order alternating round by round; the one not measured is paused
(SIGSTOP of its processes once it has settled, SIGCONT 2 s before its round), both rules
alike: six SGLang servers share this machine's 2 cores, and an idle scheduler still
polls.

The load, per round:

* arrivals at ``rate`` per second (default 0.9, exponential gaps), each a client on its
  own thread;
* ``cancel`` (10 %) of the clients hang up (``Pair.hang_up``: both connections closed) at a
  random point: 0.05-0.3 s after sending, or at a decode token;
* ``stall``: every ``stall_every``-th (default 8th) request's KV write is slow: its
  prefill's transfer call trickles it in, in ~40 pieces over ``hold_s`` seconds (default
  3 s; ``CTL/slow-ROOM``, ``sglang_site/sitecustomize.py``), and its client hangs up once
  the write has started (a congested link and an impatient client). Stock SGLang frees
  the request's KV slots at its deadline and hands them to later requests (through the
  other prefill, whose queue is not behind the slow write); the rest of the write then
  lands in their KV: wrong answers, HTTP 200. kvfence holds the slots until the prefill
  ACKs the drained write.

The decode's pool is ``--decode-tokens`` KV slots (default 600: four requests and their
decode reserve). SGLang's release deadline is ``--release-s`` (default 1 s; SGLang's own
default is 30 s, the scenarios' 4 s). Both are what lets stock's race show here: SGLang
sends every write from one prefill to one decode through one queue, so a slow write holds
up that prefill's later requests, and they hold decode slots while they wait; with the
scenarios' deadline (4 s), writes of 6-9 s and pools of 300 or 600 slots, those requests
filled the pool, nobody could be given the freed slots in time, and stock answered no
wrong token in 19 rounds over seven tries (2026-12-06). A deadline shorter than the write is the race
whatever its length.

Reported per rule: medians over rounds of completed requests/s and generated tokens/s
(answers in full only, each compared with the reference), tokens/s of right answers
(``good``), the ratios kvfence / stock, wrong answers, HTTP errors, p50/p99 latency, and the
decode's KV slots in use at idle (SGLang's own ``num_used_tokens``). ``stalled`` counts the
slow-write faults (their clients hung up: not answers). ``exposures`` reads the servers'
logs: the requests given a slow write's slots before it landed (the unsafe event; whether
the answer comes out wrong depends on the landing falling inside that request's decode,
~0.1-0.3 s here, so stock's wrong answers are a fraction of its exposures; the forced
scenarios of ``serve_sglang.py`` pin that timing, this bench does not).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import time
from typing import Any, Dict, List, Set, Tuple

import model as _model
import openloop
import sglang_pair
from sglang_pair import Pair

RULES: Tuple[str, ...] = ("stock", "kvfence")  # --rules


def client(pair: Pair, data: Dict[str, Any], hold_s: float, i: int, fault: str, rnd: float,
           r: openloop.Round) -> None:
    """One client through the router: prefill A or B by ``rnd``, then its fault or its
    answer, checked against the reference."""
    assert pair.prefill_b is not None
    pf = pair.prefill if rnd < 0.525 else pair.prefill_b
    prompt, n = data["prompts"][i], data["max_tokens"]
    t0 = time.perf_counter()
    try:
        if fault == "cancel":
            # rnd is uniform in [0.05, 1): a third hang up while queued or in transfer, the
            # rest at a decode token
            at = 0 if rnd < 0.35 else 1 + int((rnd - 0.35) / 0.65 * (n - 1))
            pair.hang_up(prompt, n, at, min(rnd, 0.3), prefill=pf)
            r.count("cancelled")
            return
        if fault == "stall" and FAULT == "fail":
            # A failed write (-1 at the transfer call; its bytes land LATE_S later, as
            # Mooncake's timeout with the batch still running): the client gets an error.
            room = pair.next_room()
            with open(os.path.join(pair.ctl, f"fail-{room}"), "w") as f:
                f.write(str(LATE_S))
            try:
                pair.generate(prompt, n, prefill=pf, room=room)
                r.count("failed_write_answered")
            except Exception:  # noqa: BLE001 - expected: its write failed
                pass
            pair.remove(f"fail-{room}")  # never taken if the write never started
            r.count("failed_writes")
            return
        if fault == "stall":
            room = pair.next_room()
            with open(os.path.join(pair.ctl, f"slow-{room}"), "w") as f:
                f.write(str(hold_s))
            pair.hang_up(prompt, n, 0, 0.0, prefill=pf, room=room,
                         until=lambda: pair.wait_ctl(f"held-{room}", 60))
            pair.remove(f"slow-{room}")  # never taken if the write never started
            r.count("stalled")
            return
        room = pair.next_room()
        out, _, _ = pair.generate(prompt, n, prefill=pf, room=room)
    except Exception as e:  # noqa: BLE001 - counted, and the run goes on
        print(f"    {pair.rule} request {i}: {str(e)[:200]}", file=sys.stderr)
        r.count("errors")
        return
    r.answered(out, data["tokens"][i], time.perf_counter() - t0, False)
    if out != data["tokens"][i]:
        WRONG_ROOMS[pair.rule].add(room)


#: Per rule, the rooms of the answers that came back wrong (for ``exposures``).
WRONG_ROOMS: Dict[str, Set[int]] = {rule: set() for rule in ("stock", "kvfence", "reset")}
#: --faults: "stall" (slow writes, the default) or "fail" (failed writes, -1); --late-s
FAULT = "stall"
LATE_S = 2.0
_STAMP = r"KVFENCE-SERVE-HOOK (\d\d):(\d\d):(\d\d\.\d{3}) "


def _seconds(m: "re.Match[str]") -> float:
    return int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))


def exposures(pair: Pair) -> Dict[str, Any]:
    """From the servers' logs (``sglang_site`` hook lines, time-stamped): for each slow
    write, the requests SGLang's allocator gave any of its KV slots before the write
    landed (``exposed``: a write still to come into their KV), and how many of those
    answered wrong. Stock exposes a request whenever a slot it freed at its deadline is
    handed out before the slow write lands; under kvfence the slots come back only after
    the prefill's drain ACK, so nothing may be exposed."""
    assert pair.prefill_b is not None
    landed: Dict[int, float] = {}
    refused = 0
    for srv in (pair.prefill, pair.prefill_b):
        for m in re.finditer(_STAMP + r".*slow: the write of room (\d+) done", srv.log_text()):
            landed[int(m.group(4))] = _seconds(m)
        # a failed write's late bytes (--faults fail): landed (rc 0), or refused (the
        # decode's transport for it torn down: kvfence's reset)
        for m in re.finditer(_STAMP + r".*fail: the late bytes of room (\d+): rc (-?\d+)",
                             srv.log_text()):
            if m.group(5) == "0":
                landed[int(m.group(4))] = _seconds(m)
            else:
                refused += 1
    allocs: List[Tuple[float, int, Set[int]]] = []
    for m in re.finditer(_STAMP + r".*pages: room (\d+) got \d+ KV slots (\S+)", pair.decode.log_text()):
        slots: Set[int] = set()
        for part in m.group(5).split(","):
            a, _, b = part.partition("-")
            slots.update(range(int(a), int(b or a) + 1))
        allocs.append((_seconds(m), int(m.group(4)), slots))
    exposed: Set[int] = set()
    for k, (_, f_room, f_slots) in enumerate(allocs):
        if f_room not in landed:
            continue
        for t, room, slots in allocs[k + 1:]:
            if t < landed[f_room] and room != f_room and slots & f_slots:
                exposed.add(room)
    return {"slow_writes_landed": len(landed), "late_writes_refused": refused,
            "exposed": len(exposed),
            "exposed_and_wrong": len(exposed & WRONG_ROOMS[pair.rule]),
            "wrong_not_exposed": len(WRONG_ROOMS[pair.rule] - exposed)}


def settle(pair: Pair, timeout: float = 90.0) -> float:
    """Waits until every slow write of the round is done and the decode's KV slots are
    all free again (SGLang's own ``num_used_tokens``), up to ``timeout``; the seconds
    waited."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        names = [n for n in os.listdir(pair.ctl) if not n.endswith(".tmp")]
        held = sum(n.startswith("held-") for n in names)
        held += sum(n.startswith("fail-") and ".taken." in n for n in names)  # taken fails
        done = sum(n.startswith("slowdone-") or n.startswith("faildone-") for n in names)
        if held == done and pair.decode.used_tokens() == 0:
            break
        time.sleep(0.5)
    return time.time() - t0


def pause(pair: Pair, paused: bool) -> None:
    """SIGSTOP (``paused``) or SIGCONT every process of every server of ``pair``."""
    for s in (pair.prefill, pair.prefill_b, pair.decode):
        if s is not None:
            s.signal(signal.SIGSTOP if paused else signal.SIGCONT)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("logdir")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--round-s", type=float, default=60.0)
    ap.add_argument("--rate", type=float, default=0.9, help="arrivals per second")
    ap.add_argument("--stall-every", type=int, default=8)
    ap.add_argument("--cancel", type=float, default=0.10)
    ap.add_argument("--release-s", type=float, default=1.0,
                    help="SGLang's deferred-release deadline (default 30 s; the scenarios' 4 s)")
    ap.add_argument("--hold-s", type=float, default=3.0)
    ap.add_argument("--decode-tokens", type=int, default=600)
    ap.add_argument("--faults", choices=("stall", "fail"), default="stall",
                    help="every --stall-every-th request: a slow write (stall) or a failed "
                         "one (fail: -1, its bytes land --late-s later)")
    ap.add_argument("--late-s", type=float, default=2.0)
    ap.add_argument("--rules", default="stock,kvfence",
                    help="stock, kvfence, reset (kvfence with KVFENCE_SGLANG_RESET=1)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    global RULES, FAULT, LATE_S
    RULES, FAULT, LATE_S = tuple(a.rules.split(",")), a.faults, a.late_s
    sglang_pair.RELEASE_TIMEOUT_S = a.release_s  # read by every Server started below
    # SIGTERM (a CI timeout, a kill) ends the run through the finally below, which stops
    # every server; without it the servers' processes outlive the harness.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    data = _model.load(a.model_dir)
    os.makedirs(a.logdir, exist_ok=True)
    t_up = time.time()
    pairs = {rule: Pair(rule, data["model"], a.logdir, sys.executable, 8500 + 10 * k,
                        decode_tokens=a.decode_tokens, second_prefill=True)
             for k, rule in enumerate(RULES)}
    rows: Dict[str, List[Dict[str, Any]]] = {}
    idle: Dict[str, Any] = {}
    try:
        for p in pairs.values():
            p.wait_ready()
        print(f"both deployments up in {time.time() - t_up:.0f} s", flush=True)
        for p in pairs.values():  # warm-up: each prefill's first request (bootstrap, first run)
            for pf in (p.prefill, p.prefill_b):
                p.generate(data["prompts"][0], data["max_tokens"], prefill=pf)
            pause(p, True)

        def measure(rule: str, arrivals: List[openloop.Arrival]) -> Dict[str, Any]:
            pair = pairs[rule]
            return openloop.run_round(
                lambda i, fault, rnd, r: client(pair, data, a.hold_s, i, fault, rnd, r),
                arrivals, a.round_s)

        rows = openloop.alternate(
            RULES, a.rounds,
            lambda rnd: openloop.schedule(rnd, a.round_s, a.rate, len(data["prompts"]),
                                          a.stall_every, a.cancel),
            measure, lambda rule: settle(pairs[rule]), lambda rule, p: pause(pairs[rule], p),
            2.0)
        for rule, p in pairs.items():
            pause(p, False)
            idle[rule] = {**exposures(p), "decode_kv_used_tokens": p.decode.used_tokens(),
                          "released_anyway": p.decode.log_text().count("releasing anyway"),
                          "slow_writes_done": sum(n.startswith("slowdone-") for n in os.listdir(p.ctl)),
                          # sglang_site's line per process: is kvfence.sglang installed here
                          "kvfence_installed": {flag: sum(
                              s.log_text().count("installed in this process (%s): %s" % (where, flag))
                              for s in (p.prefill, p.prefill_b, p.decode) if s is not None
                              for where in ("prefill transfer", "decode pre-allocation"))
                              for flag in ("True", "False")}}
            pause(p, True)
    finally:
        for p in pairs.values():
            try:
                pause(p, False)  # a stopped process ignores SIGTERM until continued
            except ProcessLookupError:
                pass
            p.stop()
    if not rows:
        return 1
    summary = openloop.summarize(rows, rule=RULES[-1], extra={
        "engine": "sglang", "rounds": a.rounds, "round_s": a.round_s, "rate": a.rate,
        "paused_when_not_measured": True, "stall_every": a.stall_every, "cancel": a.cancel,
        "faults": a.faults, "late_s": a.late_s if a.faults == "fail" else None,
        "hold_s": a.hold_s, "release_deadline_s": a.release_s,
        "decode_tokens": a.decode_tokens, "idle": idle})
    if "reset" in RULES:
        for rule in RULES:
            if rule == "reset":
                text = pairs[rule].decode.log_text()
                back = [float(x) for x in re.findall(
                    r"transport generation \d+ torn down ([0-9.]+) s after its reset", text)]
                back.sort()
                summary["reset"]["resets"] = text.count("kvfence: resetting prefill")
                summary["reset"]["pages_back_s_p50"] = back[len(back) // 2] if back else None
                summary["reset"]["pages_back_s_max"] = back[-1] if back else None
    openloop.report(summary, rows, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
