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

**vLLM's message queue spins** (push mode only, ``KVFENCE_SERVE_SHM_SPIN_SLEEP_US``, set by
``vllm_pair.Server`` for push servers). vLLM's shared-memory queue between engine core and
worker busy-waits with ``os.sched_yield()`` in a loop for 1 s after every message read
(``shm_broadcast.SpinCondition``, ``busy_loop_s=1``, no setting). In push mode the prefill's
engine steps every millisecond while a finished request waits for its decode
(``has_pending_push_work``), so its worker never leaves that spin, and the worker's
``nixl-push-writer`` thread, which receives the decode's ``PUSH_REG`` and posts the WRITE,
starves for CPU and the GIL on 2 cores: a ``PUSH_REG`` was not handled within 60 s (18 s
late with NIXL's own progress delay, and the handshake back to the decode then timed out),
and no push request was ever served here. With the variable set, the queue's spin sleeps
that long per turn instead of yielding (``time.sleep``: the GIL and the core go to the
other threads; a new message is still seen within that delay). Not ``busy_loop_s=0``: the queue's idle wait on its ZMQ notification
then loses wake-ups (its publisher drops at a high-water mark of 1) and every step waited
for a poll timeout (0.2 tokens/s, pull and push alike). Timing only, same for both rules;
logged as ``KVFENCE-SERVE-VLLM-SITE shm spin sleep=US``.

**A WRITE held at its post** (``KVFENCE_SERVE_CTL``, set by ``vllm_pair.Server`` for a push
prefill only): the harness's forcing for ``push_late_write``, test-side. When the harness
creates ``CTL/hold_next``, the next ``nixl_agent.transfer`` call (in a push prefill: the
writer thread posting a WRITE) writes ``CTL/held`` and blocks until ``CTL/release`` exists,
then posts the WRITE as it was prepared (same handle, same source and destination blocks)
and writes ``CTL/held_done``: a WRITE queued behind a slow NIC or a congested link, whose
bytes are read from the prefill's blocks when it finally goes. Both rules alike; kvfence's
adapter began its transfer before vLLM prepared the WRITE, stock has nothing open.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Callable, Dict


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
    ctl = os.environ.get("KVFENCE_SERVE_CTL")
    if ctl:
        _hold_transfers(api.nixl_agent, ctl)


def _hold_transfers(agent: type, ctl: str) -> None:
    import time

    orig = getattr(agent, "transfer")

    def say(msg: str) -> None:
        print(f"KVFENCE-SERVE-VLLM-SITE {time.strftime('%H:%M:%S')} pid {os.getpid()} {msg}",
              file=sys.stderr, flush=True)

    def transfer(self: object, handle: object, notif_msg: bytes = b"") -> str:
        hold = os.path.join(ctl, "hold_next")
        try:  # claimed by one call only (rename is atomic)
            os.rename(hold, hold + f".taken.{os.getpid()}")
        except OSError:
            return str(orig(self, handle, notif_msg))
        say("hold: a WRITE held at its post until CTL/release")
        with open(os.path.join(ctl, "held"), "w") as f:
            f.write(str(os.getpid()))
        while not os.path.exists(os.path.join(ctl, "release")):
            time.sleep(0.05)
        state = str(orig(self, handle, notif_msg))
        say(f"hold: the held WRITE posted ({state})")
        with open(os.path.join(ctl, "held_done"), "w") as f:
            f.write(state)
        return state

    setattr(agent, "transfer", transfer)
    say(f"hold point armed at nixl_agent.transfer (CTL {ctl})")


def _install_shm(shm: ModuleType) -> None:
    import time

    us = int(os.environ["KVFENCE_SERVE_SHM_SPIN_SLEEP_US"])

    def sched_yield() -> None:  # the module's own name for its spin turn
        time.sleep(us / 1e6)

    shm.sched_yield = sched_yield  # type: ignore[attr-defined]
    print(f"KVFENCE-SERVE-VLLM-SITE shm spin sleep={us}", file=sys.stderr, flush=True)


if os.environ.get("KVFENCE_SERVE_VLLM_SITE") == "1":
    # Right after vLLM imports the nixl package (which sets nixl._api), never before:
    # importing NIXL here would precede vLLM's UCX_RCACHE_MAX_UNRELEASED ("NIXL was
    # already imported") and change UCX's settings for the servers.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "site_common"))
    from serve_posthook import arm

    hooks: Dict[str, Callable[[ModuleType], None]] = {"nixl": _install}
    if os.environ.get("KVFENCE_SERVE_SHM_SPIN_SLEEP_US"):
        hooks["vllm.distributed.device_communicators.shm_broadcast"] = _install_shm
    arm(hooks)
