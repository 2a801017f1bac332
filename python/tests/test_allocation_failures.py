"""A Python allocation that fails inside a call that changes the table is a
``MemoryError``, never a panic (``PanicException``), and loses nothing: ``open`` undoes the
room it could not hand out, ``quiesce`` keeps the release it performed, ``phase`` changes
nothing. Failures are injected with CPython's ``_testcapi.set_nomemory`` (the n-th
allocation on, for every n until the call succeeds)."""

from typing import Any, Callable, List, Tuple

import pytest

from kvfence import RoomTable

_testcapi = pytest.importorskip("_testcapi", reason="needs CPython's _testcapi")


def under_nomemory(call: Callable[[], Any], start: int) -> Tuple[bool, Any]:
    """``call()`` with every allocation from the ``start``-th on failing: (ok, value)."""
    _testcapi.set_nomemory(start, 0)
    try:
        return True, call()
    except MemoryError:
        return False, None
    finally:
        _testcapi.remove_mem_hooks()


@pytest.mark.parametrize("mode", ["gate", "pool"])
def test_open_that_cannot_make_its_handle_leaves_no_room(mode: str) -> None:
    """Every room ``open`` made is either handed out or undone: released as ``finished``
    (pool pages back in the pool), none left open for a handle no one holds."""
    failed = undone = 0
    for start in range(12):
        t = RoomTable(4) if mode == "gate" else RoomTable(4, pages=8)
        t.open([0]) if mode == "gate" else t.open([0], 1)  # warm up the call itself
        t.drain_released()
        before = t.stats()["rooms_free"]
        ok, h = under_nomemory(
            (lambda: t.open([0, 1], None, 1 << 40)) if mode == "gate" else (lambda: t.open([0, 1], 2)),
            start)
        if ok:
            assert t.phase(h) == "owned"
            continue
        failed += 1
        # Failed before the room opened (reading the arguments): nothing to undo. After
        # (making the handle's int): undone, its release delivered once, as "finished".
        released = t.drain_released()
        assert [r.reason for r in released] in ([], ["finished"])
        undone += len(released)
        assert t.stats()["rooms_free"] == before
        if mode == "pool":
            assert t.stats()["pages_free"] == 8 - 1
        assert t.drain_released() == []
    assert failed > 0 and undone > 0, (failed, undone)


def test_quiesce_under_memory_failure_keeps_its_release() -> None:
    """A ``quiesce`` that performs the release and then fails to return its word (were
    the words not made at import) must still deliver the release; with the words made at
    import it returns with no allocation at all."""
    for start in range(6):
        t = RoomTable(4, release_queue=False)  # the release is returned to the binding
        h = t.open([0])
        t.abort(h)
        ok, word = under_nomemory(lambda: t.quiesce(h, 0), start)
        if ok:
            assert word == "released"
        released: List[Any] = t.drain_released()
        assert [r.reason for r in released] == ["aborted"]
        assert t.phase(h) == "free"


def test_phase_and_quiesce_words_are_shared_objects() -> None:
    """The words are interned at import: every call returns the same object."""
    t = RoomTable(4)
    a, b = t.open([0]), t.open([0])
    assert t.phase(a) is t.phase(b)
    t.abort(a)
    t.abort(b)
    assert t.quiesce(a, 0) is t.quiesce(b, 0)
