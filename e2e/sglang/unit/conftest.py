"""Runs SGLang's own unit tests of the deferred KV release against SGLang 0.5.23, with or
without kvfence.sglang (``KVFENCE_SGLANG=1``: the start-up hook installs it as soon as
SGLang's Mooncake module is imported, before the tests touch it).

The test files are SGLang's (``test/registered/unit/disaggregation/`` of
sgl-project/sglang), fetched at run time into ``e2e/sglang/.upstream/`` and never
committed. Their fixtures are a little newer than the 0.5.23 wheel; the adjustments below
only add what 0.5.23's code reads and the newer fixtures no longer set. None changes
what a test asserts.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
UPSTREAM = os.environ.get("SGLANG_UNIT_TESTS", os.path.join(os.path.dirname(HERE), ".upstream"))
sys.path.insert(0, UPSTREAM)  # the mooncake test imports its sibling by name


def _world_group():
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        dist.init_process_group("gloo", rank=0, world_size=1)
    return dist.group.WORLD


def _adjust(mod) -> None:
    name = mod.__name__
    if name == "test_deferred_decode_kv_release":
        from types import SimpleNamespace

        group = _world_group()
        make_queue = mod._make_queue

        def _make_queue(*a, **kw):
            q = make_queue(*a, **kw)
            q.gloo_group = group  # 0.5.23's resolve reduces over it (world size 1)
            q.scheduler.enable_hisparse = False  # read by 0.5.23's _release_request
            # 0.5.23 resets the row with MetadataBuffers.clear_slot (which zeroes it).
            rows = q.metadata_buffers.bootstrap_room
            q.metadata_buffers.clear_slot = lambda idx: rows.__setitem__(idx, 0)
            return q

        mod._make_queue = _make_queue
        make_req = mod._make_decode_req

        def _make_decode_req(*a, **kw):
            d = make_req(*a, **kw)
            d.kv_receiver.abort_notified = True  # read by 0.5.23's _defer_release
            return d

        mod._make_decode_req = _make_decode_req
        make_pop = mod._make_pop_queue

        def _make_pop_queue(mgr):
            q = make_pop(mgr)
            q.gloo_group = group
            return q

        mod._make_pop_queue = _make_pop_queue
        mod._TestSender.conclude_state = None  # read by 0.5.23's CommonKVSender.clear
        del SimpleNamespace
    elif name == "test_mooncake_deferred_kv_release":
        chunk_cls = mod.TransferKVChunk
        known = {f.name for f in dataclasses.fields(chunk_cls)}

        def TransferKVChunk(**kw):  # 0.5.23's chunk has no chunk_id yet
            return chunk_cls(**{k: v for k, v in kw.items() if k in known})

        mod.TransferKVChunk = TransferKVChunk


def pytest_collection_modifyitems(session, config, items):
    seen = set()
    for item in items:
        mod = getattr(item, "module", None)
        if mod is not None and mod.__name__ not in seen:
            seen.add(mod.__name__)
            _adjust(mod)


@pytest.fixture(scope="session", autouse=True)
def _report_rule():
    import kvfence.sglang as ks

    want = os.environ.get("KVFENCE_SGLANG") == "1"
    assert ks.installed() == want, "KVFENCE_SGLANG=%s but installed=%s" % (want, ks.installed())
    yield


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """How many kvfence gates SGLang's tests attached (run.py reads this line): their
    managers are built with ``__new__``, so each gate attached at the manager's first use
    by a kvfence wrapper."""
    try:
        from kvfence.sglang import _state
    except ImportError:
        return
    g = getattr(_state, "gates_attached", None)
    if g is not None:
        terminalreporter.write_line(
            "kvfence gates attached: decode %d, prefill %d (at first use %d)"
            % (g["decode"], g["prefill"], g["at_first_use"]))
