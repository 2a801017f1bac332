"""One SGLang PD role (prefill or decode) in its own process, driven over stdin/stdout.

Runs SGLang 0.5.23's real ``MooncakeKVManager`` / sender / receiver / bootstrap server and
``DecodeTransferQueue`` over Mooncake's TCP transport on loopback, with torch CPU tensors as
the KV cache and small fakes for the scheduler, the tree cache and ``Req`` (no GPU, no
model), as ``shared/SGLANG.md`` section 1 describes. Nothing of SGLang is patched here
except what a test harness must own:

* decode: ``decode.release_kv_cache`` (SGLang's real free point) is pointed at the
  harness's allocator, a LIFO free list, so a released page goes to the next request;
* prefill: ``MooncakeTransferEngine.batch_transfer_sync`` is wrapped to *force* the
  scenario's timing: hold a write (it still lands, later), or return -1 while the bytes
  keep going (what Mooncake does on its own wall-clock timeout); and
  ``_get_dsa_cache_transfer_skip_flags`` (called between the worker's "room Failed?" check
  and the write) to hold that window open once, so that an ABORT lands inside it.

With ``KVFENCE_SGLANG=1`` in the environment the ``kvfence_sglang.pth`` start-up hook
(or ``kvfence-sglang-run``) installs ``kvfence.sglang`` before anything here runs; the
harness itself does not know which rule it runs under.

Protocol: one JSON object per line on stdin (``{"op": ...}``), one JSON reply per line on
stdout; logs go to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch

LAYERS = int(os.environ.get("E2E_LAYERS", "4"))
ITEM = int(os.environ.get("E2E_ITEM_BYTES", "8192"))  # bytes per page per buffer
PAGES = int(os.environ.get("E2E_PAGES", "4352"))  # pages per buffer
META_SLOTS = 64
ROLE = sys.argv[1] if len(sys.argv) > 1 else "decode"


def log(*a: Any) -> None:
    print("[%s %.3f]" % (ROLE, time.time() % 1000), *a, file=sys.stderr, flush=True)


def reply(obj: Dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


# The prefill's bootstrap host (its bootstrap server and the host its ranks register
# with): 127.0.0.1 unless a scenario puts it on another loopback address, so that the
# prefill's ranks (rank_ip SGLANG_HOST_IP, Mooncake's and ZMQ's connections) reach the
# decode from an address other than the bootstrap host, as a multi-node prefill's do.
BOOTSTRAP_HOST = os.environ.get("E2E_BOOTSTRAP_HOST", "127.0.0.1")


def setup_runtime(mode: str, bootstrap_port: int, port: int):
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.server_args import ServerArgs
    from sglang.test.parallel_groups import publish

    sa = ServerArgs(
        model_path="dummy",
        disaggregation_mode=mode,
        disaggregation_transfer_backend="mooncake",
        disaggregation_bootstrap_port=bootstrap_port,
        host=BOOTSTRAP_HOST if mode == "prefill" else "127.0.0.1",
        port=port,
        device="cpu",
    )
    publish(sa, role="scheduler")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port + 7))
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    world = torch.distributed.group.WORLD
    g = SimpleNamespace(rank_in_group=0, world_size=1, cpu_group=world, device_group=world)
    get_parallel().override_permanently(pp_group=g, attn_tp_group=g, tp_group=g)
    from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import (
        init_mooncake_transfer_engine,
    )

    init_mooncake_transfer_engine(hostname="127.0.0.1", gpu_id=0, ib_device=None)
    return sa


def make_kv_args(kv: List[torch.Tensor], meta):
    from sglang.srt.disaggregation.base.conn import KVArgs

    a = KVArgs()
    a.engine_rank = 0
    a.kv_data_ptrs = [t.data_ptr() for t in kv]
    a.kv_data_lens = [t.numel() for t in kv]
    a.kv_item_lens = [ITEM for _ in kv]
    a.kv_layer_ids = []
    a.kv_cache_dtype_str = "uint8"
    a.kv_layout = None
    a.host_kv_data_ptrs = a.host_kv_data_lens = a.host_kv_item_lens = None
    a.host_state_data_ptrs = a.host_state_data_lens = a.host_state_item_lens = None
    a.aux_data_ptrs, a.aux_data_lens, a.aux_item_lens = meta.get_buf_infos()
    a.state_types = []
    a.state_data_ptrs, a.state_data_lens, a.state_item_lens = [], [], []
    a.state_layer_ids, a.state_dim_per_tensor, a.state_slice_outer_counts = [], [], []
    a.state_conv_shard_groups = []
    a.is_hybrid_mla_backend = False
    a.swa_kv_cache_layout = None
    a.ib_device = None
    a.gpu_id = 0
    a.kv_head_num = 1
    a.total_kv_head_num = 1
    a.page_size = 1
    a.system_dp_rank = 0
    a.rust_http_port = None
    a.pp_rank = 0
    a.prefill_start_layer = 0
    a.prefill_end_layer = LAYERS
    a.mla_compression_ratios = None
    a.kv_buf_groups = 1
    a.hidden_kv_layers = LAYERS
    a.draft_kv_layers = 0
    a.num_draft_entries = 0
    return a


def make_buffers():
    from sglang.srt.disaggregation.utils import MetadataBuffers

    kv = [torch.zeros(PAGES * ITEM, dtype=torch.uint8) for _ in range(2 * LAYERS)]
    meta = MetadataBuffers(META_SLOTS, hidden_size=16, hidden_states_dtype=torch.float32,
                           max_sampling_mask_tokens=1)
    return kv, meta


def fill_pages(kv: List[torch.Tensor], pages: List[int], value: int) -> None:
    # Last buffer first: Mooncake writes buffer by buffer from the first, so a late
    # write meets bytes that are already there (the race does not hide behind the fill).
    for t in reversed(kv):
        v = t.view(PAGES, ITEM)
        v[torch.tensor(pages, dtype=torch.long)] = value


def pages_hold(kv: List[torch.Tensor], pages: List[int], value: int) -> int:
    """How many of `pages` do not hold `value` in every buffer."""
    bad = set()
    idx = torch.tensor(pages, dtype=torch.long)
    for t in kv:
        v = t.view(PAGES, ITEM)[idx]
        wrong = (v != value).any(dim=1).nonzero().flatten().tolist()
        bad.update(pages[i] for i in wrong)
    return len(bad)


def kvfence_state() -> Dict[str, Any]:
    try:
        import kvfence.sglang as ks
    except Exception:
        return {"installed": False}
    return ks.snapshot()


# ----------------------------------------------------------------------------- prefill


class Prefill:
    def __init__(self, bootstrap_port: int, port: int) -> None:
        from sglang.srt.disaggregation.mooncake.conn import (
            MooncakeKVBootstrapServer,
            MooncakeKVManager,
        )
        from sglang.srt.disaggregation.utils import DisaggregationMode
        from sglang.srt.distributed.device_communicators import mooncake_transfer_engine as mte

        self.sa = setup_runtime("prefill", bootstrap_port, port)
        self.bootstrap = MooncakeKVBootstrapServer(BOOTSTRAP_HOST, bootstrap_port)
        self.kv, self.meta = make_buffers()
        self.mgr = MooncakeKVManager(make_kv_args(self.kv, self.meta), DisaggregationMode.PREFILL,
                                     self.sa, False)
        self.addr = "%s:%d" % (BOOTSTRAP_HOST, bootstrap_port)
        self.kv_base = [t.data_ptr() for t in self.kv]
        self.forced: Dict[int, Dict[str, Any]] = {}  # src page -> {"mode", "delay"}
        self.events: Dict[int, Dict[str, float]] = {}
        self.health_ok = True
        self.senders: Dict[int, Any] = {}
        orig = mte.MooncakeTransferEngine.batch_transfer_sync
        node = self

        def forced_batch_transfer_sync(eng, session_id, srcs, dsts, lens):
            plan = node._plan_for(srcs)
            if plan is None:
                return orig(eng, session_id, srcs, dsts, lens)
            room = plan["room"]
            ev = node.events.setdefault(room, {})
            ev["write_started"] = time.time()
            if plan["mode"] == "fail_inflight":
                # The write goes on the wire now; the call returns -1 at +delay while it
                # is still running (Mooncake's wall-clock timeout, batch still posted).
                def inflight() -> None:
                    rc = orig(eng, session_id, srcs, dsts, lens)
                    ev["write_landed" if rc == 0 else "write_refused"] = time.time()
                threading.Thread(target=inflight, daemon=True).start()
                time.sleep(plan["delay"])
                ev["returned_fail"] = time.time()
                return -1
            if plan["mode"] == "fail":
                def late() -> None:
                    time.sleep(plan["delay"])
                    rc = orig(eng, session_id, srcs, dsts, lens)
                    ev["write_landed" if rc == 0 else "write_refused"] = time.time()
                threading.Thread(target=late, daemon=True).start()
                ev["returned_fail"] = time.time()
                return -1
            time.sleep(plan["delay"])
            rc = orig(eng, session_id, srcs, dsts, lens)
            ev["write_landed"] = time.time()
            return rc

        mte.MooncakeTransferEngine.batch_transfer_sync = forced_batch_transfer_sync
        # A window between the worker's "room Failed?" check and the write: the worker
        # calls _get_dsa_cache_transfer_skip_flags right before send_kvcache. Held once
        # when armed (op "send" with pre_hold), so an ABORT lands inside it.
        self.pre_hold: Optional[Dict[str, Any]] = None
        orig_flags = MooncakeKVManager._get_dsa_cache_transfer_skip_flags

        def skip_flags(mgr, info):
            plan, node.pre_hold = node.pre_hold, None
            if plan is not None:
                node.events.setdefault(plan["room"], {})["write_started"] = time.time()
                time.sleep(plan["delay"])
            return orig_flags(mgr, info)

        MooncakeKVManager._get_dsa_cache_transfer_skip_flags = skip_flags
        self._patch_health()

    def _patch_health(self) -> None:
        # A live prefill whose heartbeat fails: its /health answers 503 while every other
        # part of it (ZMQ, Mooncake, workers) keeps running.
        from aiohttp import web

        srv = self.bootstrap
        node = self
        for route in list(srv.app.router.routes()):
            if getattr(route.resource, "canonical", "") == "/health":
                orig = route.handler

                async def health(request, _orig=orig):
                    if not node.health_ok:
                        return web.Response(status=503, text="forced heartbeat failure")
                    return await _orig(request)

                route._handler = health

    def _plan_for(self, srcs: List[int]) -> Optional[Dict[str, Any]]:
        if not self.forced or not srcs:
            return None
        s = srcs[0]
        for base in self.kv_base:
            if base <= s < base + PAGES * ITEM:
                page = (s - base) // ITEM
                for start, plan in self.forced.items():
                    if start <= page < start + plan["pages"]:
                        return plan
        return None

    def send(self, cmd: Dict[str, Any]) -> Dict[str, Any]:
        from sglang.srt.disaggregation.base.conn import KVPoll
        from sglang.srt.disaggregation.mooncake.conn import MooncakeKVSender

        room, n, src = cmd["room"], cmd["pages"], cmd["src_start"]
        pages = list(range(src, src + n))
        fill_pages(self.kv, pages, cmd["pattern"])
        aux = cmd.get("aux", room % META_SLOTS)
        self.meta.bootstrap_room[aux, 0] = room
        if cmd.get("mode", "none") != "none":
            self.forced[src] = {"room": room, "mode": cmd["mode"], "delay": cmd["delay"],
                                "pages": n}
        else:
            self.forced.pop(src, None)
        self.events[room] = {}
        if cmd.get("pre_hold"):
            self.pre_hold = {"room": room, "delay": cmd["pre_hold"]}
        sender = MooncakeKVSender(self.mgr, self.addr, room)
        self.senders[room] = sender
        deadline = time.time() + 20
        while sender.poll() != KVPoll.WaitingForInput:
            if time.time() > deadline:
                return {"ok": False, "error": "sender never WaitingForInput (%s)" % sender.poll()}
            time.sleep(0.002)
        sender.init(n, aux)
        chunks = cmd.get("chunks", 2)
        step = (n + chunks - 1) // chunks
        for i in range(0, n, step):
            sender.send(np.array(pages[i:i + step], dtype=np.int32))
        return {"ok": True}

    def handle(self, cmd: Dict[str, Any]) -> Dict[str, Any]:
        op = cmd["op"]
        if op == "send":
            return self.send(cmd)
        if op == "events":
            return {"ok": True, "events": self.events.get(cmd["room"], {})}
        if op == "unblacklist":
            # After a -1, SGLang blacklists the decode's Mooncake session (its failed-session
            # probe, off here, would lift it later); lift it now for the next scenario.
            for sid in list(self.mgr.failed_sessions):
                self.mgr._unblacklist_session(sid)
            return {"ok": True}
        if op == "set_flag":
            # What SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE sets at __init__.
            self.mgr.enable_deferred_decode_kv_release = bool(cmd["value"])
            return {"ok": True}
        if op == "health":
            self.health_ok = bool(cmd["ok"])
            return {"ok": True}
        if op == "clear":
            for room in cmd.get("rooms", list(self.senders)):
                s = self.senders.pop(room, None)
                self.forced = {k: v for k, v in self.forced.items() if v["room"] != room}
                if s is not None:
                    s.clear()
            return {"ok": True}
        if op == "state":
            return {"ok": True, "kvfence": kvfence_state()}
        raise ValueError("unknown op %r" % op)


# ------------------------------------------------------------------------------ decode


class Decode:
    def __init__(self, bootstrap_port: int, port: int) -> None:
        from sglang.srt.disaggregation import decode as dec
        from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager
        from sglang.srt.disaggregation.utils import (
            DisaggregationMode,
            ReqToMetadataIdxAllocator,
        )

        self.sa = setup_runtime("decode", bootstrap_port, port)
        self.kv, self.meta = make_buffers()
        self.mgr = MooncakeKVManager(make_kv_args(self.kv, self.meta), DisaggregationMode.DECODE,
                                     self.sa, False)
        self.free: List[int] = list(range(PAGES))[::-1]  # LIFO: pop() takes the last freed
        self.meta_alloc = ReqToMetadataIdxAllocator(META_SLOTS)
        node = self

        leak = os.environ.get("E2E_MUTATION") == "leak_release"

        def release_kv_cache(req, tree_cache, checkpoint=False, **kw):
            # SGLang's real free point, pointed at the harness's allocator.
            pages = getattr(req, "kv_pages", None)
            if pages and leak:
                # Test-only mutation: the pages vanish (neither freed nor held): the
                # driver's lost-pages check must see them.
                req.kv_pages = []
                req.released_at = time.time()
            elif pages:
                node.free.extend(pages)
                req.kv_pages = []
                req.released_at = time.time()

        dec.release_kv_cache = release_kv_cache
        sched = SimpleNamespace(
            spec_algorithm=None,
            enable_decode_hicache=False,
            enable_hisparse=False,
            disagg_decode_prealloc_queue=None,
            metrics_reporter=SimpleNamespace(enable_metrics=False),
            output_streamer=SimpleNamespace(stream_output=lambda reqs, logprob: None),
        )
        self.queue = dec.DecodeTransferQueue(self.meta_alloc, self.meta, sched, object())
        self.queue._clean_hicache_prefetch_resources = lambda decode_req: None
        self.dec = dec
        self.reqs: Dict[str, Any] = {}
        # Requests whose pages left SGLang without a release (kvfence quarantined them):
        # out of circulation; the harness recycles them between runs (reset_quarantined),
        # which is safe only because it knows the forced write has ended by then.
        self.quarantined: List[Any] = []

    def connect(self, addr: str) -> Dict[str, Any]:
        deadline = time.time() + 60
        while not self.mgr.try_ensure_parallel_info(addr):
            if time.time() > deadline:
                return {"ok": False, "error": "no parallel info from %s" % addr}
            time.sleep(0.2)
        return {"ok": True}

    def open(self, cmd: Dict[str, Any]) -> Dict[str, Any]:
        from sglang.srt.disaggregation.mooncake.conn import MooncakeKVReceiver

        addr, room, n, rid = cmd["addr"], cmd["room"], cmd["pages"], cmd["rid"]
        r = self.connect(addr)
        if not r["ok"]:
            return r
        if len(self.free) < n:
            return {"ok": False, "error": "decode pool exhausted (%d free)" % len(self.free)}
        pages = [self.free.pop() for _ in range(n)]
        fill_pages(self.kv, pages, 0)
        idx = self.meta_alloc.alloc()
        self.meta.clear_slot(idx)
        req = SimpleNamespace(rid=rid, bootstrap_room=room, return_logprob=False,
                              finished_reason=None, kv_pages=pages, released_at=None,
                              metadata_buffer_index=idx)
        recv = MooncakeKVReceiver(self.mgr, addr, room)
        recv.init(0)
        recv.send_metadata(np.array(pages, dtype=np.int32), idx)
        dreq = self.dec.DecodeRequest(req=req, kv_receiver=recv, metadata_buffer_index=idx)
        self.queue.add(dreq)
        self.reqs[rid] = dreq
        return {"ok": True, "pages": pages, "meta": idx}

    def wait_success(self, cmd: Dict[str, Any]) -> Dict[str, Any]:
        """The normal path: poll until Success, check every byte, release normally."""
        from sglang.srt.disaggregation.base.conn import KVPoll

        dreq = self.reqs.pop(cmd["rid"])
        deadline = time.time() + cmd.get("timeout", 20)
        st = None
        while time.time() < deadline:
            st = dreq.kv_receiver.poll()
            if st in (KVPoll.Success, KVPoll.Failed):
                break
            time.sleep(0.002)
        pages = list(dreq.req.kv_pages)
        bad = pages_hold(self.kv, pages, cmd["pattern"])
        meta_ok = int(self.meta.bootstrap_room[dreq.metadata_buffer_index, 0]) == dreq.req.bootstrap_room
        self.queue.queue = [q for q in self.queue.queue if q is not dreq]
        dreq.kv_receiver.clear()
        self.free.extend(pages)
        dreq.req.kv_pages = []
        self.meta.clear_slot(dreq.metadata_buffer_index)
        self.meta_alloc.free(dreq.metadata_buffer_index)
        return {"ok": True, "status": int(st) if st is not None else None, "bad_pages": bad,
                "meta_ok": meta_ok}

    def abort_and_reuse(self, cmd: Dict[str, Any]) -> Dict[str, Any]:
        """Abort R1 as Scheduler.abort_request does, loop the scheduler's release path
        as process_decode_queue does; pages released go to R2, which writes its own
        bytes; at the end: do R1's bytes sit on R2's pages?"""
        dreq = self.reqs.pop(cmd["rid"])
        req = dreq.req
        n = len(req.kv_pages)
        t0 = time.time()
        if cmd.get("abort", True):
            dreq.kv_receiver.abort()
        budget, r2_by = cmd["budget"], cmd.get("r2_by", cmd["budget"] / 2)
        r2_at, bad, overlap = self._race_r2([req], req, n, cmd, t0, budget, r2_by)
        held = [e[0].req.rid for e in self.queue._deferred_releases]
        in_queue = any(q is dreq for q in self.queue.queue)
        if req.released_at is None and not in_queue and req.rid not in held and req.kv_pages:
            self.quarantined.append(dreq)
        return {"ok": True, "released_after": (req.released_at - t0) if req.released_at else None,
                "r2_after": (r2_at - t0) if r2_at else None, "r2_bad_pages": bad,
                "r2_reused_r1_pages": overlap, "still_held": held,
                "in_queue": [q.req.rid for q in self.queue.queue]}

    def _race_r2(self, reqs: List[Any], watched: Any, n: int, cmd: Dict[str, Any], t0: float,
                 budget: float, r2_by: float) -> Any:
        """The release path looped as process_decode_queue does, until ``budget``: from
        ``r2_by`` on (or once ``watched`` is released), request R2 takes ``n`` free pages and
        writes its own bytes. Returns when R2 started (or None), how many of its pages no
        longer hold its bytes, and how many of them were R1's."""
        r2: Optional[List[int]] = None
        r2_at = None
        while time.time() - t0 < budget:
            self.queue.resolve_deferred_releases()
            self.queue.pop_transferred(rids_to_check=[r.rid for r in reqs])
            if r2 is None and (watched.released_at is not None or time.time() - t0 >= r2_by):
                if len(self.free) >= n:
                    r2 = [self.free.pop() for _ in range(n)]
                    fill_pages(self.kv, r2, cmd["r2_pattern"])
                    r2_at = time.time()
            time.sleep(0.001)
        bad = pages_hold(self.kv, r2, cmd["r2_pattern"]) if r2 else 0
        overlap = len(set(r2 or []) & set(cmd.get("r1_pages", [])))
        if r2:
            self.free.extend(r2)
        return r2_at, bad, overlap

    def abort_shared_room(self, cmd: Dict[str, Any]) -> Dict[str, Any]:
        """Two requests A and B on one bootstrap_room (a retry of A to another prefill
        would reuse it): both aborted as Scheduler.abort_request does, A first; then B's
        writer ACKs B's own ABORT at once (what another prefill, with nothing of B in
        flight, does: delivered through SGLang's real handle_abort_ack_message, as the
        decode thread receives it), while A's write is still in flight. The release path
        loops as process_decode_queue does; from ``r2_by`` on (or once A is released),
        R2 takes as many pages as A and B hold together and writes its own bytes: do A's
        bytes land on R2's pages?"""
        from sglang.srt.disaggregation.common.conn import AbortAck

        a, b = self.reqs.pop(cmd["rid_a"]), self.reqs.pop(cmd["rid_b"])
        n = len(a.req.kv_pages) + len(b.req.kv_pages)
        t0 = time.time()
        a.kv_receiver.abort()
        b.kv_receiver.abort()
        rb = b.kv_receiver
        self.mgr.handle_abort_ack_message(
            AbortAck(rb.bootstrap_room, 0, rb._abort_generation).to_zmq())
        budget, r2_by = cmd["budget"], cmd["r2_by"]
        r2_at, bad, overlap = self._race_r2([a.req, b.req], a.req, n, cmd, t0, budget, r2_by)
        held = [e[0].req.rid for e in self.queue._deferred_releases]
        for d in (a, b):
            in_queue = any(q is d for q in self.queue.queue)
            if d.req.released_at is None and not in_queue and d.req.rid not in held \
                    and d.req.kv_pages:
                self.quarantined.append(d)
        return {"ok": True,
                "released_after": (a.req.released_at - t0) if a.req.released_at else None,
                "b_released_after": (b.req.released_at - t0) if b.req.released_at else None,
                "r2_after": (r2_at - t0) if r2_at else None, "r2_bad_pages": bad,
                "r2_reused_r1_pages": overlap, "still_held": held}

    def settle(self, cmd: Dict[str, Any]) -> Dict[str, Any]:
        """Run the release path for a while (what the scheduler loop does when idle)."""
        t0 = time.time()
        while time.time() - t0 < cmd.get("seconds", 0.5):
            self.queue.resolve_deferred_releases()
            self.queue.pop_transferred(rids_to_check=[])
            time.sleep(0.002)
        return self.state()

    def state(self) -> Dict[str, Any]:
        return {"ok": True, "free": len(self.free), "total": PAGES,
                "held": [e[0].req.rid for e in self.queue._deferred_releases],
                "held_pages": sum(len(e[0].req.kv_pages) for e in self.queue._deferred_releases),
                "queue": [q.req.rid for q in self.queue.queue],
                "meta_free": self.meta_alloc.available_size(),
                "quarantined_kv_pages": sum(len(d.req.kv_pages) for d in self.quarantined),
                "kvfence": kvfence_state()}

    def handle(self, cmd: Dict[str, Any]) -> Dict[str, Any]:
        op = cmd["op"]
        if op == "connect":
            return self.connect(cmd["addr"])
        if op == "open":
            return self.open(cmd)
        if op == "wait_success":
            return self.wait_success(cmd)
        if op == "abort_and_reuse":
            return self.abort_and_reuse(cmd)
        if op == "abort_shared_room":
            return self.abort_shared_room(cmd)
        if op == "settle":
            return self.settle(cmd)
        if op == "state":
            return self.state()
        if op == "reset_quarantined":
            for d in self.quarantined:
                self.free.extend(d.req.kv_pages)
                d.req.kv_pages = []
                self.meta.clear_slot(d.metadata_buffer_index)
                self.meta_alloc.free(d.metadata_buffer_index)
            self.quarantined = []
            return {"ok": True}
        if op == "set":
            # Scenario knobs, set the way SGLang reads them (attributes of the queue
            # and manager that __init__ fills from the environment).
            for k, v in cmd["queue"].items():
                setattr(self.queue, k, v)
            for k, v in cmd.get("mgr", {}).items():
                setattr(self.mgr, k, v)
            return {"ok": True}
        raise ValueError("unknown op %r" % op)


def main() -> None:
    bootstrap_port, port = int(sys.argv[2]), int(sys.argv[3])
    t0 = time.time()
    node = Prefill(bootstrap_port, port) if ROLE == "prefill" else Decode(bootstrap_port, port)
    reply({"ready": True, "role": ROLE, "pid": os.getpid(), "start_s": time.time() - t0,
           "kvfence": kvfence_state()})
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            cmd = json.loads(line)
            if cmd.get("op") == "exit":
                reply({"ok": True})
                break
            out = node.handle(cmd)
        except Exception as e:  # a harness error is reported, never hidden
            out = {"ok": False, "error": "%s: %s" % (type(e).__name__, e),
                   "trace": traceback.format_exc()}
        reply(out)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
