"""Transfers, waits, modes, quarantine, stats: the rest of the surface."""

import gc
import threading
import time

import pytest

import kvfence
from kvfence import RoomTable
from conftest import drain_one


def test_transfer_context_manager_completes(gate):
    h = gate.open([], [1])
    with gate.begin_transfer(h, peer=2) as t:
        assert isinstance(t.token, int) and t.peer == 2 and t.handle == h
        assert not t.ended
    assert t.ended
    gate.finish(h)
    assert drain_one(gate).reason == "finished"


def test_transfer_context_manager_fails_on_exception_and_propagates(gate):
    h = gate.open([], [1])
    with pytest.raises(RuntimeError, match="link down"):
        with gate.begin_transfer(h, peer=2):
            raise RuntimeError("link down")
    gate.abort(h)
    assert gate.drain_released() == []          # failed: held until the peer is fenced
    assert gate.room_status(h)["failed"] == 1
    assert gate.fence_rank(2) >= 1
    assert drain_one(gate).handle == h


def test_transfer_ended_inside_with_is_not_ended_again(gate):
    h = gate.open([], [1])
    with gate.begin_transfer(h) as t:
        t.complete()
    gate.finish(h)
    assert len(gate.drain_released()) == 1


def test_unended_transfer_collected_counts_as_failed(gate):
    h = gate.open([], [1])
    gate.begin_transfer(h, peer=4)              # dropped at once: failed, like a Rust guard
    gc.collect()
    assert gate.room_status(h)["failed"] == 1
    gate.finish(h)
    assert gate.drain_released() == []
    gate.fence_rank(4)
    assert drain_one(gate).reason == "finished"


def test_fail_after_peer_fenced_drops_hold_at_once(gate):
    h = gate.open([], [1])
    t = gate.begin_transfer(h, peer=6)
    gate.fence_rank(6)
    gate.abort(h)
    t.fail()
    assert drain_one(gate).handle == h


def test_quarantine_never_frees_pages(pool):
    h = pool.open([0], 4)
    t = pool.begin_transfer(h)                   # no peer: only quarantine can clear it
    t.fail()
    pool.abort(h)
    pool.quiesce(h, 0)
    assert pool.drain_released() == []
    pool.quarantine(h)
    r = drain_one(pool)
    assert r.reason == "quarantined" and len(r.pages) == 4
    s = pool.stats()
    assert s["quarantined_rooms"] == 1 and s["quarantined_pages"] == 4
    assert s["pages_free"] == 252                # never back in the pool
    assert s["rooms_free"] == 64                 # but the room index is


def test_grow_and_pages_of(gate, pool):
    g = gate.open([], [1])
    assert gate.grow(g, (2, 3)) is None
    assert gate.pages_of(g) == [1, 2, 3]
    p = pool.open([], 2)
    more = pool.grow(p, 3)
    assert len(more) == 3 and pool.pages_of(p)[2:] == more
    assert pool.stats()["pages_owned"] == 5
    assert gate.open([]) and pool.open([])       # pages=None: no pages


def test_wait_released_timeout_then_success(gate):
    h = gate.open([0], [1])
    gate.abort(h)
    t0 = time.monotonic()
    assert gate.wait_released(h, timeout=0.05) is False
    assert time.monotonic() - t0 >= 0.04
    assert gate.wait_released(h, 0) is False
    gate.quiesce(h, 0)
    assert gate.wait_released(h, 0.01) is True   # decided (queued): the waiter drains
    drain_one(gate)
    assert gate.wait_released(h, 0) is True
    assert gate.wait_released(h) is True


def test_wait_idle_timeout_then_success(pool):
    h = pool.open([0], 1)
    assert pool.wait_idle(0.02) is False
    pool.finish(h)
    assert pool.wait_idle(0.02) is False         # rank 0 still writing
    pool.quiesce(h, 0)
    pool.drain_released()
    assert pool.wait_idle(0.02) is True
    assert pool.wait_idle() is True


def test_wait_releases_the_gil(gate):
    h = gate.open([0], [1])
    gate.abort(h)
    result = []
    waiter = threading.Thread(target=lambda: result.append(gate.wait_released(h, timeout=10)))
    waiter.start()
    time.sleep(0.05)                             # the waiter is parked, GIL released
    spins = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.05:
        spins += 1                               # this thread keeps running Python
    gate.quiesce(h, 0)
    gate.drain_released()
    waiter.join(5)
    assert result == [True] and spins > 1000


def test_direct_mode_releases_at_once_and_still_drains_once():
    t = RoomTable(1, 4, release_queue=False)
    assert t.release_queue is False
    h = t.open([0], 4)
    t.abort(h)
    assert t.quiesce(h, 0) == "released"
    assert t.wait_released(h, 0) is True         # index and pages back already
    h2 = t.open([0], 4)                          # reusable before the drain
    assert t.queued_releases() == 1
    r = t.drain_released()
    assert [x.handle for x in r] == [h]
    assert t.drain_released() == []
    t.abort(h2)
    assert t.fence_rank(0) == 1                  # exact in direct mode
    assert t.pop_released().handle == h2
    assert t.pop_released() is None


def test_fence_rank_counts_and_readmit(gate):
    hs = [gate.open([1], [i]) for i in range(3)]
    for h in hs[:2]:
        gate.abort(h)
    n = gate.fence_rank(1)
    assert n == 2                                 # exact in queue mode too
    assert sorted(r.handle for r in gate.drain_released()) == sorted(hs[:2])
    assert gate.room_status(hs[2])["waiting_on"] == []
    assert gate.readmit_rank(1)


def test_stats_and_room_status_keys(gate):
    h = gate.open([0, 1], [1, 2, 3])
    t = gate.begin_transfer(h, peer=0)
    gate.abort(h)
    gate.quiesce(h, 0)
    s = gate.stats()
    for key in ("rooms_free", "rooms_owned", "rooms_closing", "pages_held", "releases",
                "stale_refused", "duplicate_acks", "quarantined_pages", "failed_transfers",
                "quarantined_rooms", "fenced", "closing", "rooms_queued", "pages_queued"):
        assert key in s
    assert (s["rooms_closing"], s["pages_held"], s["rooms_free"]) == (1, 3, 63)
    st = gate.room_status(h)
    assert st == s["closing"][0]
    assert (st["phase"], st["waiting_on"], st["transfers"], st["pages"]) == ("aborting", [1], 1, 3)
    assert st["closing_for"] >= 0.0 and st["quarantined"] is False
    t.complete()
    gate.quiesce(h, 1)
    assert gate.stats()["rooms_queued"] == 1
    gate.drain_released()
    s = gate.stats()
    assert (s["releases"], s["rooms_free"], s["rooms_queued"]) == (1, 64, 0)


def test_properties_and_repr():
    g, p = RoomTable(4), RoomTable(4, 16, max_fenced=3, max_tokens=5)
    assert (g.rooms, g.pages, g.is_gate, g.release_queue) == (4, None, True, True)
    assert (p.pages, p.is_gate, p.max_fenced, p.max_tokens) == (16, False, 3, 5)
    assert "pages=None" in repr(g) and "pages=16" in repr(p)   # tests/test_reprs.py: all
    h = g.open([], [9], token=3)
    g.finish(h)
    r = g.drain_released()[0]
    assert "reason='finished'" in repr(r)
    assert kvfence.MAX_WRITERS == 64 and kvfence.__version__


def test_docstrings_everywhere():
    for cls in (kvfence.RoomTable, kvfence.Transfer, kvfence.Released, kvfence.TransferQueue):
        assert cls.__doc__
        for name, member in vars(cls).items():
            if not name.startswith("_"):
                assert getattr(member, "__doc__", None), f"{cls.__name__}.{name}"


def test_package_exports():
    """`kvfence.__all__` is the native module's names plus one class per error, each one
    importable (the stubs' check allowlists this list, so it is checked here)."""
    core = {"RoomTable", "Transfer", "Released", "TransferQueue", "MAX_WRITERS", "MAX_ROOMS",
            "MAX_PAGES", "__version__"}
    assert set(kvfence.__all__) == core | set(kvfence._errors.__all__)
    assert len(kvfence.__all__) == len(set(kvfence.__all__))
    namespace = {}
    exec("from kvfence import *", namespace)
    for name in kvfence.__all__:
        assert namespace[name] is getattr(kvfence, name)
