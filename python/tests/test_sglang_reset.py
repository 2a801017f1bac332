"""The transport reset of ``kvfence.sglang`` (``KVFENCE_SGLANG_RESET=1``, issue 38 item 9)
on SGLang 0.5.23's real classes and real Mooncake engines over TCP on loopback.

The decode manager, its queue and receivers are built as SGLang's unit tests build them
(``test_sglang_real_classes.Decode``); SGLang's own ``_setup_bootstrap_infos``,
``send_metadata``, ``apply_prefill_status``, ``resolve_deferred_releases`` and
``_do_release`` run with kvfence's wrappers. The generation engines are real Mooncake
``TransferEngine`` s (SGLang's ``MooncakeTransferEngine`` class), written to by a second
real engine playing the prefill, so "nothing lands after the reset" is a fact about
memory, and "the old transport is torn down" a fact about this process's sockets.

Each test checks that the reset ran (generations made, resets counted, ids fenced), and
``test_an_engine_not_torn_down_is_never_proven`` shows the proof failing when the engine
is not destroyed (a test-only mutation): its pages are then held, never released.
Skipped without SGLang or Mooncake (e2e/sglang/ci.sh runs it in the SGLang environment).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from types import SimpleNamespace
from typing import Any, Iterator, List, Tuple

import pytest

pytest.importorskip("sglang.srt.disaggregation.mooncake.conn")
pytest.importorskip("mooncake.engine")
os.environ.setdefault("MC_FORCE_TCP", "1")  # before any engine: Mooncake's TCP transport

import numpy as np  # noqa: E402
from mooncake.engine import TransferEngine  # noqa: E402
from sglang.srt.disaggregation import decode as dec  # noqa: E402
from sglang.srt.disaggregation.base.conn import KVPoll  # noqa: E402
from sglang.srt.disaggregation.mooncake.conn import MooncakeKVReceiver  # noqa: E402
from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import (  # noqa: E402
    MooncakeTransferEngine,
)
from test_sglang_real_classes import PREFILL, Decode  # noqa: E402

import kvfence.sglang as ks  # noqa: E402
from kvfence.sglang import _state, reset  # noqa: E402
from kvfence.sglang._config import Config  # noqa: E402

N = 1 << 20  # the decode's "KV": one registered region


@pytest.fixture(scope="module", autouse=True)
def _reset_installed() -> Iterator[None]:
    """kvfence installed with the transport reset on (a reported failed write only: no
    time trigger), restored to the default configuration after."""
    import torch.distributed as dist

    if not dist.is_initialized():  # a world-size-1 gloo group: SGLang's MIN reduction
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        dist.init_process_group("gloo", rank=0, world_size=1)
    if ks.installed():
        ks.uninstall(force=True)
    ks.install(Config(reset=True, reset_after=None))
    yield
    ks.uninstall(force=True)
    ks.install()


@pytest.fixture(autouse=True)
def _freed(monkeypatch: pytest.MonkeyPatch) -> List[Any]:
    """What SGLang's release path frees (``release_kv_cache``)."""
    freed: List[Any] = []
    monkeypatch.setattr(dec, "release_kv_cache",
                        lambda req, tree_cache, **kw: freed.append(req.rid))
    monkeypatch.setattr(dec, "prepare_abort", lambda *a, **kw: None)
    return freed


class ResetDecode(Decode):
    """A gated decode manager with a real shared Mooncake engine and one registered
    region (``kv``), so that kvfence can make generation engines like it."""

    def __init__(self, **kw: Any) -> None:
        from kvfence.sglang import decode as kdec
        if kdec._RELEASE != "0.5.23":
            pytest.skip("the transport reset needs SGLang 0.5.23 (installed: %s)"
                        % kdec._RELEASE)
        self.kv = np.zeros(N, dtype=np.uint8)
        shared = MooncakeTransferEngine(hostname="127.0.0.1")
        self.shared = shared
        super().__init__(gate=False, **kw)
        # (before attach would be SGLang's order; attach reads them: set, then re-attach)
        self.mgr.engine = shared
        self.mgr.kv_args = SimpleNamespace(
            kv_data_ptrs=[self.kv.ctypes.data], kv_data_lens=[N], aux_data_ptrs=[],
            aux_data_lens=[], state_data_ptrs=[], state_data_lens=[])
        self.mgr.is_mla_backend = False
        from kvfence.sglang import decode as kdec
        self.gate = kdec.attach(self.mgr)
        assert self.gate.resets is not None, "the reset did not turn on"
        self.rs: reset.Resets = self.gate.resets
        self.registered: List[str] = []  # session ids SGLang registered with the prefill
        self.sent: List[str] = []  # session ids of the requests' metadata

    def request(self, room: int, rid: str) -> Any:
        """A request through SGLang's own ``_setup_bootstrap_infos`` (bootstrap info from
        a stub route; SGLang's registration message built, its session captured) and
        ``send_metadata`` (the message captured at the prefill rank's socket)."""
        r = MooncakeKVReceiver.__new__(MooncakeKVReceiver)
        r.kv_mgr, r.bootstrap_room, r.bootstrap_addr = self.mgr, room, self.prefill
        r.prefill_info = self.info
        r.prefill_dp_rank, r.target_tp_rank = 0, 0
        r.target_tp_ranks, r.target_cp_ranks, r.target_pp_ranks = [0], [0], [0]
        r._connection_pool_entries = {}
        r.bootstrap_infos = None
        r.init_time, r.abort_notified, r.conclude_state = 1.0, False, None
        r._abort_generation, r._owns_bootstrap_room = None, True
        r.required_dst_info_num = 1
        lock = threading.Lock()
        r._connect_to_bootstrap_server = lambda bi: (self, lock)
        r._get_bootstrap_info_from_server = lambda *a: {
            "rank_ip": self.rank_ip, "rank_port": self.rank_port}

        def register() -> bool:
            # (what SGLang's build_receiver_registration_message sends as the session)
            self.registered.append(self.mgr.get_session_id())
            return True
        r._register_kv_args = register
        self.mgr.request_status[room] = KVPoll.WaitingForInput
        r._setup_bootstrap_infos()
        r.send_metadata(np.arange(16, dtype=np.int32), 0, None)
        return dec.DecodeRequest(
            req=SimpleNamespace(rid=rid, bootstrap_room=room, return_logprob=False,
                                finished_reason=None),
            kv_receiver=r, metadata_buffer_index=1)

    def send_multipart(self, frames: List[bytes]) -> None:
        """The prefill rank's socket: the metadata's session id (frame 3)."""
        if frames[0].isdigit() and len(frames) > 3:
            self.sent.append(frames[3].decode())
        self.sock.send_multipart(frames)

    def failed_write(self, room: int) -> None:
        """The prefill's Failed status for ``room`` with kvfence's reason (decode thread)."""
        self.mgr.apply_prefill_status(
            bootstrap_room=room, status=KVPoll.Failed, prefill_rank=0,
            failure_reason="Failed to send: a write of room %d returned -1" % room)

    def close(self) -> None:
        self.rs.wait(10)
        for gen in list(self.rs.current.values()):
            if gen is not None and gen.engine is not None:
                reset._destroy(gen.engine)
                gen.engine = None
        for s in self.rs.holders:
            s.close()


class Writer:
    """A second real Mooncake engine: the prefill's side, writing into the decode's KV."""

    def __init__(self) -> None:
        self.src = np.full(N, 0xAB, dtype=np.uint8)
        self.e = TransferEngine()
        assert self.e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        assert self.e.register_memory(self.src.ctypes.data, N) == 0

    def write(self, session: str, dst: int, n: int = N, byte: int = 0xAB) -> int:
        self.src[:n] = byte
        return int(self.e.batch_transfer_sync_write(session, [self.src.ctypes.data], [dst], [n]))


def _refused(port: int) -> bool:
    s = socket.socket()
    s.settimeout(1)
    try:
        s.connect(("127.0.0.1", port))
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    finally:
        s.close()
    return False


def _resolve_until(d: ResetDecode, freed: List[Any], rid: str, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        d.q.resolve_deferred_releases()
        if rid in freed:
            return True
        time.sleep(0.05)
    return False


def test_a_failed_write_resets_the_transport_and_gives_the_pages_back(
        _freed: List[str]) -> None:
    """A request's metadata goes out under its prefill's first generation (its own engine
    and session, registered under it); its write is reported failed (-1): the generation
    is retired, its engine destroyed (no socket left on its ports, which then refuse),
    its writer id fenced and readmitted, and the request's pages freed. A write to the old
    session lands nothing; the next request gets a new generation with new ids."""
    d = ResetDecode()
    w = Writer()
    try:
        a = d.request(90, "A")
        gen1 = d.rs.current[PREFILL]
        assert gen1 is not None and gen1.no == 1
        shared = d.shared.get_session_id()
        assert gen1.session != shared
        assert d.registered == [gen1.session] and d.sent == [gen1.session]
        assert gen1.ids and a.kv_receiver._kvfence[0].gen is gen1
        # The generation's engine is real and registered: a write lands.
        assert w.write(gen1.session, d.kv.ctypes.data) == 0
        assert d.kv[0] == 0xAB and d.kv[-1] == 0xAB
        d.abort_and_hold([a])
        assert d.held() == ["A"]
        d.failed_write(90)
        assert _resolve_until(d, _freed, "A", 15), "the failed write's pages never came back"
        assert d.rs.resets == 1 and d.rs.proven == 1 and d.rs.unproven == 0
        assert gen1.retired and gen1.proven and gen1.engine is None
        # No socket of the engine is left on its ports: what is there now is kvfence's
        # holder of each (bound: a connect is refused; or, over the engine's TIME_WAIT
        # leftovers, listening and never read), so no later engine can serve there.
        # (A port the kernel still keeps for a connection the peer has not closed, with
        # no socket of this process on it, cannot be bound yet: it stays retired, so no
        # engine of this process takes it.)
        held = {h.getsockname()[1] for h in d.rs.holders}
        assert held <= gen1.ports and d.rs.retired_ports >= gen1.ports
        assert {p for p, _ in reset.own_sockets_on(gen1.ports)} <= held
        assert all(_refused(p) or (p, "0A") in reset.own_sockets_on({p}) for p in gen1.ports)
        assert d.gate.fenced_ranks == len(gen1.ids)
        assert d.gate.table.stats()["fenced"] == []  # readmitted: the fenced set is bounded
        # Nothing lands through the old session any more.
        d.kv[:] = 0
        assert w.write(gen1.session, d.kv.ctypes.data, byte=0xCD) != 0
        assert not d.kv.any()
        # The next request to that prefill: a new generation, new ids, registered again.
        d.mgr.request_status.clear()
        d.request(91, "B")
        gen2 = d.rs.current[PREFILL]
        assert gen2 is not None and gen2.no == 2 and gen2.session not in (gen1.session, shared)
        assert gen2.ids.isdisjoint(gen1.ids)
        assert d.registered == [gen1.session, gen2.session]
        assert d.sent[-1] == gen2.session
        assert not gen2.ports & gen1.ports
        assert w.write(gen2.session, d.kv.ctypes.data, byte=0xEF) == 0 and d.kv[7] == 0xEF
    finally:
        d.close()


def test_a_write_on_the_wire_is_cut_by_the_reset(_freed: List[str]) -> None:
    """A 64 MiB write still going when the reset tears the generation down: once the
    pages are freed, nothing more of it lands (the memory is checked for a second)."""
    d = ResetDecode()
    big = 64 << 20
    d.kv = np.zeros(big, dtype=np.uint8)
    d.mgr.kv_args.kv_data_ptrs, d.mgr.kv_args.kv_data_lens = [d.kv.ctypes.data], [big]
    src = np.full(big, 0x77, dtype=np.uint8)
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert e.register_memory(src.ctypes.data, big) == 0
    try:
        a = d.request(92, "A")
        gen1 = d.rs.current[PREFILL]
        assert gen1 is not None
        rcs: List[int] = []

        def writes() -> None:
            for _ in range(20):
                rc = e.batch_transfer_sync_write(gen1.session, [src.ctypes.data],
                                                 [d.kv.ctypes.data], [big])
                rcs.append(rc)
                if rc != 0:
                    return
        t = threading.Thread(target=writes)
        t.start()
        while not d.kv[-1]:
            time.sleep(0.001)  # the first write has landed; more are on the wire
        d.abort_and_hold([a])
        d.failed_write(92)
        assert _resolve_until(d, _freed, "A", 15)
        snap = d.kv.copy()
        d.kv[:] = 0
        time.sleep(1.0)
        t.join(30)
        assert not d.kv.any(), "bytes landed after the reset's proof"
        assert rcs and rcs[-1] != 0  # the writer saw its transport die
        assert snap.any()
    finally:
        d.close()


def test_an_engine_not_torn_down_is_never_proven(_freed: List[str]) -> None:
    """Mutation: the generation's engine is *not* destroyed (a destroy that does
    nothing): its listener stays, the proof never holds, the pages stay held (no fence,
    nothing freed), and the writer can still write. What the real destroy is for."""
    d = ResetDecode()
    kept: List[Any] = []
    d.rs.destroy = kept.append  # type: ignore[assignment]
    try:
        a = d.request(93, "A")
        gen1 = d.rs.current[PREFILL]
        assert gen1 is not None
        d.abort_and_hold([a])
        d.failed_write(93)
        assert not _resolve_until(d, _freed, "A", 2.0)
        assert d.rs.resets == 1 and d.rs.proven == 0 and not gen1.proven
        assert d.held() == ["A"] and d.gate.fenced_ranks == 0
        assert reset.own_sockets_on(gen1.ports)  # why: its sockets are still there
    finally:
        for e in kept:
            reset._destroy(e)  # the teardown thread now proves it, fences, releases
        assert _resolve_until(d, _freed, "A", 15)
        d.close()


def test_a_request_registered_before_a_reset_is_refused_not_sent(
        _freed: List[str]) -> None:
    """A request whose prefill's generation was reset between its registration and its
    metadata: failed before anything is sent (it would go to an engine being destroyed),
    counted as disturbed; its status Failed with kvfence's reason."""
    d = ResetDecode()
    try:
        a = d.request(94, "A")
        gen1 = d.rs.current[PREFILL]
        assert gen1 is not None
        # B registers under generation 1 (its _setup_bootstrap_infos), then A's failed
        # write resets generation 1 before B's metadata goes out.
        r = MooncakeKVReceiver.__new__(MooncakeKVReceiver)
        r.kv_mgr, r.bootstrap_room, r.bootstrap_addr = d.mgr, 95, d.prefill
        r.prefill_info, r.bootstrap_infos = d.info, [{"rank_ip": "127.0.0.1", "rank_port": 1}]
        r.target_tp_ranks, r.target_cp_ranks, r.target_pp_ranks = [0], [0], [0]
        r.conclude_state, r._kvfence = None, gen1
        d.mgr.request_status[95] = KVPoll.WaitingForInput
        d.abort_and_hold([a])
        d.failed_write(94)
        assert _resolve_until(d, _freed, "A", 15)
        before = len(d.sent)
        assert r.send_metadata(np.arange(4, dtype=np.int32), 0, None) is None
        assert len(d.sent) == before  # nothing sent
        assert d.mgr.request_status[95] == KVPoll.Failed
        assert "reset" in d.mgr.failure_records[95]
        assert d.rs.refused == 1
    finally:
        d.close()


def test_an_abort_after_the_proof_names_no_old_writer(_freed: List[str]) -> None:
    """A request of generation 1 aborted only after generation 1 was proven torn down
    and its ids readmitted: its room must not wait on them (nothing of theirs can land,
    and no ACK will come for a write to a destroyed engine): released at its abort."""
    d = ResetDecode()
    try:
        a = d.request(96, "A")
        b = d.request(97, "B")
        d.abort_and_hold([a])
        d.failed_write(96)
        assert _resolve_until(d, _freed, "A", 15)
        gen1 = b.kv_receiver._kvfence[0].gen
        assert gen1.no == 1 and gen1.proven and d.rs.proven == 1
        d.abort_and_hold([b])  # B's room opens now, with no writer
        assert _resolve_until(d, _freed, "B", 2.0), "an old-generation room waits for ever"
    finally:
        d.close()


def test_the_kvfence_prefill_tells_the_decode_of_a_failed_write_with_a_reason() -> None:
    """SGLang's Mooncake manager sends no failure reason, and keeps a room's first
    failure: the kvfence prefill's ``_poison_unsettled_send`` sends a Failed status with
    a fourth frame, "Failed to send ...", which SGLang's decode parses as the reason."""
    from test_sglang_real_classes import Prefill

    p = Prefill()
    p.mgr.kv_status_msg_carries_reason = False
    p.mgr._room_notify_targets = lambda room: [("127.0.0.1", 7001)]
    p.mgr._prefill_unique_rank = lambda: 0
    sent: List[Tuple[str, List[bytes]]] = []
    p.mgr._send_multipart_locked = lambda ep, parts, is_ipv6=False: sent.append((ep, parts))
    p.mgr.enable_deferred_decode_kv_release = True
    p.mgr._poison_unsettled_send(98)
    assert len(sent) == 1 and sent[0][0].endswith("127.0.0.1:7001")
    d = Decode()
    room, status, rank, why = d.mgr.parse_kv_status_message(sent[0][1])
    assert (room, status, rank) == (98, KVPoll.Failed, 0)
    assert why is not None and why.startswith("Failed to send")
    assert 98 in p.mgr._deferred_ack_poisoned_rooms  # SGLang's own poison ran too


def test_a_failed_write_reported_before_the_abort_still_resets(_freed: List[str]) -> None:
    """The prefill's Failed status comes first, the decode's abort later (its failure
    record overwritten by the abort's): the noted failure waits for the room to open,
    even across drains that ran meanwhile (another request held), then resets. Both
    requests of the generation are released by its fence."""
    d = ResetDecode()
    try:
        b = d.request(100, "B")
        d.abort_and_hold([b])  # held: every resolve below drains
        a = d.request(101, "A")
        d.failed_write(101)
        d.q.resolve_deferred_releases()  # A's room is not open yet
        assert d.rs.resets == 0 and 101 in d.gate.failed_pending
        d.mgr.record_failure(101, "Aborted by AbortReq")
        d.abort_and_hold([a, b])
        assert _resolve_until(d, _freed, "A", 15)
        assert _resolve_until(d, _freed, "B", 2)
        assert d.rs.resets == 1 and d.rs.proven == 1 and not d.gate.failed_pending
    finally:
        d.close()


def test_no_ack_for_reset_after_seconds_resets(_freed: List[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A stock prefill says nothing of a failed write (Mooncake's status carries no
    reason): a room of the current generation with no ACK for ``reset_after`` seconds
    resets it. Time only starts the reset: before it the pages are held; after it, the
    teardown proof releases them."""
    monkeypatch.setattr(_state, "config", Config(reset=True, reset_after=0.5))
    d = ResetDecode()
    try:
        a = d.request(102, "A")
        d.abort_and_hold([a])
        assert not _resolve_until(d, _freed, "A", 0.3)
        assert d.rs.resets == 0
        assert _resolve_until(d, _freed, "A", 15)
        assert d.rs.resets == 1 and d.rs.proven == 1
    finally:
        d.close()
