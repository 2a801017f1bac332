"""Wrapping SGLang methods in place, all or nothing, and restoring them exactly."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Tuple

__all__ = ["Patch", "PatchSet", "require_params"]

Wrapper = Callable[[Callable[..., Any]], Callable[..., Any]]


@dataclass
class Patch:
    """Replace ``owner.name`` by ``make(original)``; the original is kept for ``undo``."""

    owner: type
    name: str
    make: Wrapper


@dataclass
class PatchSet:
    """Patches applied together: :meth:`apply` checks every target first, so a missing
    attribute refuses the whole set before anything changed."""

    patches: List[Patch] = field(default_factory=list)
    _saved: Dict[Tuple[type, str], Any] = field(default_factory=dict)

    def check(self) -> List[str]:
        """The targets that do not exist (an empty list: every one is there)."""
        return [
            "%s.%s" % (p.owner.__qualname__, p.name)
            for p in self.patches
            if p.name not in p.owner.__dict__ or not callable(p.owner.__dict__[p.name])
        ]

    def apply(self) -> None:
        """Wraps every target (call :meth:`check` first)."""
        for p in self.patches:
            orig = p.owner.__dict__[p.name]
            self._saved[(p.owner, p.name)] = orig
            wrapped = p.make(orig)
            functools.update_wrapper(wrapped, orig)
            wrapped.__kvfence_original__ = orig  # type: ignore[attr-defined]
            setattr(p.owner, p.name, wrapped)

    def undo(self) -> None:
        """Puts every original back, in reverse order."""
        for (owner, name), orig in reversed(list(self._saved.items())):
            setattr(owner, name, orig)
        self._saved.clear()


def require_params(owner: type, name: str, params: List[str]) -> None:
    """Raises ``RuntimeError`` unless ``owner.name`` takes exactly ``params``.

    For the wrappers that mirror an SGLang method's parameters so as to call it with a
    plain positional call (no ``*args/**kwargs`` repacking: the hot ones, per request or
    per chunk); :func:`kvfence.sglang.install` calls this, through each side's
    ``patches()``, before anything is patched."""
    fn = owner.__dict__.get(name)
    if fn is None:
        return  # missing: PatchSet.check names it
    found = list(inspect.signature(fn).parameters)
    if found != params:
        raise RuntimeError("kvfence.sglang: %s.%s takes %s, not %s; nothing was changed"
                           % (owner.__qualname__, name, found, params))
