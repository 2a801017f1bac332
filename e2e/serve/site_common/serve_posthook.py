"""Post-import hooks for the harness's start-up modules (``sglang_site``, ``vllm_site``).

Each ``sitecustomize`` puts this directory on ``sys.path`` and calls :func:`arm` with the
modules it wants to patch: a hook runs once, right after its module has been executed, so
the harness never imports an engine module earlier than the engine itself would (the same
mechanism as ``kvfence.sglang``'s own start-up hook). Test-side only.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Callable, Dict, Optional, Sequence

Hook = Callable[[ModuleType], None]


class _After(importlib.abc.MetaPathFinder):
    """Wraps the loader of each hooked module so that its hook runs after it (once)."""

    def __init__(self, hooks: Dict[str, Hook]) -> None:
        self.hooks = hooks

    def find_spec(self, fullname: str, path: Optional[Sequence[str]],
                  target: Optional[ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        fn = self.hooks.get(fullname)
        if fn is None:
            return None
        sys.meta_path.remove(self)  # find the real spec without us
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        orig_exec = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            orig_exec(module)
            self.hooks.pop(fullname, None)
            fn(module)

        setattr(spec.loader, "exec_module", exec_module)
        return spec


def arm(hooks: Dict[str, Hook]) -> None:
    """Runs ``hooks[name](module)`` right after module ``name`` is first imported."""
    sys.meta_path.insert(0, _After(dict(hooks)))
