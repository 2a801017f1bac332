"""Run by test_sglang_adapter.py in a subprocess (it builds a real prefill manager and
patches SGLang's module globals): kvfence.sglang's prefill gate on SGLang 0.5.23's real
``MooncakeKVManager.transfer_worker``, with SGLang's own guards taken away.

SGLang 0.5.23 guards its drain ACK itself: a per-room count of chunks dequeued and not yet
done (``_staging_outstanding``) and a set of rooms whose write returned -1
(``_deferred_ack_poisoned_rooms``). kvfence's prefill gate is a second, independent guard.
Here SGLang's two are neutralized (the count always reads 0, the poison set never keeps a
room), so only kvfence's gate stands between an ABORT and an early ACK; each check below
fails if that gate does not hold:

1. a chunk whose write is in flight when the ABORT arrives: no ACK until the write is
   done (the chunk's transfer holds the room), then exactly one;
2. a write that returned -1 (its bytes may still land): the aborted room is never ACKed,
   and its sender's ``clear()`` quarantines it;
3. a chunk still queued when its room was aborted: refused, never written; the ACK goes
   out at once (nothing was in flight).

Exits non-zero (an AssertionError) on any violation; prints ``prefill gate OK``.
"""

import os
import sys
import threading
import time
from typing import Any, Dict, List

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "e2e", "sglang", "bench"))

import bench_release_path as b  # noqa: E402
import kvfence.sglang as ks  # noqa: E402
from sglang.srt.disaggregation.base.conn import KVPoll  # noqa: E402
from sglang.srt.disaggregation.common.conn import AbortNotification  # noqa: E402
from sglang.srt.disaggregation.common.utils import FastQueue, TransferKVChunk  # noqa: E402
from sglang.srt.disaggregation.mooncake.conn import TransferInfo  # noqa: E402

ks.install()
mgr = b.prefill_manager()  # a real prefill MooncakeKVManager, kvfence's gate attached
gate = mgr._kvfence_gate


class _NoCount(dict):
    """SGLang's per-room count of chunks not yet done, taken away: always reads 0."""

    def __getitem__(self, k: Any) -> int:
        return 0

    def __setitem__(self, k: Any, v: Any) -> None:
        pass

    def get(self, k: Any, d: Any = None) -> int:
        return 0


mgr._staging_outstanding = _NoCount()
mgr.poison_deferred_ack_room = lambda room: None  # SGLang's poison set, taken away


class _Engine:
    """Stands in for Mooncake: every write returns at once with 0, except the rooms
    named in ``block`` (waits for the event) and ``fail`` (returns -1)."""

    def __init__(self) -> None:
        self.block: Dict[int, threading.Event] = {}
        self.fail: set = set()
        self.writes: List[int] = []
        self.current: Any = None
        self.started = threading.Event()

    def batch_transfer_sync(self, session_id: str, srcs: Any, dsts: Any, lens: Any) -> int:
        room = self.current
        self.writes.append(room)
        ev = self.block.get(room)
        if ev is not None:
            self.started.set()
            assert ev.wait(10), "the test never released the blocked write"
        return -1 if room in self.fail else 0

    def transfer_sync(self, *a: Any) -> int:
        return 0


engine = mgr.engine = _Engine()
acks: List[int] = []
mgr._send_abort_ack = lambda room, target: acks.append(room)

# Which room a write is for: the worker calls send_kvcache with the chunk's room set here.
orig_send = type(mgr).send_kvcache


def send_kvcache(self: Any, sid: str, prefill_kv_indices: Any, *a: Any, **kw: Any) -> Any:
    engine.current = current_room[0]
    return orig_send(self, sid, prefill_kv_indices, *a, **kw)


current_room = [None]
type(mgr).send_kvcache = send_kvcache


class _Queue(FastQueue):
    def get(self) -> Any:  # noqa: D401 - FastQueue.get's parameters (none)
        c = FastQueue.get(self)
        current_room[0] = None if c is None else c.room
        return c


def open_room(room: int) -> int:
    """A request on ``room`` as the prefill scheduler makes one: its status, its
    destination (a decode session of its own: SGLang stops writing to a session once a
    write to it failed), and (kvfence) its room, opened by the wrapped sender's __init__."""
    session = "127.0.0.1:%d" % (room % 60000)
    mgr.decode_kv_args_table[session] = b.decode_kv_args(mgr)
    mgr.request_status[room] = KVPoll.Transferring
    mgr.transfer_infos[room] = {session: TransferInfo(
        room=room, endpoint="127.0.0.1", dst_port=1, mooncake_session_id=session,
        dst_kv_indices=np.arange(64, dtype=np.int32), dst_aux_index=0,
        dst_state_indices=[], required_dst_info_num=1, is_dummy=False)}
    h = gate.open_room(room)
    assert h is not None
    return h


def chunk(room: int, last: bool = False) -> Any:
    return TransferKVChunk(room=room, prefill_kv_indices=np.arange(4, dtype=np.int32),
                           index_slice=slice(0, 4), is_last_chunk=last,
                           prefill_aux_index=None, state_indices=None)


def abort(room: int) -> None:
    """The decode's ABORT for ``room`` (generation 7), as the bootstrap thread gets it."""
    assert mgr._handle_abort_notification(AbortNotification(
        room=room, decode_ip="127.0.0.1", decode_port=2, generation=7).to_zmq())


def wait_for(pred: Any, what: str) -> None:
    t0 = time.monotonic()
    while not pred():
        assert time.monotonic() - t0 < 10, "timed out waiting for " + what
        time.sleep(0.005)


q = _Queue()
worker = threading.Thread(target=mgr.transfer_worker, args=(q, None), daemon=True)
worker.start()

# 1. In flight at the ABORT: no ACK while the write runs, exactly one after.
A = 6_000_001
open_room(A)
engine.block[A] = threading.Event()
q.put(chunk(A))
assert engine.started.wait(10)
abort(A)
time.sleep(0.2)
assert acks == [], "ACK sent while room %d's write was in flight: %s" % (A, acks)
engine.block[A].set()
wait_for(lambda: acks == [A], "room %d's ACK after its write" % A)

# 2. A write that returned -1: never ACKed; clear() quarantines the room.
B = 6_000_002
hB = open_room(B)
engine.fail.add(B)
q.put(chunk(B))
wait_for(lambda: B in engine.writes, "room %d's write" % B)
abort(B)
open_room(6_000_099)
q.put(chunk(6_000_099))  # the worker comes back for another chunk
wait_for(lambda: 6_000_099 in engine.writes, "the next chunk")
time.sleep(0.2)
assert B not in acks, "room %d ACKed after a write of it returned -1" % B
assert gate.table.room_status(hB)["failed"] == 1, gate.table.room_status(hB)
quarantined = gate.quarantined_rooms
mgr.request_status.pop(B, None)
gate.close(B)
gate.pump(mgr)
assert gate.quarantined_rooms == quarantined + 1 and gate.released.get(hB) == "quarantined"
assert B not in acks

# 3. Queued behind the ABORT: refused, never written; ACKed at once.
C = 6_000_003
open_room(C)
abort(C)
refused = gate.refused_chunks
q.put(chunk(C))
open_room(6_000_098)
q.put(chunk(6_000_098))
wait_for(lambda: 6_000_098 in engine.writes, "the chunk after room %d's" % C)
assert C not in engine.writes, "room %d's queued chunk was written after its ABORT" % C
assert gate.refused_chunks == refused + 1
assert acks.count(C) == 1, acks

q.put(None)  # SGLang's teardown sentinel
worker.join(10)
assert not worker.is_alive()
print("prefill gate OK")
os._exit(0)
