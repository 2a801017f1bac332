"""A prefill instance: its own Mooncake engine, R ranks (a worker thread and a transport
thread each), a control connection to the decode.

    python -m kvfence_e2e.prefill --inst I --ranks 0,1 --ctl PORT --session HOST:PORT --rule R

Every chunk write is guarded:
* rule kvfence: by a kvfence transfer on the rank's own *source room* (gate-mode table,
  one room per request, writer = the decode peer); ABORT_ACK is sent when that room is
  released, i.e. once every write started for it is done; a write that fails (-1: outcome
  unknown) keeps the room held, so no ACK is sent (the decode waits for a fence).
* other rules: SGLang's scheme: an outstanding counter and an aborted flag under a lock; a
  failed write counts as finished; the last finished write of an aborted request ACKs.

On a host of its own (e2e/run hosts): --ip, --ctl-host, heartbeats (--hb-ms), the session
named by the decode's WELCOME, and the graceful reset (kvfence, after a -1):
* RESET(gen, session): a standby Mooncake engine (made in the background beforehand) is
  warmed to the new session and becomes generation gen's; READY. Every request carries
  the generation the decode admitted it under (REQ gen) and each of its chunks is
  submitted on that generation's engine only: the old generation's requests go on on the
  old engine, the new ones on the new engine, never crossed;
* RETIRE(gen): the decode has torn down generation gen's transport and fenced its writer
  ids: its engine is forgotten (kept, never destroyed), its chunks not yet submitted or
  still pending are dropped, its source rooms fenced (no ACK for them: the decode
  released them itself). In the source-room tables the peer id of a room is its
  generation, so a RETIRE fences that generation's rooms only.
"""
from __future__ import annotations

import argparse
import heapq
import itertools
import os
import socket
import sys
import threading
import time

import numpy as np

from .common import Conn, fill_page

# The decode's rank id in this instance's source-room tables is the request's transport
# generation (0 until the first RESET): a RETIRE fences one generation's rooms only.
# Test-only mutation (e2e/hosts/ci.sh --mutation ack-at-reset): at a RESET the old
# generation's source rooms are given up and ACKed at once, as the abortive reset did
# before the graceful one (an ACK that does not mean "every write started has ended": the
# failed room would be released before its transport's proven teardown).
MUTATION = os.environ.get("KVFENCE_E2E_MUTATION", "")
BAD_OFFSET = 1 << 40  # a destination outside every registered buffer: Mooncake returns -1


_ENGINES = []  # every Mooncake engine this process made: kept (see make_engine)

class ReqState:
    __slots__ = ("req", "h", "chunks", "delay", "fail_chunk", "notify", "aborted",
                 "outstanding", "done", "acked", "src", "lock", "failed", "finished", "gen")

    def __init__(self, m):
        self.req, self.h = m["req"], m["h"]
        self.chunks = m["chunks"]
        self.delay = m.get("delay_ms", 0) / 1000.0
        self.fail_chunk = m.get("fail_chunk", -1)
        self.notify = m.get("notify", False)
        self.aborted = False
        self.outstanding = 0
        self.done = 0
        self.acked = False
        self.failed = False
        self.finished = False
        self.src = None
        self.lock = threading.Lock()
        self.gen = m.get("gen", 0)


class Rank:
    def __init__(self, proc, rank, ring, ring_addr, page_size):
        self.p, self.rank = proc, rank
        self.ring, self.ring_addr, self.ps = ring, ring_addr, page_size
        self.nslots = ring.size // page_size
        self.free_slots = list(range(self.nslots))
        self.slot_cv = threading.Condition()
        self.work = []  # FIFO of ReqState
        self.work_cv = threading.Condition()
        self.heap = []  # (due, seq, item) delayed submissions
        self.tx_cv = threading.Condition()
        self.seq = itertools.count()
        self.reqs = {}
        self.table = None
        if proc.rule == "kvfence":
            import kvfence
            self.kvfence = kvfence
            self.table = kvfence.RoomTable(4096, release_queue=False)
        self.stats = {"chunks_written": 0, "stale_writes_refused": 0, "writes_failed": 0,
                      "dropped_at_reset": 0}
        threading.Thread(target=self.worker, daemon=True).start()
        threading.Thread(target=self.transport, daemon=True).start()

    # ---- control (receiver thread) ----
    def on_req(self, m):
        st = ReqState(m)
        if self.table is not None:
            st.src = self.table.open([st.gen], [], token=st.req)
        self.reqs[st.req] = st
        with self.work_cv:
            self.work.append(st)
            self.work_cv.notify()

    def on_abort(self, m):
        st = self.reqs.get(m["req"])
        if st is None:
            self.send("ACK", m["req"], m["h"])
            return
        if self.table is not None:
            try:
                self.table.abort(st.src)
                self.table.quiesce(st.src, st.gen)  # the decode asked: it is told
            except self.kvfence.Error:
                pass  # source room already released (all written): ACK below
            self.deliver()
            if self.table.phase(st.src) == "free":
                with st.lock:
                    if not st.acked:
                        st.acked = True
                        self.send("ACK", st.req, st.h)
            return
        with st.lock:
            st.aborted = True
            ack = st.outstanding == 0 and not st.acked
            st.acked |= ack
        if ack:
            self.send("ACK", st.req, st.h)

    def deliver(self):
        """kvfence: act on every release of a source room, exactly once."""
        any_ = False
        for r in self.table.drain_released():
            st = self.reqs.get(r.token)
            if st is None:
                continue
            any_ = True
            if st.gen in self.p.retired:
                continue  # fenced by a RETIRE: the decode released it itself
            if r.reason == "finished":
                self.send("DONE", st.req, st.h)
            else:  # aborted: every write started for it has ended
                with st.lock:
                    if not st.acked:
                        st.acked = True
                        self.send("ACK", st.req, st.h)
        return any_

    def send(self, t, req, h, **kw):
        self.p.conn.send(t=t, req=req, h=h, rank=self.rank, **kw)

    # ---- worker: decides and starts each chunk ----
    def worker(self):
        while True:
            with self.work_cv:
                while not self.work:
                    self.work_cv.wait()
                st = self.work.pop(0)
            for i, (chunk, dst) in enumerate(st.chunks):
                gen = st.gen  # the chunk goes on its request's generation's engine only
                if self.table is not None:
                    try:
                        x = self.table.begin_transfer(st.src, peer=gen)
                    except (self.kvfence.RoomClosed, self.kvfence.StaleHandle):
                        # aborted (or aborted and already released): a stale write refused
                        self.stats["stale_writes_refused"] += len(st.chunks) - i
                        break
                else:
                    with st.lock:
                        if st.aborted:
                            self.stats["stale_writes_refused"] += len(st.chunks) - i
                            break
                        st.outstanding += 1
                    x = None
                with self.slot_cv:
                    while not self.free_slots:
                        self.slot_cv.wait()
                    slot = self.free_slots.pop()
                view = self.ring[slot * self.ps:(slot + 1) * self.ps]
                fill_page(view, st.req, chunk)  # "compute" the KV of this chunk
                if st.notify:
                    self.send("COMMIT", st.req, st.h, chunk=chunk)
                item = (st, chunk, x, slot, dst, chunk == st.fail_chunk, gen)
                with self.tx_cv:
                    heapq.heappush(self.heap, (time.monotonic() + st.delay, next(self.seq), item))
                    self.tx_cv.notify()

    # ---- transport: submits (after the throttle delay) and polls Mooncake ----
    def transport(self):
        inflight = []  # (transfer ids, item, the engine they were submitted on)
        orphans = []  # ids still pending after their chunk was reported failed
        while True:
            now = time.monotonic()
            due = []
            with self.tx_cv:
                while self.heap and self.heap[0][0] <= now:
                    due.append(heapq.heappop(self.heap)[2])
                if not due and not inflight and not orphans:
                    timeout = (self.heap[0][0] - now) if self.heap else None
                    self.tx_cv.wait(timeout)
                    continue
            for item in due:
                st, chunk, x, slot, dst, fail, gen = item
                src = self.ring_addr + slot * self.ps
                with self.p.lock:  # the transport of this chunk's generation, or none
                    ent = self.p.engines.get(gen)
                    if ent is None:
                        self.dropped(item)  # its generation was retired: never submitted
                        continue
                    eng, sess = ent
                    ids = [eng.transfer_submit_write(sess, src, dst, self.ps)]
                    if fail:  # plus a slice outside every registered buffer: it returns -1
                        ids.append(eng.transfer_submit_write(sess, src, dst + BAD_OFFSET, 4096))
                inflight.append((ids, item, eng))
            keep = []
            for ids, item, eng in inflight:
                if item[6] in self.p.retired:
                    self.dropped(item)  # on a transport the decode has torn down: forgotten
                    continue
                # (get_batch_transfer_status on several batches in flight crashes the
                # 0.3.13 wheel: single transfers + transfer_check_status are used instead)
                res = [eng.transfer_check_status(i) for i in ids]
                if any(r < 0 for r in res):
                    # the chunk failed; a sibling slice may still be landing
                    orphans.extend((i, eng) for i, r in zip(ids, res) if r == 0)
                    self.end(item, False)
                elif all(r == 1 for r in res):
                    self.end(item, True)
                else:
                    keep.append(([i for i, r in zip(ids, res) if r != 1], item, eng))
            inflight = keep
            orphans = [(i, e) for i, e in orphans if e.transfer_check_status(i) == 0]
            if inflight or orphans:
                time.sleep(0.0005)

    def dropped(self, item):
        """A chunk of a generation the decode has reset: its slot is reused (whatever the
        old transport still reads from it goes to a fenced endpoint)."""
        self.stats["dropped_at_reset"] += 1
        with self.slot_cv:
            self.free_slots.append(item[3])
            self.slot_cv.notify()

    def retire(self, gen):
        """RETIRE (the decode tore generation gen's transport down and fenced its writer
        ids): every source room of that generation is given up (fence; no ACK: deliver
        skips retired generations); gen is never used again (out of the fenced set)."""
        if self.table is not None:
            self.table.fence_rank(gen)
            self.deliver()
            self.table.readmit_rank(gen)

    def end(self, item, ok):
        st, chunk, x, slot, dst, fail, gen = item
        if ok:
            self.stats["chunks_written"] += 1
            with self.slot_cv:
                self.free_slots.append(slot)
                self.slot_cv.notify()
        else:
            self.stats["writes_failed"] += 1  # the slot is never reused: a slice may still read it
        if self.table is not None:
            try:
                if ok:
                    x.complete()
                else:
                    x.fail()  # outcome unknown: the source room stays held
            except self.kvfence.Error:
                return  # its room was fenced by a RETIRE meanwhile: nothing to report
            if not ok and not st.failed:
                st.failed = True
                self.send("FAIL", st.req, st.h)
            with st.lock:
                st.done += ok
                last = st.done == len(st.chunks)
            if last:
                try:
                    self.table.finish(st.src)
                    self.table.quiesce(st.src, st.gen)
                except self.kvfence.Error:
                    pass  # aborted meanwhile: the release says "aborted" and ACKs
            self.deliver()
            return
        with st.lock:
            st.outstanding -= 1
            st.done += 1  # SGLang: a failed transfer counts as finished
            ack = st.aborted and st.outstanding == 0 and not st.acked
            st.acked |= ack
            last = st.done == len(st.chunks) and not st.aborted
        if not ok and not st.failed:
            st.failed = True
            self.send("FAIL", st.req, st.h)
        if ack:
            self.send("ACK", st.req, st.h)
        elif last and not st.failed:
            self.send("DONE", st.req, st.h)


class Proc:
    def __init__(self, a):
        self.rule, self.inst, self.ip = a.rule, a.inst, a.ip
        self.linger = a.linger_s
        ranks = [int(r) for r in a.ranks.split(",")]
        per = a.ring * a.page_size
        self.buf = np.zeros(per * len(ranks), dtype=np.uint8)
        base = self.buf.ctypes.data
        self.lock = threading.Lock()  # guards engines / retired against submissions
        self.engines = {}  # transport generation -> (engine, session) of the decode
        self.retired = set()  # generations the decode tore down (RETIRE)
        self.spare = None  # a standby engine (ring registered), made in the background
        self.spare_cv = threading.Condition()
        self.warmed = {}  # session -> engine warmed to it (STANDBY), None while warming
        s = socket.create_connection((a.ctl_host, a.ctl))
        self.conn = Conn(s)
        self.conn.send(t="HELLO", inst=a.inst, ranks=ranks, pid=os.getpid())
        m = self.conn.recv()
        if m is None or m["t"] != "WELCOME":
            sys.exit("prefill: no WELCOME")
        self.scratch = m["scratch"]
        self.gen = m.get("gen", 0)  # the current transport generation (RESET: the next)
        session = m.get("session") or a.session
        e = self.new_engine(session)
        if e is None:
            sys.exit("prefill: Mooncake initialize / register / warm-up write failed")
        self.engines[self.gen] = (e, session)
        if a.hb_ms > 0:  # hosts mode: the graceful reset's standby engine
            threading.Thread(target=self.spare_maker, daemon=True).start()
        if a.hb_ms > 0:
            threading.Thread(target=self.heartbeat, args=(a.hb_ms / 1000.0,), daemon=True).start()
        self.ranks = {r: Rank(self, r, self.buf[i * per:(i + 1) * per], base + i * per, a.page_size)
                      for i, r in enumerate(ranks)}
        self.conn.send(t="READY", inst=a.inst)

    def make_engine(self):
        """A Mooncake engine with this instance's ring registered (None: failed)."""
        from mooncake.engine import TransferEngine
        e = TransferEngine()
        _ENGINES.append(e)  # never destroyed mid-run (its destructor holds the GIL ~1 s)
        if e.initialize(self.ip, "P2PHANDSHAKE", "tcp", "") != 0:
            return None
        if e.register_memory(self.buf.ctypes.data, self.buf.size) != 0:
            return None
        return e

    def warm(self, e, session):
        """Warms e's session to the decode (handshake) with one small write into the
        scratch page; e, or None."""
        if e is None or e.transfer_sync_write(session, self.buf.ctypes.data, self.scratch,
                                              64) != 0:
            return None
        return e

    def new_engine(self, session):
        return self.warm(self.make_engine(), session)

    def spare_maker(self):
        """Keeps one standby engine made, so that a RESET only warms it."""
        while True:
            with self.spare_cv:
                while self.spare is not None:
                    self.spare_cv.wait()
            e = self.make_engine()
            if e is None:
                return  # on_reset makes one itself
            with self.spare_cv:
                self.spare = e

    def take_spare(self):
        with self.spare_cv:
            e, self.spare = self.spare, None
            self.spare_cv.notify_all()
        return e

    def on_standby(self, m):
        """STANDBY(session): the decode reserved that session for our next transport
        generation; a standby engine is warmed to it in the background (the handshake), so
        that the RESET naming it switches at once."""
        sess = m["session"]
        with self.spare_cv:
            self.warmed[sess] = None

        def work():
            spare = self.take_spare()
            e = self.warm(spare if spare is not None else self.make_engine(), sess)
            with self.spare_cv:
                self.warmed[sess] = e if e is not None else False
                self.spare_cv.notify_all()
        threading.Thread(target=work, daemon=True).start()

    def warmed_for(self, session, timeout=5.0):
        """The engine warmed to session (waiting for a warm-up under way), or None."""
        with self.spare_cv:
            end = time.monotonic() + timeout
            while self.warmed.get(session, False) is None and time.monotonic() < end:
                self.spare_cv.wait(0.05)
            e = self.warmed.pop(session, None)
        return e or None

    def heartbeat(self, every):
        while self.conn.send(t="HB", inst=self.inst):
            time.sleep(every)

    def on_reset(self, m):
        """A write returned -1: the decode starts transport generation m["gen"] on a new
        session (its old one drains, then is torn down: RETIRE). The standby engine
        (else a new one) warmed to it becomes that generation's; the requests admitted
        from now on carry it. The old generation's engine goes on serving its own."""
        t0 = time.monotonic()
        e = self.warmed_for(m["session"])  # announced by STANDBY: already warmed
        standby = "warmed" if e is not None else None
        if e is None:
            spare = self.take_spare()
            standby = "spare" if spare is not None else "none"
            e = self.warm(spare if spare is not None else self.make_engine(), m["session"])
        engine_ms = round((time.monotonic() - t0) * 1000.0, 2)
        if e is None:
            os._exit(3)  # the decode sees the EOF and fences (a new process is spawned)
        with self.lock:
            self.engines[m["gen"]] = (e, m["session"])
            old, self.gen = self.gen, m["gen"]
        if MUTATION == "ack-at-reset":
            for r in self.ranks.values():
                if r.table is not None:
                    r.table.fence_rank(old)
                    r.deliver()
                    r.table.readmit_rank(old)
        self.conn.send(t="READY", inst=self.inst, engine_ms=engine_ms, standby=standby)

    def on_retire(self, m):
        """The decode tore generation m["gen"]'s transport down (proven) and fenced its
        writer ids: forget it (its engine kept, never destroyed while it may be in use)."""
        g = m["gen"]
        with self.lock:
            self.engines.pop(g, None)  # (the engine itself stays in _ENGINES)
            self.retired.add(g)
        for r in self.ranks.values():
            r.retire(g)

    def serve(self):
        while True:
            m = self.conn.recv()
            if m is None:
                # the decode is gone (or closed on us). On a host of its own the process
                # keeps running a while, as an engine would until its own deadline: its
                # queued writes go on being submitted and retransmitted
                time.sleep(self.linger)
                os._exit(0)
            t = m["t"]
            if t == "REQ":
                self.ranks[m["rank"]].on_req(m)
            elif t == "ABORT":
                self.ranks[m["rank"]].on_abort(m)
            elif t == "RESET":
                self.on_reset(m)
            elif t == "RETIRE":
                self.on_retire(m)
            elif t == "STANDBY":
                self.on_standby(m)
            elif t == "STOP":
                tot = {}
                for r in self.ranks.values():
                    for k, v in r.stats.items():
                        tot[k] = tot.get(k, 0) + v
                self.conn.send(t="STATS", inst=self.inst, stats=tot)
                time.sleep(0.05)
                os._exit(0)


def main():
    import faulthandler, signal
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    faulthandler.enable()
    ap = argparse.ArgumentParser()
    ap.add_argument("--inst", type=int, required=True)
    ap.add_argument("--ranks", required=True)
    ap.add_argument("--ctl", type=int, required=True)
    ap.add_argument("--session", default=None, help="(else the decode's WELCOME names it)")
    ap.add_argument("--ip", default="127.0.0.1", help="this host's address")
    ap.add_argument("--ctl-host", default="127.0.0.1", help="the decode's address")
    ap.add_argument("--hb-ms", type=float, default=0.0, help="heartbeat period (0: none)")
    ap.add_argument("--linger-s", type=float, default=0.0,
                    help="seconds to keep running after the control connection closed")
    ap.add_argument("--rule", required=True)
    ap.add_argument("--page-size", type=int, required=True)
    ap.add_argument("--ring", type=int, default=256)
    Proc(ap.parse_args()).serve()


if __name__ == "__main__":
    main()
