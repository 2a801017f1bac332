"""`grow` refuses a count larger than the pool before it claims anything, as `open` does:
`TooManyPages`, not a claim of every free page rolled back into `PoolExhausted` (during
which every other caller saw an empty pool)."""

import threading
import time

import pytest

import kvfence
from kvfence import RoomTable


@pytest.mark.parametrize("n", [257, 2**31, 2**40, 2**64 - 1])
def test_grow_larger_than_the_pool_is_too_many_pages(pool, n):
    h = pool.open([], 3)
    with pytest.raises(kvfence.TooManyPages) as e:
        pool.grow(h, n)
    assert str(n) in str(e.value)
    with pytest.raises(kvfence.TooManyPages):
        pool.open([], n)                    # the same refusal as open's
    assert len(pool.pages_of(h)) == 3
    assert pool.stats()["pages_free"] == 253
    assert len(pool.grow(h, 253)) == 253    # the whole rest still fits
    with pytest.raises(kvfence.PoolExhausted):
        pool.grow(h, 1)                     # fits the pool, not what is free


def test_grow_larger_than_the_pool_never_empties_it_for_others():
    """A thread growing by more than the pool, while another reads `stats()` (which runs
    with the GIL released, so it can see the middle of a `grow`): the pool must never look
    emptier than the pages really owned."""
    pages = 1 << 20                         # a large pool: claiming all of it takes a while
    t = RoomTable(4, pages)
    h = t.open([], 1)
    stop = threading.Event()
    grows = []

    def grower():
        n = 0
        while not stop.is_set():
            try:
                t.grow(h, pages + 1)
            except kvfence.Error:
                n += 1
        grows.append(n)

    thread = threading.Thread(target=grower)
    thread.start()
    seen_low = reads = 0
    deadline = time.monotonic() + 1.0
    try:
        while time.monotonic() < deadline:
            reads += 1
            if t.stats()["pages_free"] != pages - 1:
                seen_low += 1
    finally:
        stop.set()
        thread.join()
    print(f"{reads} stats() reads during {grows[0]} refused grows: "
          f"{seen_low} saw pages claimed by a refused grow")
    assert reads > 10 and grows[0] > 10
    assert seen_low == 0
