"""The peer behaviours SGLang's disaggregation unit tests check, one test each, against
the kvfence Python surface (decode side = the RoomTable, prefill ranks = writers)."""

import threading
import time

import pytest

import kvfence
from conftest import drain_one


def test_release_only_after_every_required_rank_acks(gate):
    h = gate.open([0, 1, 2], [10, 11, 12], token=7)
    assert gate.abort(h) == [0, 1, 2]
    assert gate.quiesce(h, 0) == "recorded"
    assert gate.quiesce(h, 2) == "recorded"
    assert gate.drain_released() == []
    assert gate.phase(h) == "aborting"
    assert gate.room_status(h)["waiting_on"] == [1]
    assert gate.quiesce(h, 1) == "released"
    r = drain_one(gate)
    assert (r.handle, r.token, r.pages, r.reason) == (h, 7, [10, 11, 12], "aborted")


def test_duplicate_ack_counts_once(gate):
    h = gate.open([0, 1], [1])
    gate.abort(h)
    assert gate.quiesce(h, 0) == "recorded"
    assert gate.quiesce(h, 0) == "duplicate"
    assert gate.quiesce(h, 0) == "duplicate"
    assert gate.drain_released() == []          # rank 1 still owes its ACK
    assert gate.stats()["duplicate_acks"] == 2
    assert gate.quiesce(h, 1) == "released"
    assert drain_one(gate).pages == [1]


def test_ack_before_abort_is_recorded(gate):
    h = gate.open([0, 1], [5, 6])
    assert gate.quiesce(h, 0) == "recorded"     # rank 0 finished sending before the abort
    assert gate.phase(h) == "owned"
    assert gate.abort(h) == [1]                 # only rank 1 still needs telling
    assert gate.quiesce(h, 1) == "released"
    assert drain_one(gate).reason == "aborted"


def test_late_ack_after_release_does_not_touch_reused_room():
    pool = kvfence.RoomTable(1, 4)              # one room, four pages: reuse is certain
    h = pool.open([0, 1], 4)
    old_pages = pool.pages_of(h)
    pool.abort(h)
    pool.quiesce(h, 0)
    pool.quiesce(h, 1)
    assert drain_one(pool).pages == old_pages
    reused = pool.open([0, 1], 4)               # same index, same pages, next request
    assert sorted(pool.pages_of(reused)) == sorted(old_pages)
    pool.abort(reused)
    # A late ACK of the first lifecycle: stale, and it changes nothing in the new one.
    assert pool.quiesce(h, 0) == "stale"
    assert pool.quiesce(h, 1) == "stale"
    assert pool.room_status(reused)["waiting_on"] == [0, 1]
    assert pool.drain_released() == []
    assert pool.stats()["stale_refused"] >= 2
    assert pool.quiesce(reused, 0) == "recorded"
    assert pool.quiesce(reused, 1) == "released"
    assert drain_one(pool).handle == reused


def test_reregistering_resets_acks(gate):
    h = gate.open([0, 1], [1])
    gate.quiesce(h, 0)
    gate.quiesce(h, 1)
    gate.finish(h)
    drain_one(gate)
    # The same request slot registered again: a new lifecycle that waits on every rank.
    h2 = gate.open([0, 1], [1], token=1)
    assert h2 != h
    assert gate.room_status(h2)["waiting_on"] == [0, 1]
    gate.abort(h2)
    assert gate.quiesce(h2, 0) == "recorded"    # not "duplicate": the ACKs were reset
    assert gate.drain_released() == []
    assert gate.quiesce(h2, 1) == "released"
    assert drain_one(gate).token == 1


def test_stale_generation_ack_is_ignored_after_room_reuse():
    table = kvfence.RoomTable(1)                # one room: reuse is certain
    h1 = table.open([3], [100])
    table.abort(h1)
    table.quiesce(h1, 3)
    drain_one(table)
    h2 = table.open([3], [200])                 # same index, next generation
    table.abort(h2)
    assert table.quiesce(h1, 3) == "stale"      # the old generation's ACK
    assert table.room_status(h2)["waiting_on"] == [3]
    assert table.phase(h2) == "aborting"
    assert table.drain_released() == []
    assert table.quiesce(h2, 3) == "released"
    assert drain_one(table).pages == [200]


def test_hold_until_drained_then_release_once_and_free_index():
    table = kvfence.RoomTable(1, 8)             # one room, so its index must come back
    h = table.open([0], 8)
    t = table.begin_transfer(h, peer=0)
    table.abort(h)
    table.quiesce(h, 0)
    assert table.phase(h) == "aborting"         # held: the transfer is in flight
    with pytest.raises(kvfence.TableFull):
        table.open([0], 1)
    t.complete()
    assert table.phase(h) == "free"
    assert table.stats()["rooms_queued"] == 1   # released, index back once drained
    r = drain_one(table)
    assert (r.reason, len(r.pages)) == ("aborted", 8)
    assert table.drain_released() == []         # once
    assert table.stats()["releases"] == 1
    h2 = table.open([0], 8)                     # the index and the pages are free again
    assert sorted(table.pages_of(h2)) == sorted(r.pages)


def test_failed_transfer_is_isolated_and_not_retried(gate):
    bad = gate.open([0], [1, 2])
    good = gate.open([0], [3, 4])
    tb = gate.begin_transfer(bad, peer=9)
    tg = gate.begin_transfer(good, peer=9)
    tb.fail()                                    # outcome unknown: bad stays held
    tg.complete()
    for h in (bad, good):
        gate.abort(h)
        gate.quiesce(h, 0)
    r = drain_one(gate)                          # only the healthy room is released
    assert r.handle == good
    assert gate.room_status(bad)["failed"] == 1
    with pytest.raises(kvfence.InvalidToken):
        tb.fail()                                # not retried: a second end is refused
    assert gate.drain_released() == []
    gate.fence_rank(9)                           # the peer's transport is torn down
    r = drain_one(gate)
    assert (r.handle, r.pages) == (bad, [1, 2])
    assert gate.drain_released() == []           # released once
    assert gate.stats()["failed_transfers"] == 1


def test_worker_skipping_chunks_before_abort_is_registered_still_acks(gate):
    h = gate.open([0, 1], list(range(8)))
    # Rank 0 sends chunk 0, then its later chunk intents find the room closed and skip.
    t = gate.begin_transfer(h, peer=0)
    t.complete()
    gate.abort(h)
    with pytest.raises(kvfence.RoomClosed) as e:
        gate.begin_transfer(h, peer=0)
    assert e.value.phase == "aborting"
    # Rank 1 skipped every chunk (it saw the abort before the decode side registered it
    # on its ACK path); both still ACK, and only then is the room released.
    assert gate.quiesce(h, 1) == "recorded"
    assert gate.drain_released() == []
    assert gate.quiesce(h, 0) == "released"
    assert drain_one(gate).pages == list(range(8))


def test_outstanding_transfer_keeps_room_held(gate):
    h = gate.open([0], [1])
    t = gate.begin_transfer(h, peer=0)
    gate.abort(h)
    gate.quiesce(h, 0)
    for _ in range(3):
        assert gate.drain_released() == []
        assert gate.phase(h) == "aborting"
        assert gate.room_status(h)["transfers"] == 1
    assert not gate.wait_released(h, timeout=0.02)
    t.complete()
    assert drain_one(gate).handle == h


def test_drain_ack_fans_out_to_every_aborting_decode_rank():
    # One request served by 4 decode ranks (TP), each with its own table, all written by
    # prefill rank 0. The prefill worker drains once and ACKs every aborting decode rank.
    decode = [kvfence.RoomTable(8) for _ in range(4)]
    handles = [d.open([0], [rank * 10, rank * 10 + 1], token=rank) for rank, d in enumerate(decode)]
    aborting = [i for i, (d, h) in enumerate(zip(decode, handles)) if d.abort(h) == [0]]
    assert aborting == [0, 1, 2, 3]
    # ... the prefill worker drains its queue and in-flight writes, then fans out:
    for i in aborting:
        assert decode[i].quiesce(handles[i], 0) == "released"
    for rank, d in enumerate(decode):
        r = drain_one(d)
        assert (r.token, r.pages) == (rank, [rank * 10, rank * 10 + 1])


def test_running_sibling_transfer_is_drained_after_first_failure(gate):
    h = gate.open([], [1, 2, 3, 4])
    first = gate.begin_transfer(h, peer=5)
    sibling = gate.begin_transfer(h, peer=5)
    first.fail()
    gate.abort(h)
    gate.fence_rank(5)                    # the failure is cleared by the fence...
    assert gate.drain_released() == []    # ...but the sibling is still running
    assert gate.room_status(h)["transfers"] == 1
    sibling.complete()
    r = drain_one(gate)
    assert (r.handle, r.reason) == (h, "aborted")


def test_abort_waits_for_worker_before_it_acks():
    table = kvfence.RoomTable(8, release_queue=False)
    h = table.open([0], [42])
    events = []
    started = threading.Event()

    def worker():
        with table.begin_transfer(h, peer=0):
            started.set()
            time.sleep(0.1)                  # a write in flight
            events.append("write landed")
        events.append("ack")
        assert table.quiesce(h, 0) == "released"

    th = threading.Thread(target=worker)
    th.start()
    started.wait()
    assert table.abort(h) == [0]             # never blocks, even with a write in flight
    assert table.phase(h) == "aborting"
    assert table.wait_released(h, timeout=10)
    events.append("released")
    th.join()
    assert events == ["write landed", "ack", "released"]
    assert drain_one(table).pages == [42]
