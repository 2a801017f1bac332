"""The decode side: kvfence decides when an aborted request's pages may be freed; SGLang
still frees them, through its own ``_do_release`` -> ``release_kv_cache`` path.

One :class:`DecodeGate` (a gate-mode :class:`kvfence.RoomTable`) is attached to each
decode ``MooncakeKVManager``. The wrappers below are installed by
:func:`kvfence.sglang.install`; each calls SGLang's own method and adds one decision:

============================================  =================================================
SGLang method (0.5.23; on 0.5.22 see below)  what kvfence adds
============================================  =================================================
``CommonKVReceiver.send_metadata``            keeps, on the receiver and before the metadata
                                              goes out, what the request's room would be:
                                              its writers (the prefill ranks its
                                              destinations are sent to) and what it holds
                                              (the KV pages, the metadata row and the state
                                              slots, which ``_do_release`` frees together);
                                              no room, no count. Refused (the request fails,
                                              nothing sent) only if kvfence cannot open a
                                              room for that writer set at all
``CommonKVReceiver._send_abort_notification`` opens the room of a request whose metadata
                                              went out (writers fenced since left out) and
                                              ``abort`` s it;
                                              the ABORT carries the room's kvfence handle
                                              as its generation
``CommonKVManager.register_deferred_abort_room`` for that abort (SGLang's own method calls
                                              it), returns the room's handle as the
                                              generation and makes no SGLang tracker entry
                                              (nothing reads one for a kvfence room);
                                              SGLang's own for any other room
``CommonKVManager.note_abort_ack``            ``quiesce(handle, rank)`` (ABORT_ACK = quiesce)
                                              instead of SGLang's ACK set, for a room
                                              kvfence holds; SGLang's own otherwise
``CommonKVManager.handle_abort_ack_message``  a generation-less ACK (2 or 3 frames) marks
                                              its prefill instance legacy: later requests
                                              to it are refused at ``send_metadata``,
                                              logged with the fix
``CommonKVManager.is_abort_release_safe``     inside SGLang's scan: "kvfence released *this
                                              entry's* request" (its receiver's handle;
                                              one room id may be held by several
                                              requests); asked by room only: every open
                                              request of the room released; SGLang's ACK
                                              count for requests kvfence does not gate
``DecodeTransferQueue.resolve_deferred_releases`` with nothing held, returns at once, as
                                              SGLang's own does (nothing drained: a
                                              decision waits, queued, for its entry);
                                              otherwise drains kvfence's releases, applies
                                              the quarantine policy, and makes every gated
                                              entry's deadline infinite: time never releases
                                              a page. With
                                              one attention-TP rank and only kvfence rooms
                                              held, SGLang's scan is skipped when kvfence
                                              released nothing, and sees only the entries
                                              kvfence released otherwise
``DecodeTransferQueue.pop_transferred``       holds every failed transfer of a gated
                                              manager, whatever
                                              ``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE``
                                              says (a queue with no gate: stock)
``DecodeTransferQueue._do_release``           a quarantined room's pages are *not* freed
``DecodeTransferQueue.release_memory_occupation``  the held requests SGLang drops stop
                                              counting as held (their records go when
                                              their rooms are released)
``CommonKVManager._handle_node_failure``      fences the dead prefill's ranks once its
                                              transport is proven torn down (:mod:`.teardown`:
                                              no socket left from its bootstrap host or any
                                              ``rank_ip`` its ranks registered)
``CommonKVReceiver._setup_bootstrap_infos``   with the transport reset on (:mod:`.reset`):
                                              the instance's generation (made here on first
                                              contact); SGLang registers under its session;
                                              the receiver keeps it for ``send_metadata``
``MooncakeKVManager.get_session_id``          the generation's session inside those two
                                              calls (thread-local); SGLang's own otherwise
``CommonKVManager.apply_prefill_status``      a prefill's "Failed to send ..." noted for
                                              the next drain, which resets the generation
============================================  =================================================

On SGLang 0.5.22 (``patches("0.5.22")``) the request's metadata goes out through
``MooncakeKVReceiver.send_metadata`` (no ``destination`` parameter; 0.5.23 moved it to
``CommonKVReceiver``), wrapped with the same decision, and a held entry is a host
destination when ``enable_host_receive and decode_req.host_staged`` (0.5.22 has no
``_is_host_destination``; nor does it MIN-reduce device entries across ranks).

SGLang's cross-rank MIN reduction (``all_reduce_flags`` in ``resolve_deferred_releases``)
is untouched: kvfence's decision is the per-rank ``is_drained`` it reduces.

Why the room opens at the abort and not at ``send_metadata`` (docs/DESIGN.md section 8,
"The SGLang decode room opens at the abort"): SGLang can free a sent request's pages only through its
release path, which every held request reaches through ``_send_abort_notification``
(``abort()``, the WaitingForInput timeout, a Failed poll's
``ensure_abort_notified(force_arm=True)``, ``_clear`` with deferred allocation); until then
a room would sit ``Owned`` with every writer pending (an ACK answers only an ABORT), which
is the state the room opened at the abort starts in. A successful request (the common
case) then costs no room, no count and no other wrapper: only what ``send_metadata`` keeps.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Set, Tuple, Union

import kvfence

from . import _state
from ._patching import require_params
from ._state import RankRegistry, logger
from .reset import Generation, NoGeneration, Resets, _override
from .teardown import mooncake_tcp_torn_down, not_torn_down

__all__ = ["DecodeGate", "RoomRecord", "patches"]

class RoomRecord(NamedTuple):
    """What the gate knows of one open room (immutable: made once per aborted request,
    when its room opens at the abort; its abort time is kept in
    :attr:`DecodeGate.aborted`)."""

    room: int
    addr: str
    writers: List[int]
    # (writers, kv_indices, aux_index, state_indices): the receiver's tuple, as
    # send_metadata kept it (no copy)
    holds: Tuple[Any, Any, Optional[int], Optional[List[Any]]]
    infos: Any  # the receiver's bootstrap_infos (rank_ip, rank_port of each writer)
    rank_of: Dict[int, int]  # SGLang prefill rank -> kvfence id (shared per writer set)

    @property
    def held_pages(self) -> int:
        """The room's KV pages + its metadata row + its state slots."""
        _, kv, aux, state = self.holds
        n = len(kv) + (0 if aux is None else 1)
        for s in state or ():
            n += len(s) if hasattr(s, "__len__") else 1
        return n


class _Writers:
    """One prefill instance's writer set (``DecodeGate.writer_cache``): the kvfence ids
    of the ranks a request's destinations go to, shared by every request to it."""

    __slots__ = ("info", "addr", "writers", "rank_of", "infos", "error", "gen")

    def __init__(self, info: Any, addr: str, writers: List[int], rank_of: Dict[int, int],
                 infos: Any, error: Optional[str], gen: Optional[Generation] = None) -> None:
        self.info = info  # the instance's prefill_info (kept: its id is the cache key)
        self.addr = addr
        self.writers = writers  # kvfence ids
        self.rank_of = rank_of  # SGLang prefill rank -> kvfence id
        self.infos = infos  # the first receiver's bootstrap_infos (the ranks' endpoints)
        self.error = error  # why kvfence cannot open a room for this set (None: it can)
        self.gen = gen  # the transport generation the ids were handed out under (.reset)


# ``RoomRecord(...)`` runs the NamedTuple's Python ``__new__``; the per-request path builds
# one with the C constructor instead (~0.1 us instead of ~1 us on the dev box).
_new_record = tuple.__new__


@dataclass
class DecodeGate:
    """kvfence's state for one decode KV manager."""

    table: kvfence.RoomTable
    ranks: RankRegistry = field(default_factory=RankRegistry)
    records: Dict[int, RoomRecord] = field(default_factory=dict)  # handle -> record
    # bootstrap_room -> the handles of its open records, in the order they opened. A room
    # id is not unique among held requests (a retry to another prefill reuses it; SGLang
    # 0.5.23 accepts a duplicate unless decode allocation is deferred), so no decision is
    # ever read through it: a held request's decision is its own handle's (the one on its
    # receiver). Written on the scheduler thread only, each value replaced whole (a tuple),
    # so the heartbeat thread's reads see one consistent value.
    room_handles: Dict[int, Tuple[int, ...]] = field(default_factory=dict)
    # handle -> release reason, for rooms kvfence released whose pages SGLang has not
    # freed yet (their records stay in `records` until _do_release)
    decided: Dict[int, str] = field(default_factory=dict)
    # handle -> when decode aborted it; dropped when SGLang frees (or kvfence quarantines)
    # the room's pages. What the quarantine policy and the held/overdue metrics read.
    aborted: Dict[int, float] = field(default_factory=dict)
    writer_cache: Dict[int, "_Writers"] = field(default_factory=dict)  # id(prefill_info) -> writers
    # bootstrap_room -> its pages, for aborted requests whose room the table refused (no
    # room free: see open_at_abort): held for good, never released (not expected)
    held_for_good: Dict[int, int] = field(default_factory=dict)
    # bootstrap_room -> handle, while that kvfence room's ABORT is being armed (set and
    # popped by _send_abort_notification's wrapper, taken by register_deferred_abort_room's)
    arming: Dict[int, int] = field(default_factory=dict)
    # Handles whose held entries SGLang dropped without freeing them
    # (DecodeTransferQueue.release_memory_occupation: the pool is torn down): no longer
    # held, so not in `aborted`; their records stay until kvfence releases their rooms
    # (an ACK or a fence may still come), then go (drain). Scheduler thread.
    dropped: Set[int] = field(default_factory=set)
    dropped_rooms: int = 0  # how many (counted once each)
    # bootstrap_addr -> kvfence ids retired from the instance there and not fenced yet
    # (the heartbeat retired them; its fence thread may still be waiting for a proof, or
    # gave up): what fence_prefill(addr) fences. Guarded by `lock` (the heartbeat thread,
    # each fence thread and the operator's thread touch it).
    retired: Dict[str, Set[int]] = field(default_factory=dict)
    # Guards `retired` only. A leaf lock: nothing else (no SGLang lock, no kvfence call
    # that can block) is taken while it is held, and it is never taken while an SGLang
    # lock is held (the _handle_node_failure wrapper releases SGLang's connection_lock
    # before node_failed runs).
    lock: threading.Lock = field(default_factory=threading.Lock)
    capacity: int = 0  # the table's rooms (set from it)
    unguarded_rooms: int = 0  # aborted requests whose room the table refused (not expected)
    fenced_ranks: int = 0
    quarantined_rooms: int = 0
    quarantined_pages: int = 0
    ignored_acks: int = 0
    # bootstrap_addr -> why requests to it are refused: the prefill instance there sent a
    # generation-less ABORT_ACK (an SGLang prefill with deferred release off, or older
    # than the generation-tagged ACK): its ACKs can never release a kvfence room, so every
    # request sent to it would be held for good. Written on the decode thread (ACKs),
    # read on the scheduler thread (send_metadata): single dict operations.
    legacy: Dict[str, str] = field(default_factory=dict)
    legacy_acks: int = 0
    # bootstrap_addr -> when an overdue hold on it was last reported (scheduler thread)
    overdue_logged: Dict[str, float] = field(default_factory=dict)
    next_policy_scan: float = 0.0
    # (hosts a writer of the instance may connect from, its endpoints) -> torn down?
    proof: Callable[..., bool] = mooncake_tcp_torn_down
    managers: "weakref.WeakSet[Any]" = field(default_factory=weakref.WeakSet)
    # The transport generations (KVFENCE_SGLANG_RESET=1; None: off): .reset
    resets: Optional[Resets] = None
    # bootstrap_rooms whose prefill reported a failed write (apply_prefill_status, decode
    # thread: list.append), taken by drain (scheduler thread: one swap): each held
    # request of such a room resets its transport generation.
    failed_writes: List[int] = field(default_factory=list)
    # bootstrap_room -> when its failed write was noted, for rooms not open yet when
    # drain took them (the Failed status comes before the decode's abort): kept until the
    # room opens (its reset then) or for _FAILED_KEEP_S. Scheduler thread.
    failed_pending: Dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.capacity = self.table.rooms

    def __hash__(self) -> int:
        return id(self)

    # -- scheduler thread ------------------------------------------------------------
    # ``send_metadata``'s wrapper (below, inlined there: it runs for every request) keeps
    # ``(writers, kv_indices, aux_index, state_indices)`` on the receiver (`_kvfence`),
    # the writers looked up in `writer_cache` (:meth:`writers_of` on a miss); nothing else.

    def refuse(self, receiver: Any, why: str) -> None:
        """Fails a request before its metadata goes out (nothing sent, nothing to hold)."""
        room = receiver.bootstrap_room
        mgr = receiver.kv_mgr
        mgr.record_failure(room, "kvfence refused the room: %s" % why)
        from sglang.srt.disaggregation.base.conn import KVPoll  # type: ignore[import-untyped,import-not-found,unused-ignore]

        mgr.update_status(room, KVPoll.Failed)

    def open_at_abort(self, receiver: Any) -> Optional[int]:
        """The first abort of a request whose metadata went out: opens its room (the
        writers ``send_metadata`` kept, minus any rank fenced since, whose transport is
        torn down: it can write nothing more) and returns its handle. ``None`` if no
        metadata went out under kvfence (SGLang's own path), or if the table refused the
        room; the request's pages are then held for good (:attr:`held_for_good`: never
        released, by time or anything else; logged and counted in ``unguarded_rooms``
        and the quarantine metrics). Not expected: a held request keeps its SGLang
        request slot, so a table with at least as many rooms as the decode's request
        pool always has one free (docs/DESIGN.md section 8)."""
        holds = getattr(receiver, _ATTR, None)
        if type(holds) is not tuple:
            return None  # nothing sent under kvfence, or its room is open already
        c = holds[0]
        receiver._kvfence = None
        room = receiver.bootstrap_room
        writers = c.writers
        gen = c.gen
        glock = self.resets.lock if gen is not None and self.resets is not None else None
        drained = False
        while True:
            try:
                if glock is None:
                    h = self.table.open(writers, None, room & 0xFFFF_FFFF_FFFF_FFFF)
                else:
                    # Its transport generation torn down and its ids fenced: nothing of
                    # theirs can land, and they are being readmitted (.reset), so the
                    # room must not name them. Under the lock the teardown thread sets
                    # `proven` under: an open before that is released by the fence (or
                    # refused, RankFenced, below).
                    with glock:
                        if gen.proven:
                            writers = []
                        h = self.table.open(writers, None, room & 0xFFFF_FFFF_FFFF_FFFF)
                break
            except kvfence.RankFenced as e:
                if e.rank not in writers:
                    why = str(e)
                else:
                    writers = [w for w in writers if w != e.rank]
                    continue
            except kvfence.TableFull as e:
                if not drained and self.table.queued_releases():
                    # Rooms released but not drained yet hold their indices (the table
                    # hands an index back when its release is drained, and an idle
                    # scheduler iteration drains nothing): drain, then try again.
                    drained = True
                    self.drain()
                    continue
                why = str(e)
            except kvfence.Error as e:
                why = str(e)
            pages = _new_record(RoomRecord, (room, c.addr, writers, holds, None, None)).held_pages
            self.held_for_good[room] = pages
            self.unguarded_rooms += 1
            self.quarantined_rooms += 1
            self.quarantined_pages += pages
            logger.error("kvfence: cannot open the room of aborted request %s (prefill %s): "
                         "%s; its %d pages incl. metadata/state slots are held for good "
                         "(never reused; KVFENCE_SGLANG_ROOMS is %d)",
                         room, c.addr, why, pages, self.capacity)
            return None
        # SGLang frees the pages itself (_do_release): kvfence keeps references to what
        # the room holds (counted only for the metrics and the quarantine log), never a
        # copy of the ids (measured: 16 ids converted in at open and out at the release
        # cost ~1.4 us per aborted request; counting them here, ~0.3 us).
        rec = _new_record(RoomRecord, (room, c.addr, writers, holds,
                                       receiver.bootstrap_infos, c.rank_of))
        # Single dict operations are atomic under the GIL; every writer of these dicts
        # runs on the scheduler thread, the ACK and heartbeat threads only read them.
        self.records[h] = rec
        self.room_handles[room] = self.room_handles.get(room, ()) + (h,)
        receiver._kvfence = h
        return h

    def writers_of(self, receiver: Any, gen: Optional[Generation] = None) -> "_Writers":
        """The writer set of ``receiver``'s prefill instance (``writer_cache``'s entry,
        made or remade here: once per instance). The kvfence ids of the prefill ranks its
        destinations go to, as their ACKs name them (``_prefill_unique_rank =
        attn_tp_rank*(pp*cp) + pp_rank*cp + cp_rank``). ``gen``: the transport generation
        the receiver registered under (:mod:`.reset`), which the ids are handed out
        under."""
        info = receiver.prefill_info
        addr = receiver.bootstrap_addr
        cps, tps, pps = receiver.target_cp_ranks, receiver.target_tp_ranks, receiver.target_pp_ranks
        unique = sorted({
            tp * (info.pp_size * info.attn_cp_size) + pp * info.attn_cp_size + cp
            for cp in cps for tp in tps for pp in pps
        })
        ids = self.ranks.ids(addr, unique)
        # One entry per instance: an info SGLang replaced (a re-bootstrap) is dropped (a
        # request sent with it keeps its own reference to the set).
        # (pop, not del: the heartbeat thread's retire() may have popped it meanwhile)
        for k, old in list(self.writer_cache.items()):
            if old.addr == addr and old.info is not info:
                self.writer_cache.pop(k, None)
        # Whether kvfence can open a room for this set at all (too many writers, say):
        # found out once per instance by opening one, not at a request's abort, when it
        # would be too late to refuse the request cleanly.
        error: Optional[str] = self.legacy.get(addr)
        try:
            probe = self.table.open(ids, None, 0)
        except kvfence.TableFull:
            pass
        except kvfence.Error as e:
            error = error or "writer set %s of prefill %s: %s" % (ids, addr, e)
            logger.error("kvfence: %s", error)
        else:
            # Released by this call, or queued (the drain forgets a "finished" release).
            self.table.finish_drained(probe)
        c = self.writer_cache[id(info)] = _Writers(
            info, addr, ids, dict(zip(unique, ids)), receiver.bootstrap_infos, error, gen)
        if gen is not None:
            gen.ids.update(ids)
        return c

    def drain(self) -> None:
        """Takes every release kvfence decided; applies the quarantine policy (its scan
        runs at most every 0.1 s)."""
        q = _state.config.quarantine_after
        if self.aborted:
            now = time.monotonic()
            if now >= self.next_policy_scan:
                self.next_policy_scan = now + 0.1
                overdue = _state.config.overdue_after
                for h, t in list(self.aborted.items()):
                    rec = self.records.get(h)
                    if rec is None or h in self.decided:
                        continue
                    gen = rec.holds[0].gen
                    ra = _state.config.reset_after
                    if gen is not None and not gen.retired and ra is not None \
                            and now - t >= ra:
                        # Time starts a reset; only its teardown proof releases.
                        self.reset_gen(gen, "aborted request %s held %.1f s with no "
                                       "ABORT_ACK" % (rec.room, now - t))
                    elif q is not None and now - t >= q:
                        self.quarantine(h, "no ACK and no fence for %.1f s" % (now - t))
                    elif now - t >= overdue and \
                            now - self.overdue_logged.get(rec.addr, -1e18) >= 300:
                        self.overdue_logged[rec.addr] = now
                        logger.error(
                            "kvfence: aborted request %s held %.0f s with no ABORT_ACK from "
                            "prefill %s (and no fence). If that prefill runs with "
                            "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=0, it never "
                            "ACKs: unset it there (the default is 1), or run the prefill "
                            "with kvfence (KVFENCE_SGLANG=1). Its pages stay held until its "
                            "writers ACK or are fenced (fence_prefill)", rec.room, now - t,
                            rec.addr)
        if self.failed_writes or self.failed_pending:
            self.reset_failed()
        if not self.table.queued_releases():
            return
        # (handle, reason) pairs, no Released object each (the gate's rooms carry no page
        # ids: SGLang frees its own). A released room keeps its record until SGLang frees
        # its pages (_do_release): one dict store per release here.
        decided = self.decided
        for h, why in self.table.drain_reasons():
            if why == "finished" or h in self.dropped:
                # Not a request's room: the probe of a new writer set (_writers), whose
                # release finish_drained queued. Or a room whose held entry SGLang
                # dropped (release_memory_occupation). Nothing to free.
                self.forget(h)
            else:
                decided[h] = why

    def reset_failed(self) -> None:
        """Resets the transport generation of every held request of a room whose prefill
        reported a failed write since the last call (:attr:`failed_writes`)."""
        rooms, self.failed_writes = self.failed_writes, []
        now = time.monotonic()
        pending = self.failed_pending
        for room in rooms:
            pending.setdefault(room, now)
        for room, t in list(pending.items()):
            hs = self.room_handles.get(room, ())
            if not hs:
                if now - t > _FAILED_KEEP_S:
                    del pending[room]  # never opened here (not held: nothing to free)
                continue
            del pending[room]
            for h in hs:
                rec = self.records.get(h)
                if rec is not None and h not in self.decided:
                    self.reset_gen(rec.holds[0].gen, "its prefill reported request %s's "
                                   "write failed" % room)

    def reset_gen(self, gen: Optional[Generation], why: str) -> None:
        """Resets transport generation ``gen`` (:meth:`Resets.reset`: only if it is its
        instance's current one; nothing for a request sent under no generation)."""
        if gen is not None and self.resets is not None:
            self.resets.reset(self, next(iter(self.managers), None), gen, why)

    def forget(self, h: int) -> Optional[RoomRecord]:
        """Drops the record of ``h`` (and ``h`` from its bootstrap_room's handles; the
        other requests of the same room keep theirs); returns it."""
        rec = self.records.pop(h, None)
        self.dropped.discard(h)
        if rec is not None:
            hs = tuple(x for x in self.room_handles.get(rec.room, ()) if x != h)
            if hs:
                self.room_handles[rec.room] = hs
            else:
                self.room_handles.pop(rec.room, None)
        return rec

    def released_for(self, room: int) -> bool:
        """Whether every open request of ``room`` was released by kvfence: the answer
        for a caller that names a room and not a request (SGLang's own
        ``is_abort_release_safe`` outside ``resolve_deferred_releases``). Conservative
        when the room is shared: one held request of it keeps the answer ``False``."""
        if self.held_for_good and room in self.held_for_good:
            return False  # another request of the room is held for good
        decided = self.decided
        return all(h in decided for h in self.room_handles.get(room, ()))

    def quarantine(self, h: int, why: str) -> None:
        """Takes the room out of circulation for good (its pages are never freed)."""
        try:
            self.table.quarantine(h)
        except kvfence.Error:  # stale or released meanwhile: nothing to quarantine
            return
        rec = self.records.get(h)
        pages = rec.held_pages if rec else 0
        self.quarantined_rooms += 1
        self.quarantined_pages += pages
        logger.warning("kvfence: quarantined room %s (%d pages incl. metadata/state slots, "
                       "prefill %s): %s; these pages are never reused",
                       rec.room if rec else "?", pages, rec.addr if rec else "?", why)

    # -- decode thread ---------------------------------------------------------------
    def legacy_ack(self, room: int) -> None:
        """A generation-less ABORT_ACK for ``room`` arrived: the prefill instance that
        sent it (the instance of every open room of ``room``) cannot release a kvfence
        room. Refuses every later request to it, loudly, with the fix."""
        self.legacy_acks += 1
        addrs = {rec.addr for h in self.room_handles.get(room, ())
                 for rec in (self.records.get(h),) if rec is not None}
        for addr in sorted(addrs):
            if addr in self.legacy:
                continue
            why = ("prefill %s sends generation-less ABORT_ACKs (it runs with "
                   "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=0, or an SGLang without "
                   "generation-tagged ACKs): kvfence on this decode cannot release an aborted "
                   "request's pages through it, so requests to it are refused. Fix: unset "
                   "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE on that prefill (the "
                   "default is 1), or run it with kvfence (KVFENCE_SGLANG=1), then restart "
                   "this decode" % addr)
            self.legacy[addr] = why
            for c in list(self.writer_cache.values()):
                if c.addr == addr:
                    c.error = why
            logger.error("kvfence: %s", why)

    # -- heartbeat thread ------------------------------------------------------------
    def node_failed(self, addr: str, affected: Iterable[int] = (),
                    status: Optional[Dict[int, Any]] = None,
                    rank_hosts: Iterable[str] = (),
                    others: Union[Iterable[Tuple[str, int]],
                                  Callable[[], Iterable[Tuple[str, int]]]] = ()) -> None:
        """The heartbeat declared ``addr`` dead: fence its ranks once its transport is
        proven torn down (a thread polls the proof; a live prefill is never fenced).

        ``affected``: the rooms SGLang tracked for ``addr`` when it declared it dead
        (``addr_to_rooms_tracker``, read before SGLang drops it), ``status`` SGLang's
        ``request_status``: a request among them that SGLang has not cleared may still
        open a room with these ranks at its abort (its metadata went out to them), so the
        thread keeps polling for the proof while one is left. ``rank_hosts``: the
        ``rank_ip`` every rank of the instance registered (SGLang's connection pool, read
        before SGLang drops it); with the bootstrap host and the ``rank_ip`` of every
        request's bootstrap infos, the addresses the proof checks for inbound sockets (a
        prefill's ranks connect from their own addresses: multi-node prefill, or a data
        NIC that registered as ``rank_ip``). ``others``: the rank endpoints (``rank_ip``,
        ``rank_port``) of the other prefill instances in SGLang's connection pool, or a
        function that reads them (called at each poll: the instances this decode talks
        to change while it waits, issue 41's ``prefill_killed``): on a host they share
        with ``addr``, a socket whose other end a process serving one of them holds is
        theirs, not ``addr``'s (:mod:`.teardown`)."""
        host, _, port = addr.rpartition(":")
        eps: Set[Tuple[str, int]] = {(host, int(port))}
        hosts: Set[str] = {host}
        hosts.update(h for h in rank_hosts if h)
        sets = [c for c in list(self.writer_cache.values()) if c.addr == addr]
        infos = [rec.infos for rec in list(self.records.values()) if rec.addr == addr]
        infos += [c.infos for c in sets]
        for bi in infos:
            for b in bi or ():
                ip = b.get("rank_ip")
                if ip:
                    hosts.add(str(ip))
                if b.get("rank_port"):
                    eps.add((str(ip), int(b.get("rank_port"))))
        ranks = self.retire(addr)
        if not ranks:
            return
        fenced = set(ranks)
        pending = list(affected)
        st: Dict[int, Any] = {} if status is None else status
        proof_hosts = sorted(hosts)
        read_others = others if callable(others) else (lambda fixed=list(others): fixed)

        def live() -> List[Tuple[str, int]]:
            return sorted(set(read_others()) - eps)

        def waits() -> bool:
            # An open room not yet released writes to them, or a request SGLang still
            # tracks whose room is not open yet (it opens at its abort, with these ranks
            # unless they are fenced by then). A successful one opens none.
            decided = self.decided
            opened = self.room_handles
            return any(not fenced.isdisjoint(rec.writers)
                       for h, rec in list(self.records.items()) if h not in decided) \
                or any(r not in opened and st.get(r, _SUCCESS) != _SUCCESS for r in pending)

        def fence_when_torn_down() -> None:
            t0 = time.monotonic()
            idle = 0
            tell = t0 + _WHY_FIRST
            while True:
                # Gone only when seen idle twice, a poll apart: a room the scheduler
                # thread was opening between the two reads of waits() is seen by the
                # second look.
                idle = 0 if waits() else idle + 1
                if idle >= 2:
                    logger.info("kvfence: prefill %s declared dead; no room waits on it", addr)
                    return
                if not self.unfenced(addr, ranks):
                    return  # fenced meanwhile (fence_prefill)
                if idle == 0 and self.proof(proof_hosts, sorted(eps), live()):
                    break
                now = time.monotonic()
                if idle == 0 and now >= tell and self.proof is mooncake_tcp_torn_down:
                    # An honest log for the operator: what keeps these pages held.
                    tell = now + _WHY_EVERY
                    logger.warning("kvfence: prefill %s declared dead %.0f s ago, not fenced "
                                   "yet (its rooms stay held): %s", addr, now - t0,
                                   not_torn_down(proof_hosts, sorted(eps), live()) or "proven now")
                time.sleep(_state.config.teardown_poll)
            self.fence(addr, ranks, "transport torn down %.2f s after the heartbeat failure"
                       " (no socket left from %s)" % (time.monotonic() - t0,
                                                       ", ".join(proof_hosts)))

        threading.Thread(target=fence_when_torn_down, name="kvfence-fence-%s" % addr,
                         daemon=True).start()

    def retire(self, addr: str) -> List[int]:
        """Forgets the kvfence ids of the instance at ``addr`` (returned: to be fenced); a
        returning instance gets new ones. Until fenced they stay in :attr:`retired`, so
        that :func:`kvfence.sglang.fence_prefill` can fence them later."""
        for k, c in list(self.writer_cache.items()):
            if c.addr == addr:
                self.writer_cache.pop(k, None)
        ranks = self.ranks.retire(addr)
        if ranks:
            with self.lock:
                self.retired.setdefault(addr, set()).update(ranks)
        return ranks

    def unfenced(self, addr: str, ranks: Iterable[int] = ()) -> List[int]:
        """The retired ids of ``addr`` not fenced yet (of ``ranks`` if given)."""
        with self.lock:
            left = self.retired.get(addr, set())
            want = set(ranks)
            return sorted(left & want if want else left)

    def fence(self, addr: str, ranks: List[int], why: str) -> int:
        """Fences ``ranks`` (of ``addr``); returns how many rooms that released."""
        released = 0
        done: List[int] = []
        for r in ranks:
            try:
                released += self.table.fence_rank(r)
            except kvfence.Error as e:
                logger.error("kvfence: cannot fence rank %d of %s: %s", r, addr, e)
                continue
            self.fenced_ranks += 1
            done.append(r)
        with self.lock:
            left = self.retired.get(addr)
            if left is not None:
                left.difference_update(done)
                if not left:
                    del self.retired[addr]
        logger.warning("kvfence: fenced prefill %s (kvfence ranks %s): %s; %d rooms released",
                       addr, ranks, why, released)
        return released


#: A prefill declared dead and not yet proven torn down is logged (with why) after this
#: many seconds, then every ``_WHY_EVERY``.
_WHY_FIRST = 10.0
_WHY_EVERY = 60.0
_KEY = "_kvfence_gate"  # the gate, an attribute of a decode manager
# How a failed write is worded ("Failed to send ..."): SGLang's prefill (conclude_failure,
# whose reason Mooncake's status does not carry) and kvfence's prefill (_tell_decode, whose
# reason it does); seen on the decode by apply_prefill_status: what starts a reset at once.
_SEND_FAILED = "Failed to send"
#: How long a reported failed write waits for its room to open (DecodeGate.failed_pending)
_FAILED_KEEP_S = 60.0
_monotonic = time.monotonic
_ROOM_GONE = (kvfence.RoomClosed, kvfence.StaleHandle)
_ERROR = kvfence.Error
# One attribute of a receiver (one, not two: measured on the dev box, a second attribute
# added to a receiver after SGLang's __init__ costs ~0.25 us to store, as CPython moves
# the object's attributes into a dict, and slows every later attribute load on it):
# absent or None: not kvfence's (SGLang's own path); a tuple (writers, kv_indices,
# aux_index, state_indices): its metadata went out under kvfence, its room is not open;
# an int: its room's kvfence handle.
_ATTR = "_kvfence"
_SEND_METADATA_PARAMS = ["self", "kv_indices", "aux_index", "state_indices",
                         "decode_prefix_len", "destination", "device_kv_indices"]
_SEND_METADATA_PARAMS_0522 = ["self", "kv_indices", "aux_index", "state_indices",
                              "decode_prefix_len", "device_kv_indices"]


def _is_host_0523(queue: Any, decode_req: Any) -> bool:
    return bool(queue._is_host_destination(decode_req))


def _is_host_0522(queue: Any, decode_req: Any) -> bool:
    # SGLang 0.5.22's DecodeTransferQueue has no _is_host_destination; its own code
    # tests this (resolve_deferred_releases, _defer_release, _do_release).
    return bool(queue.enable_host_receive and decode_req.host_staged)


# Whether a held entry is a host destination (SGLang asks its receiver, not its manager):
# set by patches() for the release installed.
_IS_HOST: Callable[[Any, Any], bool] = _is_host_0523
_RELEASE = "0.5.23"  # the SGLang release patched (set by patches())
_DEVICE: Any = None  # KVTransferDestination.DEVICE, send_metadata's default (set by patches())
# Wrappers read these with getattr(obj, name, None), never through obj.__dict__: in CPython
# 3.11+ touching an instance's __dict__ moves its attributes out of the inline values
# into a dict, and every attribute load of SGLang's own code on that object gets slower
# (measured on the dev box, stock SGLang code on receivers whose __dict__ was touched: its
# abort and pop took 1.3-1.9 us more per request each).


def _gate(mgr: Any) -> Optional[DecodeGate]:
    return getattr(mgr, _KEY, None)


def attach(mgr: Any) -> DecodeGate:
    """Attaches a gate to a decode manager (from the wrapped ``__init__``)."""
    gate = DecodeGate(kvfence.RoomTable(_state.config.rooms))
    gate.managers.add(mgr)
    if _state.config.reset:
        from .reset import unsupported
        why = unsupported(mgr, _RELEASE)
        if why is None:
            gate.resets = Resets()
        else:
            logger.error("kvfence: KVFENCE_SGLANG_RESET=1 but the transport reset cannot "
                         "run here: %s; a failed write holds its pages until its prefill "
                         "is fenced", why)
    setattr(mgr, _KEY, gate)
    # Mooncake sends the generation-tagged drain ACK; kvfence needs it whatever
    # SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE says.
    mgr.enable_deferred_decode_kv_release = True
    _state.add_decode_gate(gate)
    return gate


# ----------------------------------------------------------------------------- wrappers
#
# These run on SGLang's hot paths (per request, per scheduler iteration): each reads what
# it needs once (no helper calls, no imports, no logging) and skips SGLang's own
# bookkeeping only where kvfence's replaces it for a kvfence room.


def _send_metadata(orig: Callable[..., Any]) -> Callable[..., Any]:
    # SGLang 0.5.23's exact signature (checked by patches()): the call to SGLang's method
    # is a plain positional one, not a *args/**kwargs repacking (measured on the dev box:
    # that repacking alone was ~0.15 us of this wrapper's cost per request).
    device = _DEVICE

    def send_metadata(self: Any, kv_indices: Any, aux_index: Optional[int] = None,
                      state_indices: Optional[List[Any]] = None,
                      decode_prefix_len: Optional[int] = None, destination: Any = device,
                      device_kv_indices: Any = None) -> Any:
        gate = getattr(self.kv_mgr, _KEY, None)
        if gate is not None and self.bootstrap_infos is not None:
            if gate.resets is not None and type(getattr(self, _ATTR, None)) is Generation:
                # KVFENCE_SGLANG_RESET (checked first: without it a receiver has no
                # attribute yet here): sent under the generation it registered under
                # (.reset), or not at all.
                return _send_pinned(self, gate, self._kvfence, orig, kv_indices, aux_index,
                                    state_indices, decode_prefix_len, destination,
                                    device_kv_indices)
            # The writers depend only on the prefill instance: its info, which SGLang
            # makes once per instance (try_ensure_parallel_info, which sets its target
            # ranks before publishing it) and every receiver of it reads at init. One
            # lookup by the info's id (the entry keeps the info alive, so while it is
            # there the id is not reused) and an identity check.
            info = self.prefill_info
            c = gate.writer_cache.get(id(info))
            if c is None or c.info is not info:
                c = gate.writers_of(self)
            if c.error is not None:
                gate.refuse(self, c.error)
                return None
            # Kept before anything is sent (a partial send is covered), read by the
            # abort, which opens the room; a successful request leaves it unread. The
            # writer set itself is kept, not looked up again at the abort: a retirement
            # of the instance in between (its ranks fenced, a returning instance given
            # new ids) must not change whom this request's room waits on.
            self._kvfence = (c, kv_indices, aux_index, state_indices)
        return orig(self, kv_indices, aux_index, state_indices, decode_prefix_len,
                    destination, device_kv_indices)
    return send_metadata


def _send_pinned(recv: Any, gate: DecodeGate, gen: Generation, orig: Callable[..., Any],
                 *args: Any) -> Any:
    """``send_metadata`` of a receiver registered under transport generation ``gen``
    (:mod:`.reset`): refused if ``gen`` was reset since (its engine is going away; the
    request fails before anything is sent), else sent with ``gen``'s session id and
    kvfence ids handed out under ``gen``."""
    rs = gate.resets
    if gen.retired or rs is None:
        if rs is not None:
            rs.refused += 1
        gate.refuse(recv, "the transport to prefill %s was reset after this request "
                          "registered (generation %d)" % (gen.addr, gen.no))
        recv._kvfence = None
        return None
    info = recv.prefill_info
    c = gate.writer_cache.get(id(info))
    if c is None or c.info is not info or c.gen is not gen:
        c = gate.writers_of(recv, gen)
    if c.error is not None:
        gate.refuse(recv, c.error)
        recv._kvfence = None
        return None
    recv._kvfence = (c, args[0], args[1], args[2])
    _override.session = gen.session
    try:
        return orig(recv, *args)
    finally:
        _override.session = None


def _setup_bootstrap_infos(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``CommonKVReceiver._setup_bootstrap_infos`` (0.5.23), with KVFENCE_SGLANG_RESET:
    the request's prefill instance gets its transport generation (made on first contact
    or after a reset), under whose session SGLang registers this decode's KV args there
    (once per generation: a reset drops SGLang's cached registration); the receiver keeps
    the generation (``_kvfence``) for its ``send_metadata``."""

    def _setup_bootstrap_infos(self: Any) -> Any:
        mgr = self.kv_mgr
        gate = getattr(mgr, _KEY, None)
        rs = None if gate is None else gate.resets
        if rs is None:
            return orig(self)
        try:
            gen = rs.generation(mgr, self.bootstrap_addr)
        except NoGeneration as e:
            gate.refuse(self, str(e))  # type: ignore[union-attr]
            from sglang.srt.disaggregation.base.conn import KVPoll  # type: ignore[import-untyped,import-not-found,unused-ignore]
            self.conclude_state = KVPoll.Failed
            return None
        if gen is None:
            return orig(self)  # SGLang's shared engine for this instance (logged)
        _override.session = gen.session
        try:
            return orig(self)
        finally:
            _override.session = None
            self._kvfence = gen
    return _setup_bootstrap_infos


def _get_session_id(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``MooncakeKVManager.get_session_id``: the transport generation's session on a
    thread inside :func:`_setup_bootstrap_infos` or :func:`_send_pinned` (.reset);
    SGLang's own otherwise."""

    def get_session_id(self: Any) -> Any:
        s = _override.session
        return orig(self) if s is None else s
    return get_session_id


def _send_metadata_0522(orig: Callable[..., Any]) -> Callable[..., Any]:
    """SGLang 0.5.22's ``MooncakeKVReceiver.send_metadata`` (no ``destination``
    parameter; the Mooncake receiver's own method, which 0.5.23 moved to
    ``CommonKVReceiver``): the same decision as :func:`_send_metadata`'s."""

    def send_metadata(self: Any, kv_indices: Any, aux_index: Optional[int] = None,
                      state_indices: Optional[List[Any]] = None,
                      decode_prefix_len: Optional[int] = None,
                      device_kv_indices: Any = None) -> Any:
        gate = getattr(self.kv_mgr, _KEY, None)
        if gate is not None and self.bootstrap_infos is not None:
            info = self.prefill_info
            c = gate.writer_cache.get(id(info))
            if c is None or c.info is not info:
                c = gate.writers_of(self)
            if c.error is not None:
                gate.refuse(self, c.error)
                return None
            self._kvfence = (c, kv_indices, aux_index, state_indices)
        return orig(self, kv_indices, aux_index, state_indices, decode_prefix_len,
                    device_kv_indices)
    return send_metadata


def _send_abort_notification(orig: Callable[..., Any]) -> Callable[..., Any]:
    def _send_abort_notification(self: Any, *, force_arm: bool = False) -> Any:
        mgr = self.kv_mgr
        gate = getattr(mgr, _KEY, None)
        if gate is None:
            return orig(self, force_arm=force_arm)
        h = getattr(self, _ATTR, None)
        if type(h) is not int:
            if h is None or type(h) is Generation:
                # No metadata went out under kvfence: SGLang's own.
                return orig(self, force_arm=force_arm)
            # The first abort of a request whose metadata went out: its room opens now,
            # before the ABORT goes out (the ACK that answers it must find the room).
            h = gate.open_at_abort(self)
            if h is None:
                # The table refused the room (logged, counted; not expected): the pages
                # are held for good (is_abort_release_safe never says yes for them).
                mgr.enable_deferred_decode_kv_release = True
                return orig(self, force_arm=True)
        # The room's abort time (once; the quarantine policy reads it), then kvfence's abort.
        aborted = gate.aborted
        if h not in aborted and h in gate.records:
            aborted[h] = _monotonic()
        try:
            gate.table.abort(h)
        except _ROOM_GONE:
            pass
        # Arm and accept the drain ACK whatever the deferred-release flag says.
        mgr.enable_deferred_decode_kv_release = True
        # The ABORT's generation is the room's kvfence handle, so that its ACK names the
        # lifecycle it drains: SGLang's own method arms it through
        # register_deferred_abort_room, on this thread, whose wrapper returns the handle
        # named here (and makes no SGLang tracker entry: for a room kvfence holds,
        # note_abort_ack and is_abort_release_safe answer from kvfence).
        # force_arm: the room exists, so some destinations may be published.
        # Keyed by room (not one slot per manager), so that an abort on another thread
        # can never take this room's handle.
        arming = gate.arming
        room = self.bootstrap_room
        arming[room] = h
        try:
            return orig(self, force_arm=True)
        finally:
            arming.pop(room, None)
    return _send_abort_notification


def _register_deferred_abort_room(orig: Callable[..., Any]) -> Callable[..., Any]:
    def register_deferred_abort_room(self: Any, bootstrap_room: int) -> Any:
        gate = getattr(self, _KEY, None)
        if gate is not None:
            h = gate.arming.pop(bootstrap_room, None)
            if h is not None:
                # The abort of a kvfence room (its wrapper named the handle around
                # SGLang's _send_abort_notification): the generation is the room's handle.
                return h
        return orig(self, bootstrap_room)
    return register_deferred_abort_room


def _note_abort_ack(orig: Callable[..., Any]) -> Callable[..., Any]:
    def note_abort_ack(self: Any, bootstrap_room: int, prefill_rank: int,
                       generation: int) -> None:
        gate = getattr(self, _KEY, None)
        if gate is not None and generation is not None:
            # ABORT_ACK = quiesce on the handle it carries.
            rec = gate.records.get(generation)
            if rec is not None and rec.room == bootstrap_room:
                # A live kvfence room (the handle *and* the room match: another room's
                # SGLang-armed generation may equal a handle): quiesce replaces SGLang's
                # ACK set. The room's own mapping: the instance may have been retired since.
                rank = rec.rank_of.get(prefill_rank)
                if rank is None:
                    gate.ignored_acks += 1
                    return
                try:
                    if gate.table.quiesce(generation, rank) == "stale":
                        gate.ignored_acks += 1  # released already (not yet freed)
                except _ERROR:
                    gate.ignored_acks += 1
                return
            # Not a live kvfence room (released, or another gate's): SGLang's own.
            gate.ignored_acks += 1
        orig(self, bootstrap_room, prefill_rank, generation)
    return note_abort_ack


def _apply_prefill_status(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``CommonKVManager.apply_prefill_status`` (decode thread), with the transport reset
    on: a prefill's "Failed to send ..." for a room kvfence holds (the decode may have
    aborted it first, and SGLang may drop the status for a cleared room) is noted for the
    scheduler thread's next drain, which resets that request's transport generation."""

    def apply_prefill_status(self: Any, *, bootstrap_room: int, status: int,
                             prefill_rank: int, failure_reason: Optional[str] = None) -> Any:
        gate = getattr(self, _KEY, None)
        if gate is not None and gate.resets is not None and failure_reason is not None \
                and str(failure_reason).startswith(_SEND_FAILED):
            gate.failed_writes.append(bootstrap_room)
        return orig(self, bootstrap_room=bootstrap_room, status=status,
                    prefill_rank=prefill_rank, failure_reason=failure_reason)
    return apply_prefill_status


def _handle_abort_ack_message(orig: Callable[..., Any]) -> Callable[..., Any]:
    def handle_abort_ack_message(self: Any, msg: List[bytes]) -> bool:
        if 2 <= len(msg) <= 3:
            # [ABORT_ACK, room, rank] with no generation (an older prefill's), or
            # [ABORT_ACK, room] (what SGLang's newer prefills send with deferred release
            # off): SGLang drops both, so a kvfence room would wait on it for ever.
            gate = getattr(self, _KEY, None)
            if gate is not None and msg[0] == _ABORT_ACK_TAG:
                try:
                    room = int(msg[1].decode("ascii"))
                except (ValueError, UnicodeDecodeError):
                    room = None
                if room is not None:
                    gate.legacy_ack(room)
        return bool(orig(self, msg))
    return handle_abort_ack_message


def _is_abort_release_safe(orig: Callable[..., Any]) -> Callable[..., Any]:
    def is_abort_release_safe(self: Any, bootstrap_room: int, required_acks: int) -> bool:
        gate = getattr(self, _KEY, None)
        if gate is not None:
            asks = _asks.cur
            if asks is not None:
                # Inside resolve_deferred_releases: SGLang asks once per held entry, in
                # its list's order; the answer is that entry's own request's (its
                # receiver's handle), never another request's of the same room.
                q = asks.get((id(self), bootstrap_room))
                if q:
                    h = q.pop()
                    if h is not None:
                        return h in gate.decided
                    # An entry kvfence does not gate: SGLang's own (below).
                    if gate.held_for_good and bootstrap_room in gate.held_for_good:
                        return False
                    return bool(orig(self, bootstrap_room, required_acks))
            hs = gate.room_handles.get(bootstrap_room)
            if hs is not None:
                # Asked for a room, not a request (outside SGLang's scan): yes only if
                # every open request of the room was released by kvfence.
                return bool(gate.released_for(bootstrap_room))
            if gate.held_for_good and bootstrap_room in gate.held_for_good:
                return False  # its room was refused at the abort: never released
        return bool(orig(self, bootstrap_room, required_acks))
    return is_abort_release_safe


class _Asks(threading.local):
    """The per-entry answers of the scan SGLang is running on this thread:
    ``(id(manager), bootstrap_room) -> [handle or None, ...]`` in reverse list order (a
    ``pop()`` per question), or ``None`` outside a scan."""

    cur: Optional[Dict[Tuple[int, int], List[Optional[int]]]] = None


_asks = _Asks()


def _scan(self: Any, orig: Callable[..., Any]) -> Any:
    """Runs SGLang's ``resolve_deferred_releases`` on the held list as it is now, with
    each held entry's ``is_abort_release_safe`` answered for that entry's own request.
    SGLang 0.5.23 asks the manager of every entry that is not a host destination, once,
    in list order, with the entry's room; the same room may be held by several requests
    (and at attention TP > 1 every rank's answers are MIN-reduced entry by entry), so the
    answers are queued per (manager, room) in that order."""
    asks: Dict[Tuple[int, int], List[Optional[int]]] = {}
    is_host = _IS_HOST
    for e in self._deferred_releases:
        d = e[0]
        if is_host(self, d):
            continue
        r = d.kv_receiver
        h = getattr(r, _ATTR, None)
        key = (id(r.kv_mgr), d.req.bootstrap_room)
        lst = asks.get(key)
        if lst is None:
            asks[key] = [h if type(h) is int else None]
        else:
            lst.append(h if type(h) is int else None)
    for lst in asks.values():
        lst.reverse()
    prev = _asks.cur
    _asks.cur = asks
    try:
        return orig(self)
    finally:
        _asks.cur = prev


class _ScanState:
    """What the ``resolve_deferred_releases`` wrapper remembers of one queue's held list
    between scheduler iterations (an attribute of the queue, read with ``getattr``:
    reading a queue's ``__dict__`` would turn its attribute storage into a dict and slow
    every attribute load of SGLang's own methods on it)."""

    __slots__ = ("held", "checked", "last", "ungated", "entries", "single")

    def __init__(self, queue: Any) -> None:
        self.held: Any = None  # the list object last seen (SGLang replaces it on a scan)
        self.checked = 0  # how many of its entries were checked
        self.last: Any = None  # its last checked entry (detects changes in place)
        self.ungated = 0  # how many checked entries are rooms kvfence does not gate
        self.entries: Dict[int, Any] = {}  # handle -> held entry, for the gated ones
        try:
            import torch.distributed as dist  # type: ignore[import-untyped,import-not-found,unused-ignore]

            self.single = dist.get_world_size(queue.gloo_group) == 1
        except Exception:
            self.single = False


_SCAN = "_kvfence_scan"  # a queue's _ScanState


def _resolve_deferred_releases(orig: Callable[..., Any]) -> Callable[..., Any]:
    def resolve_deferred_releases(self: Any) -> Any:
        if not self._deferred_releases:
            # Nothing held (every scheduler iteration without an aborted request):
            # SGLang's own method returns at once, and so does this one, draining
            # nothing. A decision matters only to a held entry; the first call that finds
            # one held drains every decision made meanwhile (the table queues them, one
            # per room at most), and the quarantine policy reads only rooms whose
            # entries are held. (This frame is kept this small on purpose: measured on
            # the dev box, the whole body below in one closure made an idle call 2x
            # SGLang's, 0.064 vs 0.032 us; this one costs what SGLang's does.)
            return None
        return _resolve_held(self, orig)
    return resolve_deferred_releases


_INF = math.inf


def _resolve_held(self: Any, orig: Callable[..., Any]) -> Any:
    """``resolve_deferred_releases`` with at least one entry held (see its wrapper)."""
    inf = _INF
    held = self._deferred_releases
    decided: Optional[Dict[int, str]] = None  # the one gate's decisions, if one gate
    any_decided = False
    n = 0
    for ref in _state.decode_gate_refs():
        gate = ref()
        if gate is None:
            continue
        gate.drain()
        n += 1
        decided = gate.decided
        if decided:
            any_decided = True
    if n != 1:
        decided = None
    st = getattr(self, _SCAN, None)
    if st is None:
        st = _ScanState(self)
        setattr(self, _SCAN, st)
    checked = st.checked
    if st.held is held and checked <= len(held) \
            and (checked == 0 or held[checked - 1] is st.last):
        start, ungated, entry_of = checked, st.ungated, st.entries
    else:
        # A new list (SGLang's own scan made it), or one changed in place: all again.
        start, ungated, entry_of = 0, 0, {}
    # Entries held since the last call (each is checked once, not every iteration).
    for i in range(start, len(held)):
        e = held[i]
        recv = e[0].kv_receiver
        if getattr(recv.kv_mgr, _KEY, None) is None:
            # A manager kvfence does not gate (built before install, or another
            # backend's): exactly as stock, its deadline included.
            ungated += 1
            continue
        # Time never releases a page of a gated manager: SGLang's deadline (index 2 of
        # each entry, "(decode_req, start_time, deadline, metadata_idx,
        # required_acks)") is made infinite; only is_drained (kvfence's decision) remains.
        if e[2] != inf:
            # One new tuple per entry (SGLang 0.5.23's entries have 5 fields).
            held[i] = e = (e[0], e[1], inf, e[3], e[4]) if len(e) == 5 \
                else (e[0], e[1], inf) + tuple(e[3:])
        h = getattr(recv, _ATTR, None)
        if type(h) is not int:
            ungated += 1
        else:
            entry_of[h] = e
    st.held, st.checked, st.last = held, len(held), held[-1]
    st.ungated, st.entries = ungated, entry_of
    if ungated or not st.single:
        # A room kvfence does not gate is held, or more than one attention-TP rank
        # (SGLang's all_reduce_flags must run on every rank): SGLang's own scan, each
        # entry answered for its own request.
        return _scan(self, orig)
    if not any_decided:
        # Every held entry is a kvfence room and kvfence released none since the last
        # call: SGLang's scan would release nothing.
        return None
    if decided is None:
        return _scan(self, orig)
    # Only the entries kvfence released go through SGLang's scan (each is drained, so
    # SGLang releases it with _do_release); the others stay held, in order, unscanned.
    ready = [entry_of.pop(h) for h in list(decided) if h in entry_of]
    if not ready:
        return None
    if len(ready) == len(held):
        held.clear()
    else:
        gone = {id(e) for e in ready}  # by identity: entries are never compared
        held[:] = [e for e in held if id(e) not in gone]
    self._deferred_releases = ready
    try:
        return _scan(self, orig)
    finally:
        left = self._deferred_releases  # what SGLang did not release (none, normally)
        self._deferred_releases = held
        if left:
            held.extend(left)
            for e in left:
                h = getattr(e[0].kv_receiver, _ATTR, None)
                if type(h) is int:
                    entry_of[h] = e
        st.checked = len(held)
        st.last = held[-1] if held else None


def _pop_transferred(orig: Callable[..., Any]) -> Callable[..., Any]:
    def pop_transferred(self: Any, rids_to_check: Optional[List[str]] = None) -> Any:
        # Hold every failed transfer of a gated manager until kvfence releases it,
        # whatever the deferred-release flag says (legacy mode freed at once): the
        # queue's flag and every gated manager's (SGLang sets each once, in its
        # __init__; set here whatever set them since). A queue whose requests go to a
        # manager with no gate is left exactly as stock.
        if not self.enable_deferred_kv_release and _queue_gated(self):
            self.enable_deferred_kv_release = True
        for ref in _state.decode_manager_refs():
            mgr = ref()
            if mgr is not None and not mgr.enable_deferred_decode_kv_release:
                mgr.enable_deferred_decode_kv_release = True
        return orig(self, rids_to_check)
    return pop_transferred


def _queue_gated(queue: Any) -> bool:
    """Whether ``queue`` (a DecodeTransferQueue) serves a gated manager: the first of
    its requests with a receiver has a gate (a scheduler's queue serves one manager)."""
    for d in list(getattr(queue, "queue", None) or ()):
        recv = getattr(d, "kv_receiver", None)
        if recv is not None:
            return getattr(getattr(recv, "kv_mgr", None), _KEY, None) is not None
    return False


def _release_memory_occupation(orig: Callable[..., Any]) -> Callable[..., Any]:
    def release_memory_occupation(self: Any, *a: Any, **kw: Any) -> Any:
        # SGLang drops its held list (the pool is torn down, nothing is freed one by
        # one): kvfence's records of those requests stop counting as held (metrics,
        # quarantine policy) and go when kvfence releases their rooms (an ACK or a
        # fence may still come: the table room stays until then).
        for e in list(getattr(self, "_deferred_releases", None) or ()):
            recv = getattr(e[0], "kv_receiver", None)
            h = getattr(recv, _ATTR, None)
            gate = getattr(getattr(recv, "kv_mgr", None), _KEY, None)
            if gate is None or type(h) is not int:
                continue
            gate.aborted.pop(h, None)
            if h in gate.records and h not in gate.dropped:
                gate.dropped.add(h)
                gate.dropped_rooms += 1
                if gate.decided.pop(h, None) is not None:
                    gate.forget(h)  # released already: nothing left to wait for
        return orig(self, *a, **kw)
    return release_memory_occupation


def _do_release(orig: Callable[..., Any]) -> Callable[..., Any]:
    def _do_release(self: Any, decode_req: Any, idx: int) -> Any:
        recv = decode_req.kv_receiver
        h = getattr(recv, _ATTR, None)
        gate = getattr(recv.kv_mgr, _KEY, None) if type(h) is int else None
        if gate is None:
            return orig(self, decode_req, idx)
        reason = gate.decided.pop(h, None)
        gate.aborted.pop(h, None)  # SGLang frees (or we quarantine) it: not held any more
        if reason is not None:
            # kvfence released it: its record goes now. (SGLang frees a kvfence room only
            # once kvfence released it, its deadline being infinite; were it ever to free
            # another, that room's record would stay, and its ACKs still count.)
            gate.forget(h)
        if reason == "quarantined":
            # Never reused: neither the KV pages nor the metadata slot go back. Only the
            # receiver's bookkeeping is ended, as _do_release would.
            recv.kv_mgr.clear_deferred_abort_state(decode_req.req.bootstrap_room)
            recv.clear()
            decode_req.kv_receiver = None
            return None
        return orig(self, decode_req, idx)
    return _do_release


_SUCCESS: Any = None  # KVPoll.Success (set by patches(), which imports SGLang)
_ABORT_ACK_TAG: Any = None  # SGLang's ABORT_ACK frame tag (set by patches())


def _handle_node_failure(orig: Callable[..., Any]) -> Callable[..., Any]:
    def _handle_node_failure(self: Any, failed_bootstrap_addr: str) -> Any:
        gate = _gate(self)
        # The rooms SGLang tracks for the prefill (it drops the set): requests whose
        # rooms may still open with its ranks.
        tracker = getattr(self, "addr_to_rooms_tracker", None) or {}
        affected = list(tracker.get(failed_bootstrap_addr, ()))
        hosts: List[str] = []
        if gate is not None:
            # Every rank_ip the instance's ranks registered (SGLang's connection pool,
            # keyed by the bootstrap address plus a suffix per rank group; SGLang drops
            # the entries below): the proof checks sockets from each of them.
            hosts = _pool_endpoints(self, failed_bootstrap_addr)[0]
        out = orig(self, failed_bootstrap_addr)
        if gate is not None:
            mgr = self

            def others() -> List[Tuple[str, int]]:
                # The other instances' rank endpoints *now*, read at each proof poll: an
                # instance this decode first talks to after the failure (the one its
                # requests go to meanwhile) is one whose sockets must not count.
                return _pool_endpoints(mgr, failed_bootstrap_addr)[1]

            gate.node_failed(failed_bootstrap_addr, affected,
                             getattr(self, "request_status", None), hosts, others)
        return out
    return _handle_node_failure


def _pool_endpoints(mgr: Any, addr: str) -> Tuple[List[str], List[Tuple[str, int]]]:
    """From SGLang's connection pool (``connection_pool``, keyed by a bootstrap address
    plus a suffix per rank group): the ``rank_ip`` of every rank of the instance at
    ``addr``, and the ``(rank_ip, rank_port)`` of every rank of the other instances. Takes
    SGLang's ``connection_lock`` alone (no kvfence lock is held with it), on the
    heartbeat thread or a fence thread."""
    lock = getattr(mgr, "connection_lock", None)
    with lock if lock is not None else contextlib.nullcontext():
        pool = dict(getattr(mgr, "connection_pool", None) or {})
    hosts: List[str] = []
    others: List[Tuple[str, int]] = []
    for k, infos in pool.items():
        mine = isinstance(k, str) and k.startswith(addr)
        for b in infos or ():
            ip = b.get("rank_ip") if isinstance(b, dict) else None
            if ip and mine:
                hosts.append(str(ip))
            elif ip and b.get("rank_port"):
                # another instance's rank endpoint: see DecodeGate.node_failed
                others.append((str(ip), int(b["rank_port"])))
    return hosts, others


def patches(release: str = "0.5.23"
            ) -> List[Tuple[type, str, Callable[[Callable[..., Any]], Callable[..., Any]]]]:
    """The decode-side wrappers for SGLang ``release`` (one of
    :data:`kvfence._sglang_hooks.TESTED`), as ``(class, method, make_wrapper)``."""
    from sglang.srt.disaggregation.common.conn import CommonKVManager, CommonKVReceiver  # type: ignore[import-untyped,import-not-found,unused-ignore]
    from sglang.srt.disaggregation.base.conn import KVPoll, KVTransferDestination  # type: ignore[import-untyped,import-not-found,unused-ignore]
    from sglang.srt.disaggregation.decode import DecodeTransferQueue  # type: ignore[import-untyped,import-not-found,unused-ignore]
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVReceiver  # type: ignore[import-untyped,import-not-found,unused-ignore]

    from sglang.srt.disaggregation.common.conn import ABORT_ACK_TAG  # type: ignore[import-untyped,import-not-found,unused-ignore]

    global _SUCCESS, _DEVICE, _ABORT_ACK_TAG, _IS_HOST, _RELEASE
    _SUCCESS = KVPoll.Success
    _RELEASE = release
    _DEVICE = KVTransferDestination.DEVICE
    _ABORT_ACK_TAG = ABORT_ACK_TAG
    # The send_metadata wrapper mirrors SGLang's parameters (no *args repacking): refuse,
    # before anything is patched, an SGLang whose method takes others.
    if release == "0.5.22":
        require_params(MooncakeKVReceiver, "send_metadata", _SEND_METADATA_PARAMS_0522)
        send: Tuple[type, str, Callable[[Callable[..., Any]], Callable[..., Any]]] = (
            MooncakeKVReceiver, "send_metadata", _send_metadata_0522)
        _IS_HOST = _is_host_0522
    elif release == "0.5.23":
        require_params(CommonKVReceiver, "send_metadata", _SEND_METADATA_PARAMS)
        send = (CommonKVReceiver, "send_metadata", _send_metadata)
        _IS_HOST = _is_host_0523
    else:
        raise ValueError("kvfence.sglang: no decode patch table for SGLang %s" % release)
    extra: List[Tuple[type, str, Callable[[Callable[..., Any]], Callable[..., Any]]]] = []
    if release == "0.5.23":
        from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager  # type: ignore[import-untyped,import-not-found,unused-ignore]
        # The transport reset (KVFENCE_SGLANG_RESET; SGLang's own where it is off).
        extra = [(CommonKVReceiver, "_setup_bootstrap_infos", _setup_bootstrap_infos),
                 (CommonKVManager, "apply_prefill_status", _apply_prefill_status),
                 (MooncakeKVManager, "get_session_id", _get_session_id)]
    return extra + [
        send,
        (CommonKVReceiver, "_send_abort_notification", _send_abort_notification),
        (CommonKVManager, "register_deferred_abort_room", _register_deferred_abort_room),
        (CommonKVManager, "note_abort_ack", _note_abort_ack),
        (CommonKVManager, "handle_abort_ack_message", _handle_abort_ack_message),
        (CommonKVManager, "is_abort_release_safe", _is_abort_release_safe),
        (CommonKVManager, "_handle_node_failure", _handle_node_failure),
        (DecodeTransferQueue, "resolve_deferred_releases", _resolve_deferred_releases),
        (DecodeTransferQueue, "pop_transferred", _pop_transferred),
        (DecodeTransferQueue, "_do_release", _do_release),
        (DecodeTransferQueue, "release_memory_occupation", _release_memory_occupation),
    ]
