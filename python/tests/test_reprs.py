"""Every repr is Python syntax: a call whose arguments are Python literals equal to the
object's attributes (no Rust `Some(3)`, `None`-less options or lowercase `true`)."""

import ast

import pytest

from kvfence import RoomTable


def repr_fields(obj, name):
    """The keyword arguments of `repr(obj)`, parsed as Python: `name(k=literal, ...)`."""
    text = repr(obj)
    call = ast.parse(text, mode="eval").body
    assert isinstance(call, ast.Call), text
    assert isinstance(call.func, ast.Name) and call.func.id == name, text
    assert not call.args, text
    return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}


@pytest.mark.parametrize("peer", [3, 0, 2**32 - 2, None])
def test_transfer_repr(gate, peer):
    h = gate.open([], [1])
    t = gate.begin_transfer(h, peer=peer)
    fields = repr_fields(t, "Transfer")
    assert fields == {"token": t.token, "handle": h, "peer": peer, "ended": False}
    t.complete()
    assert repr_fields(t, "Transfer")["ended"] is True


@pytest.mark.parametrize("reason", ["finished", "aborted", "quarantined"])
def test_released_repr(gate, reason):
    h = gate.open([], [4, 2, 2**32 - 1], token=2**64 - 1)
    {"finished": gate.finish, "aborted": gate.abort, "quarantined": gate.quarantine}[reason](h)
    (r,) = gate.drain_released()
    assert repr_fields(r, "Released") == {
        "handle": h, "token": 2**64 - 1, "pages": [4, 2, 2**32 - 1], "reason": reason,
    }


def test_released_repr_no_pages(pool):
    h = pool.open([])
    pool.finish(h)
    (r,) = pool.drain_released()
    assert repr_fields(r, "Released") == {"handle": h, "token": 0, "pages": [],
                                          "reason": "finished"}


@pytest.mark.parametrize("kwargs", [
    dict(rooms=4), dict(rooms=4, pages=16), dict(rooms=8, pages=None, release_queue=False),
    dict(rooms=2, pages=3, release_queue=False, max_fenced=7, max_tokens=5),
])
def test_room_table_repr_rebuilds_the_config(kwargs):
    """`eval(repr(t))` makes a table of the same configuration."""
    t = RoomTable(**kwargs)
    fields = repr_fields(t, "RoomTable")
    again = eval(repr(t), {"RoomTable": RoomTable})
    for k in ("rooms", "pages", "release_queue", "max_fenced", "max_tokens"):
        assert fields[k] == getattr(t, k) == getattr(again, k), k
