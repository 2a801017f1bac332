"""The prefill side: every chunk's write runs under a kvfence transfer on its room, and
the drain ACK goes out only when kvfence says the room's transfers have ended.

One :class:`PrefillGate` (a gate-mode :class:`kvfence.RoomTable` with no writers per room:
the prefill protects its writes with transfers only) is attached to each prefill
``MooncakeKVManager``:

==============================================  ===============================================
SGLang method (0.5.23)                          what kvfence adds
==============================================  ===============================================
``CommonKVSender.__init__``                     opens the request's room
``MooncakeKVManager.transfer_worker``           tells the wrappers below which room the
                                                dequeued chunk belongs to (a thread-local)
``MooncakeKVManager.send_kvcache`` (and         ``begin_transfer`` before the write (refused
``send_kvcache_slice``, ``send_kvcache_dcp``,   once the room is aborted: the queued chunk is
``send_aux`` = the decode's metadata row,       not written, nothing is submitted);
``maybe_send_extra`` = state slots)             ``complete()`` on 0, ``fail()`` on -1
``MooncakeKVManager._handle_abort_notification``  ``abort`` on the room (after SGLang marked
                                                it Failed and registered the ACK target)
``CommonKVManager._maybe_ack_drained_abort``    holds the ACK while kvfence's room is not
                                                released (transfers in flight), and for
                                                good after a ``fail()``
``CommonKVSender.clear``                        ``finish``; a room with a failed write is
                                                quarantined (never ACKed)
==============================================  ===============================================
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import kvfence

from . import _state
from ._state import RankRegistry, logger

__all__ = ["PrefillGate", "patches"]

_tls = threading.local()


@dataclass
class PrefillGate:
    """kvfence's state for one prefill KV manager."""

    table: kvfence.RoomTable
    peers: RankRegistry = field(default_factory=RankRegistry)
    room_handle: Dict[int, int] = field(default_factory=dict)  # bootstrap_room -> handle
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Released lifecycles (handle -> reason). A room's mapping outlives its release, so a
    # chunk that passed SGLang's "room Failed?" check just before the ABORT is still
    # refused (StaleHandle) instead of being written ungated.
    released: Dict[int, str] = field(default_factory=dict)
    peer_ids: Dict[str, int] = field(default_factory=dict)
    refused_chunks: int = 0
    failed_transfers: int = 0
    quarantined_rooms: int = 0

    def __hash__(self) -> int:
        return id(self)

    def open_room(self, room: int) -> Optional[int]:
        """A new request on ``room``: a new kvfence lifecycle."""
        try:
            h = self.table.open([], [], token=room & 0xFFFF_FFFF_FFFF_FFFF)
        except kvfence.Error as e:
            logger.error("kvfence: cannot open prefill room %s: %s", room, e)
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

    def begin(self, h: int, session_id: str) -> Optional[Any]:
        """Begins a transfer on handle ``h`` for the write to ``session_id``; ``None`` if
        the room is aborted (or finished and released): that chunk is not written."""
        peer = self.peer_ids.get(session_id)
        if peer is None:
            peer = self.peer_ids[session_id] = self.peers.ids(session_id, [0])[0]
        try:
            return self.table.begin_transfer(h, peer)
        except (kvfence.RoomClosed, kvfence.StaleHandle):
            # SGLang has marked the room Failed, so it concludes Failed whatever the write
            # returns.
            self.refused_chunks += 1
            return None

    def write(self, room: Optional[int], session_id: str, fn: Callable[[], int]) -> int:
        """Runs one write under a transfer on ``room``'s kvfence room."""
        h = self.room_handle.get(room) if room is not None else None
        if h is None:
            return fn()
        t = self.begin(h, session_id)
        if t is None:
            return 0
        try:
            ret = fn()
        except BaseException:
            t.fail()
            self.failed_transfers += 1
            raise
        if ret == 0:
            t.complete()
        else:
            # -1: Mooncake may still be writing (no cancel): never "drained".
            t.fail()
            self.failed_transfers += 1
        return ret

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

    def holds_ack(self, room: int) -> bool:
        """Whether the drain ACK of ``room`` must wait: its kvfence room is not released,
        or it was quarantined (a write of it failed: never ACKed)."""
        h = self.room_handle.get(room)
        if h is None:
            return False
        reason = self.released.get(h)
        return reason is None or reason == "quarantined"

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
    setattr(mgr, _KEY, gate)
    # The generation-tagged drain ACK, whatever the deferred-release flag says.
    mgr.enable_deferred_decode_kv_release = True
    _state.prefill_gates.add(gate)
    return gate


_KEY = "_kvfence_gate"  # the gate, an attribute of a prefill manager (read with getattr:
# touching a manager's __dict__ slows every attribute load of SGLang's own code on it)
_ROOM_GONE = (kvfence.RoomClosed, kvfence.StaleHandle)


class _RoomTrackingQueue:
    """The worker's queue, telling the write wrappers which room a chunk is for."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._get = inner.get

    def get(self, *a: Any, **kw: Any) -> Any:
        chunk = self._get(*a, **kw)
        _tls.room = getattr(chunk, "room", None)
        return chunk

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _sender_init(orig: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self: Any, mgr: Any, bootstrap_addr: str, bootstrap_room: int,
                 *a: Any, **kw: Any) -> None:
        orig(self, mgr, bootstrap_addr, bootstrap_room, *a, **kw)
        gate = _gate(mgr)
        if gate is not None and bootstrap_room is not None:
            gate.open_room(int(bootstrap_room))
    return __init__


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
        # Always: SGLang starts its workers inside MooncakeKVManager.__init__, before the
        # wrapped __init__ attaches the gate.
        return orig(self, _RoomTrackingQueue(queue), *a, **kw)
    return transfer_worker


# The write wrappers run once per chunk (and per metadata row / state send) on the
# transfer worker: inline, no closure per call, no helper calls.


def _kv_write(orig: Callable[..., Any]) -> Callable[..., Any]:
    def write(self: Any, mooncake_session_id: str, *a: Any, **kw: Any) -> Any:
        gate = getattr(self, _KEY, None)
        if gate is None:
            return orig(self, mooncake_session_id, *a, **kw)
        h = gate.room_handle.get(getattr(_tls, "room", None))
        if h is None:
            ret = orig(self, mooncake_session_id, *a, **kw)
        else:
            # PrefillGate.begin, inline (one Python frame less per chunk).
            peer = gate.peer_ids.get(mooncake_session_id)
            if peer is None:
                peer = gate.peer_ids[mooncake_session_id] = gate.peers.ids(
                    mooncake_session_id, [0])[0]
            try:
                t = gate.table.begin_transfer(h, peer)
            except _ROOM_GONE:
                # Refused: the room is aborted (SGLang has marked it Failed, so it
                # concludes Failed whatever the write returns); nothing is submitted.
                gate.refused_chunks += 1
                return 0
            try:
                ret = orig(self, mooncake_session_id, *a, **kw)
            except BaseException:
                t.fail()
                gate.failed_transfers += 1
                raise
            if ret == 0:
                t.complete()
            else:
                # -1: Mooncake may still be writing (no cancel): never "drained".
                t.fail()
                gate.failed_transfers += 1
        if gate.table.queued_releases():
            gate.pump(self)
        return ret
    return write


def _req_write(orig: Callable[..., Any]) -> Callable[..., Any]:
    def write(self: Any, req: Any, *a: Any, **kw: Any) -> Any:
        gate = getattr(self, _KEY, None)
        if gate is None:
            return orig(self, req, *a, **kw)
        ret = gate.write(int(req.room), req.mooncake_session_id,
                         lambda: orig(self, req, *a, **kw))
        gate.pump(self)
        return ret
    return write


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

    return [
        (CommonKVSender, "__init__", _sender_init),
        (CommonKVSender, "clear", _sender_clear),
        (MooncakeKVManager, "transfer_worker", _transfer_worker),
        (MooncakeKVManager, "send_kvcache", _kv_write),
        (MooncakeKVManager, "send_kvcache_slice", _kv_write),
        (MooncakeKVManager, "send_kvcache_dcp", _kv_write),
        (MooncakeKVManager, "send_aux", _req_write),
        (MooncakeKVManager, "maybe_send_extra", _req_write),
        (MooncakeKVManager, "_handle_abort_notification", _handle_abort_notification),
        (CommonKVManager, "_maybe_ack_drained_abort", _maybe_ack_drained_abort),
    ]
