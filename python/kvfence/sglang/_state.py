"""Process-wide state of the adapter: the gates attached to SGLang's KV managers."""

from __future__ import annotations

import logging
import threading
import weakref
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from ._config import Config

if TYPE_CHECKING:
    from .decode import DecodeGate
    from .prefill import PrefillGate

logger = logging.getLogger("kvfence.sglang")

_lock = threading.Lock()
config: Config = Config()
decode_gates: "weakref.WeakSet[DecodeGate]" = weakref.WeakSet()
prefill_gates: "weakref.WeakSet[PrefillGate]" = weakref.WeakSet()

# The scheduler's per-iteration wrappers read the live decode gates (and their managers)
# from tuples of weak references rebuilt only when a gate attaches or dies, not by
# iterating the WeakSet (a generator: about 1 us even for one gate).
_gate_refs: "Tuple[weakref.ReferenceType[DecodeGate], ...]" = ()
_manager_refs: "Tuple[weakref.ReferenceType[Any], ...]" = ()
_stale = True


# How many gates this process attached, by side, and how many of them at a manager's
# first use (a manager built with __new__, as SGLang's unit tests build them). Written
# under _lock.
gates_attached: Dict[str, int] = {"decode": 0, "prefill": 0, "at_first_use": 0}


def count_attached(side: str, lazily: bool) -> None:
    """Counts a gate attached to a manager of ``side``."""
    with _lock:
        gates_attached[side] += 1
        if lazily:
            gates_attached["at_first_use"] += 1


def _gate_died(_ref: Any) -> None:
    global _stale
    _stale = True


def add_decode_gate(gate: "DecodeGate") -> None:
    """Registers a new decode gate (``decode.attach``)."""
    global _stale, _gate_refs
    with _lock:
        decode_gates.add(gate)
        _gate_refs = _gate_refs + (weakref.ref(gate, _gate_died),)
        _stale = True


def _refresh() -> None:
    global _stale, _gate_refs, _manager_refs
    with _lock:
        _stale = False
        gates = [g for g in (r() for r in _gate_refs) if g is not None]
        _gate_refs = tuple(weakref.ref(g, _gate_died) for g in gates)
        _manager_refs = tuple(weakref.ref(m) for g in gates for m in list(g.managers))


def decode_gate_refs() -> "Tuple[weakref.ReferenceType[DecodeGate], ...]":
    """Weak references to the live decode gates (call each; ``None``: it died since)."""
    if _stale:
        _refresh()
    return _gate_refs


def decode_manager_refs() -> "Tuple[weakref.ReferenceType[Any], ...]":
    """Weak references to the decode managers that have a gate."""
    if _stale:
        _refresh()
    return _manager_refs


class RankRegistry:
    """kvfence rank ids for (prefill instance, SGLang prefill rank) pairs.

    SGLang's ACK carries ``_prefill_unique_rank()`` (small, per instance); one decode
    talks to several prefill instances, so kvfence's rank id is assigned per
    ``(bootstrap_addr, unique_rank)``. Ids are never reused: when an instance is fenced
    its ids stay fenced, and the instance gets new ids if it comes back.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: Dict[Tuple[str, int], int] = {}
        self._next = 0

    def ids(self, addr: str, ranks: List[int]) -> List[int]:
        """The kvfence ids of ``ranks`` of the instance at ``addr`` (assigned on first use)."""
        with self._lock:
            out = []
            for r in ranks:
                key = (addr, r)
                rid = self._ids.get(key)
                if rid is None:
                    rid = self._next
                    self._next += 1
                    self._ids[key] = rid
                out.append(rid)
            return out

    def get(self, addr: str, rank: int) -> Optional[int]:
        """The id of ``rank`` of ``addr``, if it has one."""
        with self._lock:
            return self._ids.get((addr, rank))

    def retire(self, addr: str) -> List[int]:
        """Forgets every id of ``addr`` (it is being fenced) and returns them."""
        with self._lock:
            keys = [k for k in self._ids if k[0] == addr]
            return [self._ids.pop(k) for k in keys]

    def of(self, addr: str) -> List[int]:
        """Every current id of ``addr``."""
        with self._lock:
            return [v for k, v in self._ids.items() if k[0] == addr]
