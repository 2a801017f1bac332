"""A bool is not a rank, page id, token, handle or count, and bytes or a str is not a
sequence of ids: each is refused with TypeError, on every path (the fast reads of a list
or tuple of exact ints included), and the refused call changes nothing.

`True` is an int subclass, so `quiesce(h, True)` would otherwise ACK rank 1 and
`open(..., pages=b"\\x01")` would hand the engine page 1 back: always a caller's bug.
"""

import pytest

import kvfence
from kvfence import RoomTable


class Index:
    """Not an int, but usable as one (`__index__`): still accepted."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


# How a sequence of ids reaches the binding: list and tuple take the fast path (items read
# in place), the others the general one.
SEQUENCES = [list, tuple, iter, lambda xs: (x for x in xs), set]


def unchanged(table):
    s = table.stats()
    return s["rooms_owned"], s["fenced"], s["pages_owned"]


@pytest.mark.parametrize("make", SEQUENCES)
@pytest.mark.parametrize("b", [True, False])
def test_bool_in_writers_or_pages(gate, make, b):
    before = unchanged(gate)
    with pytest.raises(TypeError, match="bool"):
        gate.open(make([7, b]), [5])
    with pytest.raises(TypeError, match="bool"):
        gate.open(make([b]), [5])
    with pytest.raises(TypeError, match="bool"):
        gate.open([0], make([5, b]))
    h = gate.open([0], [5])
    with pytest.raises(TypeError, match="bool"):
        gate.grow(h, make([6, b]))
    assert gate.pages_of(h) == [5]
    gate.abort(h)
    gate.quiesce(h, 0)
    gate.drain_released()
    assert unchanged(gate) == before


@pytest.mark.parametrize("blob", [b"\x01\x02", bytearray(b"\x01"), "12", b""])
def test_bytes_and_str_are_not_sequences_of_ids(gate, blob):
    with pytest.raises(TypeError):
        gate.open(blob, [1])
    with pytest.raises(TypeError):
        gate.open([0], blob)
    h = gate.open([0], [1])
    with pytest.raises(TypeError):
        gate.grow(h, blob)
    assert gate.pages_of(h) == [1]
    assert gate.stats()["rooms_owned"] == 1


def test_bool_rank_arguments(gate):
    h = gate.open([0, 1], [1])
    with pytest.raises(TypeError, match="bool"):
        gate.quiesce(h, True)                   # would ACK rank 1
    with pytest.raises(TypeError, match="bool"):
        gate.quiesce(h, False)
    assert gate.room_status(h)["waiting_on"] == [0, 1]
    with pytest.raises(TypeError, match="bool"):
        gate.fence_rank(True)                   # would fence rank 1
    assert gate.stats()["fenced"] == []
    assert gate.room_status(h)["waiting_on"] == [0, 1]
    gate.fence_rank(1)
    with pytest.raises(TypeError, match="bool"):
        gate.readmit_rank(True)
    assert gate.stats()["fenced"] == [1]
    with pytest.raises(TypeError, match="bool"):
        gate.begin_transfer(h, peer=True)
    with pytest.raises(TypeError, match="bool"):
        gate.begin_transfer(h, peer=False)
    assert gate.room_status(h)["transfers"] == 0


def test_bool_token_and_handle(gate):
    with pytest.raises(TypeError, match="bool"):
        gate.open([0], [1], token=True)
    assert gate.stats()["rooms_owned"] == 0
    h = gate.open([0], [1])
    for b in (True, False):
        for call in (gate.phase, gate.pages_of, gate.room_status, gate.abort, gate.finish,
                     gate.quarantine, gate.begin_transfer, gate.wait_released):
            with pytest.raises(TypeError, match="bool"):
                call(b)
        with pytest.raises(TypeError, match="bool"):
            gate.quiesce(b, 0)
        with pytest.raises(TypeError, match="bool"):
            gate.grow(b, [1])
    assert gate.phase(h) == "owned"


def test_bool_counts(pool):
    with pytest.raises(TypeError, match="bool"):
        pool.open([0], True)
    assert pool.stats()["rooms_owned"] == 0
    h = pool.open([0], 1)
    with pytest.raises(TypeError, match="bool"):
        pool.grow(h, True)
    assert len(pool.pages_of(h)) == 1
    for kwargs in (dict(rooms=True), dict(rooms=4, pages=True), dict(rooms=4, max_fenced=True),
                   dict(rooms=4, max_tokens=True)):
        with pytest.raises(TypeError, match="bool"):
            RoomTable(**kwargs)


def test_bool_timeouts(gate):
    h = gate.open([0], [1])
    with pytest.raises(TypeError, match="bool"):
        gate.wait_released(h, True)
    with pytest.raises(TypeError, match="bool"):
        gate.wait_idle(timeout=False)
    assert gate.wait_released(h, 0) is False and gate.wait_idle(0.0) is False
    assert gate.wait_released(h, 0.001) is False and gate.wait_idle(timeout=0) is False


def test_int_subclasses_and_index_are_still_ids(gate):
    """Refusing bool refuses nothing else: IntEnum members and `__index__` objects are
    read as their values, on the fast paths' fallback and the general path."""
    import enum

    class Rank(enum.IntEnum):
        A = 3

    for make in SEQUENCES:
        h = gate.open(make([Rank.A, Index(70)]), make([Rank.A, Index(12)]))
        assert sorted(gate.pages_of(h)) == [3, 12]
        assert gate.quiesce(h, Index(70)) == "recorded"
        assert gate.quiesce(h, Rank.A) == "recorded"
        gate.finish(h)
    t = gate.begin_transfer(gate.open([], [1]), peer=Rank.A)
    assert t.peer == 3
    t.complete()
