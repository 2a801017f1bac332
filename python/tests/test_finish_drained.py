"""``RoomTable.finish_drained``: a successful transfer's end in one call (``finish`` and
``quiesce`` of every writer), its release not queued."""

import pytest

from kvfence import AlreadyAborted, RoomTable, StaleHandle


@pytest.mark.parametrize("pages", [None, 4])
def test_finish_drained_releases_at_once_and_bypasses_the_queue(pages):
    """``finish_drained`` finishes and quiesces every writer: the room is released by the
    call (``True``), and the release is not queued; under a transfer it is released (and
    queued) when the transfer ends."""
    t = RoomTable(4, pages, release_queue=True)
    h = t.open([3, 4], None if pages else [7, 8], token=0 if pages else 5)
    assert t.finish_drained(h) is True
    assert t.phase(h) == "free" and t.queued_releases() == 0 and t.drain_released() == []
    with pytest.raises(StaleHandle):
        t.finish_drained(h)
    g = t.open([3], None if pages else [9], token=0 if pages else 6)
    tr = t.begin_transfer(g)
    assert t.finish_drained(g) is False and t.phase(g) == "draining"
    tr.complete()
    assert [(r.handle, r.reason) for r in t.drain_released()] == [(g, "finished")]


def test_finish_drained_refuses_an_aborted_room_and_quiesces_nothing():
    t = RoomTable(4, release_queue=True)
    h = t.open([0, 1], None, token=1)
    t.abort(h)
    with pytest.raises(AlreadyAborted):
        t.finish_drained(h)
    assert t.quiesce(h, 0) == "recorded" and t.quiesce(h, 1) == "released"
    assert [r.reason for r in t.drain_released()] == ["aborted"]
