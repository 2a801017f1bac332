"""``RoomTable.drain_reasons()``: the releases as ``(handle, reason)`` pairs, each exactly
once, the same releases ``drain_released()`` would deliver; never one that carries page
ids the engine must free (gate mode)."""

import pytest

import kvfence
from kvfence import RoomTable


def lifecycle(t, n, pages=None):
    """``n`` rooms ended every way a gate-mode room ends: aborted and ACKed, finished
    (through the queue: a writer still pending at ``finish``), quarantined."""
    hs = [t.open([0, 1], pages, token=i) for i in range(n)]
    for i, h in enumerate(hs):
        if i % 3 == 0:
            t.abort(h)
            t.quiesce(h, 0)
            t.quiesce(h, 1)
        elif i % 3 == 1:
            t.finish(h)
            t.quiesce(h, 0)
            t.quiesce(h, 1)
        else:
            t.quarantine(h)
    return hs


@pytest.mark.parametrize("release_queue", [True, False])
def test_pairs_are_the_releases_drain_released_delivers(release_queue):
    a = RoomTable(16, release_queue=release_queue)
    b = RoomTable(16, release_queue=release_queue)
    ha, hb = lifecycle(a, 12), lifecycle(b, 12)
    pairs = a.drain_reasons()
    released = b.drain_released()
    # The same rooms (by position: each table's handles are its own), the same reasons.
    assert sorted((ha.index(h), why) for h, why in pairs) == \
        sorted((hb.index(r.handle), r.reason) for r in released)
    assert {why for _, why in pairs} == {"aborted", "finished", "quarantined"}
    # Exactly once.
    assert a.queued_releases() == 0 and a.drain_reasons() == [] and a.drain_released() == []


def test_handle_is_the_int_open_returned():
    t = RoomTable(8)
    h = t.open([0])
    t.abort(h)
    t.quiesce(h, 0)
    ((got, why),) = t.drain_reasons()
    assert got is h and why == "aborted"
    # The room index reopened before the drain: an equal int, not the new room's.
    h1 = t.open([0])
    t.abort(h1)
    t.quiesce(h1, 0)
    h2 = t.open([0])
    assert h2 != h1
    ((got, _),) = t.drain_reasons()
    assert got == h1 and got is not h2
    t.abort(h2)


def test_gate_release_with_pages_is_refused_and_kept():
    t = RoomTable(8)
    no_pages = t.open([0])
    with_pages = t.open([0], [7, 8], token=5)
    for h in (no_pages, with_pages):
        t.abort(h)
        t.quiesce(h, 0)
    with pytest.raises(ValueError, match="drain_released"):
        t.drain_reasons()
    # Nothing delivered, nothing lost: both come out of drain_released, pages intact.
    assert t.queued_releases() == 2
    got = sorted((r.token, r.pages) for r in t.drain_released())
    assert got == [(0, []), (5, [7, 8])]


def test_pool_mode_releases_come_out_as_pairs():
    t = RoomTable(4, pages=8)
    h = t.open([0], 3)
    t.abort(h)
    t.quiesce(h, 0)
    assert t.drain_reasons() == [(h, "aborted")]
    assert t.stats()["pages_free"] == 8  # already back in the pool


def test_reasons_are_shared_strings():
    t = RoomTable(8)
    lifecycle(t, 6)
    words = {why: why for _, why in t.drain_reasons()}
    again = RoomTable(8)
    lifecycle(again, 6)
    assert all(words[why] is why for _, why in again.drain_reasons())


@pytest.mark.parametrize("reopen", [False, True])
def test_no_release_lost_when_allocation_fails(reopen):
    """Every allocation of the call fails in turn (CPython's ``_testcapi.set_nomemory``):
    a ``MemoryError`` (never a panic) that delivered nothing and lost nothing. With
    ``reopen``, the released rooms' indices are reopened first, so the handle ints are no
    longer cached and are allocated too."""
    _testcapi = pytest.importorskip("_testcapi", reason="needs CPython's _testcapi")
    RoomTable(1).drain_reasons()  # warm up
    failed = succeeded = 0
    for start in range(30):
        t = RoomTable(5, release_queue=not reopen)  # direct releases free the index
        hs = lifecycle(t, 5)
        if reopen:
            assert [t.open([0]) for _ in range(5)]  # every index in use again
        _testcapi.set_nomemory(start, 0)
        try:
            got = t.drain_reasons()
        except MemoryError:
            got = None
        finally:
            _testcapi.remove_mem_hooks()
        if got is None:
            failed += 1
            assert t.queued_releases() == 5
            got = []
        else:
            succeeded += 1
        got += t.drain_reasons()
        assert sorted(hs.index(h) for h, _ in got) == list(range(5))
    assert failed > 0 and succeeded > 0
