"""The abort race on SGLang 0.5.23's own PD code, stock vs kvfence.sglang.

One prefill and one decode process per rule (``harness/node.py``: SGLang's real
MooncakeKVManager, sender, receiver, bootstrap server and DecodeTransferQueue over
Mooncake TCP on loopback) run every scenario ``--runs`` times in sequence. Rule ``stock``:
SGLang as shipped. Rule ``kvfence``: the same processes started with ``KVFENCE_SGLANG=1``
(the start-up hook installs ``kvfence.sglang``); the harness code is identical.

Each run: decode opens R1 (pages from a LIFO free list, metadata sent), the prefill
writes it; the scenario forces its timing; decode aborts R1 as ``Scheduler.abort_request``
does and loops ``resolve_deferred_releases()`` + ``pop_transferred()`` as
``process_decode_queue`` does; pages SGLang releases go to R2, which writes its own bytes;
at the end: do R1's bytes sit on R2's pages (**corrupted**), and is every page back in the
free list, still held, or quarantined (else **lost**)?

Scaled down to keep the run short (same code paths, same race): SGLang's release-anyway
deadline (30 s) to 0.5 s (10 ms for the 256 MiB write), held writes to 1-2 s, the heartbeat
to 2 s x 1 miss (SGLang's minimum), the 512 MiB write to 256 MiB, kvfence's quarantine policy to 4.5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

from .proc import Node

SMALL = 16  # pages per request (x 8 buffers x 8 KiB = 1 MiB)
LARGE = 4096  # 256 MiB


#: Rules run with kvfence installed: ``kvfence``, and ``reset`` (KVFENCE_SGLANG_RESET=1).
GATED = ("kvfence", "reset")
#: Scenarios where a failed write resets the prefill's transport under ``reset``.
RESETS = ("write_failed", "write_failed_inflight")


class Scenario:
    def __init__(self, name: str, racing: bool, doc: str, fn: Callable[..., Dict[str, Any]],
                 by_name: bool = False):
        self.name, self.racing, self.doc, self.fn = name, racing, doc, fn
        # run only when named in --scenarios (a prefill restart each: kept out of the
        # default set, which ci.sh runs, for time)
        self.by_name = by_name


def wait_event(p: Node, room: int, key: str, timeout: float = 20) -> float:
    t = time.time() + timeout
    while time.time() < t:
        ev = p.call(op="events", room=room)["events"]
        if key in ev:
            return float(ev[key])
        time.sleep(0.003)
    raise RuntimeError("prefill never reported %s for room %d" % (key, room))


class Pair:
    def __init__(self, rule: str, python: str, logdir: str, base: int) -> None:
        self.rule = rule
        env = {"KVFENCE_SGLANG": "1", "KVFENCE_SGLANG_QUARANTINE_AFTER": "4.5"} \
            if rule in GATED else {"KVFENCE_SGLANG": "0"}
        if rule == "reset":
            # The transport reset (kvfence.sglang.reset), started by a reported failed
            # write only (no time trigger: the other scenarios' holds stay as they are).
            env.update(KVFENCE_SGLANG_RESET="1", KVFENCE_SGLANG_RESET_AFTER="never")
        self.env, self.python, self.logdir = env, python, logdir
        self.bport, self.base = base, base + 1000
        self.addr = "127.0.0.1:%d" % self.bport
        t0 = time.time()
        self.p = self.start_prefill()
        self.d = Node("decode", base + 1, self.base + 200, env, python, logdir)
        self.p.wait_ready()
        r = self.d.wait_ready()
        self.start_s = time.time() - t0
        if (rule in GATED) != bool(r["kvfence"].get("installed")):
            raise RuntimeError("rule %s but kvfence installed=%s" % (rule, r["kvfence"]))
        self.d.call(op="connect", addr=self.addr)
        self.room = random.getrandbits(60)

    def start_prefill(self, bootstrap_host: str = "127.0.0.1") -> Node:
        self.base += 10
        env = dict(self.env, E2E_BOOTSTRAP_HOST=bootstrap_host)
        self.addr = "%s:%d" % (bootstrap_host, self.bport)
        return Node("prefill", self.bport, self.base, env, self.python, self.logdir)

    def restart_prefill(self, bootstrap_host: str = "127.0.0.1") -> None:
        if self.p.p.poll() is None:
            self.p.close()
        self.p = self.start_prefill(bootstrap_host)
        self.p.wait_ready()
        self.d.call(op="connect", addr=self.addr)

    def next_room(self) -> int:
        self.room += 1
        return self.room

    def knobs(self, deadline: float, deferred: bool = True) -> None:
        # What SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE(_TIMEOUT) set at __init__.
        self.d.call(op="set", queue={"deferred_kv_release_timeout": deadline,
                                     "enable_deferred_kv_release": deferred},
                    mgr={"enable_deferred_decode_kv_release": deferred})

    def close(self) -> None:
        self.p.close()
        self.d.close()


# ---------------------------------------------------------------------------- scenarios


def race(pp: Pair, run: int, *, mode: str, delay: float, deadline: float, budget: float,
         pages: int = SMALL, deferred: bool = True, abort: bool = True,
         during: Optional[Callable[[], None]] = None, r2_by: Optional[float] = None) -> Dict[str, Any]:
    pp.knobs(deadline, deferred)
    if not deferred:
        pp.p.call(op="set_flag", value=False)
    room = pp.next_room()
    r1 = pp.d.call(op="open", addr=pp.addr, room=room, pages=pages, rid="r1-%d" % room)
    pp.p.call(op="send", room=room, pages=pages, src_start=0, pattern=0xA0 | (run % 16),
              mode=mode, delay=delay, aux=1)
    wait_event(pp.p, room, "write_started")
    if during is not None:
        during()
    out = pp.d.call(op="abort_and_reuse", rid="r1-%d" % room, budget=budget, abort=abort,
                    r2_pattern=0x50 | (run % 16), r1_pages=r1["pages"],
                    r2_by=budget if r2_by is None else r2_by, timeout=budget + 60)
    if not deferred:
        pp.p.call(op="set_flag", value=True)
    return out


def s_normal(pp: Pair, run: int) -> Dict[str, Any]:
    pp.knobs(30.0)
    room = pp.next_room()
    pp.d.call(op="open", addr=pp.addr, room=room, pages=SMALL, rid="n-%d" % room)
    pp.p.call(op="send", room=room, pages=SMALL, src_start=0, pattern=0x30 | (run % 16), aux=2)
    r = pp.d.call(op="wait_success", rid="n-%d" % room, pattern=0x30 | (run % 16))
    return {"corrupted": r["bad_pages"] > 0 or not r["meta_ok"] or r["status"] != 4,
            "detail": r}


def s_inflight_drained(pp: Pair, run: int) -> Dict[str, Any]:
    return race(pp, run, mode="hold", delay=1.0, deadline=30.0, budget=2.0)


def _refused(pp: Pair) -> int:
    """The prefill's kvfence refused_chunks (0 for stock)."""
    return sum(g["refused_chunks"] for g in pp.p.call(op="state")["kvfence"].get("prefill", []))


def s_queued_chunk(pp: Pair, run: int) -> Dict[str, Any]:
    # R1's chunks wait in the worker's queue behind r0's held write when R1 is aborted:
    # SGLang skips them (the room is Failed); kvfence refuses their transfer first.
    pp.knobs(30.0)
    before = _refused(pp)
    r0 = pp.next_room()
    pp.d.call(op="open", addr=pp.addr, room=r0, pages=SMALL, rid="q0-%d" % r0)
    pp.p.call(op="send", room=r0, pages=SMALL, src_start=64, pattern=0x21, mode="hold",
              delay=1.0, aux=3)
    wait_event(pp.p, r0, "write_started")
    room = pp.next_room()
    r1 = pp.d.call(op="open", addr=pp.addr, room=room, pages=SMALL, rid="r1-%d" % room)
    pp.p.call(op="send", room=room, pages=SMALL, src_start=0, pattern=0xA0 | (run % 16), aux=1)
    out = pp.d.call(op="abort_and_reuse", rid="r1-%d" % room, budget=1.5,
                    r2_pattern=0x50 | (run % 16), r1_pages=r1["pages"], r2_by=1.5)
    w = pp.d.call(op="wait_success", rid="q0-%d" % r0, pattern=0x21)
    out["r0_bad_pages"] = w["bad_pages"]
    # R1's chunks are dequeued after r0's write: wait (up to 3 s) for kvfence to see them.
    t0 = time.time()
    while True:
        out["refused_chunks"] = _refused(pp) - before
        if out["refused_chunks"] > 0 or pp.rule != "kvfence" or time.time() - t0 > 3:
            return out
        time.sleep(0.05)


def s_chunk_after_check(pp: Pair, run: int) -> Dict[str, Any]:
    # The ABORT lands after the worker dequeued the chunk and checked the room, before
    # the write: stock writes it anyway (and waits for it before its ACK); under kvfence
    # the chunk's transfer began at its dequeue, so the room is released only after the
    # write (released_after >= the 1 s window).
    pp.knobs(30.0)
    room = pp.next_room()
    r1 = pp.d.call(op="open", addr=pp.addr, room=room, pages=SMALL, rid="r1-%d" % room)
    pp.p.call(op="send", room=room, pages=SMALL, src_start=0, pattern=0xA0 | (run % 16),
              aux=1, pre_hold=1.0)
    wait_event(pp.p, room, "write_started")
    out = pp.d.call(op="abort_and_reuse", rid="r1-%d" % room, budget=2.0,
                    r2_pattern=0x50 | (run % 16), r1_pages=r1["pages"], r2_by=2.0)
    return out


def s_deadline_expired(pp: Pair, run: int) -> Dict[str, Any]:
    return race(pp, run, mode="hold", delay=1.5, deadline=0.5, budget=2.5)


def _failed_write(pp: Pair, run: int, **kw: Any) -> Dict[str, Any]:
    # -1 from the transfer call while the bytes keep going; r2 at +1.5 s at the latest.
    # The prefill blacklisted the decode's session: un-blacklisted after (as its probe would).
    try:
        return race(pp, run, deadline=0.5, budget=5.5, r2_by=1.5, **kw)
    finally:
        pp.p.call(op="unblacklist")


def s_write_failed(pp: Pair, run: int) -> Dict[str, Any]:
    # -1 at once, the bytes land at +1 s.
    return _failed_write(pp, run, mode="fail", delay=1.0)


def s_write_failed_inflight(pp: Pair, run: int) -> Dict[str, Any]:
    # A 256 MiB write on the wire when the call returns -1 at +50 ms (Mooncake's timeout
    # with the batch still running).
    return _failed_write(pp, run, mode="fail_inflight", delay=0.05, pages=LARGE)


def s_deferred_off(pp: Pair, run: int) -> Dict[str, Any]:
    return race(pp, run, mode="hold", delay=1.0, deadline=30.0, budget=2.0, deferred=False)


def s_large_write(pp: Pair, run: int) -> Dict[str, Any]:
    # No artificial delay: a 256 MiB TCP write against a 10 ms deadline.
    return race(pp, run, mode="observe", delay=0.0, deadline=0.01, budget=3.0, pages=LARGE)


def s_heartbeat_live(pp: Pair, run: int) -> Dict[str, Any]:
    # The prefill is alive and writing; only its /health fails. No client abort: the
    # heartbeat marks the room Failed, pop_transferred notifies and holds.
    def fail_health() -> None:
        pp.p.call(op="health", ok=False)
    try:
        return race(pp, run, mode="hold", delay=3.5, deadline=0.5, budget=5.0, abort=False,
                    during=fail_health)
    finally:
        pp.p.call(op="health", ok=True)
        pp.d.call(op="connect", addr=pp.addr)


def s_kill9(pp: Pair, run: int) -> Dict[str, Any]:
    def kill() -> None:
        pp.p.kill9()
    out = race(pp, run, mode="hold", delay=3.0, deadline=0.5, budget=5.0, abort=False,
               during=kill)
    out["killed"] = True
    return out


def s_shared_room(pp: Pair, run: int) -> Dict[str, Any]:
    # Requests A and B share a bootstrap_room (issue 38 item 2). A's write is in flight
    # (1.5 s) when both are aborted and B's writer ACKs B's ABORT at once. SGLang's
    # room-keyed tracker counts B's ACK for A too and frees A's pages, which R2 reuses
    # before A's bytes land. kvfence decides per request: A stays held (here the prefill's
    # one ACK target per decode endpoint is B's by then, so A is never ACKed: quarantined
    # at 4.5 s, counted, not lost).
    pp.knobs(30.0)
    room = pp.next_room()
    a = pp.d.call(op="open", addr=pp.addr, room=room, pages=SMALL, rid="a-%d" % room)
    pp.p.call(op="send", room=room, pages=SMALL, src_start=0, pattern=0xA0 | (run % 16),
              mode="hold", delay=1.5, aux=1)
    wait_event(pp.p, room, "write_started")
    pp.d.call(op="open", addr=pp.addr, room=room, pages=SMALL, rid="b-%d" % room)
    return pp.d.call(op="abort_shared_room", rid_a="a-%d" % room, rid_b="b-%d" % room,
                     budget=5.5, r2_by=0.3, r2_pattern=0x50 | (run % 16),
                     r1_pages=a["pages"], timeout=70)


def s_kill9_rank_ip(pp: Pair, run: int) -> Dict[str, Any]:
    # A prefill whose bootstrap server is on 127.0.0.3 while its rank registers rank_ip
    # 127.0.0.1, where its Mooncake and ZMQ connections come from (a multi-node prefill's
    # ranks, issue 38 item 1), killed -9 while its write is held. The heartbeat declares
    # it dead; kvfence fences its rank only once no socket from 127.0.0.3 *or* 127.0.0.1 is
    # left (the adapter before issue 38 looked at the bootstrap host only).
    pp.restart_prefill("127.0.0.3")

    def kill() -> None:
        pp.p.kill9()
    out = race(pp, run, mode="hold", delay=3.0, deadline=0.5, budget=5.0, abort=False,
               during=kill)
    out["killed"] = True
    return out


SCENARIOS = [
    Scenario("normal", False, "transfer completes; bytes and metadata row exact", s_normal),
    Scenario("inflight_drained", False, "write in flight 1 s, deadline 30 s", s_inflight_drained),
    Scenario("queued_chunk", False, "R1's chunk queued behind another request's", s_queued_chunk),
    Scenario("chunk_after_check", False, "ABORT between the worker's check and its write",
             s_chunk_after_check),
    Scenario("deadline_expired", True, "write in flight 1.5 s, deadline 0.5 s", s_deadline_expired),
    Scenario("write_failed", True, "-1 while the bytes keep going (+1 s)", s_write_failed),
    Scenario("write_failed_inflight", True, "256 MiB write on the wire when -1 returns",
             s_write_failed_inflight, by_name=True),
    Scenario("deferred_off", True, "deferred release switched off", s_deferred_off),
    Scenario("large_write", True, "256 MiB write, no delay, deadline 10 ms", s_large_write),
    Scenario("heartbeat_live", True, "heartbeat fails, prefill alive, writing 3.5 s", s_heartbeat_live),
    Scenario("shared_room", True, "two aborted requests share a room; the 2nd's ACK first",
             s_shared_room),
    Scenario("kill9_midwrite", False, "prefill kill -9 while its write is held", s_kill9),
    Scenario("kill9_rank_ip", False, "kill -9 of a prefill whose rank connects from an "
             "address other than its bootstrap host", s_kill9_rank_ip, by_name=True),
]


def account(pp: Pair, before_q: int) -> Dict[str, Any]:
    st = pp.d.call(op="settle", seconds=0.3)
    kv = st["kvfence"]
    q_rooms = sum(g["quarantined_rooms"] for g in kv.get("decode", []))
    resets = [g.get("reset") or {} for g in kv.get("decode", [])]
    return {"resets": sum(r.get("resets", 0) for r in resets),
            "reset_proven": sum(r.get("proven", 0) for r in resets),
            "reset_refused": sum(r.get("refused_requests", 0) for r in resets),
            "free": st["free"], "total": st["total"], "held_pages": st["held_pages"],
            "held": st["held"], "queue": st["queue"], "quarantined_rooms": q_rooms,
            "quarantined_kv_pages": st.get("quarantined_kv_pages", 0)}


def run_rule(rule: str, args: argparse.Namespace, python: str, logdir: str, base: int,
             log: Callable[[str], None]) -> List[Dict[str, Any]]:
    pp = Pair(rule, python, logdir, base)
    log("%s: processes up in %.1f s" % (rule, pp.start_s))
    results = []
    try:
        for sc in SCENARIOS:
            if (args.scenarios or sc.by_name) and sc.name not in args.scenarios:
                continue
            n = args.kill_runs if sc.name == "kill9_midwrite" else args.runs
            rows = []
            for run in range(n):
                if sc.name == "kill9_midwrite" and run > 0:
                    pp.restart_prefill()
                before = account(pp, 0)
                t0 = time.time()
                out = sc.fn(pp, run)
                if not sc.name.startswith("kill9"):
                    pp.p.call(op="clear")
                acc = account(pp, 0)
                corrupted = bool(out.get("corrupted")) or out.get("r2_bad_pages", 0) > 0 \
                    or out.get("r0_bad_pages", 0) > 0
                lost = acc["total"] - acc["free"] - acc["held_pages"] - acc["quarantined_kv_pages"]
                rows.append({"corrupted": corrupted, "lost_pages": lost,
                             "resets": acc["resets"] - before["resets"],
                             "reset_proven": acc["reset_proven"] - before["reset_proven"],
                             "reset_refused": acc["reset_refused"] - before["reset_refused"],
                             "refused_chunks": out.get("refused_chunks", 0),
                             "held_pages_at_end": acc["held_pages"],
                             "quarantined_pages": acc["quarantined_kv_pages"],
                             "released_after": out.get("released_after"),
                             "r2_reused_r1_pages": out.get("r2_reused_r1_pages"),
                             "seconds": time.time() - t0, "detail": out})
                # Quarantined pages are out of circulation for good: give the harness's
                # pool its pages back between runs so later runs have room (counted above).
                pp.d.call(op="reset_quarantined")
                log("%-8s %-17s run %d: %s, lost %d, released_after %s" % (
                    rule, sc.name, run, "CORRUPTED" if corrupted else "intact", lost,
                    "%.3f" % out["released_after"] if out.get("released_after") is not None else "-"))
            rel = [r["released_after"] for r in rows if r["released_after"] is not None]
            results.append({
                "scenario": sc.name, "rule": rule, "racing": sc.racing, "doc": sc.doc,
                "runs": len(rows), "corrupted_runs": sum(r["corrupted"] for r in rows),
                "lost_pages": sum(r["lost_pages"] for r in rows),
                "held_pages_at_end": rows[-1]["held_pages_at_end"] if rows else 0,
                "quarantined_pages": sum(r["quarantined_pages"] for r in rows),
                "refused_chunks": sum(r["refused_chunks"] for r in rows),
                "released_after_median_s": statistics.median(rel) if rel else None,
                "released_after_max_s": max(rel) if rel else None,
                "r2_reused_r1_runs": sum(bool(r["r2_reused_r1_pages"]) for r in rows),
                "resets": sum(r["resets"] for r in rows),
                "reset_proven": sum(r["reset_proven"] for r in rows),
                "reset_refused": sum(r["reset_refused"] for r in rows),
                "rows": rows if args.verbose else None,
            })
    finally:
        pp.close()
    return results


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="e2e/sglang/run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="runs per scenario and rule (3)")
    ap.add_argument("--kill-runs", type=int, default=1,
                    help="runs of kill9_midwrite (each restarts the prefill, ~15-60 s) (1)")
    ap.add_argument("--rules", default="stock,kvfence")
    ap.add_argument("--scenarios", default="", help="comma-separated subset")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--verbose", action="store_true", help="per-run rows in the JSON")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--base-port", type=int, default=0)
    args = ap.parse_args(argv)
    if args.runs < 1 or args.kill_runs < 0:
        ap.error("--runs must be >= 1 and --kill-runs >= 0")
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(args.scenarios) - {s.name for s in SCENARIOS}
    if unknown:
        ap.error("unknown scenario(s): %s" % ", ".join(sorted(unknown)))
    logdir = tempfile.mkdtemp(prefix="kvfence-e2e-sglang-")
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    log("logs: %s" % logdir)
    base = args.base_port or random.randrange(20000, 40000, 100)
    results: List[Dict[str, Any]] = []
    t0 = time.time()
    for i, rule in enumerate(r for r in args.rules.split(",") if r):
        if rule not in ("stock",) + GATED:
            ap.error("unknown rule %r" % rule)
        results += run_rule(rule, args, args.python, logdir, base + 5000 * i, log)
    doc = {"runs": args.runs, "kill_runs": args.kill_runs, "seconds": time.time() - t0,
           "machine": "2-core dev box, shared/loaded", "sglang": "0.5.23",
           "scaled": {"deadline_s": 0.5, "large_write_deadline_s": 0.01,
                      "large_write_bytes": LARGE * 8 * 8192, "heartbeat": "2 s x 1",
                      "kvfence_quarantine_after_s": 4.5},
           "results": results}
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print("%-21s %-7s %-7s %5s %9s %6s %8s %11s %7s" % ("scenario", "rule", "racing",
              "runs", "corrupted", "lost", "quaran.", "released@", "resets"))
        for r in results:
            rel = r["released_after_median_s"]
            print("%-21s %-7s %-7s %5d %9d %6d %8d %11s %7d" % (
                r["scenario"], r["rule"], "yes" if r["racing"] else "no", r["runs"],
                r["corrupted_runs"], r["lost_pages"], r["quarantined_pages"],
                "%.3f s" % rel if rel is not None else "held", r["resets"]))
        print("(%.0f s; deadlines scaled: see --help)" % doc["seconds"])
    bad = [r for r in results if r["rule"] in GATED and (r["corrupted_runs"] or r["lost_pages"])]
    # The reset must give a failed write's pages back (never quarantine them), and prove
    # it ran: one reset per run, each proven.
    bad += [r for r in results if r["rule"] == "reset" and r["scenario"] in RESETS and (
        r["quarantined_pages"] or r["released_after_median_s"] is None
        or r["reset_proven"] < r["runs"])]
    for r in bad:
        log("FAIL: %s under %s: %s" % (r["scenario"], r["rule"], {
            k: r[k] for k in ("corrupted_runs", "lost_pages", "quarantined_pages",
                              "released_after_median_s", "resets", "reset_proven")}))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
