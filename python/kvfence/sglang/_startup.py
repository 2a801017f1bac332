"""The start-up hook: get kvfence into every SGLang process without editing SGLang.

``kvfence_sglang.pth`` (installed next to the package) runs :func:`maybe_hook` at every
interpreter start; it does nothing unless ``KVFENCE_SGLANG=1``. Then it arms a post-import
hook: as soon as ``sglang.srt.disaggregation.mooncake.conn`` has been imported (before any
KV manager can be built from it) :func:`kvfence.sglang.install` runs. SGLang's scheduler
processes are spawned with the parent's environment, so each one installs it too.
``kvfence-sglang-run CMD ...`` sets the variable and ``exec``s CMD (as ``ddtrace-run``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any, List, Optional, Sequence

TRIGGER = "sglang.srt.disaggregation.mooncake.conn"
ENV = "KVFENCE_SGLANG"


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Wraps the loader of :data:`TRIGGER` so that install() runs right after it."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]],
                  target: Optional[ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname != TRIGGER:
            return None
        import importlib.util

        sys.meta_path.remove(self)  # one shot; find the real spec without us
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        orig_exec = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            orig_exec(module)
            from kvfence import sglang

            sglang.install()

        setattr(loader, "exec_module", exec_module)
        return spec


def maybe_hook() -> None:
    """Arms the post-import hook when ``KVFENCE_SGLANG=1`` (called by the ``.pth``)."""
    if os.environ.get(ENV) != "1":
        return
    arm()


def arm() -> None:
    """Installs kvfence.sglang now if SGLang's Mooncake module is imported already, else
    as soon as it is (the post-import hook; idempotent)."""
    if TRIGGER in sys.modules:
        from kvfence import sglang

        sglang.install()
        return
    if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder())


def run_main(argv: Optional[List[str]] = None) -> Any:
    """``kvfence-sglang-run CMD [ARGS...]``: runs CMD with kvfence.sglang enabled."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: kvfence-sglang-run CMD [ARGS...]\n"
              "Runs CMD with KVFENCE_SGLANG=1: every Python process that imports SGLang's\n"
              "Mooncake disaggregation module installs kvfence.sglang first.")
        return 0 if args else 2
    os.environ[ENV] = "1"
    os.execvp(args[0], args)
