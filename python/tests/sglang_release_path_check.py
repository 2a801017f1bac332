"""Run by test_sglang_adapter.py in a subprocess (the benchmark's fakes patch SGLang's
module globals): kvfence.sglang's release path on SGLang's real DecodeTransferQueue,
at the sizes the benchmark uses. Exits non-zero (an AssertionError) on any violation."""

import math
import os
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "e2e", "sglang", "bench"))
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))

import torch.distributed as dist  # noqa: E402

import bench_release_path as b  # noqa: E402
import kvfence.sglang as ks  # noqa: E402

dist.init_process_group("gloo", rank=0, world_size=1)
ks.install()
# The lifecycle asserts: every aborted room held after the pop; the ACKs of 1 % release
# exactly those (the rest stay held, in order); the other ACKs release the rest.
for n in (1, 10, 300):
    for on in (False, True):
        b.decode_lifecycle(n, on)
gate = getattr(b._decode_mgrs[True], "_kvfence_gate")
assert not gate.records and not gate.decided and not gate.room_handles and not gate.held_for_good, gate
assert not gate.aborted, gate

# SGLang clears the held list in place (release_memory_occupation) and holds new entries
# whose deadlines have passed: the wrapper must see them as new (no timed release).
import sglang.srt.disaggregation.decode as dec  # noqa: E402

orig_defer = dec.DecodeTransferQueue._defer_release
seen = {}


def capture(self, decode_req):  # the queue the lifecycle builds, kept for the check below
    seen["q"] = self
    return orig_defer(self, decode_req)


dec.DecodeTransferQueue._defer_release = capture
released = []
orig_do = dec.DecodeTransferQueue._do_release
dec.DecodeTransferQueue._do_release = lambda self, r, idx: (released.append(r), orig_do(self, r, idx))
try:
    b.decode_lifecycle(20, True)
finally:
    dec.DecodeTransferQueue._defer_release = orig_defer
q = seen["q"]
assert not q._deferred_releases
reqs = released[:]
released.clear()


class _Receiver:  # a receiver kvfence does not gate (no room): SGLang's ACK count decides
    kv_mgr = b._decode_mgrs[True]
    abort_notified = True

    def clear(self):
        pass


def hold(batch, handle=None):
    past = time.monotonic() - 1.0  # SGLang's deadline has passed
    for r in batch:
        r.kv_receiver = _Receiver()
        if handle is not None:  # counted as a kvfence room (one kvfence never releases)
            r.kv_receiver._kvfence = handle
        q._deferred_releases.append((r, past, past, 0, 1))


hold(reqs[:5], handle=(1 << 127) + 12345)
q.resolve_deferred_releases()  # all "kvfence rooms", none released: the list is kept
assert not released, "released on a deadline: %r" % released
# In place, as release_memory_occupation does; then as many new entries as before (rooms
# kvfence does not gate, deadlines passed), then one more: SGLang's own scan runs.
q._deferred_releases.clear()
hold(reqs[5:10])
q.resolve_deferred_releases()
hold(reqs[10:11])
for _ in range(3):
    q.resolve_deferred_releases()
assert not released, "released on a deadline after an in-place clear: %r" % released
assert all(e[2] == math.inf for e in q._deferred_releases), q._deferred_releases

# The ABORT_ACK wrapper (note_abort_ack): an ACK from a rank that is not the room's
# writer, or for a generation kvfence does not hold, is ignored and counted; the writer's
# ACK quiesces the aborted room, which is then released.
from types import SimpleNamespace  # noqa: E402
import numpy as np  # noqa: E402

mgr = b._decode_mgrs[True]
gate = getattr(mgr, "_kvfence_gate")
# kvfence's send_metadata wrapper around a stub (these receivers are not SGLang's: its own
# method would need the rest of one)
from kvfence.sglang import decode as kdec  # noqa: E402

stash = kdec._send_metadata(lambda *a: None)
recv = SimpleNamespace(bootstrap_addr="127.0.0.1:8997", kv_mgr=mgr, bootstrap_room=4242,
                       prefill_info=SimpleNamespace(pp_size=1, attn_cp_size=1),
                       target_cp_ranks=[0], target_tp_ranks=[0], target_pp_ranks=[0],
                       bootstrap_infos=[{"rank_ip": "127.0.0.1", "rank_port": 7001}])
stash(recv, np.arange(4, dtype=np.int32), None, None)
h = gate.open_at_abort(recv)
assert h is not None
# Aborted as the abort wrapper does it (the receiver here is not SGLang's, so the wrapper
# cannot run): kvfence's abort, and the abort time the quarantine policy reads.
gate.table.abort(h)
gate.aborted[h] = time.monotonic()
ignored = gate.ignored_acks
mgr.note_abort_ack(4242, 7, h)  # not a writer of this room
gate.drain()
assert gate.ignored_acks == ignored + 1 and h in gate.records and h not in gate.decided
mgr.note_abort_ack(4242, 0, h + 1)  # a generation kvfence does not hold: SGLang's own
assert gate.ignored_acks == ignored + 2 and h in gate.records
mgr.note_abort_ack(4242, 0, None)  # no generation: SGLang's own, not counted
assert gate.ignored_acks == ignored + 2 and h in gate.records
# Another room's ACK whose SGLang-armed generation equals this room's handle (the
# generation counter is shared): SGLang's own, never a quiesce of this room.
mgr.note_abort_ack(4243, 0, h)
gate.drain()
assert h in gate.records and h not in gate.decided, "another room's ACK quiesced this one"
assert gate.ignored_acks == ignored + 3
mgr.note_abort_ack(4242, 0, h)  # the writer's ACK: quiesce -> released
gate.drain()
assert gate.decided.get(h) == "aborted", gate.decided
assert gate.ignored_acks == ignored + 3
# Released, not yet freed by SGLang: its record stays (until _do_release); a late
# duplicate ACK finds it stale and is counted as ignored, nothing else changes.
assert h in gate.records and gate.room_handles.get(4242) == (h,)
mgr.note_abort_ack(4242, 0, h)
assert gate.ignored_acks == ignored + 4 and gate.decided.get(h) == "aborted"
gate.decided.pop(h)
gate.aborted.pop(h)
assert gate.forget(h) is not None and 4242 not in gate.room_handles

# The ABORT of a kvfence room carries the room's handle as its generation (SGLang's own
# _send_abort_notification arms it through the wrapped register_deferred_abort_room) and
# makes no SGLang tracker entry; a request sent without kvfence gets SGLang's own.
import threading  # noqa: E402

from sglang.srt.disaggregation.base.conn import KVPoll  # noqa: E402
from sglang.srt.disaggregation.common.conn import AbortNotification  # noqa: E402

frames_sent = []


class _CaptureSock:
    def send_multipart(self, frames):
        frames_sent.append(AbortNotification.from_zmq(frames))


for k in ("_deferred_abort_ack_tracker", "failure_records", "request_status"):
    setattr(mgr, k, {})
mgr._deferred_abort_generation = 0
mgr.failure_lock = threading.Lock()
mgr.local_ip, mgr.rank_port = "127.0.0.1", 5000
mgr.defer_decode_allocation = False
arm = b._receiver(mgr, 4300, b._PREFILL_INFO, b._receiver_class(True))
mgr.request_status[4300] = KVPoll.WaitingForInput
b.send_metadata(True)(arm, np.arange(4, dtype=np.int32), 0, None)
# From here the ABORTs it sends are captured (its metadata went to the benchmark's sink).
arm._connect_to_bootstrap_server = lambda bi: (_CaptureSock(), threading.Lock())
arm.abort()
h3 = arm._kvfence
assert type(h3) is int and gate.records[h3].room == 4300
assert [f.generation for f in frames_sent] == [h3] and arm._abort_generation == h3
assert 4300 not in mgr._deferred_abort_ack_tracker and mgr._deferred_abort_generation == 0
assert not gate.arming
own = b._receiver(mgr, 4301, b._PREFILL_INFO, b._receiver_class(True))
own._connect_to_bootstrap_server = arm._connect_to_bootstrap_server
mgr.request_status[4301] = KVPoll.WaitingForInput
gate.arming[4399] = h3  # another room's ABORT being armed meanwhile (another thread)
own.abort()  # no send_metadata under kvfence: SGLang's own generation and tracker entry
assert frames_sent[-1].generation == 1 and mgr._deferred_abort_ack_tracker[4301].generation == 1
assert gate.arming == {4399: h3}  # not taken by another room's arming
gate.arming.clear()
# (h3's room stays open: quarantined, so that the checks below start from no queued release)
gate.table.quarantine(h3)
gate.drain()
gate.decided.pop(h3)
gate.aborted.pop(h3)
gate.forget(h3)

# A release decided while nothing is held (the idle iterations' calls return at once and
# drain nothing) is taken by the first call that finds its entry held: nothing is lost,
# nothing is released before kvfence decided.
q._deferred_releases.clear()  # what is held above stays held for good: dropped here
recv2 = SimpleNamespace(bootstrap_addr="127.0.0.1:8997", kv_mgr=mgr, bootstrap_room=4244,
                        prefill_info=recv.prefill_info, target_cp_ranks=[0],
                        target_tp_ranks=[0], target_pp_ranks=[0],
                        bootstrap_infos=recv.bootstrap_infos)
stash(recv2, np.arange(4, dtype=np.int32), None, None)
h2 = gate.open_at_abort(recv2)
assert h2 is not None
gate.table.abort(h2)
gate.aborted[h2] = time.monotonic()
mgr.note_abort_ack(4244, 0, h2)  # the writer's ACK: released in the table
for _ in range(3):
    assert q.resolve_deferred_releases() is None  # nothing held: an idle iteration
assert not released and h2 in gate.records
late = reqs[11]
late.req.bootstrap_room = 4244
hold([late], handle=h2)
q.resolve_deferred_releases()
assert released == [late], released  # released once, by SGLang's own _do_release
assert not q._deferred_releases and h2 not in gate.records and h2 not in gate.decided
assert not gate.table.queued_releases()
released.clear()
print("release path OK")
os._exit(0)
