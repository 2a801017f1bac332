"""Transport reset: a failed write (-1) to this decode costs its pages for the time of a
teardown, not for good (issue 38 item 9; opt-in: ``KVFENCE_SGLANG_RESET=1``).

The problem. Mooncake's ``batch_transfer_sync`` returns -1 when a slice failed and also on
its wall-clock timeout with the batch still running; nothing cancels the batch, so its
slices may land later, through any TCP lane to this decode. The prefill never ACKs such a
room (SGLang poisons it), so kvfence holds its pages until the prefill's writers are
fenced, and a live prefill is never fenced (:mod:`.teardown` needs its process gone):
without this module a -1 pins one request's pages until restart.

The proof used here is local to this process. Mooncake's TCP transport writes into this
decode's memory only from threads of *this* process's transfer engine, which copy what
arrives on the sockets its listener accepted. So if each prefill instance writes to an
engine of its own (its own listener, its own session id ``ip:rpc_port``), then once that
engine is destroyed (Mooncake's destructor stops its I/O context and joins its thread,
closing the listener and every accepted socket: checked below in ``/proc/self/net/tcp*``,
no socket of this process left on its ports) no byte the prefill ever queued to it can
land, whatever the prefill does: its lanes reconnect to ports that refuse (kvfence keeps
them bound, so no later engine of this process takes them), and the ranks that wrote
through it are fenced. ``e2e/hosts/`` did the same with a process per generation.

How a prefill instance's generations run (decode side; :class:`Resets`, one per gated
decode manager):

1. **First contact** (``CommonKVReceiver._setup_bootstrap_infos``, scheduler thread): the
   instance's current :class:`Generation` is made if there is none: a Mooncake engine
   (SGLang's own ``MooncakeTransferEngine`` class, same host and protocol as the shared
   one) with the manager's KV, metadata and state regions registered. While SGLang
   registers this decode's KV args with the prefill, and later while it sends each
   request's metadata, ``MooncakeKVManager.get_session_id`` answers the generation's
   session on that thread (:data:`_override`), so the prefill writes to it. The receiver
   keeps the generation (``_kvfence``); the kvfence writer ids its room will name are
   handed out under it (:attr:`Generation.ids`).
2. **Reset** (scheduler thread): when a held room of the current generation reports the
   prefill's send failure (SGLang's "Failed to send ..." failure record), or waits for an
   ACK longer than ``KVFENCE_SGLANG_RESET_AFTER``. The generation is retired: SGLang's
   cached registration for the instance is dropped (the next request registers again,
   under a new generation, with new kvfence ids); a request registered under the old one
   whose metadata has not gone out is failed (refused, nothing sent: counted as
   disturbed). Time only *starts* a reset; the teardown proof is what releases pages.
3. **Teardown** (a thread per reset): the old engine is destroyed, the proof read, its
   ports held, then its ids fenced (every room of that generation is released, the -1
   room's included) and, once no room can name them again, readmitted (kvfence's fenced
   set is bounded). Requests of the old generation still transferring fail (their writes
   get -1 on the prefill, which under stock SGLang blacklists this decode's session after
   a -1 anyway); they are counted.

Threads and guards: :attr:`Resets.current` and every :class:`Generation` field but
``proven`` are written on the scheduler thread only; ``proven``, the counters the
teardown threads write, the port holders and the retired ports are guarded by
:attr:`Resets.lock`, a leaf lock (nothing else is taken while it is held, and it is never
taken under an SGLang lock). ``kvfence`` table calls made under it are lock-free. SGLang's
``connection_lock`` is taken alone (no kvfence lock held) to drop cached registrations
(:meth:`Resets.forget_registrations`), on the scheduler thread or at ``uninstall``.
:data:`_override` is thread-local. Port discovery (the listening ports a new engine
opened, read from ``/proc`` before and after making it) assumes nothing else of this
process opens a listener meanwhile; if something does, that port counts as the engine's
and the proof waits for it too (pages held, logged after 10 s: never an early release).

Limits, each checked: Mooncake's TCP transport only (``MOONCAKE_PROTOCOL=tcp`` or
``MC_FORCE_TCP=1``; RDMA writes land with no engine thread involved), no staging
(``enable_staging``: its buffers are registered elsewhere), SGLang 0.5.23 (0.5.22 keeps
the session on each receiver). Otherwise the reset stays off for that manager, logged,
and a -1 holds its pages as before. Destroying an engine holds the GIL for its teardown
(~0.1-0.7 s measured on loopback): the decode pauses that long per reset. Two ports
stay bound per reset for the life of the process.
"""

from __future__ import annotations

import collections
import errno
import os
import socket
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple

from ._state import logger
from .teardown import _own_socket_inodes, _sockets

__all__ = ["Generation", "NoGeneration", "Resets", "unsupported", "own_sockets_on"]


class NoGeneration(Exception):
    """No engine could be made for a prefill instance that had generations: its request
    fails (it may not fall back to SGLang's shared engine; see :meth:`Resets.generation`)."""


class _Override(threading.local):
    # The session id ``MooncakeKVManager.get_session_id`` answers on this thread (None:
    # SGLang's own), set around SGLang's registration and metadata sends.
    session: Optional[str] = None


_override = _Override()


class Generation:
    """One prefill instance's current transport on this decode: an engine of its own."""

    __slots__ = ("addr", "no", "engine", "session", "ports", "ids", "retired", "proven",
                 "made", "retired_at")

    def __init__(self, addr: str, no: int, engine: Any, session: str,
                 ports: Set[int]) -> None:
        self.addr = addr
        self.no = no  # 1, 2, ... per instance
        self.engine = engine  # SGLang's MooncakeTransferEngine (None once torn down)
        self.session = session  # "ip:rpc_port": what the prefill writes to
        self.ports = ports  # every listening port the engine opened (rpc and data)
        self.ids: Set[int] = set()  # kvfence writer ids handed out under it
        self.retired = False  # no new request goes out under it
        self.proven = False  # torn down and its ids fenced: no room may name them again
        self.made = time.monotonic()
        self.retired_at = 0.0

    def __repr__(self) -> str:
        return "<generation %d of prefill %s: %s>" % (self.no, self.addr, self.session)


def own_sockets_on(ports: Set[int]) -> List[Tuple[int, str]]:
    """(local port, TCP state) of every socket this process holds whose local port is in
    ``ports``: a listener, or a connection it accepted there."""
    mine = _own_socket_inodes()
    return [(lport, st) for (_, lport, _, _, st, inode) in _sockets()
            if inode in mine and lport in ports]


def _listening_ports() -> Set[int]:
    mine = _own_socket_inodes()
    return {lport for (_, lport, _, _, st, inode) in _sockets()
            if inode in mine and st == "0A"}


def unsupported(mgr: Any, release: str) -> Optional[str]:
    """Why the reset cannot run for decode manager ``mgr`` (None: it can)."""
    if release != "0.5.23":
        return "SGLang %s keeps the session id on each receiver (needs 0.5.23)" % release
    if getattr(mgr, "enable_staging", False):
        return "staging is enabled (its buffers are registered outside kvfence's view)"
    proto = os.environ.get("MOONCAKE_PROTOCOL", "rdma")
    if os.environ.get("MC_FORCE_TCP") != "1" and proto != "tcp":
        return ("Mooncake's transport is %r, not TCP (MOONCAKE_PROTOCOL=tcp or "
                "MC_FORCE_TCP=1): the teardown proof holds for TCP only" % proto)
    if getattr(mgr, "engine", None) is None or not hasattr(mgr, "_registerable_regions"):
        return "the manager has no Mooncake engine"
    return None


def _make_engine(mgr: Any) -> Tuple[Any, str, Set[int]]:
    """A Mooncake engine like the manager's, with its regions registered: (engine,
    session id, its listening ports). Raises on failure (nothing left open)."""
    from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import (  # type: ignore[import-untyped,import-not-found,unused-ignore]
        MooncakeTransferEngine,
    )
    shared = mgr.engine
    before = _listening_ports()
    eng = MooncakeTransferEngine(hostname=shared.hostname,
                                 gpu_id=getattr(shared, "gpu_id", None))
    ports = _listening_ports() - before
    rpc = int(eng.session_id.rpartition(":")[2])
    ports.add(rpc)
    regions = mgr._registerable_regions()
    if regions:
        ptrs, lens = zip(*regions)
        rc = eng.batch_register(list(ptrs), list(lens))
        if rc != 0:
            _destroy(eng)
            raise RuntimeError("registering %d regions failed (%s)" % (len(regions), rc))
    return eng, eng.session_id, ports


def _destroy(eng: Any) -> None:
    # SGLang's wrapper holds the pybind TransferEngine; dropping the last reference runs
    # Mooncake's destructor (stops the I/O context, joins its thread, closes every socket).
    inner = getattr(eng, "engine", None)
    eng.engine = None
    del eng
    del inner


class Resets:
    """The generations of one gated decode manager (see the module docstring)."""

    def __init__(self, make: Callable[[Any], Tuple[Any, str, Set[int]]] = _make_engine,
                 destroy: Callable[[Any], None] = _destroy) -> None:
        self.make = make
        self.destroy = destroy
        # bootstrap_addr -> its current generation, or None where none could be made (the
        # instance then stays on SGLang's shared engine for good, with no reset: ids
        # handed out there must never be fenced by one). Scheduler thread.
        self.current: Dict[str, Optional[Generation]] = {}
        self.made: Dict[str, int] = {}  # bootstrap_addr -> generations made
        self.lock = threading.Lock()  # leaf (module docstring)
        self.retired_ports: Set[int] = set()
        self.holders: List[socket.socket] = []
        self.threads: List[threading.Thread] = []
        # counters (scheduler thread, or under `lock` where a teardown thread writes)
        self.resets = 0
        self.refused = 0  # requests registered under a retired generation, not sent
        self.proven = 0
        self.unproven = 0  # teardowns whose proof never held (pages stay held)
        self.pages_back: Deque[float] = collections.deque(maxlen=4096)  # s, reset -> fence
        self.released_rooms = 0

    # -- scheduler thread --------------------------------------------------------------
    def generation(self, mgr: Any, addr: str) -> Optional[Generation]:
        """The instance's current generation (made here on first contact or after a
        reset); None if the instance stays on SGLang's shared engine (no engine could be
        made at first contact); :class:`NoGeneration` if none can be made for an instance
        that had one."""
        if addr in self.current:
            gen = self.current[addr]
            if gen is None or not gen.retired:
                return gen
        no = self.made.get(addr, 0) + 1
        made: List[Tuple[Any, str, Set[int]]] = []
        try:
            # A port a retired engine had must never serve again (a lane of the old
            # generation could reconnect to it): kvfence keeps those bound, so Mooncake
            # cannot take them; checked all the same.
            for _ in range(4):
                made.append(self.make(mgr))
                with self.lock:
                    clash = made[-1][2] & self.retired_ports
                if not clash:
                    break
            else:
                raise RuntimeError("every new engine took a retired port")
        except Exception as e:  # noqa: BLE001 - any failure: the shared engine, logged
            for m in made:
                self.destroy(m[0])
            if self.made.get(addr):
                # An instance that had generations: its requests cannot go to the shared
                # engine (their ids could then be fenced by no proof); refuse them.
                why = ("cannot make generation %d of prefill %s's transport (%s); its "
                       "requests fail until one can be made" % (no, addr, e))
                logger.error("kvfence: %s", why)
                raise NoGeneration(why) from e
            logger.error("kvfence: cannot make a transport of its own for prefill %s (%s): "
                         "it uses SGLang's shared engine, and a failed write to it holds "
                         "its pages until that prefill is fenced", addr, e)
            self.current[addr] = None
            return None
        for m in made[:-1]:
            self.destroy(m[0])
        eng, session, ports = made[-1]
        gen = Generation(addr, no, eng, session, ports)
        self.made[addr] = no
        self.current[addr] = gen
        # A registration SGLang cached before (under another session: kvfence installed
        # after this decode first talked to the instance) must not serve this generation.
        self.forget_registrations(mgr, addr)
        logger.info("kvfence: prefill %s writes to this decode through %s (generation %d, "
                    "ports %s)", addr, session, no, sorted(ports))
        return gen

    def forget_registrations(self, mgr: Any, addr: Optional[str] = None) -> None:
        """Drops SGLang's cached registration with the prefill at ``addr`` (every one
        with a generation if None), so that its next request registers again."""
        lock = getattr(mgr, "connection_lock", None)
        pool = getattr(mgr, "connection_pool", None)
        if lock is None or pool is None:
            return
        addrs = [addr] if addr is not None else list(self.current)
        with lock:
            for a in addrs:
                for k in [k for k in pool if isinstance(k, str) and k.startswith(a + "_")]:
                    del pool[k]

    def reset(self, gate: Any, mgr: Any, gen: Generation, why: str) -> bool:
        """Retires ``gen`` (if current) and starts its teardown; False if it was not."""
        if gen.retired or self.current.get(gen.addr) is not gen:
            return False
        gen.retired = True
        gen.retired_at = time.monotonic()
        self.resets += 1
        addr = gen.addr
        # The next request to the instance registers again (under a new generation).
        self.forget_registrations(mgr, addr)
        # New kvfence ids for it from now on; the old ones wait for the proof.
        gate.retire(addr)
        logger.warning("kvfence: resetting prefill %s's transport to this decode "
                       "(generation %d, %s): %s", addr, gen.no, gen.session, why)
        t = threading.Thread(target=self._teardown, args=(gate, gen, why),
                             name="kvfence-reset-%s" % addr, daemon=True)
        self.threads = [x for x in self.threads if x.is_alive()] + [t]
        t.start()
        return True

    # -- a teardown thread -------------------------------------------------------------
    def _teardown(self, gate: Any, gen: Generation, why: str) -> None:
        addr = gen.addr
        eng, gen.engine = gen.engine, None
        t0 = gen.retired_at
        if eng is not None:
            self.destroy(eng)
            del eng
        # The proof: no socket of this process left on the engine's ports (its listener
        # and every connection it accepted are closed; its thread was joined by the
        # destructor). Waits while one is left (never a timeout: pages stay held).
        told = time.monotonic() + 10.0
        while True:
            left = own_sockets_on(gen.ports)
            if not left:
                break
            if time.monotonic() >= told:
                told += 60.0
                with self.lock:
                    self.unproven += 1
                logger.error("kvfence: generation %d of prefill %s not torn down: sockets "
                             "%s still open on its ports; its rooms stay held", gen.no,
                             addr, left)
            time.sleep(0.05)
        self._hold(gen.ports)
        ids = gate.unfenced(addr, gen.ids)
        released = gate.fence(addr, ids, "generation %d's engine (%s) destroyed, no socket "
                              "left on ports %s (%s)" % (gen.no, gen.session,
                                                         sorted(gen.ports), why)) if ids else 0
        with self.lock:
            gen.proven = True  # from now on no room names these ids (open_at_abort)
            self.proven += 1
            self.released_rooms += released
            self.pages_back.append(time.monotonic() - t0)
        # Every room that named them was released by the fence, and none can name them
        # again: kvfence's fenced set (bounded) gives their entries back.
        for r in ids:
            try:
                gate.table.readmit_rank(r)
            except Exception as e:  # noqa: BLE001 - logged; the entry stays used
                logger.error("kvfence: cannot readmit rank %d of %s: %s", r, addr, e)
        logger.warning("kvfence: prefill %s's transport generation %d torn down %.3f s "
                       "after its reset; %d rooms released", addr, gen.no,
                       time.monotonic() - t0, released)

    def _hold(self, ports: Set[int]) -> None:
        """Binds each port (not listening: a connect is refused) so that no later engine
        of this process, nor another process, serves on it."""
        for port in sorted(ports):
            s = None
            try:
                s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                try:
                    s.bind(("::", port))
                except OSError as e:
                    if e.errno != errno.EADDRINUSE:
                        raise
                    # TIME_WAIT leftovers of the engine's connections: bind over them and
                    # listen (a listener excludes any other bind; what connects is never
                    # read).
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind(("::", port))
                    s.listen(1)
            except OSError as e:
                if s is not None:
                    s.close()
                # (e.g. the kernel keeps it for a connection the peer has not closed yet,
                # with no socket of this process on it)
                logger.info("kvfence: cannot hold retired port %d (%s); no engine of this "
                            "process will serve on it again", port, e)
                s = None
            with self.lock:
                self.retired_ports.add(port)
                if s is not None:
                    self.holders.append(s)

    def wait(self, timeout: float = 30.0) -> bool:
        """Waits for every teardown started so far (tests, status); True if none is left."""
        end = time.monotonic() + timeout
        for t in list(self.threads):
            t.join(max(0.0, end - time.monotonic()))
        return not any(t.is_alive() for t in self.threads)

    def status(self) -> Dict[str, Any]:
        """Counters for :func:`kvfence.sglang.status` and the metrics."""
        with self.lock:
            back = sorted(self.pages_back)
            out: Dict[str, Any] = {
                "resets": self.resets, "proven": self.proven, "unproven": self.unproven,
                "refused_requests": self.refused, "released_rooms": self.released_rooms,
                "held_ports": len(self.holders),
            }
        out["generations"] = {a: (g.no if g is not None else 0)
                              for a, g in list(self.current.items())}
        if back:
            out["pages_back_s_p50"] = back[len(back) // 2]
            out["pages_back_s_max"] = back[-1]
        return out
