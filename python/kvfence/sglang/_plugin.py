"""kvfence.sglang as a plugin of SGLang's plugin framework (SGLang 0.5.22+).

SGLang's ``load_plugins()`` (``sglang/srt/plugins``) runs every function registered in the
``sglang.srt.plugins`` entry-point group, in every scheduler process (where the KV managers
live), the engine, the detokenizer and the DP controller; ``SGLANG_PLUGINS`` (read by
SGLang) is its comma-separated allowlist. kvfence's package registers :func:`register`
there as ``kvfence`` (``python/pyproject.toml``), so that

    SGLANG_PLUGINS=kvfence python -m sglang.launch_server ...

enables it, with nothing else to set. ``KVFENCE_SGLANG=1`` (the start-up hook) still works,
and :func:`kvfence.sglang.install` / :func:`kvfence.sglang.uninstall` stay for tests.
"""

from __future__ import annotations

import os

from ._state import logger

__all__ = ["register", "enabled"]

NAME = "kvfence"


def enabled() -> bool:
    """Whether kvfence was asked for: ``SGLANG_PLUGINS`` names it, or ``KVFENCE_SGLANG=1``.
    (With ``SGLANG_PLUGINS`` unset SGLang runs every installed plugin: installing kvfence
    alone does not enable it.)"""
    names = {x.strip() for x in os.environ.get("SGLANG_PLUGINS", "").split(",")}
    return NAME in names or os.environ.get("KVFENCE_SGLANG") == "1"


def register() -> None:
    """The plugin function SGLang calls: when kvfence is enabled, installs it into this
    process as soon as SGLang's Mooncake module is imported (at once if it is already).

    On an SGLang this adapter does not support, raises ``SystemExit`` naming the supported
    versions (SGLang's loader only logs an ``Exception``, and the server would then run
    without the protection it was asked for)."""
    if not enabled():
        logger.debug("kvfence.sglang: installed as an SGLang plugin but not enabled "
                     "(SGLANG_PLUGINS=kvfence enables it)")
        return
    from . import _sglang_version, _supported_release
    from ._startup import arm

    try:
        _supported_release(_sglang_version())  # (by the code, as install() decides)
        arm()
    except Exception as e:  # noqa: BLE001 - any failure to protect is fatal here
        raise SystemExit("kvfence.sglang was enabled (SGLANG_PLUGINS=kvfence) but cannot "
                         "be installed: %s" % e) from e
