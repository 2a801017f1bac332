"""The binding's argument fast paths: they must give exactly what the exact paths give.

Handles are read back through a cache of the ints `open` returned (one int comparison
instead of a 128-bit conversion); writer ranks and page ids in a list or tuple are read in
place. Each test here would fail if a fast path accepted something the exact path refuses
(a forged handle sharing a cached handle's low bits) or read a wrong value.
"""

import enum
import pickle

import pytest

import kvfence
from kvfence import RoomTable

from conftest import drain_one


def test_equal_handle_objects_all_work(gate):
    """The int `open` returned, an equal int from the wire, an int subclass: one room."""
    h = gate.open([0, 1], [7])

    class Wire(int):
        pass

    for same in (h, int(str(h)), pickle.loads(pickle.dumps(h)), Wire(h)):
        assert same == h
        assert gate.phase(same) == "owned"
        assert gate.pages_of(same) == [7]
    assert gate.quiesce(int(str(h)), 0) == "recorded"
    assert gate.quiesce(Wire(h), 1) == "recorded"
    assert gate.quiesce(h, 1) == "duplicate"


@pytest.mark.parametrize("bit", [64, 65, 100, 127])
def test_forged_high_bits_are_refused_while_cached(gate, bit):
    """Same low 64 bits (room index, generation) as a cached handle, another check: the
    cache must miss and the core refuse it."""
    h = gate.open([0], [1])
    forged = h ^ (1 << bit)
    assert forged & (2**64 - 1) == h & (2**64 - 1)
    with pytest.raises(kvfence.InvalidHandle):
        gate.phase(forged)
    with pytest.raises(kvfence.InvalidHandle):
        gate.quiesce(forged, 0)
    with pytest.raises(kvfence.InvalidHandle):
        gate.abort(forged)
    assert gate.phase(h) == "owned"


@pytest.mark.parametrize("bad", [-1, 2**128, 2**128 + 5, -(2**128) + 1])
def test_out_of_range_sharing_low_bits(gate, bad):
    """Ints outside 0..2**128 whose low 64 bits match a cached handle's."""
    h = gate.open([0], [1])
    forged = (h & (2**64 - 1)) + (bad - (bad & (2**64 - 1)))
    assert forged & (2**64 - 1) == h & (2**64 - 1)
    with pytest.raises(kvfence.InvalidHandle):
        gate.phase(forged)
    with pytest.raises(ValueError):
        gate.quiesce(forged, 0)


def test_stale_after_the_slot_was_reused():
    """One room: the second lifecycle replaces the cached int; the first handle is stale
    (through the cache before the reopen, through the exact path after)."""
    t = RoomTable(1)
    h1 = t.open([0], [1])
    t.abort(h1)
    assert t.quiesce(h1, 0) == "released"
    assert t.quiesce(h1, 0) == "stale"          # still cached: the core says stale
    drain_one(t)
    h2 = t.open([0], [2])
    assert h2 != h1
    assert t.quiesce(h1, 0) == "stale"          # evicted: exact path, still stale
    assert t.quiesce(int(str(h1)), 0) == "stale"
    assert t.phase(h1) == "free"
    assert t.pages_of(h2) == [2]


def test_more_rooms_than_cache_slots():
    """A table larger than the cache (4096 slots): colliding handles evict each other and
    every one still works."""
    t = RoomTable(5000)
    hs = [t.open([i % 7], [i], token=i) for i in range(5000)]
    assert len(set(hs)) == 5000
    for i, h in enumerate(hs):
        assert t.pages_of(h) == [i]
    for i, h in enumerate(hs):
        assert t.abort(h) == [i % 7]
        assert t.quiesce(h, i % 7) == "released"
    assert sorted(r.token for r in t.drain_released()) == list(range(5000))


class Rank(enum.IntEnum):
    A = 3
    B = 9


class Index:
    """Not an int, but usable as one (`__index__`)."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


@pytest.mark.parametrize("make", [list, tuple, iter, lambda xs: (x for x in xs)])
def test_sequences_of_every_kind(gate, make):
    h = gate.open(make([0, 5, 64, 4_000_000_000]), make([0, 1, 2**32 - 1]))
    assert gate.pages_of(h) == [0, 1, 2**32 - 1]
    assert sorted(gate.abort(h)) == [0, 5, 64, 4_000_000_000]


def test_int_like_items_take_the_exact_path(gate):
    h = gate.open([Rank.A, Index(1), Index(70)], [Rank.B, Index(0), Index(12)])
    assert gate.pages_of(h) == [9, 0, 12]
    assert sorted(gate.abort(h)) == [1, 3, 70]


@pytest.mark.parametrize("make", [list, tuple])
def test_bad_items_in_a_sequence(gate, make):
    with pytest.raises(ValueError):
        gate.open([0], make([1, 2**32]))
    with pytest.raises(ValueError):
        gate.open([0], make([1, -1]))
    with pytest.raises(ValueError):
        gate.open([0], make([1, 2**70]))
    with pytest.raises(TypeError):
        gate.open([0], make([1, 2.0]))
    with pytest.raises(kvfence.InvalidRank):
        gate.open(make([0, 2**32]), [1])
    with pytest.raises(kvfence.InvalidRank):
        gate.open(make([0, 2**32 - 1]), [1])
    with pytest.raises(kvfence.DuplicateWriter):
        gate.open(make([70, 1, 70]), [1])
    with pytest.raises(TypeError):
        gate.open(make([0, "1"]), [1])
    assert gate.stats()["rooms_owned"] == 0


def test_list_changed_by_an_item_while_it_is_read(gate):
    """An item's `__index__` empties the list being read: no crash, no garbage; the
    result is what the list held when each item was read."""
    pages = [1, 2, None, 4, 5]

    class Clear:
        def __index__(self):
            del pages[3:]
            return 3

    pages[2] = Clear()
    h = gate.open([0], pages)
    assert gate.pages_of(h) == [1, 2, 3]
