"""kvfence.vllm under vLLM's real ``Scheduler`` and vLLM's ``FakeNixlWrapper``.

Each test drives a real vLLM 0.33.0 ``Scheduler`` and a NIXL worker connector (vLLM's
``FakeNixlConnectorWorker`` from its own unit tests, on vLLM's ``FakeNixlWrapper``) step
by step, as the engine does (schedule -> connector metadata -> worker ``start_load_kv`` /
``get_transfer_results`` -> ``KVConnectorOutput`` -> ``update_from_output``), and records
two things in order: every block free of the scheduler (``Scheduler._free_blocks``) and
every NIXL teardown (``remove_remote_agent``). Each checks that a request's blocks are
freed exactly once, never while a handle may still move bytes (no free before the
transfer ended or its peer was torn down), and that nothing leaks once the peer is fenced.

Run by ``e2e/vllm/ci.sh`` with the plugin ``kvfence_swap`` (vLLM's NIXL names point at
kvfence's subclasses). With ``KVFENCE_SWAP=0`` the same tests run against stock vLLM:
every one of them must then fail (``ci.sh`` checks that too).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple
from unittest.mock import MagicMock, patch

import pytest

from tests.v1.kv_connector.unit.test_nixl_connector import (  # vLLM's own fakes
    FakeNixlConnectorWorker,
    FakeNixlWrapper,
)
from tests.v1.kv_connector.unit.utils import (
    create_model_runner_output,
    create_request,
    create_scheduler,
    create_vllm_config,
    make_kv_cache_config,
    maybe_update_block_size,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import (
    NixlConnector,
    NixlPushConnector,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.tp_mapping import ReadSpec
from vllm.forward_context import ForwardContext
from vllm.v1.request import RequestStatus

KVFENCE = os.environ.get("KVFENCE_SWAP", "1") != "0"
BASE_WORKER = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker.NixlWrapper"
REMOTE = FakeNixlConnectorWorker.REMOTE_ENGINE_ID
BLOCK = maybe_update_block_size(16)  # vLLM's unit conftest lets the CPU backend take 16


def test_swap_is_what_we_think() -> None:
    """The classes under test are kvfence's (or stock's when KVFENCE_SWAP=0)."""
    assert NixlConnector.__module__ == ("kvfence.vllm" if KVFENCE else
                                        "vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector")


class PD:
    """One engine side: a real Scheduler plus one worker connector, stepped together."""

    def __init__(self, role: str, extra: Optional[Dict[str, Any]] = None, push: bool = False) -> None:
        self.log: List[Tuple[str, Any]] = []
        self.failed: List[str] = []  # every request reported in failed_recving, in order
        cfg = create_vllm_config(
            block_size=BLOCK,
            kv_role=role,
            kv_connector="NixlPushConnector" if push else "NixlConnector",
            kv_connector_extra_config=extra or {},
        )
        self.cfg = cfg
        self.sched = create_scheduler(cfg, num_blocks=200)
        real_free = self.sched._free_blocks

        def spy_free(request: Any) -> None:
            self.log.append(("free", request.request_id))
            real_free(request)

        self.sched._free_blocks = spy_free  # type: ignore[method-assign]
        kvcc = make_kv_cache_config(block_size=BLOCK, num_blocks=200)
        cls = NixlPushConnector if push else NixlConnector
        self.conn = cls(cfg, KVConnectorRole.WORKER, kvcc)
        if not push:
            self.conn.connector_worker = FakeNixlConnectorWorker(
                cfg, self.conn.engine_id, hand_shake_latency=0, kv_cache_config=kvcc
            )
        self.worker = self.conn.connector_worker
        if push:  # set up by register_kv_caches, which needs a real KV cache
            self.worker.transfer_topo = MagicMock()
        wrapper = self.worker.nixl_wrapper
        real_remove = wrapper.remove_remote_agent

        def spy_remove(agent: str) -> None:
            self.log.append(("teardown", agent))
            real_remove(agent)

        wrapper.remove_remote_agent = spy_remove
        real_release = wrapper.release_xfer_handle

        def spy_release(handle: int) -> None:
            self.log.append(("release", handle))
            real_release(handle)

        wrapper.release_xfer_handle = spy_release
        self.ctx = ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={})

    def frees(self, req_id: str) -> int:
        return sum(1 for e in self.log if e == ("free", req_id))

    def step(self, use_eos: bool = False) -> None:
        out = self.sched.schedule()
        self.conn.bind_connector_metadata(out.kv_connector_metadata)
        self.conn.start_load_kv(self.ctx)
        res = self.conn.get_transfer_results(set())
        self.failed.extend(sorted(res.failed_recving))
        self.conn.clear_connector_metadata()
        running = [self.sched.requests[r] for r in out.num_scheduled_tokens]
        mro = create_model_runner_output(
            running,
            finished_sending=res.finished_sending or None,
            finished_recving=res.finished_recving or None,
            invalid_block_ids=self.conn.get_block_ids_with_load_errors() or None,
            use_eos=use_eos,
            kv_connector_worker_meta=self.conn.build_connector_worker_meta(),
        )
        if mro.kv_connector_output is not None:
            mro.kv_connector_output.failed_recving = res.failed_recving
        self.sched.update_from_output(out, mro)

    def steps(self, n: int, until: Optional[Callable[[], bool]] = None, sleep: float = 0.0) -> None:
        for _ in range(n):
            self.step()
            if until is not None and until():
                return
            if sleep:
                time.sleep(sleep)


# --------------------------------------------------------------------------- decode (pull)


def _decode_with_read(
    pd: PD, cycles: int = 10**9, n: int = 1, remote_request_id: Optional[str] = None
) -> List[str]:
    """Adds ``n`` remote-prefill requests and steps until each has a READ posted."""
    pd.worker.nixl_wrapper._cycles_before_xfer_done = cycles
    ids = []
    for _ in range(n):
        req = create_request(do_remote_prefill=True, num_tokens=3 * BLOCK, block_size=BLOCK)
        req.kv_transfer_params["remote_engine_id"] = REMOTE
        if remote_request_id is not None:
            req.kv_transfer_params["remote_request_id"] = remote_request_id
        req.kv_transfer_params["remote_block_ids"] = ([0, 1, 2],)
        pd.sched.add_request(req)
        ids.append(req.request_id)
    pd.steps(100, until=lambda: all(r in pd.worker._recving_transfers for r in ids), sleep=0.01)
    for r in ids:
        assert pd.worker._recving_transfers.get(r), f"no READ posted for {r}"
        assert pd.sched.requests[r].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    return ids


def _assert_freed_once_after_teardown(pd: PD, req_id: str) -> None:
    assert pd.frees(req_id) == 1, f"{req_id} freed {pd.frees(req_id)} times: {pd.log}"
    first_teardown = next((i for i, e in enumerate(pd.log) if e[0] == "teardown"), None)
    free_at = pd.log.index(("free", req_id))
    assert first_teardown is not None and first_teardown < free_at, (
        f"blocks of {req_id} freed while its handle could still move bytes "
        f"(no teardown of the peer before the free): {pd.log}"
    )


@patch(BASE_WORKER, FakeNixlWrapper)
def test_failed_handle_frees_once_after_teardown(default_vllm_config: Any, dist_init: Any) -> None:
    """A READ handle in error: vLLM releases it and frees the blocks at once, though
    "a status error does not guarantee that the backend stopped DMA". kvfence keeps the
    handle and the blocks until the peer is torn down and fenced, then frees once."""
    pd = PD("kv_consumer")
    (rid,) = _decode_with_read(pd)
    pd.worker.nixl_wrapper.check_xfer_state = lambda h: "ERR"
    pd.steps(5)
    _assert_freed_once_after_teardown(pd, rid)
    pd.steps(3)
    assert pd.frees(rid) == 1


@patch(BASE_WORKER, FakeNixlWrapper)
def test_stuck_handle_frees_once_after_teardown(default_vllm_config: Any, dist_init: Any) -> None:
    """A READ that never completes: vLLM leaks its blocks for ever (#46283). kvfence tears
    the peer down after kvfence_stuck_handle_s, fences it, and the blocks go back once."""
    pd = PD("kv_consumer", {"kvfence_stuck_handle_s": 0.3})
    (rid,) = _decode_with_read(pd)
    pd.steps(3)
    assert pd.frees(rid) == 0  # still posted: held
    pd.steps(60, until=lambda: pd.frees(rid) > 0, sleep=0.02)
    _assert_freed_once_after_teardown(pd, rid)


@patch(BASE_WORKER, FakeNixlWrapper)
def test_abort_while_waiting_for_remote_kvs(default_vllm_config: Any, dist_init: Any) -> None:
    """A client abort while WAITING_FOR_REMOTE_KVS with a READ that never completes: the
    free stays delayed (vLLM #32255) but then leaks. kvfence: freed once, after teardown."""
    pd = PD("kv_consumer", {"kvfence_stuck_handle_s": 0.3})
    (rid,) = _decode_with_read(pd)
    pd.sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
    pd.steps(3)
    assert pd.frees(rid) == 0  # the READ may still write: held
    pd.steps(60, until=lambda: pd.frees(rid) > 0, sleep=0.02)
    _assert_freed_once_after_teardown(pd, rid)
    pd.steps(3)
    assert pd.frees(rid) == 1


@patch(BASE_WORKER, FakeNixlWrapper)
def test_peer_disappears_nothing_leaks(default_vllm_config: Any, dist_init: Any) -> None:
    """The prefill peer goes away: one READ errors, the other stays posted for ever. vLLM
    frees the first at once and leaks the second. kvfence tears the peer down on the
    error, fences it, and both requests' blocks go back exactly once."""
    pd = PD("kv_consumer", {"kvfence_failure_grace_s": 0.2})
    a, b = _decode_with_read(pd, n=2)
    ha = set(pd.worker._recving_transfers[a])
    pd.worker.nixl_wrapper.check_xfer_state = lambda h: "ERR" if h in ha else "PROC"
    pd.steps(100, until=lambda: pd.frees(a) and pd.frees(b), sleep=0.01)
    _assert_freed_once_after_teardown(pd, a)
    _assert_freed_once_after_teardown(pd, b)
    pd.steps(3)
    assert pd.frees(a) == 1 and pd.frees(b) == 1


# -------------------------------------------------------------------------- prefill (pull)


def _finished_prefill(pd: PD) -> str:
    req = create_request(do_remote_decode=True, num_tokens=3 * BLOCK, block_size=BLOCK)
    pd.sched.add_request(req)
    pd.step(use_eos=True)  # prefill done: blocks held for the decode's READ
    rid = req.request_id
    assert rid in pd.sched.requests and pd.frees(rid) == 0
    pd.steps(2)  # the lease reaches the worker (reqs_to_send)
    assert rid in pd.worker._reqs_to_send
    return rid


@patch(BASE_WORKER, FakeNixlWrapper)
def test_lease_lapses_while_read_posted(default_vllm_config: Any, dist_init: Any) -> None:
    """The decode's READ of a finished prefill is still posted when the lease lapses:
    vLLM frees the blocks (the READ then reads reused blocks). kvfence holds them until
    the decode's completion notification, then frees them once."""
    pd = PD("kv_producer", {"kv_lease_duration": 1})
    rid = _finished_prefill(pd)
    time.sleep(1.1)
    pd.steps(3)
    assert pd.frees(rid) == 0, "blocks freed on lease expiry while a READ may be posted"
    # The decode's READ completes: its notification ("<req>:<consumers>") arrives late.
    notifs = [{"decode-agent": [f"{rid}:1".encode()]}]
    pd.worker.nixl_wrapper.get_new_notifs = lambda: notifs.pop() if notifs else {}
    pd.steps(3)
    assert pd.frees(rid) == 1


# -------------------------------------------------------------------------- prefill (push)


def _stub_descriptors(w: Any) -> None:
    """The per-engine descriptor maps vLLM's push ``_xfer_blocks`` reads (set up by
    ``register_kv_caches`` and the handshake, which need a real KV cache): 0.32 and 0.33
    keep region maps per engine, 0.34 one ``_dst_pairs`` entry (``_compute_desc_ids`` is
    stubbed, so only the lookups must succeed)."""
    w.dst_num_blocks = {"decode-engine": 8, w.engine_id: 8}
    for eid in ("decode-engine", w.engine_id):
        w.dst_region_num_blocks[eid] = [8]
        if hasattr(w, "dst_uses_region_group_mapping"):  # 0.32, 0.33
            w.dst_region_group_ids[eid] = [0]
            w.dst_uses_region_group_mapping[eid] = False
        if hasattr(w, "_dst_pairs"):  # 0.34
            w._dst_pairs[eid] = MagicMock()


@patch(BASE_WORKER, FakeNixlWrapper)
def test_push_write_in_progress_at_expiry(default_vllm_config: Any, dist_init: Any) -> None:
    """Push: the prefill's WRITE is still in progress when the lease lapses. vLLM reports
    the request done ("even if their WRITEs finish later") and frees the source blocks
    the WRITE is reading. kvfence frees them once the WRITE handle is DONE, once."""
    # vLLM's writer posts one WRITE (its _xfer_blocks, with the descriptor plumbing that
    # register_kv_caches/handshake would set up stubbed as in vLLM's own push tests).
    pd, rid, _ = _push_prefill_with_write({"kv_lease_duration": 1})
    w = pd.worker
    time.sleep(1.1)
    pd.steps(3)
    assert pd.frees(rid) == 0, "source blocks freed at expiry while the WRITE reads them"
    w.nixl_wrapper._cycles_before_xfer_done = 0  # the WRITE completes
    pd.steps(3)
    assert pd.frees(rid) == 1


@pytest.mark.skipif(not KVFENCE, reason="kvfence only: its metadata and metrics")
@patch(BASE_WORKER, FakeNixlWrapper)
def test_events_travel_in_connector_metadata(default_vllm_config: Any, dist_init: Any) -> None:
    """Fences reach the scheduler in vLLM's kv_connector_worker_meta and are counted."""
    import kvfence.vllm as kv

    before = kv.EVENTS.labels(event="fence")._value.get()
    pd = PD("kv_consumer")
    _decode_with_read(pd)
    pd.worker.nixl_wrapper.check_xfer_state = lambda h: "ERR"
    sched_conn = pd.sched.connector
    seen: List[Any] = []
    real = sched_conn.update_connector_output

    def spy(o: Any) -> None:
        if o.kv_connector_worker_meta is not None:
            seen.append(o.kv_connector_worker_meta)
        real(o)

    sched_conn.update_connector_output = spy
    pd.steps(3)
    assert any(isinstance(m, kv.KvfenceWorkerMeta) and any(e[0] == "fence" for e in m.events)
               for m in seen)
    assert kv.EVENTS.labels(event="fence")._value.get() == before + 1


@pytest.mark.skipif(not KVFENCE, reason="kvfence only: its version check")
def test_version_check_reads_the_hooks_not_the_version(tmp_path: Any) -> None:
    """Support is decided by the code of the hooks: the installed vLLM matches its tested
    release whatever its version string says; a copy of it with one hook changed is
    refused with an error naming that hook and the supported releases."""
    import shutil

    import kvfence.vllm as kv
    from kvfence import _vllm_hooks

    import vllm

    root = os.path.dirname(os.path.dirname(vllm.__file__))
    installed = kv._check_version(root)
    assert installed == kv.VLLM_RELEASE and installed in ("0.32.0", "0.33.0", "0.34.0")
    with patch.object(kv._metadata, "version", return_value=installed + "+cu130"):
        assert kv._check_version(root) == installed  # a local suffix changes nothing
    nixl = os.path.join(tmp_path, _vllm_hooks._NIXL)
    shutil.copytree(os.path.join(root, _vllm_hooks._NIXL), nixl)
    path = os.path.join(nixl, "base_worker.py")
    text = open(path).read()
    marker = "    def _reap_expired_send_leases(self, done_sending: set[str]) -> None:\n"
    assert marker in text
    open(path, "w").write(text.replace(marker, marker + "        pass  # changed\n"))
    with pytest.raises(ImportError, match=r"supports vLLM 0\.32\.0, 0\.33\.0, 0\.34\.0.*"
                       r"differs in 1 of them: NixlBaseConnectorWorker\._reap_expired_send_leases"):
        kv._check_version(str(tmp_path))


@pytest.mark.skipif(not KVFENCE, reason="kvfence only: its per-step direct calls")
def test_direct_calls_refuse_a_class_they_would_skip() -> None:
    """kvfence's per-step hooks call vLLM's next method directly (not via super()): a
    class that would put an override of one of them between kvfence's class and vLLM's
    is refused with a TypeError (it would be skipped); a patch on vLLM's class applies."""
    import kvfence.vllm as kv

    class Polls(kv.NixlPullConnectorWorker):  # type: ignore[misc]
        def get_transfer_results(self) -> Any:
            raise AssertionError("skipped by a direct call")

    class Pops(kv.NixlPullConnectorWorker):  # type: ignore[misc]
        def _pop_done_transfers(self, transfers: Any) -> Any:
            raise AssertionError("skipped by a direct call")

    class Other(kv.NixlPullConnectorWorker):  # type: ignore[misc]
        def unrelated(self) -> None:
            pass

    with pytest.raises(TypeError, match="overrides get_transfer_results"):
        type("Bad1", (kv.KvfencePullWorker, Polls), {})
    with pytest.raises(TypeError, match="overrides _pop_done_transfers"):
        type("Bad2", (kv.KvfencePullWorker, Pops), {})
    ok = type("Ok", (kv.KvfencePullWorker, Other), {})
    w = ok.__new__(ok)
    seen: List[Any] = []
    with patch.object(kv.NixlBaseConnectorWorker, "_pop_done_transfers",
                      lambda self, t: seen.append(t) or (set(), set())):
        assert w._pop_done_transfers({}) == (set(), set())
    assert seen == [{}]


def _lease_scenario(w: Any, leases_cls: Any) -> List[str]:
    """Leases stored every way vLLM (and a dict) can store them, each lapsed request
    reaped by the first poll after its deadline? Returns the requests a poll missed."""
    now = time.perf_counter()
    w._reqs_to_send = leases_cls({"a": now + 100.0, "b": now + 200.0})
    missed: List[str] = []

    def poll(expect_reaped: str) -> None:
        w._reap_expired_send_leases(set())
        if expect_reaped in w._reqs_to_send:
            missed.append(expect_reaped)
            del w._reqs_to_send[expect_reaped]  # (go on with the rest of the scenario)

    w._reap_expired_send_leases(set())
    assert set(w._reqs_to_send) == {"a", "b"}, "a lease reaped before its deadline"
    w._reqs_to_send["a"] = now + 300.0  # a heartbeat moves the earliest deadline later
    w._reqs_to_send["c"] = now - 1.0  # a new lease below every other (a short TTL)
    poll("c")
    del w._reqs_to_send["b"]  # the decode read it: the bound is now too low (harmless)
    w._reap_expired_send_leases(set())
    assert set(w._reqs_to_send) == {"a"}, "a live lease reaped after a stale bound"
    w._reqs_to_send.update({"d": now - 1.0})
    poll("d")
    w._reqs_to_send.setdefault("e", now - 1.0)
    poll("e")
    w._reqs_to_send |= {"f": now - 1.0}
    poll("f")
    w._reqs_to_send = {"a": now + 300.0, "g": now - 1.0}  # a plain dict put in its place
    poll("g")
    assert set(w._reqs_to_send) == {"a"}
    return missed


@pytest.mark.skipif(not KVFENCE, reason="kvfence only: its lease map's lower bound")
@patch(BASE_WORKER, FakeNixlWrapper)
def test_lease_bound_sees_every_deadline(default_vllm_config: Any, dist_init: Any) -> None:
    """The per-step lapse check compares the clock with a lower bound of the deadlines
    (``_Leases``) instead of scanning them: a lease stored in any way, below the bound,
    after a heartbeat or after a removal, is still reaped by the first poll after its
    deadline, and no live lease is reaped. A bound that a store does not lower (the
    mutant below) misses it: this test fails on it."""
    import kvfence.vllm as kv

    class NotLowered(kv._Leases):  # the mutant: a store does not lower the bound
        __slots__ = ()

        def __setitem__(self, key: str, value: float) -> None:
            dict.__setitem__(self, key, value)

    pd = PD("kv_producer")
    assert type(pd.worker._reqs_to_send) is kv._Leases
    assert _lease_scenario(pd.worker, kv._Leases) == []
    assert "c" in _lease_scenario(PD("kv_producer").worker, NotLowered), "mutant not caught"


# ------------------------------------------------ threads: vLLM's writer beside the step


def _event_count(event: str) -> float:
    """kvfence's scheduler-side counter of ``event`` (0 under stock)."""
    if not KVFENCE:
        return 0.0
    import kvfence.vllm as kv

    return float(kv.EVENTS.labels(event=event)._value.get())


def _push_prefill_with_write(extra: Optional[Dict[str, Any]] = None) -> Tuple[PD, str, int]:
    """A push prefill whose finished request has one WRITE in progress to the decode
    engine ``decode-engine`` (handshaken: it has a NIXL agent), posted by vLLM's own
    ``_xfer_blocks`` with the descriptor plumbing stubbed as in vLLM's push tests."""
    pd = PD("kv_producer", extra, push=True)
    rid = _finished_prefill(pd)
    w = pd.worker
    w.transfer_topo.block_size_ratio.return_value = 1
    w._apply_prefix_caching = MagicMock(return_value=([[1]], [[1]]))
    w._compute_desc_ids = MagicMock(return_value=[0])
    _stub_descriptors(w)
    w._remote_agents["decode-engine"] = {0: "decode-agent"}
    w.nixl_wrapper._cycles_before_xfer_done = 10**9  # in progress
    handle = _post_write(w, rid)
    assert handle is not None
    with w._sending_transfers_lock:
        w._sending_transfers[rid].append(handle)
    return pd, rid, handle


def _post_write(w: Any, rid: str) -> Optional[int]:
    return w._xfer_blocks(  # type: ignore[no-any-return]
        read_spec=ReadSpec(0, [[1]], [[1]]),
        dst_engine_id="decode-engine",
        request_id=rid,
        remote_request_id="decode-req",
        local_xfer_side_handle=1,
        remote_xfer_side_handle=2,
    )


@pytest.mark.skipif(not KVFENCE, reason="kvfence only: the order of its lock and vLLM's")
@patch(BASE_WORKER, FakeNixlWrapper)
def test_writer_thread_teardown_does_not_deadlock_the_step(
    default_vllm_config: Any, dist_init: Any
) -> None:
    """Push prefill, forced interleaving: the step thread holds vLLM's
    ``_sending_transfers_lock`` (its push poll) when vLLM's writer thread evicts the decode
    engine (``_ensure_handshake`` -> ``_evict_stale_engines`` -> ``_cleanup_remote_engine``)
    while a WRITE to it is a live transfer. Before the fix the writer fenced under
    kvfence's lock and then waited for vLLM's lock, and the step, waiting for kvfence's
    lock, never ran again. Now the writer retires the rank and returns; the fence runs on
    the step thread; the blocks go back once, after the teardown."""
    pd, rid, _ = _push_prefill_with_write({"kv_lease_duration": 1})
    w = pd.worker
    writer = threading.Thread(target=w._cleanup_remote_engine, args=("decode-engine",))
    with w._sending_transfers_lock:  # the step thread, inside vLLM's push poll
        writer.start()
        writer.join(5)
        writer_blocked = writer.is_alive()
        step_got_kvfence_lock = w._kvf_lock.acquire(timeout=5)
        if step_got_kvfence_lock:
            w._kvf_lock.release()
    writer.join(5)
    assert not writer_blocked and step_got_kvfence_lock, (
        "deadlock: the writer thread's teardown waits for vLLM's _sending_transfers_lock "
        "while the step thread waits for kvfence's lock"
    )
    # The WRITE is fenced; like a failed push (vLLM's own rule), the request's blocks go
    # back when its lease lapses.
    time.sleep(1.1)
    pd.steps(20, until=lambda: pd.frees(rid) > 0, sleep=0.01)
    _assert_freed_once_after_teardown(pd, rid)


@pytest.mark.skipif(not KVFENCE, reason="kvfence only: its transfer map under its lock")
@patch(BASE_WORKER, FakeNixlWrapper)
def test_failure_log_while_the_writer_posts(default_vllm_config: Any, dist_init: Any) -> None:
    """Push prefill, forced interleaving: vLLM's ``_log_failure`` (the step thread, a
    failed poll) walks kvfence's transfers while vLLM's writer thread posts a WRITE, which
    inserts one. Before the fix the walk was unlocked: ``RuntimeError: dictionary changed
    size during iteration`` out of the engine step. Now the writer waits for the walk."""
    pd, rid, _ = _push_prefill_with_write()
    w = pd.worker
    _post_write(w, rid)  # a second live transfer: the walk has more than one to visit
    go, inserted = threading.Event(), threading.Event()

    class Racy(dict):  # type: ignore[type-arg]
        """kvfence's transfer map, pausing a walk after its first item for the writer."""

        def values(self) -> Any:  # type: ignore[override]
            for i, v in enumerate(dict.values(self)):
                if i == 0:
                    go.set()
                    inserted.wait(1.0)
                yield v

    w._kvf_xfers = Racy(w._kvf_xfers)
    errors: List[BaseException] = []

    def writer() -> None:
        go.wait(5)
        try:
            _post_write(w, rid)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        inserted.set()

    t = threading.Thread(target=writer)
    t.start()
    try:
        w._log_failure(failure_type="transfer_failed", req_id="another-request", msg="x")
    except RuntimeError as e:
        errors.append(e)
    finally:
        go.set()
        t.join(5)
    assert not errors, f"the step's failure log raced the writer: {errors!r}"
    assert go.is_set() and len(w._kvf_xfers) == 3, "the walk or the writer did not run"


@patch(BASE_WORKER, FakeNixlWrapper)
def test_no_teardown_while_the_writer_submits(default_vllm_config: Any, dist_init: Any) -> None:
    """Push prefill, forced interleaving: the step thread decides to tear the decode
    engine down (a WRITE stuck past ``kvfence_stuck_handle_s``) while vLLM's writer thread
    is inside ``_do_start_push_kv`` submitting another WRITE to it, between reading the
    engine's descriptor handles and posting. Before the fix the teardown released those
    descriptors under the submission. Now it waits for the submission to end."""
    pd, rid, _ = _push_prefill_with_write({"kvfence_stuck_handle_s": 0.2})
    w = pd.worker
    inside, leave = threading.Event(), threading.Event()
    torn_while_inside: List[bool] = []

    def paused_submission(req_id: str, meta: Any) -> None:
        inside.set()
        leave.wait(10)
        torn_while_inside.append(any(e[0] == "teardown" for e in pd.log))

    w._ensure_handshake = MagicMock(return_value=None)  # the handshake is done
    w._xfer_blocks_for_req = paused_submission
    reg = {
        "decode_engine_id": "decode-engine",
        "local_block_ids": [1],
        "request_id": "decode-req-2",
        "decode_host": "127.0.0.1",
        "decode_port": 1,
        "decode_tp_size": 1,
    }
    t = threading.Thread(target=w._do_start_push_kv, args=(rid, [1], reg))
    t.start()
    assert inside.wait(10)
    time.sleep(0.3)  # the live WRITE is now stuck
    pd.steps(5, sleep=0.02)
    leave.set()
    t.join(10)
    assert torn_while_inside == [False], (
        "the decode engine was torn down (its descriptors released) while vLLM's writer "
        "was submitting a WRITE to it"
    )
    pd.steps(20, until=lambda: any(e[0] == "teardown" for e in pd.log), sleep=0.02)
    assert any(e[0] == "teardown" for e in pd.log), "the stuck WRITE's peer was never torn down"


@patch(BASE_WORKER, FakeNixlWrapper)
def test_live_handles_released_before_their_descriptors(
    default_vllm_config: Any, dist_init: Any
) -> None:
    """A READ stuck in PROC: the teardown of its prefill releases the engine's descriptor
    lists and agents. vLLM never releases descriptors under an outstanding handle; before
    the fix kvfence released the PROC handle only after the teardown. Now every handle to
    the engine is released first."""
    pd = PD("kv_consumer", {"kvfence_stuck_handle_s": 0.3})
    (rid,) = _decode_with_read(pd)
    handles = list(pd.worker._recving_transfers[rid])
    pd.steps(60, until=lambda: pd.frees(rid) > 0, sleep=0.02)
    _assert_freed_once_after_teardown(pd, rid)
    teardown = next(i for i, e in enumerate(pd.log) if e[0] == "teardown")
    for h in handles:
        assert ("release", h) in pd.log[:teardown], (
            f"handle {h} released after its engine's teardown (or never): {pd.log}"
        )


# -------------------------------------------------- quarantine, then a late proof of drain


def _pool(pd: PD) -> Any:
    return pd.sched.kv_cache_manager.block_pool


def _quarantined_prefill(pd: PD) -> Tuple[str, List[int], int]:
    """A finished prefill whose lease lapses and whose decode never reports within
    ``kvfence_quarantine_after_s``: returns the request, its blocks and the pool's free
    block count before it was admitted (the idle value)."""
    idle = _pool(pd).get_num_free_blocks()
    rid = _finished_prefill(pd)
    (blocks,) = pd.sched.kv_cache_manager.get_block_ids(rid)
    time.sleep(1.1)
    pd.steps(3)
    time.sleep(0.4)
    pd.steps(3)
    return rid, list(blocks), idle


@patch(BASE_WORKER, FakeNixlWrapper)
def test_late_notification_frees_a_quarantined_room(
    default_vllm_config: Any, dist_init: Any
) -> None:
    """Pull prefill: the lease lapses and no decode reports for
    ``kvfence_quarantine_after_s``: the blocks are quarantined. Then the decode's
    completion notification arrives: the READ has ended, which is the proof the
    quarantine waited for. Before the fix the notification was dropped ("unrecognized")
    and the blocks were lost for good; stock frees them at the lapse. Counted from vLLM's
    own block pool (free blocks back to the idle value)."""
    pd = PD("kv_producer", {"kv_lease_duration": 1, "kvfence_quarantine_after_s": 0.3})
    quarantines = _event_count("quarantine")
    rid, blocks, idle = _quarantined_prefill(pd)
    assert _pool(pd).get_num_free_blocks() == idle - len(blocks), (
        "blocks back in the pool without any proof that the READ ended"
    )
    if KVFENCE:  # counted in the scheduler, from the worker's connector metadata
        assert _event_count("quarantine") == quarantines + 1, "nothing was quarantined"
    notifs = [{"decode-agent": [f"{rid}:1".encode()]}]
    pd.worker.nixl_wrapper.get_new_notifs = lambda: notifs.pop() if notifs else {}
    pd.steps(3)
    assert _pool(pd).get_num_free_blocks() == idle, "the late completion did not free the blocks"
    assert pd.frees(rid) == 1


@patch(BASE_WORKER, FakeNixlWrapper)
def test_quarantined_blocks_are_pinned_not_the_request(
    default_vllm_config: Any, dist_init: Any
) -> None:
    """A quarantined prefill request no longer lives for ever in the scheduler: kvfence's
    scheduler-side connector pins its blocks through vLLM's own ``bind_gpu_block_pool``
    (a reference of its own, their prefix hashes dropped), the worker then reports the
    request sent, and the scheduler frees the request (not the blocks). Before: the
    request was never reported (``frees == 0``, the ``Request`` kept for ever)."""
    pd = PD("kv_producer", {"kv_lease_duration": 1, "kvfence_quarantine_after_s": 0.3})
    rid, blocks, idle = _quarantined_prefill(pd)
    pd.steps(3)
    assert pd.frees(rid) == 1 and rid not in pd.sched.requests, "the quarantined request lives on"
    # Idle, the prefill must keep stepping: the late completion that unpins is read in a
    # step (found on the real pair: the pins outlived the late READ's notification).
    assert not pd.sched.get_num_unfinished_requests()
    assert pd.sched.has_requests(), "an idle prefill with pinned blocks would stop stepping"
    pool = _pool(pd)
    assert pool.get_num_free_blocks() == idle - len(blocks), "quarantined blocks went back"
    for b in blocks:
        assert pool.blocks[b].ref_cnt >= 1 and pool.blocks[b].block_hash is None, (
            f"block {b}: ref_cnt {pool.blocks[b].ref_cnt}, hash {pool.blocks[b].block_hash}"
        )
    # More requests than the free blocks: the pinned blocks are never handed out.
    for _ in range(3):
        other = _finished_prefill(pd)
        (got,) = pd.sched.kv_cache_manager.get_block_ids(other)
        assert not set(got) & set(blocks), "a pinned block was handed to another request"
    notifs = [{"decode-agent": [f"{rid}:1".encode()]}]
    pd.worker.nixl_wrapper.get_new_notifs = lambda: notifs.pop() if notifs else {}
    pd.steps(3)
    assert all(pool.blocks[b].ref_cnt == 0 for b in blocks), "the late completion left a pin"
    assert not pd.sched.connector.has_pending_push_work(), "awake with nothing pinned"


# ------------------------------------------------------------- the blast radius of a -1


def _blast(pd: PD, n: int) -> Tuple[List[str], str]:
    ids = _decode_with_read(pd, n=n)
    bad = set(pd.worker._recving_transfers[ids[0]])
    finish = {"done": False}
    pd.worker.nixl_wrapper.check_xfer_state = lambda h: (
        "ERR" if h in bad else ("DONE" if finish["done"] else "PROC")
    )
    pd.steps(2, sleep=0.01)  # the failure is seen; the healthy READs still in progress
    finish["done"] = True
    pd.steps(300, until=lambda: all(pd.frees(r) for r in ids), sleep=0.01)
    for r in ids:
        assert pd.frees(r) == 1, f"{r} freed {pd.frees(r)} times: {pd.log}"
    return ids, ids[0]


@patch(BASE_WORKER, FakeNixlWrapper)
def test_one_failed_read_fails_only_its_request(default_vllm_config: Any, dist_init: Any) -> None:
    """Four READs from one prefill; one handle fails, the other three complete a step
    later. Before the fix the failure tore the prefill down at once and all four were
    reported failed (blast radius 4 per -1). Now the teardown waits up to
    ``kvfence_failure_grace_s`` for the READs begun before the failure: one request fails,
    its blocks freed once after the teardown; three succeed. (``_grace_zero`` below shows
    the old radius.)"""
    pd = PD("kv_consumer", {"kvfence_failure_grace_s": 5})
    ids, bad = _blast(pd, 4)
    assert pd.failed == [bad], f"failed_recving {pd.failed}, expected only {bad}"
    _assert_freed_once_after_teardown(pd, bad)


@pytest.mark.skipif(not KVFENCE, reason="kvfence only: its failure grace setting")
@patch(BASE_WORKER, FakeNixlWrapper)
def test_blast_radius_grace_zero(default_vllm_config: Any, dist_init: Any) -> None:
    """With ``kvfence_failure_grace_s = 0`` (the behaviour before the grace) a failed handle
    fails every READ in progress from its prefill: the radius is the READs in flight."""
    pd = PD("kv_consumer", {"kvfence_failure_grace_s": 0})
    ids, bad = _blast(pd, 4)
    assert sorted(pd.failed) == sorted(ids)


# ------------------------------------------- a failed READ: the prefill gets its blocks back


@patch(BASE_WORKER, FakeNixlWrapper)
def test_failed_read_gives_the_prefill_its_blocks_back(
    default_vllm_config: Any, dist_init: Any
) -> None:
    """Pull, a prefill and a decode stepped together. The prefill's lease lapses while the
    decode's READ is posted (kvfence holds the blocks: no proof the READ ended); then the
    READ fails and the decode tears the prefill down and fences it. Before the fix nothing
    ever told the prefill: its blocks waited for a notification that never came (held for
    good with ``kvfence_quarantine_after_s = 0``). Now, once the decode has handshaken
    with the prefill again, it sends the READ's own completion notification, which the
    teardown made true, and the prefill frees its blocks once. Stock frees them at the
    lapse, while the READ may still read them."""
    prefill = PD("kv_producer", {"kv_lease_duration": 1, "kvfence_quarantine_after_s": 0})
    prid = _finished_prefill(prefill)
    decode = PD("kv_consumer")
    _decode_with_read(decode, remote_request_id=prid)
    time.sleep(1.1)
    prefill.steps(3)
    assert prefill.frees(prid) == 0, "the prefill freed its blocks while a READ of them was posted"
    sent: List[Tuple[int, bytes]] = []
    decode.worker.nixl_wrapper.send_notif = lambda agent, notif_msg: sent.append(
        (len(decode.log), notif_msg)
    )
    decode.worker.nixl_wrapper.check_xfer_state = lambda h: "ERR"
    decode.steps(200, until=lambda: bool(sent), sleep=0.02)
    assert sent, "the decode never told the prefill that its fenced READ ended"
    at, msg = sent[0]
    teardown = next((i for i, e in enumerate(decode.log) if e[0] == "teardown"), None)
    assert teardown is not None and teardown < at, "notified before the teardown proved the end"
    assert msg == f"{prid}:1".encode()
    inbox = [{"decode-agent": [msg]}]
    prefill.worker.nixl_wrapper.get_new_notifs = lambda: inbox.pop() if inbox else {}
    prefill.steps(3)
    assert prefill.frees(prid) == 1, "the prefill's blocks did not come back"


@patch(BASE_WORKER, FakeNixlWrapper)
def test_request_failed_before_its_read_gives_the_prefill_its_blocks_back(
    default_vllm_config: Any, dist_init: Any
) -> None:
    """Pull. The decode's handshake with the prefill fails, so vLLM fails the request
    before any READ of it is posted (likewise an engine it marked invalid, a declined
    read). vLLM's decode tells the prefill nothing: stock frees the blocks at the lease;
    before this fix a kvfence prefill waited for a notification that never came (held for
    good with ``kvfence_quarantine_after_s = 0``: found on a real pair, e2e/serve's
    ``read_failure``, where a 4-block prefill then served nothing more). Now the decode,
    once a later handshake succeeds, sends the request's completion notification through
    vLLM's own notify-only path (no READ is ever posted for it), and the prefill frees its
    blocks once. Stock: the decode never sends it."""
    prefill = PD("kv_producer", {"kv_lease_duration": 1, "kvfence_quarantine_after_s": 0})
    prid = _finished_prefill(prefill)
    decode = PD("kv_consumer")
    w = decode.worker
    real_handshake = w._nixl_handshake
    handshakes: List[str] = []

    def first_fails(*args: Any, **kwargs: Any) -> Any:
        # vLLM's handshake fails (the request is failed), and kvfence's first retry too
        # (the decode then owes the prefill for a 1 s backoff, idle).
        handshakes.append("fail" if len(handshakes) < 2 else "ok")
        if handshakes[-1] == "fail":
            raise ConnectionError("the prefill did not answer (test)")
        return real_handshake(*args, **kwargs)

    w._nixl_handshake = first_fails
    sent: List[Tuple[str, bytes]] = []
    w.nixl_wrapper.send_notif = lambda agent, notif_msg: sent.append((agent, notif_msg))
    reads: List[Any] = []
    real_read = type(w)._read_blocks

    def spy_read(self: Any, *args: Any, **kwargs: Any) -> Any:
        reads.append(kwargs["read_spec"].local_block_ids)
        return real_read(self, *args, **kwargs)

    req = create_request(do_remote_prefill=True, num_tokens=3 * BLOCK, block_size=BLOCK)
    req.kv_transfer_params["remote_engine_id"] = REMOTE
    req.kv_transfer_params["remote_request_id"] = prid
    req.kv_transfer_params["remote_block_ids"] = ([0, 1, 2],)
    decode.sched.add_request(req)
    rid = req.request_id
    # The decode's engine must keep stepping while it owes the notification, idle or not
    # (vLLM steps an idle engine only while its scheduler has_requests()): recorded
    # after each step, with whether the request was failed and the notification sent.
    awake: List[Tuple[bool, bool, bool]] = []

    def step_and_record() -> bool:
        awake.append((rid in decode.failed, bool(sent), decode.sched.has_requests()))
        return rid in decode.failed and bool(sent)

    with patch.object(type(w), "_read_blocks", spy_read):
        decode.steps(300, until=step_and_record, sleep=0.01)
    assert handshakes and handshakes[0] == "fail", f"the handshake was not failed: {handshakes}"
    assert rid in decode.failed, "vLLM did not fail the request whose handshake failed"
    assert not w._recving_transfers.get(rid), "a READ was posted for the failed request"
    assert sent, "the decode never told the prefill that the failed request will not be read"
    assert [m for _, m in sent] == [f"{prid}:1".encode()], sent
    assert reads and all(not any(ids) for ids in reads), f"a READ was posted: {reads}"
    owing = [a for failed, told, a in awake if failed and not told]
    assert owing and all(owing), (
        f"the idle decode would stop stepping while it owes the prefill (has_requests): {awake}"
    )
    decode.steps(5, sleep=0.01)
    assert len(sent) == 1, f"notified more than once: {sent}"
    assert not decode.sched.has_requests(), "the decode keeps stepping after it paid"
    time.sleep(1.1)
    prefill.steps(3)
    assert prefill.frees(prid) == 0, "the prefill freed its blocks before the decode's word"
    inbox = [{"decode-agent": [sent[0][1]]}]
    prefill.worker.nixl_wrapper.get_new_notifs = lambda: inbox.pop() if inbox else {}
    prefill.steps(3)
    assert prefill.frees(prid) == 1, "the prefill's blocks did not come back"


@pytest.mark.skipif(not KVFENCE, reason="kvfence only: its retries to tell a prefill")
@patch(BASE_WORKER, FakeNixlWrapper)
def test_unreachable_prefill_backoff_then_give_up(
    default_vllm_config: Any, dist_init: Any, monkeypatch: Any
) -> None:
    """A prefill the decode can never reach again (down, or replaced by one with another
    engine id): the decode retries the handshake that would carry the notification with
    a doubling backoff (1 s, 2 s, ...), never once per engine step, and gives up after
    ``_OWED_TRIES`` failures with one event and a warning (the prefill keeps the blocks
    until its own quarantine or restart). Counted: the handshakes, their spacing, the
    event."""
    import kvfence.vllm as kv

    monkeypatch.setattr(kv, "_OWED_TRIES", 3)
    decode = PD("kv_consumer")
    w = decode.worker
    at: List[float] = []

    def never(*args: Any, **kwargs: Any) -> Any:
        at.append(time.monotonic())
        raise ConnectionError("the prefill is gone (test)")

    w._nixl_handshake = never
    ours: List[float] = []  # the handshakes kvfence started (vLLM may start its own)
    real_ensure = w._ensure_handshake

    def ensure(*args: Any, **kwargs: Any) -> Any:
        if sys._getframe(1).f_code.co_name == "_kvf_pay":
            ours.append(time.monotonic())
        return real_ensure(*args, **kwargs)

    w._ensure_handshake = ensure
    given_up = _event_count("owed_given_up")
    req = create_request(do_remote_prefill=True, num_tokens=3 * BLOCK, block_size=BLOCK)
    req.kv_transfer_params["remote_engine_id"] = REMOTE
    req.kv_transfer_params["remote_block_ids"] = ([0, 1, 2],)
    decode.sched.add_request(req)
    decode.steps(
        1000, until=lambda: _event_count("owed_given_up") > given_up, sleep=0.01
    )
    assert _event_count("owed_given_up") == given_up + 1, "the decode never gave up"
    assert REMOTE not in w._kvf_owed
    # kvfence's: one at once, one 1 s after its failure, one 2 s after the next (the
    # third failure gives up).
    assert len(ours) == 3, f"kvfence started {len(ours)} handshakes (3 expected): a spin?"
    gaps = [b - a for a, b in zip(ours, ours[1:])]
    assert gaps[0] >= 0.9 and gaps[1] >= 1.9, f"no backoff between handshakes: {gaps}"
    n = len(at)
    decode.steps(50, sleep=0.01)
    assert len(ours) == 3 and len(at) == n, "handshakes went on after the decode gave up"


# ------------------------------------------------- what real NIXL hands out: handle objects


class _Handle:
    """What real NIXL's ``make_prepped_xfer`` returns: an object (``nixl_xfer_handle``),
    not the ``int`` of vLLM's ``FakeNixlWrapper``."""

    __slots__ = ("h",)

    def __init__(self, h: int) -> None:
        self.h = h


@pytest.mark.skipif(not KVFENCE, reason="kvfence only: its bookkeeping of NIXL handles")
@patch(BASE_WORKER, FakeNixlWrapper)
def test_read_completes_with_real_nixl_handle_objects(
    default_vllm_config: Any, dist_init: Any
) -> None:
    """Found on the real server (e2e/serve): kvfence told its own keys from NIXL handles by
    ``isinstance(key, int)``; real NIXL handles are objects, so a completed READ never
    completed its transfer and every decode request waited for ever. Here the fake
    wrapper hands out objects: the READ completes and the request leaves
    WAITING_FOR_REMOTE_KVS, its handle released once."""
    pd = PD("kv_consumer")
    w = pd.worker.nixl_wrapper
    make, check, release = w.make_prepped_xfer, w.check_xfer_state, w.release_xfer_handle
    w.make_prepped_xfer = lambda *a, **k: _Handle(make(*a, **k))
    w.check_xfer_state = lambda h: check(h.h)
    w.release_xfer_handle = lambda h: release(h.h)
    (rid,) = _decode_with_read(pd, cycles=3)
    assert all(isinstance(h, _Handle) for h in pd.worker._recving_transfers[rid])
    pd.steps(30, until=lambda: pd.sched.requests[rid].status != RequestStatus.WAITING_FOR_REMOTE_KVS,
             sleep=0.01)
    assert pd.sched.requests[rid].status != RequestStatus.WAITING_FOR_REMOTE_KVS, (
        "the READ completed but kvfence never released the request's room"
    )
    assert sum(1 for e in pd.log if e[0] == "release") == 1
