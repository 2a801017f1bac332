"""Test-side hooks of the e2e/serve SGLang pair (never part of kvfence).

``e2e/serve/sglang.sh`` puts this directory on the ``PYTHONPATH`` of its SGLang servers;
Python imports this module at start-up in every process. It does nothing unless
``KVFENCE_SERVE_CTL`` names the harness's control directory. Then, as soon as SGLang's
modules are imported (a post-import hook, as ``kvfence.sglang``'s own start-up hook):

* **CPU workaround** (prefill): ``MooncakeKVSender.supports_host_tensor_indices = False``.
  SGLang's prefill otherwise takes a pinned-memory + ``torch.cuda.Event`` path for the
  page indices, which needs CUDA; False takes its plain path. Outside the abort/release
  code; same for both rules.
* **Fault injection at the transfer call** (prefill, ``MooncakeTransferEngine.
  batch_transfer_sync``): when the harness creates ``CTL/fail_next``, the next call
  returns -1 without moving a byte, and a thread performs that very write (same session,
  same source and destination addresses) when the harness creates ``CTL/land``, then
  writes ``CTL/landed``. That is Mooncake's semantics for a transfer timeout with slices
  still posted: reported failed, bytes landing later. When the harness creates
  ``CTL/hold_next``, the next call blocks until ``CTL/release`` exists, then writes and
  returns the real result: a write slower than any deadline. When the harness creates
  ``CTL/slow-ROOM`` (its text: seconds), the first transfer call of room ROOM writes
  ``CTL/held-ROOM``, writes it in ~40 pieces spread over that long (piece k of n at
  (k + 1) / n of it), then writes ``CTL/slowdone-ROOM``: the throughput bench's slow
  write, keyed by the request (the transfer worker's current room is read where it takes
  the chunk off its queue, ``FastQueue.get``, and the call runs on that worker's thread).
* **Decode pause** (decode, ``Scheduler.run_batch``): while ``CTL/pause`` exists, the
  decode's scheduler stops before its next decode step, after writing ``CTL/paused``
  (the rooms of the running requests). Its Mooncake receiver keeps running (other
  threads), so a write can land meanwhile. This pins "the late bytes land while the next
  request is decoding" to an order of events instead of a time.
* **Page log** (decode, ``DecodePreallocQueue._pre_alloc``): each request's room and the
  KV slots it was given, for the evidence that a victim got the failed request's pages.

Every hook logs a line starting with ``KVFENCE-SERVE-HOOK HH:MM:SS.mmm [ROLE pid N]``
(``serve_sglang._PAGES`` and ``bench_sglang.exposures`` parse it).
"""

from __future__ import annotations

import os
import sys

_CTL = os.environ.get("KVFENCE_SERVE_CTL")
_ROLE = os.environ.get("KVFENCE_SERVE_ROLE", "")


_told = set()


def _tell_kvfence(where: str) -> None:
    """Logs once per process whether kvfence.sglang is installed here (the evidence that
    the rule under test is the one running)."""
    if where in _told:
        return
    _told.add(where)
    on = False
    mod = sys.modules.get("kvfence.sglang")
    if mod is not None:
        try:
            on = bool(mod.installed())
        except Exception:  # noqa: BLE001
            on = False
    _log("kvfence.sglang installed in this process (%s): %s" % (where, on))


def _log(msg: str) -> None:
    import time

    now = time.time()
    stamp = time.strftime("%H:%M:%S", time.localtime(now)) + ".%03d" % int(now % 1 * 1000)
    sys.stderr.write("KVFENCE-SERVE-HOOK %s [%s pid %d] %s\n" % (stamp, _ROLE, os.getpid(), msg))
    sys.stderr.flush()


def _claim(name: str) -> bool:
    """Takes the control file ``name`` (atomically: one call claims it)."""
    p = os.path.join(_CTL, name)  # type: ignore[arg-type]
    try:
        os.rename(p, p + ".taken.%d" % os.getpid())
        return True
    except OSError:
        return False


def _exists(name: str) -> bool:
    return os.path.exists(os.path.join(_CTL, name))  # type: ignore[arg-type]


def _write(name: str, text: str) -> None:
    p = os.path.join(_CTL, name)  # type: ignore[arg-type]
    with open(p + ".tmp", "w") as f:
        f.write(text)
    os.rename(p + ".tmp", p)


def _claim_text(name: str) -> "str | None":
    """Takes the control file ``name`` like ``_claim``; its text, or None if absent."""
    p = os.path.join(_CTL, name)  # type: ignore[arg-type]
    taken = p + ".taken.%d" % os.getpid()
    try:
        os.rename(p, taken)
    except OSError:
        return None
    with open(taken) as f:
        return f.read()


def _wait_for(name: str, present: bool = True) -> None:
    import time

    while _exists(name) != present:
        time.sleep(0.01)


def _patch_engine(mod) -> None:  # type: ignore[no-untyped-def]
    import threading

    cls = mod.MooncakeTransferEngine
    orig = cls.batch_transfer_sync

    def batch_transfer_sync(self, session_id, buffers, peer_buffer_addresses, lengths):  # type: ignore[no-untyped-def]
        nbytes = sum(int(x) for x in lengths)
        _tell_kvfence("prefill transfer")
        if _claim("fail_next"):
            args = (session_id, list(buffers), list(peer_buffer_addresses), list(lengths))
            _log("write_failed: returned -1 for a write of %d blocks, %d bytes to %s; its "
                 "bytes land when CTL/land exists" % (len(lengths), nbytes, session_id))

            def late() -> None:
                _wait_for("land")
                rc = orig(self, *args)
                _log("write_failed: the late bytes landed (rc %s)" % rc)
                _write("landed", str(rc))

            threading.Thread(target=late, name="kvfence-serve-late-write", daemon=True).start()
            return -1
        room = getattr(_current, "room", None)
        late = _claim_text("fail-%s" % room) if room is not None else None
        if late is not None:
            # The bench's failed write: -1 now, the same bytes land ``late`` s later.
            import time

            args = (session_id, list(buffers), list(peer_buffer_addresses), list(lengths))
            _log("fail: returned -1 for a write of room %s (%d bytes to %s); its bytes land "
                 "in %s s" % (room, nbytes, session_id, late))

            def land_later() -> None:
                time.sleep(float(late or 0))
                rc = orig(self, *args)
                _log("fail: the late bytes of room %s: rc %s" % (room, rc))
                _write("faildone-%s" % room, str(rc))

            threading.Thread(target=land_later, name="kvfence-serve-late-write",
                             daemon=True).start()
            return -1
        slow = _claim_text("slow-%s" % room) if room is not None else None
        if slow is not None:
            import time

            _write("held-%s" % room, session_id)
            # A congested link: the write trickles in, in ~40 pieces (each block cut into
            # equal parts), piece k of n landing at (k + 1) / n of the hold: the first
            # ones before SGLang's deadline, the rest after it, every ~0.2 s.
            cut = max(1, 40 // max(1, len(lengths)))
            pieces = []
            for src, dst, ln in zip(buffers, peer_buffer_addresses, lengths):
                step = -(-int(ln) // cut)
                pieces += [(src + o, dst + o, min(step, int(ln) - o)) for o in range(0, int(ln), step)]
            n, t0, rc = len(pieces), time.time(), 0
            _log("slow: a write of room %s (%d blocks, %d bytes) trickling in %d pieces over %s s"
                 % (room, len(lengths), nbytes, n, slow))
            for k, (src, dst, ln) in enumerate(pieces):
                time.sleep(max(0.0, t0 + float(slow) * (k + 1) / n - time.time()))
                rc = rc or orig(self, session_id, [src], [dst], [ln])
            _log("slow: the write of room %s done (rc %s)" % (room, rc))
            _write("slowdone-%s" % room, str(rc))
            return rc
        if _claim("hold_next"):
            _log("hold: a write of %d blocks, %d bytes to %s held until CTL/release"
                 % (len(lengths), nbytes, session_id))
            _write("held", session_id)
            _wait_for("release")
            rc = orig(self, session_id, buffers, peer_buffer_addresses, lengths)
            _log("hold: the held write done (rc %s)" % rc)
            _write("held_done", str(rc))
            return rc
        return orig(self, session_id, buffers, peer_buffer_addresses, lengths)

    cls.batch_transfer_sync = batch_transfer_sync
    _log("fault injection armed at MooncakeTransferEngine.batch_transfer_sync")


_current = None  # threading.local: the room of the chunk this transfer worker took last


def _patch_queue(mod) -> None:  # type: ignore[no-untyped-def]
    import threading

    global _current
    _current = threading.local()
    cls = mod.FastQueue
    orig = cls.get

    def get(self):  # type: ignore[no-untyped-def]
        item = orig(self)
        _current.room = getattr(item, "room", None)
        return item

    cls.get = get


def _patch_conn(mod) -> None:  # type: ignore[no-untyped-def]
    mod.MooncakeKVSender.supports_host_tensor_indices = False
    _log("CPU workaround: MooncakeKVSender.supports_host_tensor_indices = False")


def _patch_scheduler(mod) -> None:  # type: ignore[no-untyped-def]
    cls = mod.Scheduler
    orig = cls.run_batch

    def run_batch(self, batch, *a, **kw):  # type: ignore[no-untyped-def]
        try:
            decoding = batch is not None and batch.forward_mode.is_decode()
        except Exception:  # noqa: BLE001
            decoding = False
        if decoding and _exists("pause"):
            rooms = [getattr(r, "bootstrap_room", None) for r in batch.reqs]
            _log("pause: the decode stops before a decode step of rooms %s" % rooms)
            _write("paused", " ".join(str(r) for r in rooms))
            _wait_for("pause", present=False)
            _log("pause: resumed")
        return orig(self, batch, *a, **kw)

    cls.run_batch = run_batch
    _log("decode pause armed at Scheduler.run_batch")


def _patch_decode(mod) -> None:  # type: ignore[no-untyped-def]
    cls = mod.DecodePreallocQueue
    orig = cls._pre_alloc

    def _pre_alloc(self, req, *a, **kw):  # type: ignore[no-untyped-def]
        loc = orig(self, req, *a, **kw)
        _tell_kvfence("decode pre-allocation")
        try:
            if loc is not None and len(loc):
                v = sorted(int(x) for x in loc.tolist())
                runs, start = [], v[0]
                for a, b in zip(v, v[1:] + [None]):
                    if b != a + 1:
                        runs.append("%d-%d" % (start, a) if a != start else "%d" % a)
                        start = b
                _log("pages: room %s got %d KV slots %s" % (req.bootstrap_room, len(v), ",".join(runs)))
        except Exception:  # noqa: BLE001
            pass
        return loc

    cls._pre_alloc = _pre_alloc


_HOOKS = {
    "prefill": {
        "sglang.srt.distributed.device_communicators.mooncake_transfer_engine": _patch_engine,
        "sglang.srt.disaggregation.mooncake.conn": _patch_conn,
        "sglang.srt.disaggregation.common.utils": _patch_queue,
    },
    "decode": {
        "sglang.srt.managers.scheduler": _patch_scheduler,
        "sglang.srt.disaggregation.decode": _patch_decode,
    },
}


if _CTL and _ROLE in _HOOKS:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "site_common"))
    from serve_posthook import arm

    arm(_HOOKS[_ROLE])
