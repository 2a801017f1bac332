"""A scheduler's use of the package, fully annotated: `scripts/python.sh` type-checks this
file with `mypy --strict` against the stubs (and pytest runs it), so a stub that drifts
from the surface fails one or the other."""

from __future__ import annotations

from typing import List

import kvfence


def decode_step(table: kvfence.RoomTable, writers: List[int], pages: List[int]) -> List[int]:
    """Open, transfer, abort with its fan-out and ACKs, drain: the pages to free."""
    h: int = table.open(writers, pages, token=7)
    with table.begin_transfer(h, peer=writers[0]) as transfer:
        assert not transfer.ended
    for rank in table.abort(h):
        answer = table.quiesce(h, rank)
        assert answer in ("recorded", "released")
    free: List[int] = []
    for released in table.drain_released():
        assert released.token == 7 and released.handle == h
        if released.reason != "quarantined":
            free.extend(released.pages)
    try:
        table.finish(h)
    except kvfence.StaleHandle:
        pass
    assert table.phase(h) == "free"
    return free


def test_typed_use() -> None:
    table = kvfence.RoomTable(8, max_fenced=4)
    assert decode_step(table, [0, 1], [10, 11, 12]) == [10, 11, 12]
    stats = table.stats()
    assert stats["rooms_owned"] == 0
    assert table.wait_idle(timeout=1.0)
