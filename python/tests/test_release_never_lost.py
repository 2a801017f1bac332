"""A release taken from the table is never lost, even when handing it to Python fails.

`drain_released` and `pop_released` take releases out of the table and then allocate
Python objects for them (the list, one `Released` each). If an allocation raises
(MemoryError), every release not handed over must still come from the next drain: the
engine would otherwise never free those pages.

The failure is injected with CPython's own test hook, `_testcapi.set_nomemory(start)`:
every Python allocation from the `start`-th on fails (Rust's allocations are not hooked).
Sweeping `start` hits every allocation of the call in turn.
"""

import pytest

from kvfence import RoomTable

_testcapi = pytest.importorskip("_testcapi", reason="needs CPython's _testcapi (set_nomemory)")


def failing_at(start, call):
    """`call()` with every Python allocation from the `start`-th on failing: its result,
    or None if it raised MemoryError."""
    _testcapi.set_nomemory(start, 0)
    try:
        return call()
    except MemoryError:
        return None
    finally:
        _testcapi.remove_mem_hooks()


def release_rooms(t, tokens):
    for tok in tokens:
        h = t.open([], [tok, tok + 1000], token=tok)
        t.finish(h)


@pytest.mark.parametrize("release_queue", [True, False])
@pytest.mark.parametrize("method", ["drain_released", "pop_released"])
def test_no_release_is_lost_when_python_allocation_fails(release_queue, method):
    RoomTable(1).drain_released()      # warm up: the Released type object exists
    failed = succeeded = 0
    for start in range(40):            # a drain of 5 makes ~7 Python allocations
        t = RoomTable(8, release_queue=release_queue)
        tokens = [start * 10 + k for k in range(5)]
        release_rooms(t, tokens)
        got = failing_at(start, getattr(t, method))
        if got is None:
            failed += 1
            assert t.queued_releases() == 5          # nothing handed over, nothing lost
            delivered = []
        else:
            succeeded += 1
            delivered = got if isinstance(got, list) else [got]
        # Everything left comes out now, each release exactly once, pages intact.
        delivered += t.drain_released()
        assert sorted((r.token, r.pages, r.reason) for r in delivered) == [
            (tok, [tok, tok + 1000], "finished") for tok in tokens]
        assert t.queued_releases() == 0 and t.drain_released() == []
    print(f"{method}, release_queue={release_queue}: {failed} calls failed, "
          f"{succeeded} succeeded")
    assert failed > 0 and succeeded > 0          # the failure window was hit, and missed
