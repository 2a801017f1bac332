"""Python threads against one table: prefill workers write stamps into a shared page
arena while a decode thread aborts requests and reuses their pages."""

import queue
import random
import threading
import time

import kvfence

PAGE = 16            # bytes per page in the arena
PAGES = 96
ROOMS = 16
PER_ROOM = 4
RANKS = 3
LIFECYCLES = 600


def test_no_write_lands_in_a_reused_page_and_every_release_is_drained_once():
    table = kvfence.RoomTable(ROOMS, PAGES)
    arena = bytearray(PAGES * PAGE)
    owner = [None] * PAGES                 # page -> handle of the room that owns it now
    violations = []
    writes = [0]
    inboxes = [queue.Queue() for _ in range(RANKS)]
    drained = []                           # every release, from both drainers
    drained_lock = threading.Lock()
    stop = threading.Event()

    def collect():
        # Drain and mark the pages unowned atomically w.r.t. the decode thread's open.
        with drained_lock:
            for r in table.drain_released():
                for p in r.pages:
                    owner[p] = None        # back in the pool only now (queue mode)
                drained.append(r)

    def prefill(rank):
        rng = random.Random(rank)
        while True:
            task = inboxes[rank].get()
            if task is None:
                return
            h, pages = task
            for page in pages:             # one chunk per page
                try:
                    t = table.begin_transfer(h, peer=rank)
                except kvfence.RoomClosed:
                    break                  # aborted: skip the remaining chunks
                with t:
                    stamp = h.to_bytes(16, "little")
                    if owner[page] != h:
                        violations.append((rank, h, page, "before"))
                    arena[page * PAGE:(page + 1) * PAGE] = stamp
                    writes[0] += 1
                    if rng.random() < 0.2:
                        time.sleep(0)      # let the decode thread abort mid-transfer
                    if owner[page] != h or arena[page * PAGE:(page + 1) * PAGE] != stamp:
                        violations.append((rank, h, page, "after"))
            assert table.quiesce(h, rank) in ("recorded", "released")   # the ACK

    def second_drainer():
        while not stop.is_set():
            collect()
            time.sleep(0.0005)

    workers = [threading.Thread(target=prefill, args=(r,)) for r in range(RANKS)]
    drainer = threading.Thread(target=second_drainer)
    for th in workers + [drainer]:
        th.start()

    rng = random.Random(7)
    opened = []
    aborted = 0
    for _ in range(LIFECYCLES):
        while True:
            with drained_lock:
                try:
                    h = table.open(range(RANKS), PER_ROOM)
                except (kvfence.TableFull, kvfence.PoolExhausted):
                    h = None
                if h is not None:
                    pages = table.pages_of(h)
                    for p in pages:
                        assert owner[p] is None, "page handed out before its release was drained"
                        owner[p] = h
                    break
            collect()
            time.sleep(0.0002)
        opened.append(h)
        for box in inboxes:
            box.put((h, pages))
        if rng.random() < 0.6:
            if rng.random() < 0.5:
                time.sleep(rng.random() * 0.0005)
            fanout = table.abort(h)
            assert set(fanout) <= set(range(RANKS))
            aborted += 1
        else:
            table.finish(h)
        collect()

    for box in inboxes:
        box.put(None)
    for th in workers:
        th.join(30)
    deadline = time.monotonic() + 30
    while len(drained) < len(opened) and time.monotonic() < deadline:
        collect()
        time.sleep(0.001)
    stop.set()
    drainer.join(10)
    collect()

    assert violations == []
    handles = [r.handle for r in drained]
    assert len(handles) == len(set(handles)), "a release was delivered twice"
    assert sorted(handles) == sorted(opened), "a release was lost"
    reasons = {r.reason for r in drained}
    assert reasons <= {"aborted", "finished"} and aborted > 0
    assert writes[0] > 0
    s = table.stats()
    assert (s["rooms_free"], s["pages_free"], s["releases"]) == (ROOMS, PAGES, len(opened))
    assert table.wait_idle(1.0)


def test_concurrent_drainers_deliver_each_release_once():
    table = kvfence.RoomTable(256)
    handles = [table.open([], [i], token=i) for i in range(256)]
    got = [[] for _ in range(4)]
    barrier = threading.Barrier(5)

    def drain(i):
        barrier.wait()
        for _ in range(200):
            got[i].extend(table.drain_released())

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    barrier.wait()
    for h in handles:
        table.finish(h)
    for t in threads:
        t.join()
    rest = table.drain_released()
    tokens = sorted(r.token for g in got for r in g) + [r.token for r in rest]
    assert sorted(tokens) == list(range(256))
