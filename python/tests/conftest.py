import pytest

import kvfence


@pytest.fixture
def gate():
    """A gate-mode table (the engine owns its pages), releases through the queue."""
    return kvfence.RoomTable(64)


@pytest.fixture
def pool():
    """A pool-mode table of 64 rooms and 256 pages."""
    return kvfence.RoomTable(64, 256)


def drain_one(table):
    """The one release waiting in the queue."""
    released = table.drain_released()
    assert len(released) == 1, released
    return released[0]
