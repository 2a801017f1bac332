"""Test-side CPU workaround of the e2e/serve vLLM pair (never part of kvfence).

``vllm_pair.Server`` puts this directory on the ``PYTHONPATH`` of its vLLM servers, stock
and kvfence alike; Python imports this module at start-up in every process (API server,
engine core, workers).

**NIXL's progress thread spins.** NIXL 1.5.1's Python API builds every agent with
``pthrDelay = 0`` (``nixl._api.nixl_agent.__init__``), and its UCX backend's shared progress
thread sleeps in ``poll()`` for that delay rounded up to whole milliseconds: 0, so it never
sleeps (seen with ``strace``: ``poll(..., 0)`` in a loop, one core per worker at 100 %). On
a GPU host that is one core of many; on this 2-core box the two workers' progress threads
take both cores from the model's kernels, and single requests took 2-54 s under either rule
(``e2e/serve/RESULTS.md``). Here every ``nixlAgent`` is built with ``pthrDelay`` of
``KVFENCE_SERVE_NIXL_PTHR_DELAY_US`` (default 1000 us: the thread wakes on the UCX worker's
event fd, or after 1 ms at the latest, as the C++ code's own comment intends). Transfer
semantics are untouched: the same thread makes the same progress calls, less often when
idle. Outside kvfence's code; same for both rules.

Each agent built logs ``KVFENCE-SERVE-VLLM-SITE nixlAgent NAME pthrDelay=US`` to stderr,
so a run can show the workaround was in force in both rules' servers. Set
``KVFENCE_SERVE_NIXL_PTHR_DELAY_US=0`` for NIXL's own behaviour.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType


def _install(_nixl: ModuleType) -> None:
    api = sys.modules.get("nixl._api")  # the real nixl_cuXX._api, set by nixl/__init__
    if api is None:
        print("KVFENCE-SERVE-VLLM-SITE nixl._api not set by nixl: no workaround",
              file=sys.stderr, flush=True)
        return
    bind = api.nixlBind
    base = bind.nixlAgent
    if getattr(base, "_kvfence_serve_delay", False):
        return
    delay = int(os.environ.get("KVFENCE_SERVE_NIXL_PTHR_DELAY_US", "1000"))

    class _Agent(base):  # type: ignore[misc, valid-type]
        _kvfence_serve_delay = True

        def __init__(self, name: str, config: object) -> None:
            if delay > 0:
                config.pthrDelay = delay  # type: ignore[attr-defined]
            print(f"KVFENCE-SERVE-VLLM-SITE nixlAgent {name} "
                  f"pthrDelay={config.pthrDelay}",  # type: ignore[attr-defined]
                  file=sys.stderr, flush=True)
            super().__init__(name, config)

    bind.nixlAgent = _Agent


if os.environ.get("KVFENCE_SERVE_VLLM_SITE") == "1":
    # Right after vLLM imports the nixl package (which sets nixl._api), never before:
    # importing NIXL here would precede vLLM's UCX_RCACHE_MAX_UNRELEASED ("NIXL was
    # already imported") and change UCX's settings for the servers.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "site_common"))
    from serve_posthook import arm

    arm({"nixl": _install})
