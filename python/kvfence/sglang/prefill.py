"""The prefill side: every chunk the transfer worker takes runs under a kvfence transfer
on its room, and the drain ACK goes out only when kvfence says the room's transfers have
ended.

One :class:`PrefillGate` (a gate-mode :class:`kvfence.RoomTable` with no writers per room:
the prefill protects its writes with transfers only) is attached to each prefill
``MooncakeKVManager``:

==============================================  ===============================================
SGLang method (0.5.22 and 0.5.23)               what kvfence adds
==============================================  ===============================================
``CommonKVSender.__init__``                     opens the request's room; with no room
                                                free the request fails (never ungated)
``MooncakeKVManager.transfer_worker``           its queue is wrapped in a
                                                :class:`kvfence.TransferQueue`, whose
                                                ``get`` begins a transfer on the dequeued
                                                chunk's room and ends the previous chunk's:
                                                every write the worker makes for a chunk
                                                (KV pages, state slots, the decode's
                                                metadata row) is inside it; refused once the
                                                room is aborted (SGLang then skips the
                                                chunk: it marked the room Failed first)
``MooncakeKVManager._poison_unsettled_send``    a write returned -1: ``fail()`` on the
                                                chunk's transfer (Mooncake may still be
                                                writing: the room is never "drained"),
                                                and the decode is told, with a reason
                                                (``_tell_decode``: its transport reset)
``MooncakeKVManager._handle_abort_notification``  ``abort`` on the room (after SGLang marked
                                                it Failed and registered the ACK target)
``CommonKVManager._maybe_ack_drained_abort``    holds the ACK while kvfence's room is not
                                                released (a chunk's transfer open), and for
                                                good after a ``fail()``
``CommonKVSender.clear``                        ``finish``; a room with a failed write is
                                                quarantined (never ACKed)
``CommonKVSender.abort``                        ``abort`` on the room (a request aborted in
                                                the waiting queue is never cleared: its
                                                room is released once nothing of it is in
                                                flight)
==============================================  ===============================================

No write method is wrapped: a chunk costs one native call (the queue's ``get``: the
previous chunk's transfer ended, the next one's begun, no Python frame), and SGLang's own
per-chunk ``_maybe_ack_drained_abort`` call returns early for a room kvfence holds.

Why a chunk's transfer spans from its dequeue to the worker's next ``get``: that span
covers every write the worker makes for the chunk, whichever method makes it (the staging
path's included), and ends before the worker blocks for more work, so an idle worker holds
no room. Between the chunk's last write and that ``get`` SGLang only does its own
bookkeeping; its ``_maybe_ack_drained_abort`` for the room is held meanwhile, and
:meth:`PrefillGate.pump` sends it when the transfer's end releases the room. A write that
returns -1 makes SGLang call ``_poison_unsettled_send``, whose wrapper fails the chunk's
transfer then and there (Mooncake may still be writing: the room is never "drained", and
the ``clear()`` that follows finds the failure and quarantines the room).

A chunk whose transfer is refused (its room aborted, or finished and released) is handed
to SGLang all the same, with no transfer: SGLang's own check right after the ``get``
skips it, because SGLang marks a room Failed before kvfence aborts it
(``_handle_abort_notification``'s wrapper) and drops its status before kvfence finishes
it (``clear``'s). A chunk that passed that check just before the ABORT holds its transfer,
so the room's release waits for it: its write lands in pages the decode still holds.
(``python/tests/sglang_prefill_gate_check.py`` takes SGLang's own drain count and poison
set away and shows this gate alone holds the ACK.)
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import kvfence

from . import _state
from ._patching import require_params
from ._state import logger

__all__ = ["PrefillGate", "patches"]

_tls = threading.local()


@dataclass
class PrefillGate:
    """kvfence's state for one prefill KV manager."""

    table: kvfence.RoomTable
    room_handle: Dict[int, int] = field(default_factory=dict)  # bootstrap_room -> handle
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Released lifecycles (handle -> reason). A room's mapping outlives its release, so a
    # chunk of it dequeued after the release is refused (StaleHandle), not run ungated.
    released: Dict[int, str] = field(default_factory=dict)
    # The transfer workers' queues (kvfence.TransferQueue), bound to this gate.
    queues: List[kvfence.TransferQueue] = field(default_factory=list)
    failed_elsewhere: int = 0  # -1s of a room no worker queue was processing
    quarantined_rooms: int = 0
    refused_rooms: int = 0  # requests failed because the table had no room free
    # A handle of this table that names no live room (opened and finished at once): a
    # room mapped to it has every chunk refused (StaleHandle).
    refuse_handle: int = -1

    def __post_init__(self) -> None:
        h = self.table.open([], [], token=0)
        self.table.finish(h)
        self.refuse_handle = h

    @property
    def refused_chunks(self) -> int:
        """Chunks not written: their room was aborted (or released) when dequeued."""
        return sum(q.refused for q in list(self.queues))

    @property
    def failed_transfers(self) -> int:
        """Chunks a write of which returned -1 (their bytes may still land)."""
        return self.failed_elsewhere + sum(q.failed for q in list(self.queues))

    def __hash__(self) -> int:
        return id(self)

    def open_room(self, room: int) -> Optional[int]:
        """A new request on ``room``: a new kvfence lifecycle. ``None`` if the table
        refused it (full): the room is then mapped to :attr:`refuse_handle`, so that
        every chunk of it is refused (never written ungated), and the caller fails the
        request."""
        try:
            h = self.table.open([], [], token=room & 0xFFFF_FFFF_FFFF_FFFF)
        except kvfence.Error as e:
            self.refused_rooms += 1
            logger.error("kvfence: cannot open prefill room %s: %s; the request fails "
                         "(KVFENCE_SGLANG_ROOMS is %d)", room, e, self.table.rooms)
            old = self.room_handle.get(room)
            self.room_handle[room] = self.refuse_handle
            if old is not None:
                self.released.pop(old, None)
            return None
        old = self.room_handle.get(room)
        self.room_handle[room] = h
        if old is not None:
            self.released.pop(old, None)
        if len(self.room_handle) > 2 * self.table.rooms:
            self._prune()
        return h

    def _prune(self) -> None:
        """Forgets the oldest released lifecycles (bounded memory)."""
        with self.lock:
            for room, h in list(self.room_handle.items()):
                if len(self.room_handle) <= self.table.rooms:
                    break
                if h in self.released:
                    del self.room_handle[room]
                    del self.released[h]

    def abort(self, room: int) -> None:
        """The decode's ABORT for ``room``."""
        h = self.room_handle.get(room)
        if h is None:
            return
        try:
            self.table.abort(h)
        except (kvfence.RoomClosed, kvfence.StaleHandle):
            pass

    def close(self, room: int) -> None:
        """The sender is done with ``room``: finish it, or quarantine it if a write of it
        failed (it can never be proven drained: no ACK will be sent)."""
        h = self.room_handle.get(room)
        if h is None or h in self.released:
            return
        try:
            if self.table.room_status(h).get("failed", 0):
                self.table.quarantine(h)
                self.quarantined_rooms += 1
                logger.warning("kvfence: prefill room %s quarantined: a write to the decode "
                               "failed (-1) and may still land; its ABORT is never ACKed", room)
            else:
                self.table.finish(h)
        except (kvfence.RoomClosed, kvfence.StaleHandle):
            pass
        except kvfence.Error as e:
            logger.error("kvfence: closing prefill room %s: %s", room, e)

    def pump(self, mgr: Any) -> None:
        """Takes kvfence's releases; each released room may now be ACKed."""
        if not self.table.queued_releases():
            return
        for r in self.table.drain_released():
            room = int(r.token)
            self.released[r.handle] = r.reason
            if r.reason != "quarantined" and self.room_handle.get(room) == r.handle:
                mgr._maybe_ack_drained_abort(room)


def _gate(mgr: Any) -> Optional[PrefillGate]:
    return getattr(mgr, _KEY, None)


def attach(mgr: Any) -> PrefillGate:
    """Attaches a gate to a prefill manager (from the wrapped ``__init__``)."""
    gate = PrefillGate(kvfence.RoomTable(_state.config.rooms, release_queue=False))
    with _unbound_lock:
        setattr(mgr, _KEY, gate)
        for q in _unbound.pop(mgr, []):
            _bind(q, gate, mgr)
    # The generation-tagged drain ACK, whatever the deferred-release flag says.
    mgr.enable_deferred_decode_kv_release = True
    _state.prefill_gates.add(gate)
    return gate


_KEY = "_kvfence_gate"  # the gate, an attribute of a prefill manager (read with getattr:
# touching a manager's __dict__ slows every attribute load of SGLang's own code on it)
_ROOM_GONE = (kvfence.RoomClosed, kvfence.StaleHandle)


# The worker queues made before their manager's gate was attached (SGLang starts the
# transfer workers inside MooncakeKVManager.__init__, before the wrapped __init__ attaches
# the gate; no chunk is queued before that): bound by attach().
_unbound: "weakref.WeakKeyDictionary[Any, List[kvfence.TransferQueue]]" = \
    weakref.WeakKeyDictionary()
# Lock order: kvfence.sglang._LazyGate's lock (a gate attached at a manager's first use)
# -> _unbound_lock (attach()); never the other way (transfer_worker's wrapper triggers
# the attachment before taking _unbound_lock). No SGLang lock is taken under either.
_unbound_lock = threading.Lock()


def _bind(q: kvfence.TransferQueue, gate: PrefillGate, mgr: Any) -> None:
    """Binds a worker's queue to the gate of its manager ``mgr``."""
    q.bind(gate.table, gate.room_handle, lambda: gate.pump(mgr))
    gate.queues.append(q)


def _sender_init(orig: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self: Any, mgr: Any, bootstrap_addr: str, bootstrap_room: int,
                 *a: Any, **kw: Any) -> None:
        orig(self, mgr, bootstrap_addr, bootstrap_room, *a, **kw)
        gate = _gate(mgr)
        if gate is not None and bootstrap_room is not None:
            if gate.open_room(int(bootstrap_room)) is None:
                # No room free: the request fails now (SGLang's own failure path: its
                # chunks, were any queued, are skipped, and kvfence refuses them too);
                # the gate is never off for it.
                from sglang.srt.disaggregation.base.conn import KVPoll  # type: ignore[import-untyped,import-not-found,unused-ignore]

                mgr.record_failure(bootstrap_room, "kvfence: no prefill room free "
                                   "(KVFENCE_SGLANG_ROOMS=%d)" % gate.table.rooms)
                mgr.update_status(bootstrap_room, KVPoll.Failed)
                self.conclude_state = KVPoll.Failed
    return __init__


def _sender_abort(orig: Callable[..., Any]) -> Callable[..., Any]:
    def abort(self: Any) -> Any:
        # SGLang marks the room Failed (its worker skips the room's chunks from now on),
        # and may never clear() the sender (a request aborted in the waiting queue:
        # release_aborted_prefill_waiting_req): kvfence aborts the room too, so that it
        # is released once no chunk of it is in flight, and its index goes back.
        out = orig(self)
        gate = _gate(self.kv_mgr)
        if gate is not None and self.bootstrap_room is not None:
            gate.abort(int(self.bootstrap_room))
            gate.pump(self.kv_mgr)
        return out
    return abort


def _sender_clear(orig: Callable[..., Any]) -> Callable[..., Any]:
    def clear(self: Any) -> Any:
        out = orig(self)
        gate = _gate(self.kv_mgr)
        if gate is not None and self.bootstrap_room is not None:
            gate.close(int(self.bootstrap_room))
            gate.pump(self.kv_mgr)
        return out
    return clear


def _transfer_worker(orig: Callable[..., Any]) -> Callable[..., Any]:
    def transfer_worker(self: Any, queue: Any, *a: Any, **kw: Any) -> Any:
        # Every chunk the worker takes holds a transfer on its room until it comes back
        # for the next one (kvfence.TransferQueue: native, no Python frame per chunk).
        q = _tls.queue = kvfence.TransferQueue(queue, "room")
        # A manager built with __new__ gets its gate here, at its first use (the lazy
        # attachment takes its own lock, then _unbound_lock in attach()): outside
        # _unbound_lock, which is never held while that lock is taken. Inside, the
        # instance's own attribute only (no descriptor, no lock).
        _gate(self)
        with _unbound_lock:
            gate = self.__dict__.get(_KEY)
            if gate is not None:
                _bind(q, gate, self)
            else:
                _unbound.setdefault(self, []).append(q)
        try:
            return orig(self, q, *a, **kw)
        except BaseException:
            # SGLang's worker raises when a chunk went wrong ("Prefill instance ... is
            # dead"): what that chunk submitted may still be in flight, never drained.
            if q.current is not None:
                q.fail(q.current)
            raise
    return transfer_worker


def _poison_unsettled_send(orig: Callable[..., Any]) -> Callable[..., Any]:
    def _poison_unsettled_send(self: Any, room: int) -> Any:
        # A write of ``room`` returned -1 (its bytes may still land): the chunk's
        # transfer fails, and the room is never ACKed.
        q = getattr(_tls, "queue", None)
        if q is None or not q.fail(room):
            gate = _gate(self)
            h = None if gate is None else gate.room_handle.get(room)
            if gate is not None and h is not None:
                # Not the chunk this worker is processing (not expected): a failed
                # transfer of its own marks the room, if it can still be marked.
                try:
                    gate.table.begin_transfer(h).fail()
                    gate.failed_elsewhere += 1
                except _ROOM_GONE:
                    logger.error("kvfence: a write to prefill room %s failed after the "
                                 "room was closed", room)
        out = orig(self, room)
        if _gate(self) is not None:
            _tell_decode(self, room)
        return out
    return _poison_unsettled_send


def _tell_decode(mgr: Any, room: int) -> None:
    """Tells the room's decode endpoints that a write of it failed (-1): a Failed status
    with a fourth frame, the reason, starting "Failed to send". SGLang's Mooncake manager
    sends no reason (``kv_status_msg_carries_reason`` is False) and keeps a room's first
    failure, so a decode that aborted first could not tell a -1 from any other failure.
    SGLang's decode parses a fourth frame as the reason (``parse_kv_status_message``):
    a kvfence decode with the transport reset (:mod:`.reset`) resets the request's
    generation on it; any decode records it for a room it still tracks (failed already)
    and drops it for a cleared one (``apply_prefill_status``)."""
    from sglang.srt.disaggregation.base.conn import KVPoll  # type: ignore[import-untyped,import-not-found,unused-ignore]
    from sglang.srt.disaggregation.common.conn import NetworkAddress  # type: ignore[import-untyped,import-not-found,unused-ignore]
    reason = ("Failed to send: a write of room %s returned -1 (its bytes may still land; "
              "kvfence)" % room)
    try:
        parts = mgr._encode_kv_status_message(bootstrap_room=room, status=KVPoll.Failed,
                                              failure_reason=reason)
        if not mgr.kv_status_msg_carries_reason:
            parts.append(reason.encode("utf-8"))
        for endpoint, port in mgr._room_notify_targets(room):
            na = NetworkAddress(endpoint, port)
            mgr._send_multipart_locked(na.to_tcp(), parts, is_ipv6=na.is_ipv6)
    except Exception as e:  # noqa: BLE001 - the decode falls back to its time trigger
        logger.warning("kvfence: could not tell the decode that room %s's write "
                       "failed: %s", room, e)


def _handle_abort_notification(orig: Callable[..., Any]) -> Callable[..., Any]:
    def _handle_abort_notification(self: Any, msg: List[bytes]) -> bool:
        gate = _gate(self)
        if gate is not None:
            # The generation-tagged drain ACK, whatever the deferred-release flag says.
            self.enable_deferred_decode_kv_release = True
        claimed = orig(self, msg)
        if gate is not None and claimed:
            from sglang.srt.disaggregation.common.conn import AbortNotification  # type: ignore[import-untyped,import-not-found,unused-ignore]

            n = AbortNotification.from_zmq(msg)
            if n is not None:
                gate.abort(int(n.room))
                gate.pump(self)
        return bool(claimed)
    return _handle_abort_notification


def _maybe_ack_drained_abort(orig: Callable[..., Any]) -> Callable[..., Any]:
    def _maybe_ack_drained_abort(self: Any, room: int) -> None:
        gate = getattr(self, _KEY, None)
        if gate is not None:
            h = gate.room_handle.get(room)
            if h is not None:
                # Held while kvfence's room is not released (transfers in flight), and
                # for good once quarantined (a write of it failed).
                reason = gate.released.get(h)
                if reason is None or reason == "quarantined":
                    return None
        orig(self, room)
        return None
    return _maybe_ack_drained_abort


def patches() -> List[Tuple[type, str, Callable[[Callable[..., Any]], Callable[..., Any]]]]:
    """The prefill-side wrappers, as ``(class, method, make_wrapper)``."""
    from sglang.srt.disaggregation.common.conn import CommonKVManager, CommonKVSender  # type: ignore[import-untyped,import-not-found,unused-ignore]
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager  # type: ignore[import-untyped,import-not-found,unused-ignore]

    from sglang.srt.disaggregation.common.utils import FastQueue  # type: ignore[import-untyped,import-not-found,unused-ignore]

    # The queue wrapper mirrors SGLang's FastQueue.get (no parameters): refuse, before
    # anything is patched, an SGLang whose get takes others.
    require_params(FastQueue, "get", ["self"])
    return [
        (CommonKVSender, "__init__", _sender_init),
        (CommonKVSender, "clear", _sender_clear),
        (CommonKVSender, "abort", _sender_abort),
        (MooncakeKVManager, "transfer_worker", _transfer_worker),
        (MooncakeKVManager, "_poison_unsettled_send", _poison_unsettled_send),
        (MooncakeKVManager, "_handle_abort_notification", _handle_abort_notification),
        (CommonKVManager, "_maybe_ack_drained_abort", _maybe_ack_drained_abort),
    ]
