"""Every exception path of the surface."""

import pytest

import kvfence
from kvfence import RoomTable


def test_hierarchy():
    for name in kvfence._errors.__all__:
        cls = getattr(kvfence, name)
        assert issubclass(cls, kvfence.Error)
    for cls in (kvfence.InvalidHandle, kvfence.InvalidRank, kvfence.InvalidConfig,
                kvfence.DuplicateWriter, kvfence.TooManyWriters, kvfence.RankNotInRoom,
                kvfence.TooManyPages, kvfence.InvalidToken):
        assert issubclass(cls, ValueError)
    assert issubclass(kvfence.AlreadyAborted, kvfence.RoomClosed)
    assert issubclass(kvfence.AlreadyFinished, kvfence.RoomClosed)
    assert not issubclass(kvfence.StaleHandle, ValueError)


@pytest.mark.parametrize("kwargs", [
    dict(rooms=0), dict(rooms=2**24 + 1), dict(rooms=4, pages=0), dict(rooms=4, max_fenced=0),
    dict(rooms=4, max_tokens=0), dict(rooms=4, max_fenced=2**16 + 1),
])
def test_invalid_config(kwargs):
    with pytest.raises(kvfence.InvalidConfig):
        RoomTable(**kwargs)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError):
        RoomTable(-1)
    with pytest.raises(TypeError):
        RoomTable("8")
    with pytest.raises(TypeError):
        RoomTable(8, [1, 2])
    assert RoomTable(8).max_tokens == 32        # the core's default: 4 per room
    assert RoomTable(8, max_tokens=3).max_tokens == 3


@pytest.mark.parametrize("bad", [-1, 2**128, -(2**127), 2**200])
def test_handle_out_of_range_is_invalid_handle(gate, bad):
    for call in (gate.finish, gate.abort, gate.pages_of, gate.phase, gate.room_status,
                 gate.quarantine, gate.begin_transfer, gate.wait_released):
        with pytest.raises(kvfence.InvalidHandle):
            call(bad)
    with pytest.raises(ValueError):
        gate.quiesce(bad, 0)


def test_handle_not_issued_is_invalid_handle(gate):
    other = RoomTable(64)
    h = other.open([0], [1])
    for forged in (0, 1, h, h ^ 1, 2**128 - 1):
        with pytest.raises(kvfence.InvalidHandle):
            gate.phase(forged)
        with pytest.raises(kvfence.InvalidHandle):
            gate.quiesce(forged, 0)


def test_handle_wrong_type(gate):
    with pytest.raises(TypeError):
        gate.phase("0x1")
    with pytest.raises(TypeError):
        gate.phase(1.0)


def test_stale_handle(gate):
    h = gate.open([], [1])
    gate.finish(h)
    gate.drain_released()
    for call in (gate.finish, gate.pages_of, gate.room_status, gate.quarantine,
                 gate.begin_transfer):
        with pytest.raises(kvfence.StaleHandle):
            call(h)
    with pytest.raises(kvfence.StaleHandle):
        gate.abort(h)
    with pytest.raises(kvfence.StaleHandle):
        gate.grow(h, [2])
    assert gate.quiesce(h, 0) == "stale"   # ACKs: returned, not raised
    assert gate.phase(h) == "free"


def test_room_closed(gate, pool):
    h = gate.open([0], [1])
    gate.abort(h)
    with pytest.raises(kvfence.RoomClosed) as e:
        gate.begin_transfer(h)
    assert e.value.phase == "aborting"
    with pytest.raises(kvfence.RoomClosed):
        gate.grow(h, [2])
    with pytest.raises(kvfence.RoomClosed):
        gate.pages_of(h)
    p = pool.open([0], 2)
    pool.finish(p)
    with pytest.raises(kvfence.RoomClosed) as e:
        pool.begin_transfer(p)
    assert e.value.phase == "draining"
    with pytest.raises(kvfence.RoomClosed):
        pool.grow(p, 1)


def test_already_aborted_and_finished(gate):
    h = gate.open([0], [1])
    gate.finish(h)
    with pytest.raises(kvfence.AlreadyFinished):
        gate.finish(h)
    assert gate.abort(h) == [0]          # a finishing room can still be aborted
    assert gate.abort(h) == []           # already aborting: nothing more to tell
    with pytest.raises(kvfence.AlreadyAborted) as e:
        gate.finish(h)
    assert e.value.phase == "aborting"


def test_ranks(gate):
    with pytest.raises(kvfence.InvalidRank):
        gate.open([2**32 - 1], [1])
    with pytest.raises(kvfence.InvalidRank):
        gate.open([-1], [1])
    with pytest.raises(kvfence.InvalidRank):
        gate.open([2**32], [1])
    with pytest.raises(kvfence.TooManyWriters):
        gate.open(range(kvfence.MAX_WRITERS + 1), [1])
    with pytest.raises(kvfence.DuplicateWriter) as e:
        gate.open([1, 2, 1], [1])
    assert e.value.rank == 1
    h = gate.open(range(kvfence.MAX_WRITERS), [1])
    with pytest.raises(kvfence.RankNotInRoom) as e:
        gate.quiesce(h, 1000)
    assert e.value.rank == 1000
    with pytest.raises(kvfence.InvalidRank):
        gate.quiesce(h, -5)
    with pytest.raises(kvfence.InvalidRank):
        gate.fence_rank(2**32 - 1)
    with pytest.raises(kvfence.InvalidRank):
        gate.readmit_rank(-1)
    with pytest.raises(kvfence.InvalidRank):
        gate.begin_transfer(h, peer=2**40)
    # Issue 18, item 4: 2**32 - 1 is no rank id; as a peer it was accepted, and such a
    # failed transfer could only end by quarantine.
    with pytest.raises(kvfence.InvalidRank) as e:
        gate.begin_transfer(h, peer=2**32 - 1)
    assert e.value.rank == 2**32 - 1
    assert gate.room_status(h)["transfers"] == 0
    with pytest.raises(TypeError):
        gate.open(5, [1])                # writers must be iterable


def test_rank_fenced_and_too_many_fenced():
    t = RoomTable(8, max_fenced=1)
    assert t.fence_rank(3) == 0
    with pytest.raises(kvfence.RankFenced) as e:
        t.open([1, 3], [1])
    assert e.value.rank == 3
    with pytest.raises(kvfence.TooManyFenced):
        t.fence_rank(4)
    assert t.stats()["fenced"] == [3]
    assert t.readmit_rank(3) is True
    assert t.readmit_rank(3) is False
    t.open([1, 3], [1])


def test_pages_arguments(gate, pool):
    with pytest.raises(ValueError):
        gate.open([0], [-1])
    with pytest.raises(ValueError):
        gate.open([0], [2**32])
    with pytest.raises(TypeError):
        gate.open([0], 3)                # gate mode takes ids, not a count
    with pytest.raises(TypeError):
        pool.open([0], [1, 2])           # pool mode takes a count
    with pytest.raises(ValueError):
        pool.open([0], -1)
    with pytest.raises(ValueError):
        pool.open([0], 1, token=5)       # token is gate mode only
    with pytest.raises(ValueError):
        gate.open([0], [1], token=-1)
    with pytest.raises(ValueError):
        gate.open([0], [1], token=2**64)
    h = pool.open([0], 1)
    with pytest.raises(TypeError):
        pool.grow(h, [1])
    g = gate.open([0], [1])
    with pytest.raises(TypeError):
        gate.grow(g, 1)


def test_too_many_pages_table_full_pool_exhausted():
    t = RoomTable(2, 8)
    with pytest.raises(kvfence.TooManyPages):
        t.open([], 9)
    a = t.open([], 6)
    with pytest.raises(kvfence.PoolExhausted) as e:
        t.open([], 3)
    assert e.value.requested == 3
    with pytest.raises(kvfence.PoolExhausted):
        t.grow(a, 3)
    t.open([], 2)
    with pytest.raises(kvfence.TableFull):
        t.open([], 0)
    assert t.stats()["pages_free"] == 0


def test_invalid_token_and_too_many_transfers():
    t = RoomTable(4, max_tokens=1)
    h = t.open([], [1])
    x = t.begin_transfer(h)
    with pytest.raises(kvfence.TooManyTransfers):
        t.begin_transfer(h)
    x.complete()
    with pytest.raises(kvfence.InvalidToken):
        x.complete()
    with pytest.raises(kvfence.InvalidToken):
        x.fail()
    y = t.begin_transfer(h)              # the token slot is free again
    y.complete()
    t.finish(h)
    assert len(t.drain_released()) == 1  # released once, never decremented twice


def test_timeouts_are_validated(gate):
    h = gate.open([], [1])
    for bad in (-0.1, float("nan")):
        with pytest.raises(ValueError):
            gate.wait_released(h, bad)
        with pytest.raises(ValueError):
            gate.wait_idle(bad)
    with pytest.raises(TypeError):
        gate.wait_idle("1")


def test_error_messages_are_the_cores(gate):
    h = gate.open([0], [1])
    gate.abort(h)
    with pytest.raises(kvfence.RoomClosed, match="no new transfer may begin"):
        gate.begin_transfer(h)
