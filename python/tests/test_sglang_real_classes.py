"""kvfence.sglang on SGLang 0.5.23's real classes (issue 38): ``MooncakeKVManager``,
``MooncakeKVReceiver``, ``DecodeTransferQueue`` and ``CommonKVSender``, built as SGLang's own
unit tests build them (``__new__`` plus the fields their methods read; no ZMQ, network or
allocator: ABORTs go to a capturing socket, ``release_kv_cache`` records what it frees).
SGLang's own methods run (``send_metadata``, ``abort``, ``pop_transferred``,
``handle_abort_ack_message``, ``resolve_deferred_releases``, ``_do_release``,
``_handle_node_failure``, ``release_memory_occupation``, the prefill scheduler's
``release_aborted_prefill_waiting_req``), with kvfence's wrappers installed.

Every test that checks kvfence also checks that kvfence ran (the gate it attached, the
rooms it opened), so that a test cannot pass on a wrapper that was skipped. Skipped
without SGLang (e2e/sglang/ci.sh runs it in the SGLang environment).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any, Dict, Iterator, List, Optional

import pytest

pytest.importorskip("sglang.srt.disaggregation.mooncake.conn")

import numpy as np  # noqa: E402
import torch.distributed as dist  # noqa: E402
from sglang.srt.disaggregation import decode as dec  # noqa: E402
from sglang.srt.disaggregation.base.conn import KVPoll  # noqa: E402
from sglang.srt.disaggregation.common.conn import (  # noqa: E402
    ABORT_ACK_TAG,
    ABORT_TAG,
    AbortAck,
    AbortNotification,
    CommonKVSender,
)
from sglang.srt.disaggregation.mooncake.conn import (  # noqa: E402
    MooncakeKVManager,
    MooncakeKVReceiver,
)

import kvfence.sglang as ks  # noqa: E402
from kvfence.sglang import _state, metrics  # noqa: E402
from kvfence.sglang import decode as kdec  # noqa: E402
from kvfence.sglang import prefill as kpre  # noqa: E402

PREFILL = "127.0.0.1:8998"


@pytest.fixture(scope="module", autouse=True)
def _installed() -> Iterator[None]:
    """kvfence installed for the module (uninstalled after, whatever a failed test left
    held), and a world-size-1 gloo group (SGLang's MIN reduction reads it)."""
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        dist.init_process_group("gloo", rank=0, world_size=1)
    was = ks.installed()
    if not was:
        ks.install()
    yield
    if not was and ks.installed():
        ks.uninstall(force=True)


@pytest.fixture(autouse=True)
def _freed(monkeypatch: pytest.MonkeyPatch) -> List[Any]:
    """What SGLang's release path frees (``release_kv_cache``, the real free point).
    (Also: kvfence installed, whatever an earlier test left.)"""
    if not ks.installed():
        ks.install()
    freed: List[Any] = []
    monkeypatch.setattr(dec, "release_kv_cache",
                        lambda req, tree_cache, **kw: freed.append(req.rid))
    monkeypatch.setattr(dec, "prepare_abort", lambda *a, **kw: None)
    return freed


class _Sock:
    """A prefill rank's ZMQ socket as the receiver sees it: captures the ABORTs."""

    def __init__(self) -> None:
        self.sent: List[AbortNotification] = []
        self.messages = 0  # every message (metadata included)

    def send_multipart(self, frames: List[bytes]) -> None:
        self.messages += 1
        n = AbortNotification.from_zmq(frames) if frames[0] == ABORT_TAG else None
        if n is not None:
            self.sent.append(n)


class Decode:
    """One decode scheduler's objects: a MooncakeKVManager, its DecodeTransferQueue and
    receivers, built as SGLang's unit tests build them. ``gate``: attach kvfence's gate
    as the wrapped ``__init__`` does (``decode.attach``)."""

    def __init__(self, gate: bool = True, prefill: str = PREFILL,
                 rank_ip: str = "127.0.0.1", rank_port: int = 7000) -> None:
        mgr = MooncakeKVManager.__new__(MooncakeKVManager)
        mgr._deferred_abort_ack_tracker = {}
        mgr._deferred_abort_generation = 0
        mgr.enable_deferred_decode_kv_release = True
        mgr.failure_lock = threading.Lock()
        mgr.failure_records = {}
        mgr.request_status = {}
        mgr.local_ip, mgr.rank_port = "127.0.0.1", 5000
        mgr.deferred_bootstrap = None
        mgr.defer_decode_allocation = False
        mgr.addr_to_rooms_tracker = {prefill: set()}
        mgr.required_prefill_response_num_table = {}
        mgr.prefill_response_tracker = {}
        mgr.enable_staging = False
        mgr.engine = SimpleNamespace(get_session_id=lambda: "127.0.0.1:17000")
        mgr.connection_lock = threading.Lock()
        mgr.connection_pool = {}
        mgr.prefill_info_table = {}
        mgr.heartbeat_failures = {}
        self.mgr = mgr
        if not gate:
            # A manager kvfence does not gate (as one SGLang's __init__ built before
            # install(), or another backend's): what kvfence's lazy attachment gives it.
            mgr._kvfence_gate = None
        self.gate: Optional[kdec.DecodeGate] = kdec.attach(mgr) if gate else None
        q = dec.DecodeTransferQueue.__new__(dec.DecodeTransferQueue)
        q._deferred_releases = []
        q.deferred_kv_release_timeout = 30.0
        q.enable_host_receive = False
        q.enable_staging = False
        q.staging_handler = None
        q.enable_deferred_kv_release = True
        q.tree_cache = object()
        q.gloo_group = None
        q.tp_rank = 0
        q.queue = []
        # (0.5.23 clears a slot with clear_slot, 0.5.22 writes bootstrap_room[idx] = 0)
        q.metadata_buffers = SimpleNamespace(clear_slot=lambda idx: None, bootstrap_room={})
        q.req_to_metadata_buffer_idx_allocator = SimpleNamespace(free=lambda idx: None)
        q.scheduler = SimpleNamespace(
            enable_decode_hicache=False, enable_hisparse=False,
            output_streamer=SimpleNamespace(stream_output=lambda reqs, logprob: None),
            metrics_reporter=SimpleNamespace(enable_metrics=False))
        q._clean_hicache_prefetch_resources = lambda decode_req: None
        self.q = q
        self.sock = _Sock()
        self.prefill, self.rank_ip, self.rank_port = prefill, rank_ip, rank_port
        self.info = SimpleNamespace(pp_size=1, attn_cp_size=1)
        self.n = 0

    def request(self, room: int, rid: str) -> Any:
        """A request whose metadata went out (SGLang's send_metadata, kvfence's wrapper
        around it) to prefill rank 0 of ``self.prefill``."""
        r = MooncakeKVReceiver.__new__(MooncakeKVReceiver)
        r.kv_mgr, r.bootstrap_room, r.bootstrap_addr = self.mgr, room, self.prefill
        r.prefill_info = self.info
        r.target_tp_ranks, r.target_cp_ranks, r.target_pp_ranks = [0], [0], [0]
        r.bootstrap_infos = [{"rank_ip": self.rank_ip, "rank_port": self.rank_port,
                              "is_dummy": False}]
        r.init_time, r.abort_notified, r.conclude_state = 1.0, False, None
        r._abort_generation, r._owns_bootstrap_room = None, True
        r.required_dst_info_num = 1
        r.session_id = "127.0.0.1:17000"  # (0.5.22's send_metadata reads it)
        lock = threading.Lock()
        r._connect_to_bootstrap_server = lambda bi: (self.sock, lock)
        self.mgr.request_status[room] = KVPoll.WaitingForInput
        self.mgr.addr_to_rooms_tracker.setdefault(self.prefill, set()).add(room)
        r.send_metadata(np.arange(16, dtype=np.int32) + 16 * self.n, self.n % 64, None)
        self.n += 1
        return dec.DecodeRequest(
            req=SimpleNamespace(rid=rid, bootstrap_room=room, return_logprob=False,
                                finished_reason=None),
            kv_receiver=r, metadata_buffer_index=self.n % 64)

    def abort_and_hold(self, reqs: List[Any]) -> None:
        """Each request aborted as Scheduler.abort_request does, then its Failed poll
        held by SGLang's pop_transferred (as process_decode_queue does)."""
        for d in reqs:
            d.kv_receiver.abort()
        self.q.queue = list(reqs)
        self.q._poll_with_metadata_gate = lambda: [KVPoll.Failed] * len(reqs)
        self.q.pop_transferred()

    def ack(self, d: Any, rank: int = 0) -> None:
        """The prefill rank's ABORT_ACK for ``d``'s ABORT (its own generation), as the
        decode thread receives it."""
        r = d.kv_receiver
        self.mgr.handle_abort_ack_message(
            AbortAck(r.bootstrap_room, rank, r._abort_generation).to_zmq())

    def held(self) -> List[str]:
        return [e[0].req.rid for e in self.q._deferred_releases]


def _min_with_a_peer_rank(monkeypatch: pytest.MonkeyPatch, q: Any) -> None:
    """Attention TP 2, as SGLang's own tests simulate it: ``all_reduce_flags`` MIN-reduces
    this rank's flags with a peer rank whose every entry is ready (its writers ACKed)."""
    peer = object()
    q.gloo_group = peer
    real = dist.get_world_size
    monkeypatch.setattr(dist, "get_world_size",
                        lambda group=None: 2 if group is peer else real(group))
    # (SGLang 0.5.22 reduces no device entry across ranks: it has no all_reduce_flags)
    monkeypatch.setattr(dec, "all_reduce_flags",
                        lambda flags, group, op: [min(int(f), 1) for f in flags],
                        raising=False)


# -- item 2: decisions per held request, never per bootstrap_room -------------------------


@pytest.mark.parametrize("shape", ["tp1", "tp2", "two_gates"])
def test_two_held_requests_of_one_room_are_released_each_on_its_own_acks(
        monkeypatch: pytest.MonkeyPatch, _freed: List[str], shape: str) -> None:
    """Requests A and B share bootstrap_room R (a retry to another prefill), both aborted
    and held. B's writer ACKs: B is released, A stays held (its writer never ACKed: it may
    still be writing). Then A's writer ACKs: A is released too (not held for good).
    ``tp2``: SGLang's MIN reduction over attention TP 2; ``two_gates``: a second gated
    manager in the process. Before issue 38 the decision was read through R (the latest
    request opened with it): A was freed on B's ACK (tp2, two_gates) or held for good
    (tp1)."""
    d = Decode()
    if shape == "tp2":
        _min_with_a_peer_rank(monkeypatch, d.q)
    other = Decode() if shape == "two_gates" else None
    a, b = d.request(42, "A"), d.request(42, "B")
    d.abort_and_hold([a, b])
    assert d.gate is not None and len(d.gate.records) == 2  # kvfence opened both rooms
    assert d.held() == ["A", "B"]
    d.q.resolve_deferred_releases()
    assert d.held() == ["A", "B"] and _freed == []
    d.ack(b)
    d.q.resolve_deferred_releases()
    assert _freed == ["B"], "A freed on B's ACK: %s" % _freed
    assert d.held() == ["A"]
    d.ack(a)
    d.q.resolve_deferred_releases()
    assert _freed == ["B", "A"], "A held after its own writer ACKed: %s" % _freed
    assert not d.held() and not d.gate.records and not d.gate.room_handles
    assert other is not None or shape != "two_gates"


def test_stock_sglang_frees_a_request_on_the_acks_of_another_of_its_room(
        monkeypatch: pytest.MonkeyPatch, _freed: List[str]) -> None:
    """What SGLang 0.5.23 does itself (kvfence uninstalled): its ACK tracker is keyed by bootstrap_room, so B's ABORT re-arms
    R with B's generation and A's entry is answered with B's ACKs: A is freed while A's
    writer never ACKed, at attention TP 2 (MIN reduction) as at TP 1. Recorded in
    docs/sglang-upstream.md."""
    ks.uninstall()  # SGLang as shipped (nothing of kvfence held here)
    try:
        _stock_frees_early(monkeypatch, _freed)
    finally:
        ks.install()


def _stock_frees_early(monkeypatch: pytest.MonkeyPatch, _freed: List[str]) -> None:
    for tp2 in (False, True):
        _freed.clear()
        d = Decode(gate=False)
        if tp2:
            _min_with_a_peer_rank(monkeypatch, d.q)
        a, b = d.request(43, "A"), d.request(43, "B")
        d.abort_and_hold([a, b])
        assert [n.generation for n in d.sock.sent] == [1, 2]  # SGLang's own generations
        d.q.resolve_deferred_releases()
        assert _freed == []
        d.ack(b)  # only B's writer ACKs
        d.q.resolve_deferred_releases()
        assert sorted(_freed) == ["A", "B"], _freed  # A freed early: stock's race


# -- item 1: the teardown proof covers every address the instance's writers use ----------


def _refusing_port(host: str) -> int:
    s = socket.socket()
    s.bind((host, 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def test_a_writer_connected_from_its_own_rank_ip_blocks_the_fence(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefill whose rank registered rank_ip 127.0.0.2 (bootstrap host 127.0.0.1)
    pushes 64 KiB into the decode's listener and is killed -9: its socket stays in
    CLOSE_WAIT with unread bytes (Mooncake may still copy them into the pages). The
    heartbeat failure (SGLang's real _handle_node_failure) must not fence the rank while
    that socket is open; once it is closed, the rank is fenced and the held room
    released. Before issue 38 the proof counted sockets from the bootstrap host only and
    fenced at once."""
    monkeypatch.setattr(_state, "config", ks.Config(teardown_poll=0.02))
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    lport = srv.getsockname()[1]
    bport = _refusing_port("127.0.0.1")
    rport = _refusing_port("127.0.0.2")
    addr = "127.0.0.1:%d" % bport
    d = Decode(prefill=addr, rank_ip="127.0.0.2", rank_port=rport)
    d.mgr.connection_pool[addr + "_0_0"] = [{"rank_ip": "127.0.0.2", "rank_port": rport}]
    d.mgr.prefill_info_table[addr] = d.info
    peer = subprocess.Popen(
        [sys.executable, "-c",
         "import socket,sys,time;s=socket.socket();s.bind(('127.0.0.2',0));"
         "s.connect(('127.0.0.1',%d));s.sendall(b'x'*65536);"
         "sys.stdout.write('x');sys.stdout.flush();time.sleep(60)" % lport],
        stdout=subprocess.PIPE)
    acc, (src, _) = srv.accept()
    try:
        assert src == "127.0.0.2"
        assert peer.stdout is not None and peer.stdout.read(1) == b"x"
        a = d.request(44, "A")
        d.abort_and_hold([a])
        assert d.gate is not None and len(d.gate.records) == 1
        os.kill(peer.pid, signal.SIGKILL)
        peer.wait()
        d.mgr._handle_node_failure(addr)
        time.sleep(0.5)  # 25 polls
        d.q.resolve_deferred_releases()
        assert d.gate.fenced_ranks == 0, "fenced with a socket from the rank's address open"
        assert d.held() == ["A"]
    finally:
        acc.close()
        srv.close()
        if peer.poll() is None:
            peer.kill()
    deadline = time.monotonic() + 10
    while d.gate.fenced_ranks == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert d.gate.fenced_ranks == 1
    d.q.resolve_deferred_releases()
    assert not d.held()


# -- item 3: fence_prefill after the heartbeat retired the ranks --------------------------


@contextlib.contextmanager
def _declared_dead_unproven(monkeypatch: pytest.MonkeyPatch, room: int
                            ) -> Iterator[Any]:
    """A decode whose prefill (a listening socket stands for its bootstrap endpoint, so
    the teardown can never be proven) served request "A" (``room``), which was aborted
    and held; then the heartbeat declared that prefill dead. Yields ``(decode, the
    prefill's address)``."""
    monkeypatch.setattr(_state, "config", ks.Config(teardown_poll=0.02))
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    addr = "127.0.0.1:%d" % srv.getsockname()[1]
    try:
        d = Decode(prefill=addr)
        d.abort_and_hold([d.request(room, "A")])
        assert d.gate is not None and len(d.gate.records) == 1
        d.mgr._handle_node_failure(addr)  # ranks retired, no proof
        time.sleep(0.2)
        yield d, addr
    finally:
        srv.close()


def test_fence_prefill_fences_ranks_the_heartbeat_retired(
        monkeypatch: pytest.MonkeyPatch, _freed: List[str]) -> None:
    """The heartbeat declares a prefill dead whose host cannot be proven torn down (here:
    its bootstrap endpoint still accepts, as a powered-off host's would time out): the
    room stays held. The operator's documented fix, fence_prefill(addr), must fence the
    ranks the heartbeat retired and release the room. Before issue 38 it returned 0."""
    with _declared_dead_unproven(monkeypatch, 45) as (d, addr):
        d.q.resolve_deferred_releases()
        assert d.held() == ["A"] and d.gate.fenced_ranks == 0
        assert ks.fence_prefill(addr) == 1
        d.q.resolve_deferred_releases()
        assert _freed == ["A"] and d.gate.fenced_ranks == 1
        assert not d.gate.unfenced(addr)


def test_fence_prefill_of_a_restarted_prefill_fences_only_the_old_instance(
        monkeypatch: pytest.MonkeyPatch, _freed: List[str]) -> None:
    """A prefill killed and restarted on the same address before its old transport was
    proven torn down (its endpoint accepts again: here the listening socket stands for
    the new instance): the old instance's room stays held. ``fence_prefill(addr,
    current=False)`` fences the ranks the heartbeat retired, not the new instance's: a
    request the new instance serves, aborted and held, stays held (its writer is live);
    the default (``current=True``) would have fenced it too."""
    with _declared_dead_unproven(monkeypatch, 47) as (d, addr):
        b = d.request(48, "B")  # the restarted instance: new kvfence ids
        d.abort_and_hold([b])
        d.q.resolve_deferred_releases()
        assert sorted(d.held()) == ["A", "B"]
        assert ks.fence_prefill(addr, "restarted", current=False) == 1
        d.q.resolve_deferred_releases()
        assert _freed == ["A"] and d.held() == ["B"]
        # (the default fences the current instance too: B released, nothing left held
        # for the tests after this one)
        assert ks.fence_prefill(addr, "cut off") == 1
        d.q.resolve_deferred_releases()
        assert _freed == ["A", "B"] and not d.held()


# -- item 5: uninstall never strands held rooms --------------------------------------------


def test_uninstall_refuses_while_requests_are_held(_freed: List[str]) -> None:
    """A held request's pages can only be released by kvfence (SGLang has no ACK state
    for it and its deadline is infinite): uninstall() refuses, naming it, and changes
    nothing; once released, it uninstalls. Before issue 38 it uninstalled and stranded
    the pages."""
    d = Decode()
    a = d.request(46, "A")
    d.abort_and_hold([a])
    assert d.gate is not None and len(d.gate.records) == 1
    with pytest.raises(RuntimeError, match=r"46 \(held\)"):
        ks.uninstall()
    assert ks.installed()
    d.ack(a)
    d.q.resolve_deferred_releases()
    assert _freed == ["A"]
    assert ks.held_requests() == []
    ks.uninstall()
    try:
        assert not ks.installed()
    finally:
        ks.install()


# -- item 7: a queue with no gate is exactly stock -----------------------------------------


def test_a_manager_without_a_gate_is_stock(_freed: List[str]) -> None:
    """A manager kvfence did not gate (built before install, or another backend's): its
    queue keeps SGLang's legacy mode (freed at once, nothing held) and, with deferral on,
    SGLang's deadline. Before issue 38 every queue was forced to defer and every deadline
    made infinite."""
    d = Decode(gate=False)
    d.q.enable_deferred_kv_release = False
    d.mgr.enable_deferred_decode_kv_release = False
    a = d.request(47, "A")
    d.abort_and_hold([a])
    assert _freed == ["A"] and not d.held()
    assert d.q.enable_deferred_kv_release is False
    d2 = Decode(gate=False)
    d2.q.deferred_kv_release_timeout = 0.0  # SGLang's deadline, already passed
    b = d2.request(48, "B")
    d2.abort_and_hold([b])
    assert d2.held() == ["B"]
    d2.q.resolve_deferred_releases()
    assert _freed == ["A", "B"], "the ungated entry's deadline was changed"
    # ... while a gated manager's queue in the same process never releases on time
    g = Decode()
    g.q.deferred_kv_release_timeout = 0.0
    c = g.request(49, "C")
    g.abort_and_hold([c])
    g.q.resolve_deferred_releases()
    assert g.held() == ["C"] and g.gate is not None and len(g.gate.records) == 1
    g.ack(c)
    g.q.resolve_deferred_releases()
    assert _freed == ["A", "B", "C"]


# -- item 8: release_memory_occupation -----------------------------------------------------


def test_release_memory_occupation_ends_what_kvfence_counts_as_held(
        _freed: List[str]) -> None:
    """SGLang's release_memory_occupation drops its held list without freeing (the pool
    is torn down): kvfence must not count those requests as held any more (metrics,
    held_requests), and forgets each when its room is released. Before issue 38
    kvfence_sglang_held_rooms stayed up for ever."""
    d = Decode()
    a, b = d.request(50, "A"), d.request(51, "B")
    d.abort_and_hold([a, b])
    assert d.gate is not None and len(d.gate.records) == 2
    before = metrics.values()["held_rooms"]
    d.q.release_memory_occupation()
    assert not d.held()
    assert metrics.values()["held_rooms"] == before - 2
    assert [r for r, _ in ks.held_requests() if r in (50, 51)] == []
    assert d.gate.dropped_rooms == 2
    d.ack(a)
    d.ack(b)
    d.q.resolve_deferred_releases()  # nothing held: drains nothing (idle)
    d.gate.drain()
    assert not d.gate.records and not d.gate.decided and not d.gate.dropped
    assert _freed == []  # SGLang dropped them; nothing freed twice


# -- item 4: prefill rooms of waiting-queue aborts, and a full table -------------------------


class _Sender(CommonKVSender):  # type: ignore[misc]
    """SGLang's CommonKVSender (abstract in 0.5.22: its poll and failure_exception are the
    backend's), every method kvfence wraps inherited."""

    def poll(self) -> Any:  # pragma: no cover - not called
        raise NotImplementedError

    def failure_exception(self) -> Any:  # pragma: no cover - not called
        raise NotImplementedError


class Prefill:
    """A prefill MooncakeKVManager built with ``__new__`` (what its sender, abort and ACK
    methods read), with kvfence's gate attached as the wrapped ``__init__`` does."""

    def __init__(self) -> None:
        mgr = MooncakeKVManager.__new__(MooncakeKVManager)
        mgr.request_status = {}
        mgr.failure_records = {}
        mgr.failure_lock = threading.Lock()
        mgr._deferred_ack_targets = {}
        mgr._deferred_ack_poisoned_rooms = set()
        mgr._staging_outstanding = {}
        mgr.deferred_bootstrap = None
        mgr.enable_deferred_decode_kv_release = True
        self.mgr = mgr
        self.gate = kpre.attach(mgr)

    def sender(self, room: int) -> Any:
        """A sender as the scheduler's bootstrap queue makes one (its room opened by the
        wrapped ``__init__``: kvfence's step of it, as SGLang's __init__ needs a
        published runtime context)."""
        s = _Sender.__new__(_Sender)
        s.kv_mgr, s.bootstrap_room, s.conclude_state = self.mgr, room, None
        s._owns_bootstrap_room = True
        s.trace_ctx = SimpleNamespace(abort=lambda **kw: None, trace_req_finish=lambda: None)
        self.mgr.request_status[room] = KVPoll.WaitingForInput
        kpre._sender_init(lambda *a, **kw: None)(s, self.mgr, PREFILL, room)
        return s


def test_waiting_queue_aborts_give_their_prefill_rooms_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's release_aborted_prefill_waiting_req calls sender.abort() and never
    clear(): with 4 rooms, 10 such aborts must still leave a room for every next
    request. Before issue 38 the 5th request found the table full."""
    from sglang.srt.disaggregation.prefill import SchedulerDisaggregationPrefillMixin

    monkeypatch.setattr(_state, "config", ks.Config(rooms=4))
    p = Prefill()
    sched = SimpleNamespace(clear_pending_chunk_send=lambda req: None,
                            req_to_metadata_buffer_idx_allocator=None, tree_cache=None)
    for i in range(10):
        s = p.sender(900 + i)
        h = p.gate.room_handle.get(900 + i)
        assert h is not None and h != getattr(p.gate, "refuse_handle", None), \
            "request %d found no room" % i
        req = SimpleNamespace(disagg_kv_sender=s, metadata_buffer_index=-1,
                              kv=SimpleNamespace(holds_kv=False, holds_mamba=False),
                              pending_bootstrap=True)
        SchedulerDisaggregationPrefillMixin.release_aborted_prefill_waiting_req(sched, req)
        assert p.mgr.request_status[900 + i] == KVPoll.Failed
    assert p.gate.table.stats()["rooms_owned"] == 0


def test_a_full_prefill_table_fails_the_request_and_refuses_its_chunks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With every room in use, a new request is failed (SGLang's failure path) and its
    room mapped so that the worker's queue refuses its chunks: never written ungated.
    Before issue 38 the request went on and every chunk of it ran with no transfer."""
    from sglang.srt.disaggregation.common.utils import FastQueue, TransferKVChunk

    import kvfence

    monkeypatch.setattr(_state, "config", ks.Config(rooms=2))
    p = Prefill()
    p.sender(1), p.sender(2)
    s3 = p.sender(3)
    assert p.mgr.request_status[3] == KVPoll.Failed and s3.conclude_state == KVPoll.Failed
    assert p.gate.refused_rooms == 1 and "no prefill room free" in p.mgr.failure_records[3]
    q = kvfence.TransferQueue(FastQueue(), "room")
    kpre._bind(q, p.gate, p.mgr)
    q.queue.put(TransferKVChunk(room=3, prefill_kv_indices=np.arange(4, dtype=np.int32),
                                index_slice=slice(0, 4), is_last_chunk=True,
                                prefill_aux_index=None, state_indices=None))
    assert q.get().room == 3
    assert q.current is None and q.refused == 1


# -- the heartbeat thread's writer_cache cleanup vs the scheduler's lookups (item 10) -----


def test_retire_racing_writers_of_raises_nothing() -> None:
    """writers_of (scheduler thread, on a re-bootstrapped instance) drops the instance's
    stale writer_cache entries while retire (heartbeat thread) pops them: the race is
    forced here (retire runs between writers_of's snapshot of the cache and its
    removal); no KeyError may come out of send_metadata. Before issue 38 it did."""
    d = Decode()
    assert d.gate is not None
    gate = d.gate
    d.request(10_000, "r0")  # the instance's writer set, cached
    raced: List[bool] = []

    class _Racing(dict):  # type: ignore[type-arg]
        def items(self) -> Any:
            out = list(super().items())
            if not raced:
                raced.append(True)
                gate.retire(PREFILL)  # the heartbeat thread, at the worst moment
            return out

    gate.writer_cache = _Racing(gate.writer_cache)
    d.info = SimpleNamespace(pp_size=1, attn_cp_size=1)  # the instance re-bootstrapped
    d.request(10_001, "r1")
    assert raced


# -- item 6: a prefill that sends generation-less ACKs is refused loudly --------------------


@pytest.mark.parametrize("frames", [3, 2])
def test_a_generation_less_ack_refuses_its_prefill_loudly(
        caplog: pytest.LogCaptureFixture, frames: int) -> None:
    """A prefill with SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=0 (or an SGLang
    without generation-tagged ACKs) ACKs with no generation: such an ACK can never release
    a kvfence room, so every abort behind it would be held for good. On the first one,
    every later request to that prefill is refused at send_metadata (it fails, nothing is
    sent), with the fix in the log and in the request's failure. Before issue 38 the
    requests kept going to it. (``frames`` 2: ``[ABORT_ACK, room]``, what SGLang's newer
    prefills send with deferred release off.)"""
    d = Decode()
    a = d.request(60, "A")
    d.abort_and_hold([a])
    assert d.gate is not None and len(d.gate.records) == 1
    with caplog.at_level("ERROR", logger="kvfence.sglang"):
        d.mgr.handle_abort_ack_message([ABORT_ACK_TAG, b"60", b"0"][:frames])
    d.q.resolve_deferred_releases()
    assert d.held() == ["A"]  # never released on a legacy ACK
    sent = d.sock.messages
    b = d.request(61, "B")
    assert d.mgr.request_status[61] == KVPoll.Failed, "request sent to a legacy prefill"
    assert d.sock.messages == sent  # nothing sent
    assert "DEFERRED_DECODE_KV_RELEASE" in d.mgr.failure_records[61]
    assert any("DEFERRED_DECODE_KV_RELEASE" in r.getMessage() for r in caplog.records)
    assert b.kv_receiver is not None
    d.ack(a)  # the room's own, generation-tagged ACK still releases it
    d.q.resolve_deferred_releases()
    assert not d.held()


# -- item 10: a subclass of the Mooncake manager (Ascend's) is not gated ---------------------


def test_a_subclass_of_the_mooncake_manager_stays_stock() -> None:
    """Ascend's AscendKVManager subclasses MooncakeKVManager but moves bytes with another
    engine (the teardown proof and the per-chunk span were shown for Mooncake's TCP
    transport only): the wrapped __init__ leaves it without a gate. SGLang's own
    MooncakeKVManager gets one. Before issue 38 every subclass was gated."""
    from sglang.srt.disaggregation.utils import DisaggregationMode

    try:
        from sglang.srt.disaggregation.ascend.conn import AscendKVManager as Sub
    except Exception:  # Ascend's module needs its NPU stack: a stand-in subclass
        class Sub(MooncakeKVManager):  # type: ignore[no-redef]
            pass
    init = ks._manager_init(lambda self, *a, **kw: None)
    for cls, gated in ((Sub, False), (MooncakeKVManager, True)):
        m = cls.__new__(cls)
        m.disaggregation_mode = DisaggregationMode.DECODE
        m.enable_deferred_decode_kv_release = False
        init(m)
        assert (getattr(m, "_kvfence_gate", None) is not None) == gated, cls


# -- the gate attaches where a manager is first used (SGLang's unit tests) -------------------


def test_a_manager_built_with_new_gets_its_gate_at_first_use() -> None:
    """SGLang's unit tests build managers with ``__new__`` (no ``__init__``, which is where
    the gate used to attach): the gate attaches at the manager's first use by a kvfence
    wrapper, on the side its fields show, and is counted. A manager SGLang's __init__
    built before install() (it has a mode) stays stock."""
    from sglang.srt.disaggregation.common.conn import CommonKVManager
    from sglang.srt.disaggregation.utils import DisaggregationMode

    before = dict(getattr(_state, "gates_attached", {}))
    dm = CommonKVManager.__new__(CommonKVManager)  # SGLang's tests' _make_manager()
    dm._deferred_abort_ack_tracker = {}
    dm._deferred_abort_generation = 0
    dm.enable_deferred_decode_kv_release = True
    assert dm.register_deferred_abort_room(103) == 1  # SGLang's own (no kvfence room)
    assert isinstance(getattr(dm, "_kvfence_gate", None), kdec.DecodeGate)
    pm = MooncakeKVManager.__new__(MooncakeKVManager)  # its prefill-side _manager()
    pm.request_status, pm._deferred_ack_targets, pm._staging_outstanding = {}, {}, {}
    pm._deferred_ack_poisoned_rooms = set()
    pm._maybe_ack_drained_abort(106)
    assert isinstance(getattr(pm, "_kvfence_gate", None), kpre.PrefillGate)
    after = _state.gates_attached
    assert after["decode"] == before["decode"] + 1
    assert after["prefill"] == before["prefill"] + 1
    assert after["at_first_use"] == before["at_first_use"] + 2
    early = MooncakeKVManager.__new__(MooncakeKVManager)
    early.disaggregation_mode = DisaggregationMode.DECODE
    early._deferred_abort_ack_tracker = {}
    assert getattr(early, "_kvfence_gate", None) is None
    assert _state.gates_attached["at_first_use"] == before["at_first_use"] + 2


# -- SGLang's tracker behaviours, with a gate attached ------------------------------------


def _request2(d: Decode, room: int, rid: str) -> Any:
    """A request to prefill ranks 0 and 1 of ``d.prefill`` (two writers)."""
    r = MooncakeKVReceiver.__new__(MooncakeKVReceiver)
    r.kv_mgr, r.bootstrap_room, r.bootstrap_addr = d.mgr, room, d.prefill
    r.prefill_info = d.info
    r.target_tp_ranks, r.target_cp_ranks, r.target_pp_ranks = [0, 1], [0], [0]
    r.bootstrap_infos = [{"rank_ip": "127.0.0.1", "rank_port": 7000 + i, "is_dummy": False}
                         for i in range(2)]
    r.init_time, r.abort_notified, r.conclude_state = 1.0, False, None
    r._abort_generation, r._owns_bootstrap_room = None, True
    r.required_dst_info_num = 1
    r.session_id = "127.0.0.1:17000"  # (0.5.22's send_metadata reads it)
    lock = threading.Lock()
    r._connect_to_bootstrap_server = lambda bi: (d.sock, lock)
    d.mgr.request_status[room] = KVPoll.WaitingForInput
    r.send_metadata(np.arange(8, dtype=np.int32), 0, None)
    return dec.DecodeRequest(
        req=SimpleNamespace(rid=rid, bootstrap_room=room, return_logprob=False,
                            finished_reason=None),
        kv_receiver=r, metadata_buffer_index=3)


def test_tracker_aggregation_duplicates_and_arming_with_a_gate(_freed: List[str]) -> None:
    """As SGLang's TestAbortAckAggregation / TestAbortArmsTrackerBeforeSend, on a gated
    manager: the ABORT carries the room's kvfence handle (armed before it is sent), an
    ACK before the ABORT is dropped, release only after *every* writer ACKed, a
    duplicate ACK counts once, a non-writer's ACK counts for nothing."""
    d = Decode()
    a = _request2(d, 70, "A")
    d.mgr.handle_abort_ack_message(AbortAck(70, 0, 1).to_zmq())  # before any ABORT
    d.abort_and_hold([a])
    assert d.gate is not None
    h = a.kv_receiver._kvfence
    assert type(h) is int and h in d.gate.records  # kvfence's room
    assert [n.generation for n in d.sock.sent] == [h, h]  # one ABORT per writer
    d.q.resolve_deferred_releases()
    assert d.held() == ["A"]
    d.ack(a, 0)
    d.ack(a, 0)  # duplicate
    d.ack(a, 5)  # not a writer
    d.q.resolve_deferred_releases()
    assert d.held() == ["A"] and _freed == []
    d.ack(a, 1)
    d.q.resolve_deferred_releases()
    assert _freed == ["A"] and not d.held() and not d.gate.records


def test_stale_and_late_acks_never_touch_a_reused_room(_freed: List[str]) -> None:
    """As SGLang's test_late_ack_after_release_does_not_pollute_reused_room and the
    stale-generation test, on a gated manager: request A on room R is released; a late
    ACK of A arrives after request B reused R; B is released only on B's own ACKs."""
    d = Decode()
    a = d.request(71, "A")
    d.abort_and_hold([a])
    gen_a = a.kv_receiver._abort_generation
    d.ack(a)
    d.q.resolve_deferred_releases()
    assert _freed == ["A"]
    b = d.request(71, "B")
    d.abort_and_hold([b])
    assert d.gate is not None and b.kv_receiver._kvfence in d.gate.records
    d.mgr.handle_abort_ack_message(AbortAck(71, 0, gen_a).to_zmq())  # A's, late
    d.q.resolve_deferred_releases()
    assert d.held() == ["B"] and _freed == ["A"]
    d.ack(b)
    d.q.resolve_deferred_releases()
    assert _freed == ["A", "B"]


@pytest.mark.parametrize("path", ["abort", "prefill_failure", "legacy_flag"])
def test_every_failure_path_is_held_until_drained(_freed: List[str], path: str) -> None:
    """As SGLang's deferred-release tests, on a gated manager: a failed transfer is held
    and released once, with its metadata index freed, only after its writer ACKed,
    whichever way it failed: the decode aborted it; the prefill failed it (no decode
    abort: pop_transferred arms it with force_arm); or the queue's deferral flag was off
    (legacy mode, which frees at once on stock)."""
    d = Decode()
    freed_idx: List[int] = []
    d.q.req_to_metadata_buffer_idx_allocator = SimpleNamespace(free=freed_idx.append)
    a = d.request(72, "A")
    if path == "legacy_flag":
        d.q.enable_deferred_kv_release = False
    if path == "prefill_failure":
        d.mgr.record_failure(72, "prefill said so")
        d.mgr.update_status(72, KVPoll.Failed)
        d.q.queue = [a]
        d.q._poll_with_metadata_gate = lambda: [KVPoll.Failed]
        d.q.pop_transferred()
    else:
        d.abort_and_hold([a])
    assert d.gate is not None and len(d.gate.records) == 1
    assert d.held() == ["A"] and _freed == []
    for _ in range(3):
        d.q.resolve_deferred_releases()
    assert d.held() == ["A"]
    d.ack(a)
    d.q.resolve_deferred_releases()
    assert _freed == ["A"] and freed_idx == [a.metadata_buffer_index]
    d.q.resolve_deferred_releases()
    assert _freed == ["A"]  # once


def test_a_new_prefill_manager_first_used_by_its_transfer_worker_gets_its_gate() -> None:
    """A prefill manager built with ``__new__`` whose first use is SGLang's real
    transfer_worker (as a test of SGLang's worker would run it): the gate attaches there,
    the worker's queue is bound to it, and the worker runs (here: takes SGLang's teardown
    sentinel and returns). The attachment must not take the lazy gate's lock under the
    worker wrapper's own lock (attach() takes that one too: a self-deadlock)."""
    from sglang.srt.disaggregation.common.utils import FastQueue

    m = MooncakeKVManager.__new__(MooncakeKVManager)
    m.request_status, m._deferred_ack_targets, m._staging_outstanding = {}, {}, {}
    m._deferred_ack_poisoned_rooms = set()
    m.enable_trace = False
    q = FastQueue()
    q.put(None)  # SGLang's teardown sentinel: the worker returns
    t = threading.Thread(target=m.transfer_worker, args=(q, None), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "transfer_worker hung at its manager's gate attachment"
    gate = m.__dict__.get("_kvfence_gate")
    assert isinstance(gate, kpre.PrefillGate) and len(gate.queues) == 1


def test_an_overdue_hold_names_the_legacy_prefill_fix(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A 0.5.23 prefill with SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=0 sends no
    ACK at all: a hold older than overdue_after with no ACK and no fence logs the fix,
    once per prefill (not once per iteration)."""
    monkeypatch.setattr(_state, "config", ks.Config(overdue_after=0.0))
    d = Decode()
    a = d.request(62, "A")
    d.abort_and_hold([a])
    assert d.gate is not None and len(d.gate.records) == 1
    with caplog.at_level("ERROR", logger="kvfence.sglang"):
        for _ in range(3):
            d.gate.next_policy_scan = 0.0
            d.q.resolve_deferred_releases()
    hits = [r for r in caplog.records if "DEFERRED_DECODE_KV_RELEASE=0" in r.getMessage()]
    assert len(hits) == 1 and d.held() == ["A"]
    d.ack(a)
    d.q.resolve_deferred_releases()
    assert not d.held()
