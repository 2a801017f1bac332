"""TEST-SIDE STAND-IN for ``sgl_kernel``, the CPU build of SGLang's kernel package.

SGLang 0.5.23's CPU platform imports ``sgl_kernel`` (e.g. ``copy_all_layer_kv_cache_cpu``)
on its import chain, and no registry ships the CPU build (PyPI has CUDA builds only; the
CPU build is a from-source build with AMX/AVX-512 kernels). ``e2e/serve/sglang.sh`` puts
this directory on ``PYTHONPATH`` of its SGLang servers so that they start; with the tiny
Llama of ``e2e/serve/model.py`` on the ``torch_native`` attention backend, no function of it
is needed.

Every attribute is a function that **fails loudly** when called: it appends a line to
``$KVFENCE_STANDIN_CALLS`` (when set), prints ``KVFENCE-STANDIN-CALLED`` to stderr (the
server's log) and raises. ``sglang.sh`` proves after each run that neither the file nor
that word exists. This is a harness part, never part of kvfence.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Any

MARK = "KVFENCE-STANDIN-CALLED"


def _called(name: str) -> None:
    msg = ("%s sgl_kernel.%s: this is the e2e/serve test stand-in for SGLang's CPU kernel "
           "package (no registry ships it); nothing may call it" % (MARK, name))
    path = os.environ.get("KVFENCE_STANDIN_CALLS")
    if path:
        try:
            with open(path, "a") as f:
                f.write("%d %s\n" % (os.getpid(), name))
        except OSError:
            pass
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()
    raise RuntimeError(msg)


class _Fn:
    """A stand-in for any function (or namespace) of sgl_kernel: raises when called."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *a: Any, **kw: Any) -> Any:
        _called(self._name)

    def __getattr__(self, attr: str) -> "_Fn":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Fn(self._name + "." + attr)

    def __repr__(self) -> str:
        return "<sgl_kernel stand-in %s>" % self._name


class _Module(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Fn(self.__name__.partition(".")[2] + ("." if "." in self.__name__ else "") + attr)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Every ``sgl_kernel.X`` submodule is a stand-in module too."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.startswith("sgl_kernel."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        m = _Module(spec.name)
        m.__path__ = []  # type: ignore[attr-defined]
        return m

    def exec_module(self, module: types.ModuleType) -> None:
        pass


sys.modules[__name__].__class__ = _Module
if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.append(_Finder())
__version__ = "0.0.0+kvfence-standin"
