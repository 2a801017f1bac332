"""kvfence as SGLang's release gate, on both sides of its Mooncake PD disaggregation.

Supported: **SGLang 0.5.22 and 0.5.23** with the Mooncake transfer backend, decided by
their code (:mod:`kvfence._sglang_hooks`: every method kvfence wraps or relies on must be,
digest for digest, one of theirs); any other SGLang is refused by :func:`install`, which
names the supported range and the methods that differ, and changes nothing.

    import kvfence.sglang
    kvfence.sglang.install()     # before SGLang builds its KV managers; idempotent
    ...
    kvfence.sglang.uninstall()   # puts every SGLang method back

Or through SGLang's own plugin framework: ``SGLANG_PLUGINS=kvfence python -m
sglang.launch_server ...`` (:mod:`kvfence.sglang._plugin`, registered in the
``sglang.srt.plugins`` entry-point group). Or ``KVFENCE_SGLANG=1 python -m sglang.launch_server ...`` (the
``kvfence_sglang.pth`` start-up hook installs it as soon as SGLang's Mooncake module is
imported, in every process SGLang spawns), or ``kvfence-sglang-run python -m ...``.

What changes (see docs/ENGINES-sglang.md):

* decode: an aborted request's pages (KV pages, metadata row, state slots) are freed only
  when kvfence releases its room: every prefill rank it was sent to ACKed that its writes
  drained, or was fenced after its transport was proven torn down, or the room was
  quarantined (then they are never freed). **Never on a deadline**: SGLang's
  ``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT`` no longer releases
  anything, and ``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=0`` no longer frees at
  once. SGLang still does the freeing, through ``_do_release``.
* prefill: each chunk write is a kvfence transfer; a chunk of an aborted room is not
  written; a write that returned -1 keeps the room from ever being ACKed: its pages on
  the decode stay held until that prefill is fenced (or are quarantined). No transport
  reset to a live prefill is possible from this adapter (SGLang's -1 leaves the batch
  running in Mooncake, and every prefill writes to the decode's one engine port):
  docs/sglang-upstream.md section 9.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import _sglang_hooks
from . import _state, metrics
from ._config import Config
from ._patching import Patch, PatchSet

__all__ = [
    "SUPPORTED_SGLANG",
    "UnsupportedSGLangVersion",
    "Config",
    "RoomsStillHeld",
    "held_requests",
    "install",
    "uninstall",
    "installed",
    "fence_prefill",
    "snapshot",
]

#: The SGLang releases this adapter was built and tested for (decided by their code:
#: :mod:`kvfence._sglang_hooks`).
SUPPORTED_SGLANG: Tuple[str, ...] = tuple(_sglang_hooks.TESTED)

logger = _state.logger
_lock = threading.RLock()
_patches: Optional[PatchSet] = None


class UnsupportedSGLangVersion(RuntimeError):
    """The installed SGLang is not one this adapter supports; nothing was changed."""


def _sglang_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        raise UnsupportedSGLangVersion(
            "kvfence.sglang: SGLang is not installed (supported: %s)" % ", ".join(SUPPORTED_SGLANG)
        ) from None


def _supported_release(found: str) -> str:
    """The tested release whose code the installed SGLang has (every method kvfence
    wraps or relies on, digest for digest: :mod:`kvfence._sglang_hooks`); raises
    :class:`UnsupportedSGLangVersion` naming the version found, the supported range and
    the methods that differ."""
    root = _sglang_hooks.installed_root()
    if root is None:
        raise UnsupportedSGLangVersion(
            "kvfence.sglang: SGLang is not installed (supported: %s)"
            % _sglang_hooks.supported_range())
    release, diff = _sglang_hooks.match(_sglang_hooks.digests(root))
    if release is None:
        raise UnsupportedSGLangVersion(
            "kvfence.sglang supports SGLang %s only; the installed SGLang is %s, whose "
            "code differs from every supported release in %s. Nothing was changed."
            % (_sglang_hooks.supported_range(), found, ", ".join(diff)))
    return release


def _attach_for(mgr: Any, side: Optional[str] = None) -> Optional[str]:
    """Attaches the gate of ``mgr``'s side (``"decode"`` / ``"prefill"``, returned), or
    none (``None``). The side is the manager's ``disaggregation_mode``, or ``side`` when
    it has none (a manager built with ``__new__``, as SGLang's unit tests build them).
    Only SGLang's own ``MooncakeKVManager`` is gated (and, without a mode, a bare
    ``CommonKVManager``: only SGLang's tests make one), not a subclass: Ascend's
    ``AscendKVManager`` moves bytes with another engine (the teardown proof and the
    per-chunk span were shown for Mooncake's TCP transport only); it stays stock."""
    from sglang.srt.disaggregation.common.conn import CommonKVManager  # type: ignore[import-untyped,import-not-found,unused-ignore]
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager  # type: ignore[import-untyped,import-not-found,unused-ignore]
    from sglang.srt.disaggregation.utils import DisaggregationMode  # type: ignore[import-untyped,import-not-found,unused-ignore]

    from . import decode, prefill

    mode = getattr(mgr, "disaggregation_mode", None)
    if mode is None and side is not None and type(mgr) in (MooncakeKVManager, CommonKVManager):
        mode = DisaggregationMode.DECODE if side == "decode" else DisaggregationMode.PREFILL
    elif type(mgr) is not MooncakeKVManager:
        logger.warning("kvfence.sglang: %s is not gated (only SGLang's MooncakeKVManager "
                       "is supported); it runs as stock SGLang", type(mgr).__qualname__)
        return None
    if mode == DisaggregationMode.DECODE:
        decode.attach(mgr)
        _state.count_attached("decode", lazily=side is not None)
        return "decode"
    if mode == DisaggregationMode.PREFILL:
        prefill.attach(mgr)
        _state.count_attached("prefill", lazily=side is not None)
        return "prefill"
    return None


class _LazyGate:
    """``_kvfence_gate`` as a class attribute of SGLang's ``CommonKVManager`` (installed
    by :func:`install`): read on a manager that has no gate of its own yet (one built with
    ``__new__``, as SGLang's unit tests build them, so that its ``__init__``, which
    attaches the gate, never ran), it attaches the gate of the side the manager's fields
    show (SGLang's decode ACK tracker, or its prefill ACK targets) and returns it. The
    gate is then an attribute of the instance, which Python reads before this non-data
    descriptor: a manager pays for this once. A manager that must stay stock (another
    backend's, or one SGLang's ``__init__`` built before :func:`install`) gets ``None``
    as its own attribute."""

    # Lock order: (an SGLang lock a wrapper's caller may hold) -> this lock ->
    # _state._lock (decode.attach) or prefill._unbound_lock (prefill.attach). Neither of
    # those is ever held while this one is taken, and nothing done under this one takes
    # an SGLang lock.
    _lock = threading.Lock()

    def __get__(self, mgr: Any, owner: Optional[type] = None) -> Any:
        if mgr is None:
            return self
        with self._lock:
            d = vars(mgr)  # first use only: the attribute is the instance's afterwards
            if "_kvfence_gate" in d:
                return d["_kvfence_gate"]
            if "disaggregation_mode" in d:
                # Built by SGLang's __init__ before install(): stays stock (its requests
                # went out without kvfence, its transfer workers run unwrapped).
                setattr(mgr, "_kvfence_gate", None)
                return None
            if "_deferred_abort_ack_tracker" in d:
                side = "decode"
            elif "_deferred_ack_targets" in d or "request_status" in d:
                side = "prefill"
            else:
                return None  # not used as either side yet: decided at a later use
            if _attach_for(mgr, side) is None:
                setattr(mgr, "_kvfence_gate", None)
            return vars(mgr).get("_kvfence_gate")


def _manager_init(orig: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self: Any, *a: Any, **kw: Any) -> None:
        orig(self, *a, **kw)
        _attach_for(self)
    return __init__


def installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _patches is not None


def install(config: Optional[Config] = None) -> None:
    """Installs kvfence into SGLang (idempotent; a second call changes nothing).

    Must run before SGLang builds its ``MooncakeKVManager`` (the start-up hook sees to
    that); managers SGLang's ``__init__`` built earlier stay stock (no gate: every wrapper
    runs SGLang's own code for them). A manager built with ``__new__`` (SGLang's unit
    tests) gets its gate at its first use (``_LazyGate``). ``config`` defaults to
    :meth:`Config.from_env`.

    Raises :class:`UnsupportedSGLangVersion` (naming the version found, the supported
    range and the methods that differ) on any SGLang whose code is not one of
    :data:`SUPPORTED_SGLANG`'s, and ``RuntimeError`` if a method it wraps is missing; in
    both cases nothing was changed.
    """
    global _patches
    with _lock:
        if _patches is not None:
            return
        found = _sglang_version()
        release = _supported_release(found)
        cfg = config if config is not None else Config.from_env()
        from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager  # type: ignore[import-untyped,import-not-found,unused-ignore]

        from . import decode, prefill

        ps = PatchSet([Patch(MooncakeKVManager, "__init__", _manager_init)])
        for owner, name, make in decode.patches(release) + prefill.patches():
            ps.patches.append(Patch(owner, name, make))
        missing = ps.check()
        if missing:
            raise RuntimeError("kvfence.sglang: SGLang %s lacks %s; nothing was changed"
                               % (found, ", ".join(missing)))
        _state.config = cfg
        ps.apply()
        from sglang.srt.disaggregation.common.conn import CommonKVManager  # type: ignore[import-untyped,import-not-found,unused-ignore]

        CommonKVManager._kvfence_gate = _LazyGate()
        _patches = ps
        if cfg.metrics:
            metrics.register()
        logger.info("kvfence.sglang installed into SGLang %s (the code of %s; %d methods "
                    "wrapped)", found, release, len(ps.patches))


class RoomsStillHeld(RuntimeError):
    """:func:`uninstall` refused: kvfence holds aborted requests whose pages only it can
    release (nothing was changed)."""


def held_requests() -> List[Tuple[int, str]]:
    """``(bootstrap_room, state)`` of every aborted request whose pages a decode gate of
    this process still holds: ``"held"`` (waiting for its writers' ACKs or a fence),
    ``"released"`` (kvfence released it; SGLang frees it at its next scan) or
    ``"held for good"`` (no room could be opened for it)."""
    out: List[Tuple[int, str]] = []
    for g in list(_state.decode_gates):
        for h in list(g.aborted):
            rec = g.records.get(h)
            if rec is not None:
                out.append((rec.room, "released" if h in g.decided else "held"))
        out.extend((room, "held for good") for room in list(g.held_for_good))
    return out


def uninstall(force: bool = False) -> None:
    """Restores every SGLang method :func:`install` wrapped (no-op if not installed).

    **Refuses** (:class:`RoomsStillHeld`, naming them; nothing changed) while a decode
    gate holds aborted requests (:func:`held_requests`): SGLang's own code could never
    release them (it has no ACK state for them, their deadline is infinite, and their
    ACKs carry kvfence's handles), so uninstalling would strand their pages. Wait until
    they are released (their writers ACK or are fenced, then one scheduler iteration),
    or fence their prefills. ``force=True`` uninstalls anyway and strands them, logged
    (for a process that is exiting). Managers built while installed keep their gate
    object but stop using it."""
    global _patches
    with _lock:
        if _patches is None:
            return
        held = held_requests()
        if held:
            what = ", ".join("%s (%s)" % (r, st) for r, st in held[:10])
            more = "" if len(held) <= 10 else " and %d more" % (len(held) - 10)
            if not force:
                raise RoomsStillHeld(
                    "kvfence.sglang: not uninstalled: %d aborted requests are held by "
                    "kvfence, which alone can release them: %s%s. Wait for their "
                    "prefills' ACKs (or fence_prefill() them) and one scheduler "
                    "iteration; nothing was changed" % (len(held), what, more))
            logger.error("kvfence.sglang: uninstalled with %d aborted requests held: "
                         "their pages are never freed: %s%s", len(held), what, more)
        _patches.undo()
        for g in list(_state.decode_gates):
            if g.resets is not None:
                # SGLang registered this decode with each prefill under a generation's
                # session: drop those registrations so its next request registers under
                # SGLang's own session again (the engines stay, for transfers in flight).
                for mgr in list(g.managers):
                    g.resets.forget_registrations(mgr)
        from sglang.srt.disaggregation.common.conn import CommonKVManager  # type: ignore[import-untyped,import-not-found,unused-ignore]

        if isinstance(CommonKVManager.__dict__.get("_kvfence_gate"), _LazyGate):
            delattr(CommonKVManager, "_kvfence_gate")
        _patches = None
        metrics.unregister()
        logger.info("kvfence.sglang uninstalled")


def fence_prefill(bootstrap_addr: str, why: str = "fenced by the operator", *,
                  current: bool = True) -> int:
    """Fences every rank of the prefill instance at ``bootstrap_addr`` on every decode
    gate of this process, *now*; returns how many rooms that released.

    For a fencing agent or an operator who has cut that prefill off (its process killed,
    its host powered off or isolated): kvfence trusts the caller that no byte of it can
    land any more. The heartbeat path calls the same fence only after its own proof
    (:mod:`kvfence.sglang.teardown`).

    Also after the heartbeat declared that prefill dead (which retired its ranks and
    waits, or gave up waiting, for a proof that never comes for a powered-off host): the
    ranks retired and not fenced yet are kept per address, and fenced here.

    ``current=False`` fences only those retired ranks, not the ids of the instance that
    serves ``bootstrap_addr`` now: for a prefill that was **restarted on the same
    address** before its old transport was proven torn down (the new instance's
    endpoints accept, so that proof cannot hold), once the caller knows the old process
    is gone. The restarted instance's rooms are left to its own ACKs.

    >>> fence_prefill("10.0.0.7:8998", "old process gone, restarted", current=False)  # doctest: +SKIP
    """
    total = 0
    for g in list(_state.decode_gates):
        if current:
            g.retire(bootstrap_addr)  # the instance's current ids join the retired ones
        ranks = g.unfenced(bootstrap_addr)
        if ranks:
            total += g.fence(bootstrap_addr, ranks, why)
    return total


def snapshot() -> Dict[str, Any]:
    """A JSON-able summary: whether installed, the metrics, the gates' table stats."""
    out: Dict[str, Any] = {"installed": installed(), "metrics": metrics.values(),
                           "gates_attached": dict(_state.gates_attached)}
    dec: List[Dict[str, Any]] = []
    for g in list(_state.decode_gates):
        s = g.table.stats()
        dec.append({"rooms_owned": s["rooms_owned"], "rooms_closing": s["rooms_closing"],
                    "quarantined_rooms": g.quarantined_rooms,
                    "quarantined_pages": g.quarantined_pages,
                    "fenced_ranks": g.fenced_ranks, "fenced": s["fenced"],
                    "records": len(g.records), "decided": len(g.decided),
                    "held_for_good": len(g.held_for_good), "unguarded_rooms": g.unguarded_rooms,
                    "ignored_acks": g.ignored_acks, "dropped_rooms": g.dropped_rooms,
                    "retired_unfenced": sum(len(v) for v in list(g.retired.values())),
                    "reset": None if g.resets is None else g.resets.status()})
    pre: List[Dict[str, Any]] = []
    for p in list(_state.prefill_gates):
        s = p.table.stats()
        pre.append({"rooms_owned": s["rooms_owned"], "rooms_closing": s["rooms_closing"],
                    "refused_chunks": p.refused_chunks, "failed_transfers": p.failed_transfers,
                    "refused_rooms": p.refused_rooms,
                    "quarantined_rooms": p.quarantined_rooms})
    out["decode"] = dec
    out["prefill"] = pre
    return out
