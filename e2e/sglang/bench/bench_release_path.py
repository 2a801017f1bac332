"""The decode release path per request and the prefill cost per chunk, stock SGLang 0.5.23
vs kvfence.sglang, side by side in one process (``install()`` / ``uninstall()`` between
rounds, alternating), at 10, 1,000 and 10,000 requests in flight.

    python e2e/sglang/bench/bench_release_path.py [--rounds 5] [--sizes 10,1000,10000] [--json]

Decode, SGLang's real methods on managers, receivers and a DecodeTransferQueue built with
``__new__`` plus fakes, as SGLang's own unit tests do (no ZMQ, network or allocator; the
metadata and the ABORT go to a fake socket, ``release_kv_cache`` is a no-op): for N requests in flight
whose destinations were published, one lifecycle is timed phase by phase:

* ``open``      ``send_metadata``: SGLang's own (its metadata message built for each
                prefill rank and handed to the fake socket); kvfence's wrapper around it
                also keeps the request's writers and holds on the receiver (no room, no
                count)
* ``abort``     ``CommonKVReceiver.abort()`` (fan-out to the fake socket); kvfence opens
                the room of the request whose metadata went out here
* ``pop``       ``DecodeTransferQueue.pop_transferred()`` with N Failed polls -> N held
* ``scan_first`` the first ``resolve_deferred_releases()`` after the pop, N held, none
                releasable (kvfence checks each new entry once here), per held request
* ``scan``      a later ``resolve_deferred_releases()``, N held, none releasable: what the
                scheduler pays every loop iteration while they are held (median of 3
                calls), per held request
* ``ack``       ``handle_abort_ack_message(ABORT_ACK)`` for each (decode_thread)
* ``trickle``   ``resolve_deferred_releases()`` after the ACKs of 1 % of them (at least
                one): the iteration that releases those k while N - k stay held, per
                held request
* ``release``   ``resolve_deferred_releases()`` releasing the other N - k (``_do_release``
                each), per released request
* ``lifecycle`` open + abort + pop + scan_first + ack + release: one aborted request's
                whole cost in the release path, the per-iteration scans not included
                (``breakeven_iterations``: after how many scheduler iterations held the
                per-iteration saving, stock's ``scan`` minus kvfence's, repays kvfence's
                extra ``lifecycle`` cost)
* ``success_clear`` the normal path (the transfer succeeded): ``receiver.clear()`` with
                the room's status Success, which SGLang's ``pop_transferred`` calls
                through ``_commit_transfer_to_req`` (kvfence adds nothing there: only
                ``open`` above, at ``send_metadata``); per request
* ``success_drain`` the scheduler iteration after those clears:
                ``resolve_deferred_releases()`` with nothing held, where kvfence takes
                whatever the finished rooms left to drain; per request
* ``success``   open + success_clear + success_drain: a successful request's whole cost
                in the release path (stock: its clear and that iteration)
* ``idle_scan`` ``resolve_deferred_releases()`` with nothing held and N rooms open (every
                scheduler iteration without an aborted request); per call (a loop
                of 200 calls timed), not per request

Prefill: ``MooncakeKVManager.transfer_worker`` (the real loop) on a real prefill manager,
draining a queue of chunks spread over N open rooms; per chunk:

* ``prefill_chunk``      the Mooncake engine replaced by one that completes every write
                         at once (what the worker itself costs: kvfence's share is
                         largest here);
* ``prefill_chunk_real`` the real Mooncake engine writing each chunk (4 pages of each KV
                         buffer) over TCP to the prefill's own segment on loopback, for
                         the first 50 rooms (N open); 7 repetitions per round.

Decode phases run with the garbage collector off (after collecting the young
generations), as ``timeit`` runs. Reported: per round the median over max(3, 2000 / N) repetitions, then the median over
rounds of each phase's time per request (per chunk), and the median of the per-round
ratios kvfence/stock. Machine: whatever runs it (results
committed in RESULTS.md name it).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any, Dict, List

import numpy as np

os.environ.setdefault("SGLANG_HOST_IP", "127.0.0.1")
os.environ.setdefault("MOONCAKE_PROTOCOL", "tcp")
os.environ.setdefault("MC_FORCE_TCP", "1")
os.environ.setdefault("SGLANG_ENABLE_FAILED_SESSION_PROBE", "0")
os.environ.setdefault("SGLANG_DISAGGREGATION_QUEUE_SIZE", "1")
os.environ.setdefault("SGLANG_DISAGGREGATION_THREAD_POOL_SIZE", "1")
os.environ.setdefault("GLOG_minloglevel", "3")
os.environ["KVFENCE_SGLANG"] = "0"  # this script toggles install() itself

import kvfence.sglang as ks  # noqa: E402
from sglang.srt.disaggregation import decode as dec  # noqa: E402
from sglang.srt.disaggregation.base.conn import KVPoll  # noqa: E402
from sglang.srt.disaggregation.common.conn import AbortAck, CommonKVReceiver  # noqa: E402
from sglang.srt.disaggregation.mooncake.conn import (  # noqa: E402
    MooncakeKVManager,
    MooncakeKVReceiver,
)

import logging  # noqa: E402

# SGLang logs one error line per failed transfer; the benchmark measures code, not I/O.
logging.getLogger("sglang").setLevel(logging.CRITICAL)
dec.release_kv_cache = lambda req, tree_cache, checkpoint=False, **kw: None
dec.prepare_abort = lambda *a, **kw: None


class _Sock:
    def send_multipart(self, frames: List[bytes]) -> None:
        pass


_LOCK = threading.Lock()


_decode_mgrs: Dict[bool, Any] = {}
# The prefill instance's info: SGLang makes one per instance (try_ensure_parallel_info) and
# every receiver of the instance reads it at init; one instance for the whole run.
_PREFILL_INFO = SimpleNamespace(pp_size=1, attn_cp_size=1)


def new_decode_manager() -> Any:
    """A decode MooncakeKVManager made with ``__new__``, with what SGLang's own
    ``send_metadata`` reads of its manager."""
    mgr = MooncakeKVManager.__new__(MooncakeKVManager)
    mgr.enable_staging = False
    mgr.local_ip, mgr.rank_port = "127.0.0.1", 5000
    mgr.engine = SimpleNamespace(get_session_id=lambda: "127.0.0.1:17000")
    return mgr


def decode_manager(kvfence_on: bool) -> Any:
    """One decode manager per side for the whole run, as in a server (kvfence's has a
    gate: its table is made once, not per lifecycle)."""
    mgr = _decode_mgrs.get(kvfence_on)
    if mgr is None:
        from kvfence.sglang import decode as kdec

        mgr = _decode_mgrs[kvfence_on] = new_decode_manager()
        if kvfence_on:
            kdec.attach(mgr)
    return mgr


# SGLang's own send_metadata (its message built for every prefill rank, sent to the fake
# socket below), as the scheduler runs it for every request; kvfence wraps it. SGLang
# 0.5.23 defines it on CommonKVReceiver, 0.5.22 on MooncakeKVReceiver (no destination
# parameter): kvfence's wrapper for each.
_SEND_OWNER = MooncakeKVReceiver if "send_metadata" in MooncakeKVReceiver.__dict__ \
    else CommonKVReceiver
_sglang_send_metadata = getattr(_SEND_OWNER.__dict__["send_metadata"],
                                "__kvfence_original__", _SEND_OWNER.__dict__["send_metadata"])


# kvfence_on -> send_metadata as the benchmark calls it (the A/B sets other adapters')
SEND_METADATA: Dict[bool, Any] = {False: _sglang_send_metadata}


def send_metadata(kvfence_on: bool) -> Any:
    """``send_metadata`` as a server would run it (kvfence: its wrapper around SGLang's)."""
    f = SEND_METADATA.get(kvfence_on)
    if f is None:
        from kvfence.sglang import decode as kdec

        wrap = kdec._send_metadata_0522 if _SEND_OWNER is MooncakeKVReceiver \
            else kdec._send_metadata
        f = SEND_METADATA[kvfence_on] = wrap(_sglang_send_metadata)
    return f


def _median_call(f: Any, k: int) -> float:
    """The median time of ``k`` calls of ``f()``."""
    times = []
    for _ in range(k):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# Each variant's receivers are of their own subclass of MooncakeKVReceiver (no method of
# its own): CPython shares an instance attribute layout per class, so an attribute one
# variant adds to its receivers (kvfence's, or another adapter's in the A/B) must not
# change the layout, and the attribute loads, of another's. (Measured on the dev box: in
# one class, a second adapter's attribute name made the first's receivers keep their
# attributes in a dict: SGLang's own clear() 1.3x slower on them.)
RECEIVER_CLASS: Dict[Any, type] = {}


def _receiver_class(kvfence_on: Any) -> type:
    cls = RECEIVER_CLASS.get(kvfence_on)
    if cls is None:
        cls = RECEIVER_CLASS[kvfence_on] = type(
            "BenchReceiver_%s" % kvfence_on, (MooncakeKVReceiver,), {})
    return cls


def _receiver(mgr: Any, room: int, info: Any, cls: type = MooncakeKVReceiver) -> Any:
    """A receiver whose destinations were published (one prefill rank), built with
    ``__new__`` as SGLang's own unit tests do."""
    r = cls.__new__(cls)
    r.kv_mgr, r.bootstrap_room, r.bootstrap_addr = mgr, room, "127.0.0.1:8998"
    r.prefill_info, r.target_tp_ranks, r.target_cp_ranks, r.target_pp_ranks = info, [0], [0], [0]
    r.bootstrap_infos = [{"rank_ip": "127.0.0.1", "rank_port": 7000, "is_dummy": False}]
    r.init_time, r.abort_notified, r.conclude_state = 1.0, False, None
    r._abort_generation, r._owns_bootstrap_room = None, True
    r.required_dst_info_num = 1
    r.session_id = "127.0.0.1:17000"  # (0.5.22's send_metadata reads it)
    r._connect_to_bootstrap_server = _connect
    return r


_SOCK = (_Sock(), _LOCK)


def _connect(bootstrap_info: Any) -> Any:
    """The receivers' connection to a prefill's bootstrap server: a fake socket (the
    messages SGLang builds are dropped, not sent)."""
    return _SOCK


def _gc_off(f: Any) -> Any:
    """Runs ``f`` with the garbage collector off (as ``timeit`` does), after collecting
    the young generations (the previous run's garbage): a full collection of 10,000
    requests' objects landing inside one timed phase was measured as that phase's cost
    (~40 us per request) in earlier runs, for either side at random. (Not a full
    collection before each run: it walks the whole heap and leaves the caches cold, which
    doubled every phase at 10 in flight.) Both sides run the same way."""
    def run(*a: Any, **kw: Any) -> Any:
        gc.collect(1)
        gc.disable()
        try:
            return f(*a, **kw)
        finally:
            gc.enable()
    run.__doc__ = f.__doc__
    return run


@_gc_off
def decode_lifecycle(n: int, kvfence_on: bool) -> Dict[str, float]:
    mgr = decode_manager(kvfence_on)
    mgr._deferred_abort_ack_tracker = {}
    mgr._deferred_abort_generation = 0
    mgr.enable_deferred_decode_kv_release = True
    mgr.failure_lock = threading.Lock()
    mgr.failure_records = {}
    mgr.request_status = {}
    mgr.local_ip, mgr.rank_port = "127.0.0.1", 5000
    mgr.deferred_bootstrap = None
    mgr.defer_decode_allocation = False
    mgr.addr_to_rooms_tracker = {"127.0.0.1:8998": set()}
    mgr.required_prefill_response_num_table = {}
    mgr.prefill_response_tracker = {}
    mgr.enable_staging = False
    info = _PREFILL_INFO
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
    q.metadata_buffers = SimpleNamespace(clear_slot=lambda idx: None, bootstrap_room={})
    q.req_to_metadata_buffer_idx_allocator = SimpleNamespace(free=lambda idx: None)
    q.scheduler = SimpleNamespace(
        enable_decode_hicache=False, enable_hisparse=False,
        output_streamer=SimpleNamespace(stream_output=lambda reqs, logprob: None),
        metrics_reporter=SimpleNamespace(enable_metrics=False))
    q._clean_hicache_prefetch_resources = lambda decode_req: None
    reqs = []
    for i in range(n):
        room = 1_000_000 + i
        r = _receiver(mgr, room, info, _receiver_class(kvfence_on))
        mgr.request_status[room] = KVPoll.WaitingForInput
        reqs.append(dec.DecodeRequest(
            req=SimpleNamespace(rid="r%d" % i, bootstrap_room=room, return_logprob=False,
                                finished_reason=None),
            kv_receiver=r, metadata_buffer_index=i % 64))
    pages = np.arange(16, dtype=np.int32)
    t: Dict[str, float] = {}
    send = send_metadata(kvfence_on)
    t0 = time.perf_counter()
    for d in reqs:
        send(d.kv_receiver, pages, 0, None)
    t["open"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for d in reqs:
        d.kv_receiver.abort()
    t["abort"] = time.perf_counter() - t0
    q.queue = list(reqs)
    q._poll_with_metadata_gate = lambda n=n: [KVPoll.Failed] * n
    receivers = [d.kv_receiver for d in reqs]
    t0 = time.perf_counter()
    q.pop_transferred()
    t["pop"] = time.perf_counter() - t0
    assert len(q._deferred_releases) == n, len(q._deferred_releases)
    t0 = time.perf_counter()
    q.resolve_deferred_releases()
    t["scan_first"] = time.perf_counter() - t0
    t["scan"] = _median_call(q.resolve_deferred_releases, 3)
    assert len(q._deferred_releases) == n
    msgs = [AbortAck(r.bootstrap_room, 0, r._abort_generation).to_zmq() for r in receivers]
    k = max(1, n // 100)
    t0 = time.perf_counter()
    for m in msgs[:k]:
        mgr.handle_abort_ack_message(m)
    t["ack"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    q.resolve_deferred_releases()
    t["trickle"] = time.perf_counter() - t0
    assert len(q._deferred_releases) == n - k, (len(q._deferred_releases), n, k)
    # Exactly the k ACKed rooms were released (_do_release ends their receiver); every
    # other one is still held, in order.
    assert all(d.kv_receiver is None for d in reqs[:k])
    assert [e[0] for e in q._deferred_releases] == reqs[k:]
    t0 = time.perf_counter()
    for m in msgs[k:]:
        mgr.handle_abort_ack_message(m)
    t["ack"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    q.resolve_deferred_releases()
    t["release"] = time.perf_counter() - t0
    assert not q._deferred_releases, len(q._deferred_releases)
    out = {k2: v / n for k2, v in t.items()}
    if n > k:
        out["release"] = t["release"] / (n - k)
    out["lifecycle"] = sum(out[p] for p in ("open", "abort", "pop", "scan_first", "ack", "release"))
    return out


@_gc_off
def decode_success(n: int, kvfence_on: bool) -> Dict[str, float]:
    """The normal path: N rooms open (kvfence) whose transfers succeeded; one idle
    scheduler iteration (nothing held), then each receiver's ``clear()``."""
    mgr = decode_manager(kvfence_on)
    mgr.request_status = {}
    mgr.required_prefill_response_num_table = {}
    mgr.prefill_response_tracker = {}
    mgr.addr_to_rooms_tracker = {"127.0.0.1:8998": set()}
    mgr.defer_decode_allocation = False
    info = _PREFILL_INFO
    q = dec.DecodeTransferQueue.__new__(dec.DecodeTransferQueue)
    q._deferred_releases = []
    q.gloo_group = None
    receivers = []
    for i in range(n):
        room = 3_000_000 + i
        r = _receiver(mgr, room, info, _receiver_class(kvfence_on))
        mgr.request_status[room] = KVPoll.Success
        mgr.addr_to_rooms_tracker["127.0.0.1:8998"].add(room)
        receivers.append(r)
    gate = getattr(mgr, "_kvfence_gate", None)
    pages = np.arange(16, dtype=np.int32)
    send = send_metadata(kvfence_on)
    for r in receivers:
        send(r, pages, 0, None)
    t: Dict[str, float] = {}
    # Per call, from a loop of 200 (nothing held: each call is the same): one call alone
    # is a tenth of a microsecond, of the order of the timer's own overhead.
    f = q.resolve_deferred_releases
    t0 = time.perf_counter()
    for _ in range(200):
        f()
    t["idle_scan"] = (time.perf_counter() - t0) / 200
    t0 = time.perf_counter()
    for r in receivers:
        r.clear()
    t["success_clear"] = (time.perf_counter() - t0) / n
    assert not mgr.request_status and all(r.conclude_state == KVPoll.Success for r in receivers)
    t0 = time.perf_counter()
    q.resolve_deferred_releases()
    t["success_drain"] = (time.perf_counter() - t0) / n
    if gate is not None:
        # No room ever opened: nothing left.
        # (room_handles since issue 38; room_handle in the adapters the A/B compares with)
        assert not gate.records and not getattr(gate, "room_handles",
                                                getattr(gate, "room_handle", None)), gate
        assert not gate.decided and not gate.table.queued_releases()
        assert gate.table.stats()["rooms_owned"] == 0
    return t


class _FakeEngine:
    def batch_transfer_sync(self, session_id: str, srcs: Any, dsts: Any, lens: Any) -> int:
        return 0

    def transfer_sync(self, *a: Any) -> int:
        return 0


_FAKE_ENGINE = _FakeEngine()


class _ListQueue:
    """The worker's queue: the chunks, then None (SGLang's teardown sentinel). Times the
    worker from its first ``get`` to its last: the chunks' processing, not the worker's
    start (kvfence wraps its queue then: once per worker thread in a server, once per
    measurement here)."""

    def __init__(self, items: List[Any]) -> None:
        self.items = items
        self.i = 0
        self.t_first = self.t_last = 0.0

    def get(self) -> Any:
        if self.i == len(self.items):
            self.t_last = time.perf_counter()
            return None
        if self.i == 0:
            self.t_first = time.perf_counter()
        self.i += 1
        return self.items[self.i - 1]

    def put(self, x: Any) -> None:
        self.items.append(x)


_prefill: Dict[str, Any] = {}


def prefill_manager() -> Any:
    """A real prefill MooncakeKVManager (built once, with kvfence's gate attached: the
    stock rounds run with uninstall(), where no wrapper consults it)."""
    if _prefill:
        return _prefill["mgr"]
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from harness import node

    port = 40000 + os.getpid() % 5000
    node.ROLE = "prefill"
    p = node.Prefill(port, port + 11)
    _prefill["engine"] = p.mgr.engine  # the real one, for prefill_chunks(real=True)
    p.mgr.engine = _FAKE_ENGINE
    _prefill["node"], _prefill["mgr"] = p, p.mgr
    return p.mgr


def decode_kv_args(mgr: Any) -> Any:
    """A decode rank's registration as the prefill keeps it (``decode_kv_args_table``):
    its KV buffers are the prefill's own (the writes go nowhere: the engine is a fake)."""
    return SimpleNamespace(
        requires_dcp_relayout=False, dst_kv_ptrs=list(mgr.kv_args.kv_data_ptrs),
        dst_kv_layer_ids=None, dst_kv_item_len=mgr.kv_args.kv_item_lens[0],
        dst_attn_tp_size=1, dst_aux_ptrs=[], staging_base_ptr=0, staging_total_size=0,
        dst_tp_rank=0, dst_state_data_ptrs=[], dst_kv_item_lens=None, dst_dcp_size=1,
        dst_dcp_rank=0, dcp_token_item_lens=None, state_layout=None)


def prefill_chunks(n: int, chunks: int, kvfence_on: bool, real: bool = False) -> float:
    """The worker's time per chunk: ``chunks`` chunks for each of ``n`` open rooms, each
    written by a fake engine that returns at once; with ``real``, by the prefill's real
    Mooncake engine over TCP (to its own segment on loopback: 4 pages of each of its KV
    buffers per chunk), for the first 50 rooms only (every one of the ``n`` is open)."""
    from sglang.srt.disaggregation.common.utils import TransferKVChunk
    from sglang.srt.disaggregation.mooncake.conn import TransferInfo
    mgr = prefill_manager()
    gate = getattr(mgr, "_kvfence_gate", None)
    session = _prefill["engine"].get_session_id() if real else "127.0.0.1:1"
    mgr.engine = _prefill["engine"] if real else _FAKE_ENGINE
    mgr.decode_kv_args_table[session] = decode_kv_args(mgr)
    items = []
    for i in range(n):
        room = 5_000_000 + i
        mgr.request_status[room] = KVPoll.Transferring
        mgr.transfer_infos[room] = {session: TransferInfo(
            room=room, endpoint="127.0.0.1", dst_port=1, mooncake_session_id=session,
            dst_kv_indices=np.arange(64, dtype=np.int32), dst_aux_index=0,
            dst_state_indices=[], required_dst_info_num=1, is_dummy=False)}
        if kvfence_on and gate is not None:
            gate.open_room(room)
    for c in range(chunks):
        for i in range(min(n, 50) if real else n):
            items.append(TransferKVChunk(
                room=5_000_000 + i, prefill_kv_indices=np.arange(4, dtype=np.int32) + 4 * (c % 8),
                index_slice=slice(4 * (c % 8), 4 * (c % 8) + 4), is_last_chunk=False,
                prefill_aux_index=None, state_indices=None))
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        q = _ListQueue(items)
        mgr.transfer_worker(q, ex)
        dt = q.t_last - q.t_first
    for i in range(n):
        room = 5_000_000 + i
        mgr.request_status.pop(room, None)
        mgr.transfer_infos.pop(room, None)
        if gate is not None:
            gate.close(room)
            gate.pump(mgr)
    mgr.engine = _FAKE_ENGINE
    assert not mgr.failed_sessions, mgr.failed_sessions
    return dt / len(items)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default="10,1000,10000")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    ks.install()  # attach the prefill gate when the manager is built, then toggle
    prefill_manager()
    phases = ["open", "abort", "pop", "scan_first", "scan", "ack", "trickle", "release",
              "lifecycle", "success_clear", "success_drain", "success", "idle_scan",
              "prefill_chunk", "prefill_chunk_real"]
    raw: Dict[int, Dict[str, Dict[str, List[float]]]] = {
        n: {rule: {p: [] for p in phases} for rule in ("stock", "kvfence")} for n in sizes}
    for rnd in range(args.rounds):
        for n in sizes:
            reps = max(3, 2000 // n)
            order = ("stock", "kvfence") if rnd % 2 == 0 else ("kvfence", "stock")
            for rule in order:
                (ks.install if rule == "kvfence" else ks.uninstall)()
                acc: Dict[str, List[float]] = {p: [] for p in phases}
                for _ in range(reps):
                    life = decode_lifecycle(n, rule == "kvfence")
                    for k, v in life.items():
                        acc[k].append(v)
                    ok = decode_success(n, rule == "kvfence")
                    for k, v in ok.items():
                        acc[k].append(v)
                    acc["success"].append(life["open"] + ok["success_clear"] + ok["success_drain"])
                    acc["prefill_chunk"].append(prefill_chunks(n, 2, rule == "kvfence"))
                for _ in range(7):
                    acc["prefill_chunk_real"].append(
                        prefill_chunks(n, 2, rule == "kvfence", real=True))
                for p in phases:
                    raw[n][rule][p].append(statistics.median(acc[p]))
        print("round %d done" % (rnd + 1), file=sys.stderr, flush=True)
    ks.uninstall()
    out = []
    for n in sizes:
        for p in phases:
            s, k = raw[n]["stock"][p], raw[n]["kvfence"][p]
            ratios = [b / a for a, b in zip(s, k) if a > 0]
            out.append({"in_flight": n, "phase": p, "stock_us": statistics.median(s) * 1e6,
                        "kvfence_us": statistics.median(k) * 1e6,
                        "ratio": statistics.median(ratios) if ratios else None})
    # An aborted request's extra cost under kvfence (its lifecycle) against what kvfence
    # saves on each scheduler iteration it is held (stock scans it, kvfence does not):
    # the iterations held after which kvfence has cost less for it than stock.
    med = {(r["in_flight"], r["phase"]): r for r in out}
    breakeven: Dict[int, Any] = {}
    for n in sizes:
        life, scan = med[(n, "lifecycle")], med[(n, "scan")]
        saved = scan["stock_us"] - scan["kvfence_us"]
        extra = life["kvfence_us"] - life["stock_us"]
        breakeven[n] = None if saved <= 0 else max(0.0, extra / saved)
    if args.json:
        print(json.dumps({"rounds": args.rounds, "results": out,
                          "breakeven_iterations": breakeven}, indent=1))
    else:
        print("%9s  %-14s %10s %11s %8s" % ("in flight", "phase", "stock us", "kvfence us", "ratio"))
        for r in out:
            print("%9d  %-14s %10.2f %11.2f %8s" % (
                r["in_flight"], r["phase"], r["stock_us"], r["kvfence_us"],
                "%.2fx" % r["ratio"] if r["ratio"] else "-"))
        for n in sizes:
            k = breakeven[n]
            print("%9d  an aborted request costs less under kvfence once held %s" % (
                n, "%.1f scheduler iterations" % k if k is not None else "(never: no saving)"))
    os._exit(0)


if __name__ == "__main__":
    main()
