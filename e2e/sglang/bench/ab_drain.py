"""A/B in one process: the SGLang gate's drain of N released rooms, the previous loop
(``drain_released()``: a ``Released`` object per release, its ``handle`` and ``reason``
read as attributes, the record moved to a second dict) vs the current one
(``drain_reasons()``: ``(handle, reason)`` pairs, one dict store per release; the record
stays until ``_do_release``), alternating per round; per release, median of 9 rounds and
of the per-round ratios.

    python e2e/sglang/bench/ab_drain.py

Needs only the kvfence binding (no SGLang): the loops are the adapter's, on plain dicts.
"""


import statistics
import time

import kvfence


def old_drain(  # the adapter's loop before 2026-12-02 (its own code)
        t, records, room_handle, decided, decided_records):
    for r in t.drain_released():
        h = r.handle
        got = records.pop(h, None)
        if r.reason == "finished":
            if got is not None and room_handle.get(got.room) == h:
                del room_handle[got.room]
            continue
        decided[h] = r.reason
        if got is not None:
            decided_records[h] = got
def new_drain(t, records, room_handle, decided, decided_records):
    for h, why in t.drain_reasons():
        if why == "finished":
            records.pop(h, None)
        else:
            decided[h] = why
class Rec(tuple):
    room = property(lambda s: s[0])
res = {}
for N in (10, 1000, 10000):
    for rnd in range(9):
        for name, f in ((("old", old_drain), ("new", new_drain)) if rnd % 2 else (("new", new_drain), ("old", old_drain))):
            t = kvfence.RoomTable(16384)
            hs = [t.open([0], None, i) for i in range(N)]
            records = {h: Rec((i,)) for i, h in enumerate(hs)}
            room_handle = {i: h for i, h in enumerate(hs)}
            for h in hs: t.abort(h); t.quiesce(h, 0)
            d, dr = {}, {}
            t0 = time.perf_counter(); f(t, records, room_handle, d, dr); dt = time.perf_counter() - t0
            assert len(d) == N
            res.setdefault((N, name), []).append(dt / N * 1e6)
    o, n = res[(N, "old")], res[(N, "new")]
    print("N=%5d drain per release: drain_released loop %.2f us, drain_reasons loop %.2f us, new/old %.2fx" % (N, statistics.median(o), statistics.median(n), statistics.median(y / x for x, y in zip(o, n))))
