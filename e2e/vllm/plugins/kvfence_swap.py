"""pytest plugin: runs vLLM's own NIXL / P-D unit tests against kvfence's connector.

Loaded with ``-p kvfence_swap`` (``e2e/vllm/plugins`` on ``PYTHONPATH``) before any test
module is imported, it points every name the tests reach vLLM's NIXL classes by at the
kvfence subclasses (``kvfence.vllm``), so the *same* tests exercise them:

* ``NixlConnector`` / ``NixlPullConnector`` -> ``KvfenceNixlConnector`` and
  ``NixlPushConnector`` -> ``KvfenceNixlPushConnector`` (in the ``nixl`` package and its
  ``connector`` module);
* ``NixlConnectorWorker`` / ``NixlPullConnectorWorker`` -> ``KvfencePullWorker`` and
  ``NixlPushConnectorWorker`` -> ``KvfencePushWorker`` (the tests subclass these, e.g.
  ``FakeNixlConnectorWorker``, and construct them directly);
* vLLM's ``KVConnectorFactory`` entries "NixlConnector" / "NixlPushConnector" (what the
  tests' ``create_vllm_config`` and the real ``Scheduler`` load).

Only names are rebound; no vLLM code is changed, and vLLM's own ``isinstance`` checks
still hold (the kvfence classes subclass vLLM's). ``KVFENCE_SWAP=0`` disables it (stock).
"""

from __future__ import annotations

import os
import sys
from typing import Any


def _swap() -> None:
    import kvfence.vllm as kv
    from vllm.distributed.kv_transfer.kv_connector import factory
    from vllm.distributed.kv_transfer.kv_connector.v1 import nixl
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import (
        connector,
        pull_worker,
        push_worker,
        worker,
    )

    names: dict[str, Any] = {
        "NixlConnector": kv.KvfenceNixlConnector,
        "NixlPullConnector": kv.KvfenceNixlConnector,
        "NixlPushConnector": kv.KvfenceNixlPushConnector,
        "NixlConnectorWorker": kv.KvfencePullWorker,
        "NixlPullConnectorWorker": kv.KvfencePullWorker,
        "NixlPushConnectorWorker": kv.KvfencePushWorker,
    }
    for mod in (nixl, worker, pull_worker, push_worker):
        for name, cls in names.items():
            if hasattr(mod, name):
                setattr(mod, name, cls)
    # connector.py: only the connector names (its worker globals stay vLLM's, so that
    # NixlPullConnector.start_load_kv's isinstance check keeps its meaning).
    for name in ("NixlConnector", "NixlPullConnector", "NixlPushConnector"):
        setattr(connector, name, names[name])
    legacy = sys.modules.get("vllm.distributed.kv_transfer.kv_connector.v1.nixl_connector")
    if legacy is not None:
        for name, cls in names.items():
            if hasattr(legacy, name):
                setattr(legacy, name, cls)
    reg = factory.KVConnectorFactory._registry
    reg["NixlConnector"] = lambda: kv.KvfenceNixlConnector
    reg["NixlPushConnector"] = lambda: kv.KvfenceNixlPushConnector


def _cpu_without_triton() -> None:
    """vLLM 0.34's CPU platform refuses every ``VllmConfig`` on an x86 CPU without Triton
    ("vLLM on x86 CPUs requires Triton (triton-cpu)"). These tests run no kernel (the
    connector and the scheduler only), so the test run, never the adapter, tells vLLM that
    Triton is there; stock and kvfence runs alike."""
    try:
        import vllm.triton_utils as tu
    except ImportError:  # pragma: no cover - no such module in this release
        return
    if not getattr(tu, "HAS_TRITON", True):
        tu.HAS_TRITON = True


def pytest_configure(config: Any) -> None:
    """Rebinds the names once, before collection imports the test modules."""
    _cpu_without_triton()
    if os.environ.get("KVFENCE_SWAP", "1") != "0":
        _swap()
        config.kvfence_swapped = True
