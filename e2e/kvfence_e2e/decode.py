"""The decode instance (this process) and its prefill instances (child processes).

One registered KV buffer split into pages; the engine's own allocator (a LIFO free list:
a freed page is reused at once); a kvfence RoomTable in gate mode with release_queue=True
(rule kvfence) or SGLang-style bookkeeping (the other rules); an ACK receiver thread per
control connection; a scheduler loop (the caller's thread) that drains releases and only
then frees pages.

hosts mode (cfg.hosts, e2e/run hosts, kvfence_e2e/hosts.py): this process runs on the
decode host; a Mooncake engine per prefill incarnation; heartbeats and a deadline; a dead
or reset peer is fenced only after its transport's proven teardown (hosts.DecodeNet).
"""
from __future__ import annotations

import os
import queue
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from .common import (MAGIC_DATA, MAGIC_FREE, MAGIC_OWNED, Conn, check_page, header, my_tcp_sockets,
                     stamp)

TRANSFER, DECODING, ABORTING, DONE = "transfer", "decoding", "aborting", "done"
# Test-only mutations (e2e/hosts/ci.sh --mutation shows each check can fail):
#   fence-without-teardown  hosts mode: fence a dead/reset peer's ranks without tearing
#                           its transport down first;
#   no-reset                hosts mode: a -1 does not reset the transport (the room is
#                           held until the rank is fenced for another reason);
#   ack-at-reset            hosts mode (prefill.py): at a RESET the peer ACKs the old
#                           generation's rooms at once (the failed room is released
#                           before its transport's teardown).
MUTATION = os.environ.get("KVFENCE_E2E_MUTATION", "")
_ENGINES = []  # every Mooncake engine this process made (never destroyed: make_engine)
WRITER_STRIDE = 1000  # writer id = rank + WRITER_STRIDE * transport generation


class Rec:
    __slots__ = ("id", "inst", "ranks", "pages", "h", "state", "t_open", "abort_at",
                 "t_abort", "done_ranks", "acks", "decode_until", "corrupt", "why",
                 "abort_on_commit", "released", "t_fail", "lranks", "wgen", "reset_log")

    def __init__(self, rid, inst, ranks, pages):
        self.id, self.inst, self.ranks, self.pages = rid, inst, ranks, pages
        self.lranks = ranks  # the ranks on the wire; self.ranks: their writer ids in the
        self.wgen = 0        # table, of transport generation wgen (hosts mode: see reset)
        self.h = None
        self.state = TRANSFER
        self.t_open = time.monotonic()
        self.abort_at = None
        self.t_abort = None
        self.done_ranks = set()
        self.acks = set()
        self.decode_until = None
        self.corrupt = False
        self.why = []
        self.abort_on_commit = False
        self.released = False
        self.t_fail = None
        self.reset_log = None


class Decode:
    def __init__(self, cfg, rule):
        from mooncake.engine import TransferEngine
        self.cfg, self.rule = cfg, rule
        self.ps, self.npages = cfg.page_size, cfg.pages
        # hosts mode (e2e/run hosts): this process runs in the decode's network namespace;
        # every prefill incarnation gets its own Mooncake engine here (its own ports), so
        # that one incarnation's transport can be fenced by a packet filter (hosts.py)
        self.hosts = getattr(cfg, "hosts", None)
        self.ip = self.hosts["decode_ip"] if self.hosts else "127.0.0.1"
        self.TransferEngine = TransferEngine
        # pages 0..N-1 for KV, page N is a scratch page for the prefill warm-up write
        self.kv = np.zeros((self.npages + 1) * self.ps, dtype=np.uint8)
        self.kv_addr = self.kv.ctypes.data
        self.engines = {}  # hosts mode: inst -> the engine of its current incarnation
        self.engine_lock = threading.Lock()
        self.engine_ms = []  # ms per engine made (its ports found included)
        if not self.hosts:
            self.engine = self.make_engine()[0]
            self.session = "127.0.0.1:%d" % self.engine.get_rpc_port()
        for p in range(self.npages):
            stamp(self.page(p), MAGIC_FREE, 0)
        self.free = list(range(self.npages - 1, -1, -1))  # LIFO: pop() reuses the last freed
        self.retired = []  # quarantined pages: never reused
        self.table = None
        if rule == "kvfence":
            import kvfence
            self.kvfence = kvfence
            self.table = kvfence.RoomTable(4096, release_queue=True)
        self.timeout = {"timeout-30s": 30.0 * getattr(cfg, "scale", 1.0),
                        "timeout-50ms": 0.05}.get(rule)
        self.events = queue.Queue()
        self.recs = {}  # id -> Rec (not yet released)
        self.by_inst = {}
        self.conns, self.procs, self.alive, self.ranks_of = {}, {}, set(), {}
        self.writers_of = {}  # inst -> writer ids of its current transport (hosts: reset)
        self.gen_of = {}  # inst -> its transport generation (+1 at each reset)
        self.resets_pending = 0
        self.pstats = {}
        self.m = {"requests": 0, "finished": 0, "aborted": 0, "corrupted_requests": 0,
                  "corrupted_pages": 0, "stale_landings_on_free_pages": 0, "failed_writes": 0,
                  "rank_fences": 0, "kills": 0, "quarantined_pages": 0,
                  "peak_pages_held_awaiting_drain": 0, "fence_wait_ms_max": 0.0,
                  "fence_waits_with_unread_data": 0, "transport_resets": 0,
                  "declared_dead": 0, "fenced_host_landings_after_heal": 0,
                  "reset_drain_aborts": 0, "released_before_old_transport_fenced": 0,
                  "failed_rooms_released_before_fence": 0, "resets_on_announced_standby": 0}
        self.teardowns = []  # hosts mode: ms from "declare dead" to "proven torn down"
        # per -1 reset (hosts mode, kvfence): where its cost goes (hosts.py summarizes)
        self.reset_log = []  # dicts: t (monotonic), inst, extra_aborted, session_ms,
        #                      reset_to_ready_ms, peer_engine_ms, teardown_ms, fenced_at
        self.reset_open = {}  # inst -> its reset_log entry awaiting READY
        self.teardown_errors = []
        self.landed = set()
        self.lat = []
        self.fail_lat = []  # ms from a -1 (FAIL) to the release of its room
        self.acked = set()
        self.pending_fence = {}  # inst -> time its control connection closed
        self.fence_waits = []  # ms from control EOF to proven transport teardown
        self.last_sock_check = 0.0  # requests some rank has ACKed (also after their release)
        self.next_id = 1
        self.logdir = tempfile.mkdtemp(prefix="kvfence-e2e-")
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind((self.ip, 0))
        self.lsock.listen(64)
        self.ctl_port = self.lsock.getsockname()[1]
        self.last_seen = {}  # inst -> monotonic time of its last control message
        self.hold_respawn = set()  # instances not to respawn yet (cut off)
        self.exited_at = {}  # inst -> when its exited process was noticed
        self.rids_by_inst = {}
        self.owner = {}  # page -> request id owning it (None: free)
        self.watch = None  # (request ids, heal time): bytes of a cut host watched for
        # hosts mode, kvfence: transports being drained after a -1 (see reset): dicts
        # inst, gen, writers, engine, conn, deadline, log
        self.draining = []
        self.drain_s = (self.hosts or {}).get("reset_drain_s", 0.5)
        # standby engines (hosts mode): made off the scheduler thread, so that a new
        # session (a reset, a respawn) costs the scheduler nothing (measured before: a
        # synchronous make_engine in reset() held the scheduler 25-73 ms, all hosts idle)
        self.spares = []
        self.spare_cv = threading.Condition()
        self.standby = {}  # inst -> (engine record, conn): announced to that incarnation
        self.standby_lock = threading.Lock()
        self.alive_or_welcomed = set()  # incarnations a standby may be announced to
        self.announce_q = queue.Queue()  # (inst, conn): standbys to announce (a thread)
        self.spare_target = 0
        if self.hosts:
            from . import hosts
            self.net = hosts.DecodeNet(self)
            self.spare_target = max(1, cfg.instances if hasattr(cfg, "instances") else 1)
            # (these two threads keep this Decode, hence its engines, alive for the
            # driver's lifetime: never destroyed during a later run. Measured on the dev
            # box: a TransferEngine's destructor takes ~0.95 s and holds the GIL, 40 of
            # them 38 s; destroyed by the cycle collector in a later run, they would stall
            # it)
            threading.Thread(target=self.spare_maker, daemon=True).start()
            threading.Thread(target=self.announcer, daemon=True).start()
        threading.Thread(target=self.acceptor, daemon=True).start()

    def make_engine(self):
        """A Mooncake engine on this host with the KV buffer registered; (engine, its
        listening ports). Serialized: the ports are the ones that appeared meanwhile (hosts
        mode: in the decode's namespace, where this process is alone)."""
        from .common import listen_ports, netns_listen_ports
        ports_now = netns_listen_ports if self.hosts else listen_ports
        with self.engine_lock:
            t0 = time.monotonic()
            before = ports_now()
            e = self.TransferEngine()
            if e.initialize(self.ip, "P2PHANDSHAKE", "tcp", "") != 0:
                raise RuntimeError("Mooncake initialize failed")
            if e.register_memory(self.kv_addr, self.kv.size) != 0:
                raise RuntimeError("Mooncake register_memory failed")
            ports = (ports_now() - before) | {e.get_rpc_port()}
            self.engine_ms.append((time.monotonic() - t0) * 1000.0)
            # Every engine stays referenced for the process's lifetime: a TransferEngine's
            # destructor takes ~0.95 s with the GIL held (measured), so one dropped mid-run
            # (a dead incarnation's standby, a retired generation) would stall the whole
            # decode for that long.
            _ENGINES.append(e)
            return e, ports

    def spare_maker(self):
        """hosts mode: keeps spare_target standby engines made (a fresh engine each: its
        ports serve one incarnation or generation only, so that its teardown filter never
        touches another's)."""
        while True:
            with self.spare_cv:
                while len(self.spares) >= self.spare_target:
                    self.spare_cv.wait()
            try:
                e = self.make_engine()
            except RuntimeError as x:
                self.teardown_errors.append("standby engine: %r" % x)
                return  # session_for makes them synchronously from now on
            with self.spare_cv:
                self.spares.append(e)

    def take_engine(self):
        """A standby engine if one is ready (else one made now); (engine, ports)."""
        with self.spare_cv:
            if self.spares:
                e = self.spares.pop(0)
                self.spare_cv.notify()
                self.m["standby_engines_used"] = self.m.get("standby_engines_used", 0) + 1
                return e
        self.m["engines_made_inline"] = self.m.get("engines_made_inline", 0) + 1
        return self.make_engine()

    def session_for(self, inst, rec=None):
        """The Mooncake session a new incarnation (or transport generation) of inst writes
        to (rec: an engine record already made, e.g. inst's announced standby)."""
        if not self.hosts:
            return self.session
        if rec is None:
            e, ports = self.take_engine()
            rec = {"engine": e, "ports": ports, "session": "%s:%d" % (self.ip, e.get_rpc_port())}
        # (the record replaced keeps nothing alive: every engine stays in _ENGINES, its
        # ports bound, never reused)
        self.engines[inst] = rec
        return rec["session"]

    def announcer(self):
        while True:
            self.announce_standby(*self.announce_q.get())

    def announce_standby(self, inst, conn):
        """hosts mode, kvfence (off the scheduler thread): reserves a standby engine for
        inst's next transport generation and names it to the peer (STANDBY), which warms a
        standby engine of its own to it (the handshake): a RESET then switches at once.
        The standby belongs to this incarnation from then on: if it dies, the standby is
        torn down with its current transport (on_dead); an engine no peer was told of goes
        back to the pool."""
        e, ports = self.take_engine()
        rec = {"engine": e, "ports": ports, "session": "%s:%d" % (self.ip, e.get_rpc_port())}
        with self.standby_lock:
            if self.conns.get(inst) is conn and inst in self.alive_or_welcomed \
                    and inst not in self.standby:
                self.standby[inst] = (rec, conn)
                conn.send(t="STANDBY", session=rec["session"])  # (before any RESET using it)
                return
        with self.spare_cv:
            self.spares.append((e, ports))

    def page(self, p):
        return self.kv[p * self.ps:(p + 1) * self.ps]

    # ---------------- prefill processes ----------------
    def spawn(self, inst):
        R = self.cfg.ranks_per_instance
        ranks = list(range(inst * R, inst * R + R))
        self.ranks_of[inst] = ranks
        env = dict(os.environ)
        env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        log = open(os.path.join(self.logdir, "prefill%d.log" % inst), "ab")
        cmd = [sys.executable, "-m", "kvfence_e2e.prefill", "--inst", str(inst),
               "--ranks", ",".join(map(str, ranks)), "--ctl", str(self.ctl_port),
               "--rule", self.rule, "--page-size", str(self.ps)]
        if self.hosts:  # on its own host: its namespace, its address, heartbeats
            h = self.hosts["prefills"][inst]
            cmd = ["ip", "netns", "exec", h["ns"]] + cmd + [
                "--ip", h["ip"], "--ctl-host", self.ip, "--hb-ms", str(self.hosts["hb_ms"]),
                "--linger-s", str(self.hosts.get("linger_s", 0.0))]
        else:
            cmd += ["--session", self.session]
        self.procs[inst] = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)

    def acceptor(self):
        while True:
            try:
                s, _ = self.lsock.accept()
            except OSError:
                return
            threading.Thread(target=self.receiver, args=(Conn(s),), daemon=True).start()

    def receiver(self, conn):
        """One per prefill instance: ACKs go straight to the table (any thread)."""
        m = conn.recv()
        if m is None or m["t"] != "HELLO":
            return
        inst = m["inst"]
        self.last_seen[inst] = time.monotonic()
        conn.send(t="WELCOME", scratch=self.kv_addr + self.npages * self.ps,
                  session=self.session_for(inst), gen=self.gen_of.get(inst, 0))
        self.conns[inst] = conn
        if self.hosts and self.table is not None:
            self.alive_or_welcomed.add(inst)
            self.announce_standby(inst, conn)
        while True:
            m = conn.recv()
            if self.conns.get(inst) is conn:
                self.last_seen[inst] = time.monotonic()
            if m is None:
                conn.close()  # (else it would sit in CLOSE_WAIT itself)
                self.events.put(("dead", inst, conn))  # the control connection closed
                return
            if m["t"] == "HB":
                continue  # a heartbeat: only last_seen
            if m["t"] == "ACK" and self.table is not None:
                rec = self.recs.get(m["req"])
                if rec is not None and m["rank"] in rec.lranks:
                    # "stale" for a late ACK: harmless
                    self.table.quiesce(m["h"], rec.ranks[rec.lranks.index(m["rank"])])
            self.events.put((m["t"], inst, m))

    def start(self, n):
        for i in range(n):
            self.spawn(i)
        t0 = time.monotonic()
        while len(self.alive) < n:
            if time.monotonic() - t0 > 60:
                raise RuntimeError("prefill processes did not start (see %s)" % self.logdir)
            self.step(0.05)

    def kill(self, inst):
        p = self.procs.get(inst)
        if p and p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            self.m["kills"] += 1

    # ---------------- allocation / release ----------------
    def admit(self, inst, *, delay_ms=0, fail_chunk=-1, notify=False, abort_at=None,
              abort_on_commit=False):
        ppr = self.cfg.pages_per_request
        if len(self.free) < ppr or inst not in self.alive:
            return None
        pages = [self.free.pop() for _ in range(ppr)]
        rid = self.next_id
        self.next_id += 1
        for p in pages:  # reuse: nothing may have landed since the free
            magic, r, _, _ = header(self.page(p))
            if magic != MAGIC_FREE:
                self.m["stale_landings_on_free_pages"] += 1
                self.m["corrupted_pages"] += 1
            stamp(self.page(p), MAGIC_OWNED, rid)
            self.owner[p] = rid
        ranks = self.writers_of.get(inst, self.ranks_of[inst])
        rec = Rec(rid, inst, ranks, pages)
        rec.lranks = self.ranks_of[inst]
        rec.wgen = self.gen_of.get(inst, 0)
        self.rids_by_inst.setdefault(inst, []).append(rid)
        rec.abort_at, rec.abort_on_commit = abort_at, abort_on_commit
        if self.table is not None:
            rec.h = self.table.open(ranks, pages, token=rid)  # writers = the serving ranks
        self.recs[rid] = rec
        self.m["requests"] += 1
        R = len(ranks)
        for j, r in enumerate(rec.lranks):
            chunks = [(c, self.kv_addr + pages[c] * self.ps) for c in range(ppr) if c % R == j]
            self.conns[inst].send(t="REQ", req=rid, h=rec.h or 0, rank=r, chunks=chunks,
                                  delay_ms=delay_ms, fail_chunk=fail_chunk, notify=notify,
                                  gen=rec.wgen)
        return rec

    def release(self, rec, quarantined=False):
        """The scheduler thread frees the pages to its own allocator."""
        if rec.released:
            return
        rec.released = True
        if rec.t_abort is not None:
            self.lat.append((time.monotonic() - rec.t_abort) * 1000.0)
        if rec.t_fail is not None:
            self.fail_lat.append((time.monotonic() - rec.t_fail) * 1000.0)
            if rec.reset_log is not None:
                rec.reset_log["fail_to_release_ms"] = round(self.fail_lat[-1], 2)
        if rec.reset_log is not None and "fenced_at" not in rec.reset_log \
                and rec.t_abort is not None:
            # an aborted room of a reset generation released before that transport's fence:
            # only on the peer's ACK (every write it started has ended); never the failed
            # room (its -1 write's outcome is unknown: only the fence may release it)
            self.m["released_before_old_transport_fenced"] += 1
            if rec.t_fail is not None and rec.reset_log.get("failed_req") == rec.id:
                self.m["failed_rooms_released_before_fence"] += 1
        for p in rec.pages:
            self.owner[p] = None
        if quarantined:
            self.retired.extend(rec.pages)
            self.m["quarantined_pages"] += len(rec.pages)
        else:
            for p in rec.pages:
                stamp(self.page(p), MAGIC_FREE, rec.id)
                self.free.append(p)
        rec.state = DONE
        self.recs.pop(rec.id, None)

    def abort(self, rec):
        if rec.state != TRANSFER:
            return
        rec.state = ABORTING
        rec.t_abort = time.monotonic()
        self.m["aborted"] += 1
        if self.table is not None:
            tell = [rec.lranks[rec.ranks.index(w)] for w in self.table.abort(rec.h)]
        else:
            tell = rec.lranks
        conn = self.conns.get(rec.inst)
        if rec.inst in self.alive and conn is not None:
            for r in tell:
                conn.send(t="ABORT", req=rec.id, h=rec.h or 0, rank=r)
        if self.rule == "naive":
            self.release(rec)

    def verify(self, rec):
        for c, p in enumerate(rec.pages):
            why = check_page(self.page(p), rec.id, c)
            if why and (c, why) not in rec.why:
                rec.why.append((c, why))
                self.m["corrupted_pages"] += 1
                rec.corrupt = True

    # ---------------- the scheduler loop ----------------
    def drain(self):
        """Frees every release kvfence decided since the last drain, exactly once."""
        for r in self.table.drain_released():
            rec = self.recs.get(r.token)
            if rec is not None:
                self.release(rec, quarantined=(r.reason == "quarantined"))

    def step(self, wait=0.001):
        try:
            ev = self.events.get(timeout=wait)
            self.handle(ev)
            while True:
                self.handle(self.events.get_nowait())
        except queue.Empty:
            pass
        now = time.monotonic()
        if self.hosts:
            self.check_heartbeats(now)
            if self.draining:
                self.check_drains(now)
            if self.watch is not None:
                self.scan_landings()
        if self.table is not None:
            if not self.hosts:
                self.try_fence()
            self.drain()
        elif self.timeout is not None:
            for rec in list(self.recs.values()):
                if rec.state == ABORTING and (rec.acks >= set(rec.lranks)
                                              or now - rec.t_abort >= self.timeout):
                    self.release(rec)
        held = 0
        for rec in list(self.recs.values()):
            if rec.state == DECODING and now >= rec.decode_until:
                self.verify(rec)  # the KV is read until the end of decoding
                self.m["finished"] += 1
                self.m["corrupted_requests"] += rec.corrupt
                if self.table is not None:
                    rec.state = DONE
                    self.table.finish(rec.h)
                    for r in rec.ranks:
                        self.table.quiesce(rec.h, r)  # their DONE was their last word
                else:
                    self.release(rec)
            elif rec.state == TRANSFER and rec.abort_at is not None and now >= rec.abort_at:
                self.abort(rec)
            if rec.state == ABORTING and not rec.released:
                held += len(rec.pages)
        if self.table is not None:
            # The requests finished in this step: their pages are free before the next
            # admission, as the stock rules free them inline.
            self.drain()
        self.m["peak_pages_held_awaiting_drain"] = max(
            self.m["peak_pages_held_awaiting_drain"], held)
        return held

    def handle(self, ev):
        t, inst, m = ev
        if t == "READY":
            log = self.reset_open.pop(inst, None)
            if log is not None:
                log["reset_to_ready_ms"] = round((time.monotonic() - log["t_sent"]) * 1000.0, 2)
                log["peer_engine_ms"] = m.get("engine_ms")
                log["peer_standby"] = m.get("standby")
            self.alive.add(inst)
            if self.table is not None:
                for r in self.writers_of.get(inst, self.ranks_of[inst]):
                    self.table.readmit_rank(r)
            return
        if t == "STATS":
            self.pstats[inst] = m["stats"]
            return
        if t == "dead":
            if self.conns.get(inst) is not m:
                return
            self.on_dead(inst)
            return
        rec = self.recs.get(m["req"])
        if t == "ACK":
            self.acked.add(m["req"])
        if rec is None:
            return  # a late message about a released request
        if t == "DONE":
            rec.done_ranks.add(m["rank"])
            if rec.state == TRANSFER and rec.done_ranks >= set(rec.lranks):
                self.verify(rec)
                rec.state = DECODING
                rec.decode_until = time.monotonic() + self.cfg.decode_ms / 1000.0
        elif t == "ACK":
            rec.acks.add(m["rank"])
        elif t == "FAIL":
            self.m["failed_writes"] += 1
            if rec.t_fail is None:
                rec.t_fail = time.monotonic()
            self.abort(rec)  # the request fails
            if self.hosts and self.table is not None and rec.inst in self.alive \
                    and rec.wgen == self.gen_of.get(rec.inst, 0) and MUTATION != "no-reset":
                self.reset(rec.inst, failed=rec.id)  # -1: the transport to that peer is reset
        elif t == "COMMIT":
            if rec.abort_on_commit:
                self.abort(rec)

    def on_dead(self, inst, declared=False):
        """The control connection of a prefill instance closed (its process is gone), or
        (declared) the instance was silent past the heartbeat deadline (hosts mode)."""
        self.alive.discard(inst)
        with self.standby_lock:
            conn = self.conns.pop(inst, None)
            self.alive_or_welcomed.discard(inst)
            sb = self.standby.pop(inst, None)  # warmed by this incarnation: torn down too
        if declared:
            self.m["declared_dead"] += 1
            if conn is not None:
                conn.close()  # its FIN leaves when (if) the link heals
        mine = [r for r in self.recs.values() if r.inst == inst]
        for rec in mine:
            if rec.state == TRANSFER:
                self.abort(rec)  # the request fails
        for old in self.draining:  # its old transport generations: torn down now
            if old["inst"] == inst:
                old["deadline"] = 0.0
        if self.table is not None and self.hosts:
            self.fence_inst(inst, standby=sb[0] if sb else None)  # the local teardown,
            # proven (of its current transport and of its standby), then the fence
        elif self.table is not None:
            # Fence only once the transport is torn down. The control EOF is not enough:
            # Mooncake's server may still hold the dead peer's bytes in a data socket
            # (CLOSE_WAIT with unread data) and write them into our pages afterwards.
            self.pending_fence[inst] = time.monotonic()
            self.try_fence()
        else:  # SGLang's node-failure path: its rooms are freed at once
            for rec in mine:
                if rec.state == ABORTING:
                    self.release(rec)

    def fence_inst(self, inst, then=None, engine=None, writers=None, log=None, standby=None):
        """hosts mode, kvfence: tear down the transport of inst's current incarnation
        without its help (hosts.DecodeNet.teardown: filter, drain, abort, prove), then
        fence its ranks: their rooms are released only now (the scheduler drains them).
        On a thread of its own, so that the other hosts are served meanwhile; then() runs
        after the fence. inst stays in pending_fence (no respawn, no admission) until
        then."""
        reset = writers is not None
        if reset:
            self.resets_pending += 1
        else:
            self.pending_fence[inst] = time.monotonic()
        ranks = list(writers if reset else self.writers_of.get(inst, self.ranks_of[inst]))
        eng = engine if engine is not None else self.engines.get(inst)
        both = None
        if standby is not None:  # one teardown over both engines' ports
            both = [x for x in (eng, standby) if x is not None]
            eng = {"ports": set().union(*(x["ports"] for x in both)),
                   "fenced": all(x.get("fenced") for x in both)}

        def work():
            try:
                # (test-only mutation: fence at once, as if the control EOF or the
                # deadline proved the transport gone: the partition check must catch it)
                ms = 0.0 if MUTATION == "fence-without-teardown" else self.net.teardown(inst, eng)
                if ms > 0:
                    self.teardowns.append(ms)
                for x in both or ():
                    x["fenced"] = True
                if log is not None:
                    log["teardown_ms"] = round(ms, 2)
                    log["fenced_at"] = time.monotonic()  # (set before the fence below:
                    # a release it causes is drained after it)
                self.m["fence_wait_ms_max"] = round(max(self.m["fence_wait_ms_max"], ms), 1)
                for r in ranks:
                    self.m["rank_fences"] += 1
                    self.table.fence_rank(r)
                if reset:
                    for r in ranks:  # never used again: out of the (bounded) fenced set
                        self.table.readmit_rank(r)
                if then is not None:
                    then()
            except Exception as e:  # a teardown that cannot be proven: never fence
                self.teardown_errors.append(repr(e))
                return
            if reset:
                self.resets_pending -= 1
            else:
                self.pending_fence.pop(inst, None)
        threading.Thread(target=work, daemon=True).start()

    def reset(self, inst, failed=None):
        """kvfence, hosts mode: a write of inst returned -1 (request failed, aborted by
        the caller). A graceful reset of the transport to that peer:

        * at once, a new transport generation: new writer ids (a room opened on them can
          never be released by the old ones' fence), a standby engine here (its own
          ports: the old one's teardown filter never touches it), RESET(gen, session) to
          the peer, which switches to a standby engine of its own. inst stays alive: the
          requests admitted from now on carry the new generation and are written on the
          new transport only (the peer routes each chunk by its request's generation);
        * the old generation drains: its requests in transfer go on on the old transport
          (the failed room's chunks are refused: it was aborted), their ACKs are honest
          (sent once every write started for the room has ended);
        * once none of them is in transfer any more, or after drain_s (then the rest are
          aborted, as an abortive reset would), check_drains tears the old transport down
          (proven, hosts.DecodeNet.teardown) and only then fences the old writer ids: the
          failed room (and any aborted room not yet ACKed) is released now, never before;
          RETIRE(gen) tells the peer to forget that generation.
        """
        self.m["transport_resets"] += 1
        t0 = time.monotonic()
        old_gen = self.gen_of.get(inst, 0)
        hit = [r for r in self.recs.values() if r.inst == inst and r.wgen == old_gen
               and r.state in (TRANSFER, ABORTING)]
        old = {"inst": inst, "gen": old_gen,
               "writers": list(self.writers_of.get(inst, self.ranks_of[inst])),
               "engine": self.engines.get(inst), "conn": self.conns.get(inst),
               "deadline": t0 + self.drain_s}
        g = old_gen + 1
        self.gen_of[inst] = g
        self.writers_of[inst] = [r + WRITER_STRIDE * g for r in self.ranks_of[inst]]
        t_s = time.monotonic()
        with self.standby_lock:
            sb = self.standby.pop(inst, None)
        if sb is not None and sb[1] is old["conn"]:
            session = self.session_for(inst, sb[0])  # announced: the peer has warmed it
            self.m["resets_on_announced_standby"] += 1
        else:
            session = self.session_for(inst)  # a standby engine of the pool: no wait
        if old["conn"] is not None:
            self.announce_q.put((inst, old["conn"]))  # the next generation's standby
        log = {"t": t0, "inst": inst, "gen": g, "failed_req": failed,
               "in_transfer_at_reset": sum(1 for r in hit if r.state == TRANSFER),
               "extra_aborted": 0, "session_ms": round((time.monotonic() - t_s) * 1000.0, 2)}
        old["log"] = log
        self.reset_log.append(log)
        for rec in hit:
            rec.reset_log = rec.reset_log or log
        conn = old["conn"]
        if conn is not None:
            conn.send(t="RESET", gen=g, session=session)
            log["t_sent"] = time.monotonic()
            self.reset_open[inst] = log
        self.resets_pending += 1  # (until its teardown and fence: run_mixed waits for it)
        self.draining.append(old)
        self.check_drains(t0)

    def check_drains(self, now):
        """The old transport generations whose requests have all left TRANSFER (or whose
        drain time is up: the rest aborted) are torn down, then their writer ids fenced."""
        for old in list(self.draining):
            inst, gen = old["inst"], old["gen"]
            busy = [r for r in self.recs.values()
                    if r.inst == inst and r.wgen == gen and r.state == TRANSFER]
            if busy and now < old["deadline"] and inst in self.alive:
                continue
            self.draining.remove(old)
            for rec in busy:  # drain time up: the safe abort (it releases no page itself)
                old["log"]["extra_aborted"] += 1
                self.m["reset_drain_aborts"] += 1
                self.abort(rec)
            old["log"]["drain_ms"] = round((now - old["log"]["t"]) * 1000.0, 2)
            conn = old["conn"]

            def retire(inst=inst, gen=gen, conn=conn):
                if conn is not None and self.conns.get(inst) is conn:
                    conn.send(t="RETIRE", gen=gen)  # the peer forgets that generation
            self.resets_pending -= 1  # (fence_inst counts it again until its fence)
            self.fence_inst(inst, then=retire, engine=old["engine"], writers=old["writers"],
                            log=old["log"])

    def check_heartbeats(self, now):
        for inst in list(self.alive):
            if now - self.last_seen.get(inst, now) > self.hosts["dead_after_s"]:
                self.on_dead(inst, declared=True)

    def scan_landings(self):
        """After a heal: bytes of the cut host's requests on a page they do not own."""
        rids, healed = self.watch
        if healed is None:
            return
        hdr = self.kv[:self.npages * self.ps].reshape(self.npages, self.ps)[:, :16]
        hdr = np.ascontiguousarray(hdr).view(np.uint32)
        for p in np.nonzero(hdr[:, 0] == MAGIC_DATA)[0]:
            r = int(hdr[p, 1])
            if r in rids and self.owner.get(int(p)) != r and (int(p), r) not in self.landed:
                self.landed.add((int(p), r))
                self.m["fenced_host_landings_after_heal"] += 1

    def try_fence(self):
        """Fences the ranks of dead instances once no data socket of ours is half-closed
        (CLOSE_WAIT: its peer is gone, and the server has not consumed it all yet)."""
        now = time.monotonic()
        if not self.pending_fence or now - self.last_sock_check < 0.002:
            return
        self.last_sock_check = now
        half = [x for x in my_tcp_sockets() if x[2] == "08"]
        if half:
            if any(x[3] > 0 for x in half):
                self.m["fence_waits_with_unread_data"] += 1
            return
        for inst, t in list(self.pending_fence.items()):
            del self.pending_fence[inst]
            w = (now - t) * 1000.0
            self.fence_waits.append(w)
            self.m["fence_wait_ms_max"] = round(max(self.m["fence_wait_ms_max"], w), 1)
            for r in self.ranks_of[inst]:  # the transport is torn down: fence only now
                self.m["rank_fences"] += 1
                self.table.fence_rank(r)

    def shutdown(self, grace=10.0):
        """STOP every prefill; their connections close; wait for the releases."""
        for inst, c in list(self.conns.items()):
            c.send(t="STOP")
        t0 = time.monotonic()
        while (self.alive or self.pending_fence) and time.monotonic() - t0 < grace:
            self.step(0.01)
        for inst, p in self.procs.items():
            if p.poll() is None:
                p.kill()
            p.wait()
        t1 = time.monotonic()
        while time.monotonic() - t1 < 0.3:
            self.step(0.01)
        # late landings on free pages after everything stopped
        for p in self.free:
            if header(self.page(p))[0] != MAGIC_FREE:
                self.m["stale_landings_on_free_pages"] += 1
                self.m["corrupted_pages"] += 1
        unreleased = sum(len(r.pages) for r in self.recs.values())
        self.m["pages_unreleased_at_end"] = unreleased
        self.m["lost_pages"] = self.npages - len(self.free) - len(self.retired) - unreleased
        try:
            self.lsock.close()
        except OSError:
            pass

    def summary(self, duration):
        lat = sorted(self.lat)

        def pct(q):
            if not lat:
                return None
            return round(lat[min(len(lat) - 1, int(q * len(lat)))], 1)

        out = {"rule": self.rule}
        out.update(self.m)
        ps = {}
        for s in self.pstats.values():
            for k, v in s.items():
                ps[k] = ps.get(k, 0) + v
        out["stale_writes_refused"] = ps.get("stale_writes_refused", 0)
        out["chunks_written"] = ps.get("chunks_written", 0)
        out["abort_to_release_ms_p50"] = pct(0.5)
        out["abort_to_release_ms_p99"] = pct(0.99)
        fl = sorted(self.fail_lat)
        out["fail_to_release_ms_p50"] = round(fl[len(fl) // 2], 1) if fl else None
        out["fail_to_release_ms_max"] = round(fl[-1], 1) if fl else None
        if self.hosts:
            out["teardown_ms"] = [round(x, 2) for x in self.teardowns]
            out["teardown_parts_ms"] = self.net.parts  # (filter, drain, abort+proof)
            out["teardown_impl"] = self.net.impl()  # (in process, or the tools' fallback)
            out["teardown_errors"] = self.teardown_errors
            out["resets"] = [{k: v for k, v in x.items()
                              if k not in ("t", "t_sent", "fenced_at", "failed_req")}
                             for x in self.reset_log]

            def med(k):
                xs = sorted(x[k] for x in self.reset_log if x.get(k) is not None)
                return round(xs[len(xs) // 2], 2) if xs else None
            out["reset_summary"] = {
                "n": len(self.reset_log),
                "extra_aborted_total": sum(x["extra_aborted"] for x in self.reset_log),
                "session_ms_p50": med("session_ms"), "reset_to_ready_ms_p50": med("reset_to_ready_ms"),
                "peer_engine_ms_p50": med("peer_engine_ms"), "teardown_ms_p50": med("teardown_ms"),
                "fail_to_release_ms_p50": med("fail_to_release_ms"),
                "drain_ms_p50": med("drain_ms"),
                "decode_engine_make_ms_p50": (round(sorted(self.engine_ms)[len(self.engine_ms) // 2], 2)
                                              if self.engine_ms else None),
                "in_transfer_at_reset_total": sum(x.get("in_transfer_at_reset", 0)
                                                  for x in self.reset_log)}
        out["throughput_rps"] = round(self.m["finished"] / duration, 1) if duration else 0.0
        return out


def run_mixed(cfg, rule, tick=None):
    """A seeded mixed load; the same schedule for every rule. tick(decode, t) (hosts
    mode) injects network faults; an instance found dead is respawned 0.5 s after its
    old process exited (unless tick holds it)."""
    d = Decode(cfg, rule)
    rng = random.Random(cfg.seed)
    try:
        d.start(cfg.instances)
        t0 = time.monotonic()
        end = t0 + cfg.duration
        killed = False
        respawn_at = None
        rr = 0
        while True:
            now = time.monotonic()
            if now >= end:
                break
            if cfg.kill_at is not None and not killed and now - t0 >= cfg.kill_at:
                # kill -9 the instance with the most writes in flight
                busy = {}
                for r in d.recs.values():
                    if r.state == TRANSFER:
                        busy[r.inst] = busy.get(r.inst, 0) + 1
                victim = max(busy, key=busy.get) if busy else 0
                d.kill(victim)
                killed = True
                respawn_at = (victim, now + 0.5)
            if respawn_at and now >= respawn_at[1] and respawn_at[0] not in d.conns \
                    and respawn_at[0] not in d.pending_fence:
                d.spawn(respawn_at[0])
                respawn_at = None
            if tick is not None:
                tick(d, now - t0)
            if d.hosts:
                for inst, p in d.procs.items():
                    if inst in d.conns or inst in d.hold_respawn or p.poll() is None \
                            or inst in d.pending_fence \
                            or (respawn_at and respawn_at[0] == inst):
                        continue
                    exited = d.exited_at.setdefault(inst, now)
                    if now - exited >= 0.5:
                        del d.exited_at[inst]
                        d.spawn(inst)
            active = sum(1 for r in d.recs.values() if r.state in (TRANSFER, DECODING))
            alive = sorted(d.alive)
            while active < cfg.max_inflight and alive and len(d.free) >= cfg.pages_per_request:
                inst = alive[rr % len(alive)]
                rr += 1
                # the request's fate comes from the seeded stream (same for every rule)
                slow = rng.random() < cfg.slow_share
                ab = rng.random() < cfg.abort_share
                fail = rng.random() < cfg.fail_share
                ab_ms = rng.uniform(0, cfg.abort_max_ms)
                rec = d.admit(inst, delay_ms=cfg.delay_ms if slow else 0,
                              fail_chunk=(cfg.pages_per_request - 1) if fail else -1,
                              abort_at=(time.monotonic() + ab_ms / 1000.0) if ab else None)
                if rec is None:
                    break
                active += 1
            d.step(0.002)
        duration = time.monotonic() - t0
        # let requests in flight end (aborting rooms under timeout-30s may stay held)
        t1 = time.monotonic()
        while time.monotonic() - t1 < 3.0 and any(
                r.state in (TRANSFER, DECODING) for r in d.recs.values()):
            d.step(0.005)
        while d.hosts and (d.pending_fence or d.resets_pending or d.draining) \
                and time.monotonic() - t1 < 8.0:
            d.step(0.005)  # a reset under way at the end of the load: its teardown ends
        for _ in range(3):
            d.step(0.005)  # (its releases drained)
        d.m["pages_held_awaiting_drain_at_end"] = sum(
            len(r.pages) for r in d.recs.values() if r.state == ABORTING)
        d.m["failed_rooms_held_at_end"] = sum(
            1 for r in d.recs.values() if r.t_fail is not None and not r.released)
        d.shutdown()
        return d.summary(duration)
    finally:
        for p in d.procs.values():
            if p.poll() is None:
                p.kill()


def run_repro(cfg, rule, runs):
    """The race, forced: request A's chunk is committed (begin_transfer succeeded) and its
    Mooncake write throttled; the decode aborts A on the COMMIT notice; B gets A's pages
    (LIFO) from another instance and is decoded for decode_ms while A's write lands."""
    d = Decode(cfg, rule)
    per_run = []
    try:
        d.start(2)
        for k in range(runs):
            before = (d.m["corrupted_pages"], d.m["corrupted_requests"])
            a = d.admit(0, delay_ms=cfg.delay_ms, notify=True, abort_on_commit=True)
            if a is None:
                raise RuntimeError("repro: no pages for A")
            t0 = time.monotonic()
            while a.state == TRANSFER and time.monotonic() - t0 < 10:
                d.step(0.001)
            while not a.released and time.monotonic() - t0 < 40:
                d.step(0.001)  # naive: at once; timeout: ACK or deadline; kvfence: drained
            b = None
            while b is None and time.monotonic() - t0 < 40:
                b = d.admit(1)
                d.step(0.001)
            if b is None:
                raise RuntimeError("repro: B not admitted (pages held)")
            same = len(set(a.pages) & set(b.pages))
            while b.state != DONE and time.monotonic() - t0 < 40:
                d.step(0.001)
            # wait until A's rank has ACKed (its write ended), then look at the free pages
            while a.id not in d.acked and time.monotonic() - t0 < 40:
                d.step(0.005)
            t2 = time.monotonic()
            while time.monotonic() - t2 < 0.05:
                d.step(0.005)
            for p in d.free:
                if header(d.page(p))[0] != MAGIC_FREE:
                    d.m["stale_landings_on_free_pages"] += 1
                    d.m["corrupted_pages"] += 1
                    stamp(d.page(p), MAGIC_FREE, 0)
            after = (d.m["corrupted_pages"], d.m["corrupted_requests"])
            per_run.append({"run": k, "corrupted": after != before, "pages_shared": same,
                            "b_errors": b.why})
        d.shutdown()
        out = d.summary(0)
        out["runs"] = runs
        out["corrupted_runs"] = sum(r["corrupted"] for r in per_run)
        out["per_run"] = per_run
        return out
    finally:
        for p in d.procs.values():
            if p.poll() is None:
                p.kill()
