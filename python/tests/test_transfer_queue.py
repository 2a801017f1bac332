"""kvfence.TransferQueue: each item taken from a work queue holds a transfer on its room
from the ``get`` that returns it until the next ``get``."""

import gc
import queue
import threading
from types import SimpleNamespace

import pytest

import kvfence


class _Q:
    """A FIFO with a parameterless ``get`` (SGLang's FastQueue shape)."""

    def __init__(self, items=()):
        self.q = queue.Queue()
        for i in items:
            self.q.put(i)
        self.size = 7  # an attribute of the queue only

    def get(self):
        return self.q.get()

    def put(self, item):
        self.q.put(item)


def _item(room):
    return SimpleNamespace(room=room)


def _setup(release_queue=False):
    table = kvfence.RoomTable(64, release_queue=release_queue)
    handles = {}
    released = []

    def on_release():
        released.extend((r.token, r.reason) for r in table.drain_released())

    return table, handles, released, on_release


def test_an_item_holds_its_room_until_the_next_get():
    table, handles, released, on_release = _setup()
    handles[1] = table.open([], [], token=1)
    handles[2] = table.open([], [], token=2)
    tq = kvfence.TransferQueue(_Q([_item(1), _item(2), None]))
    tq.bind(table, handles, on_release)
    assert tq.get().room == 1 and tq.current == 1
    table.abort(handles[1])
    assert table.room_status(handles[1])["transfers"] == 1 and released == []
    assert tq.get().room == 2 and tq.current == 2  # item 1's transfer ended: released
    assert released == [(1, "aborted")]
    assert tq.get() is None and tq.current is None  # the sentinel: item 2's ended too
    table.finish(handles[2])
    assert released == [(1, "aborted")] and table.drain_released()[0].token == 2


def test_an_item_of_a_closed_room_is_returned_with_no_transfer_and_counted():
    table, handles, released, on_release = _setup()
    handles[1] = table.open([], [], token=1)
    table.abort(handles[1])
    on_release()
    assert released == [(1, "aborted")]
    handles[3] = table.open([], [], token=3)
    table.finish(handles[3])  # released at once (nothing in flight)
    tq = kvfence.TransferQueue(_Q([_item(1), _item(3), _item(9), SimpleNamespace(x=1)]))
    tq.bind(table, handles, on_release)
    for expect in (1, 3):
        assert tq.get().room == expect and tq.current is None
    assert tq.refused == 2
    assert tq.get().room == 9 and tq.current is None  # not in handles: not counted
    assert not hasattr(tq.get(), "room") and tq.refused == 2  # no key attribute


def test_fail_keeps_the_room_from_ever_draining():
    table, handles, released, on_release = _setup()
    handles[1] = table.open([], [], token=1)
    tq = kvfence.TransferQueue(_Q([_item(1), None]))
    tq.bind(table, handles, on_release)
    tq.get()
    assert not tq.fail(2)  # another room's: nothing
    assert tq.fail(1) and tq.failed == 1 and tq.current is None
    assert not tq.fail(1)  # ended already
    tq.get()
    table.abort(handles[1])
    assert released == [] and table.drain_released() == []
    assert table.room_status(handles[1])["failed"] == 1
    table.quarantine(handles[1])
    assert table.drain_released()[0].reason == "quarantined"


def test_before_bind_items_pass_through_and_bind_is_once():
    table, handles, _, _ = _setup()
    handles[1] = table.open([], [], token=1)
    tq = kvfence.TransferQueue(_Q([_item(1), _item(1)]))
    assert tq.get().room == 1 and tq.current is None
    tq.bind(table, handles)
    assert tq.get().room == 1 and tq.current == 1
    with pytest.raises(RuntimeError, match="bound"):
        tq.bind(table, handles)
    with pytest.raises(TypeError):
        kvfence.TransferQueue(_Q()).bind(table, [])


def test_forwards_put_and_other_attributes_and_the_key_is_configurable():
    table, handles, _, _ = _setup()
    handles["a"] = table.open([], [], token=5)
    inner = _Q()
    tq = kvfence.TransferQueue(inner, key="rid")
    tq.bind(table, handles)
    tq.put(SimpleNamespace(rid="a"))
    assert tq.size == 7 and tq.queue is inner
    assert tq.get().rid == "a" and tq.current == "a"
    assert "current='a'" in repr(tq)
    with pytest.raises(AttributeError):
        tq.no_such_attribute


def test_a_queue_dropped_with_a_transfer_open_fails_it():
    table, handles, _, _ = _setup()
    handles[1] = table.open([], [], token=1)
    tq = kvfence.TransferQueue(_Q([_item(1)]))
    tq.bind(table, handles)
    tq.get()
    del tq
    gc.collect()
    table.abort(handles[1])
    assert table.drain_released() == [] and table.room_status(handles[1])["failed"] == 1


def test_errors_of_the_wrapped_queue_propagate_and_lose_nothing():
    table, handles, _, _ = _setup()
    handles[1] = table.open([], [], token=1)

    class Broken(_Q):
        def get(self):
            raise OSError("queue broke")

    tq = kvfence.TransferQueue(Broken())
    tq.bind(table, handles)
    with pytest.raises(OSError, match="queue broke"):
        tq.get()
    with pytest.raises(AttributeError):
        kvfence.TransferQueue(object())  # no get


def test_the_release_queue_mode_calls_on_release_too():
    table, handles, released, on_release = _setup(release_queue=True)
    handles[1] = table.open([], [], token=1)
    tq = kvfence.TransferQueue(_Q([_item(1), None]))
    tq.bind(table, handles, on_release)
    tq.get()
    table.abort(handles[1])
    tq.get()
    assert released == [(1, "aborted")]


def test_a_worker_thread_and_aborts_from_another_thread():
    """A worker takes 2,000 items over 50 rooms while another thread aborts rooms: an
    aborted room is released only when no item of it is being processed (checked by the
    worker's own flag), every room is released exactly once."""
    table, handles, released, _ = _setup()
    lock = threading.Lock()
    busy = {}
    bad = []

    def on_release():
        for r in table.drain_released():
            with lock:
                if busy.get(r.token):
                    bad.append(r.token)
                released.append(r.token)

    for room in range(50):
        handles[room] = table.open([], [], token=room)
    inner = _Q([_item(i % 50) for i in range(2000)] + [None])
    tq = kvfence.TransferQueue(inner)
    tq.bind(table, handles, on_release)

    def worker():
        while True:
            item = tq.get()
            if item is None:
                return
            if tq.current is None:
                continue  # refused: the room is aborted (skipped, as an engine would)
            with lock:
                busy[item.room] = True
            with lock:
                busy[item.room] = False

    t = threading.Thread(target=worker)
    t.start()
    for room in range(50):
        table.abort(handles[room])
        on_release()
    t.join(30)
    on_release()
    assert not t.is_alive() and bad == [] and sorted(released) == list(range(50))
