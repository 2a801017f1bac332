"""Per-step cost of kvfence's NIXL connector against stock vLLM 0.33.0, side by side.

Run (from the repository root; on the 2-core dev box ~1 min with
``KVFENCE_BENCH_N=10,1000``, ~25 min loaded with 10,000, nearly all of it building the
two 10,000-request schedulers; ``KVFENCE_BENCH_ROUNDS``, ``KVFENCE_BENCH_STEPS``,
``KVFENCE_BENCH_CHUNKS`` and ``KVFENCE_BENCH_N`` change rounds, steps, chunks and sizes)::

    KVFENCE_SWAP=0 e2e/vllm/pytest.sh -q -s -p tests.conftest \
        -p tests.v1.kv_connector.unit.conftest $PWD/e2e/vllm/bench/bench_step.py

Three measurements, each at 10, 1,000 and 10,000 requests in flight, stock and kvfence
built the same way and timed in alternating rounds in one process (medians of per-round
times, and the median of the per-round kvfence/stock ratios):

* **worker poll**: ``get_transfer_results()`` of a pull worker (vLLM's
  ``FakeNixlConnectorWorker`` on ``FakeNixlWrapper``) holding N decode READs in progress
  (one handle each) and N prefill requests waiting to be read (leases not expired): the
  poll vLLM runs every engine step. kvfence's worker also holds the N recv rooms with one
  transfer each (its send rooms are opened only when a lease lapses: none here).
* **worker step**: everything the connector's worker side runs in an engine step with
  nothing new scheduled: ``start_load_kv`` (an empty ``NixlConnectorMetadata``), the poll,
  then the connector's ``build_connector_worker_meta()`` (stock: vLLM's base, ``None``;
  kvfence: the step's events, ``None`` when there are none).
* **scheduler step**: ``schedule()`` + ``update_from_output()`` of vLLM's real
  ``Scheduler`` with N decode requests in WAITING_FOR_REMOTE_KVS, its connector loaded
  by name: ``NixlConnector`` vs ``KvfenceNixlConnector`` from ``kvfence.vllm``.

Writes a Markdown table to ``$KVFENCE_BENCH_OUT`` (default: stdout only).
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Tuple
from unittest.mock import patch

import kvfence.vllm as kv
from tests.v1.kv_connector.unit.test_nixl_connector import (
    FakeNixlConnectorWorker,
    FakeNixlWrapper,
)
from tests.v1.kv_connector.unit.utils import (
    create_model_runner_output,
    create_request,
    create_scheduler,
    create_vllm_config,
    make_kv_cache_config,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlPullConnector
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import NixlConnectorMetadata
from vllm.v1.request import RequestStatus

NS = [int(x) for x in os.environ.get("KVFENCE_BENCH_N", "10,1000,10000").split(",")]
ROUNDS = int(os.environ.get("KVFENCE_BENCH_ROUNDS", "21"))
# Per round, CHUNKS alternating chunks per side of max(1, STEPS // N) steps each (the
# scheduler: half that, at least 1): ~1 ms chunks at 10 and 1,000 in flight; at 10,000
# a step alone is 50-100 ms: 3 chunks of one step.
STEPS = int(os.environ.get("KVFENCE_BENCH_STEPS", "1000"))
CHUNKS = int(os.environ.get("KVFENCE_BENCH_CHUNKS", "10"))
BLOCK = 16
REMOTE = FakeNixlConnectorWorker.REMOTE_ENGINE_ID


class _KvfFake(kv.KvfencePullWorker, FakeNixlConnectorWorker):  # type: ignore[misc]
    """kvfence's worker hooks over vLLM's test worker (same fakes as the stock one)."""


def _worker(kvf: bool) -> Any:
    cfg = create_vllm_config(block_size=BLOCK)
    kvcc = make_kv_cache_config(block_size=BLOCK, num_blocks=100)
    cls = _KvfFake if kvf else FakeNixlConnectorWorker
    w = cls.__new__(cls)
    FakeNixlConnectorWorker.__init__(w, cfg, "local-engine", hand_shake_latency=0,
                                     kv_cache_config=kvcc)
    w.nixl_wrapper._cycles_before_xfer_done = 10**12  # every READ stays in progress
    return w


def _load_worker(w: Any, n: int, kvf: bool) -> None:
    far = time.perf_counter() + 1e6
    if kvf:
        w._kvf_ensure()
    for i in range(n):
        r, h = f"d{i}", 10_000_000 + i
        w._recving_transfers[r] = [h]
        w._recving_metadata[r] = SimpleNamespace(remote=SimpleNamespace(engine_id=REMOTE))
        p = f"p{i}"
        w._reqs_to_process.add(p)
        w._reqs_to_send[p] = far
        if kvf:
            w._kvf_begin(h, "recv", r, REMOTE)  # what _read_blocks_for_req does


def _scheduler(kvf: bool, n: int) -> Tuple[Any, Callable[[], None]]:
    cfg = create_vllm_config(
        block_size=BLOCK,
        max_num_seqs=n + 16,
        max_num_batched_tokens=max(64, 4 * n),
        kv_connector="KvfenceNixlConnector" if kvf else "NixlConnector",
        kv_connector_module_path="kvfence.vllm" if kvf else None,
    )
    sched = create_scheduler(cfg, num_blocks=3 * n + 64)
    for _ in range(n):
        req = create_request(do_remote_prefill=True, num_tokens=2 * BLOCK, block_size=BLOCK)
        sched.add_request(req)

    def step() -> None:
        out = sched.schedule()
        sched.update_from_output(out, create_model_runner_output([]))

    for _ in range(50):
        step()
        if all(r.status == RequestStatus.WAITING_FOR_REMOTE_KVS for r in sched.requests.values()):
            break
    waiting = sum(r.status == RequestStatus.WAITING_FOR_REMOTE_KVS for r in sched.requests.values())
    assert waiting == n, f"{waiting} of {n} requests waiting for remote KVs"
    if kvf:
        assert type(sched.connector).__name__ == "KvfenceNixlConnector"
    return sched, step


def _side_by_side(
    make: Callable[[bool], Callable[[], None]], steps: int, chunks: int
) -> Dict[str, float]:
    """ROUNDS rounds; each round times ``chunks`` chunks of ``steps`` steps per side,
    alternating sides chunk by chunk (so that load on a shared machine falls on both
    alike), and sums them per side. Returns medians over rounds."""
    fns = {k: make(k) for k in (False, True)}
    for fn in fns.values():
        fn()  # warm
    # As vLLM's engine does after start-up (gc.freeze): the long-lived heap (torch,
    # the fixtures, both sides' state) is out of the collector's way for both sides.
    gc.collect()
    gc.freeze()
    per: Dict[bool, List[float]] = {False: [], True: []}
    ratios: List[float] = []
    clock = time.perf_counter
    try:
        for r in range(ROUNDS):
            t = {False: 0.0, True: 0.0}
            for c in range(chunks):
                for k in ((False, True) if (r + c) % 2 == 0 else (True, False)):
                    fn = fns[k]
                    t0 = clock()
                    for _ in range(steps):
                        fn()
                    t[k] += clock() - t0
            for k in (False, True):
                per[k].append(t[k] / (steps * chunks))
            ratios.append(t[True] / t[False])
    finally:
        gc.unfreeze()
    return {
        "stock_us": statistics.median(per[False]) * 1e6,
        "kvfence_us": statistics.median(per[True]) * 1e6,
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }


@patch("vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker.NixlWrapper", FakeNixlWrapper)
def test_bench_step(default_vllm_config: Any, dist_init: Any) -> None:
    """Prints (and writes) the side-by-side table; checks kvfence's state is in place."""
    rows = []
    for n in NS:
        steps = max(1, STEPS // n)
        chunks = CHUNKS if n <= 1000 else 3

        def mk_worker(kvf: bool, n: int = n) -> Callable[[], None]:
            w = _worker(kvf)
            _load_worker(w, n, kvf)
            if kvf:
                assert len(w._kvf_xfers) == n  # the n READs
            return w.get_transfer_results

        res = _side_by_side(mk_worker, steps, chunks)
        rows.append(("worker poll (get_transfer_results)", n, res))
        print(f"worker poll n={n}: {res}", flush=True)

        def mk_step(kvf: bool, n: int = n) -> Callable[[], None]:
            w = _worker(kvf)
            _load_worker(w, n, kvf)
            # The connector around the worker (only its worker-side metadata hook is
            # called): vLLM's NixlConnector or kvfence's subclass of it.
            ccls = kv.KvfenceNixlConnector if kvf else NixlPullConnector
            conn = ccls.__new__(ccls)
            conn.connector_worker = w
            empty = NixlConnectorMetadata()
            load, poll, meta = w.start_load_kv, w.get_transfer_results, conn.build_connector_worker_meta

            def step() -> None:
                load(empty)
                poll()
                meta()

            return step

        res = _side_by_side(mk_step, steps, chunks)
        rows.append(("worker step (start_load_kv + poll + worker meta)", n, res))
        print(f"worker step n={n}: {res}", flush=True)

        def mk_sched(kvf: bool, n: int = n) -> Callable[[], None]:
            return _scheduler(kvf, n)[1]

        res = _side_by_side(mk_sched, max(1, steps // 2), chunks)
        rows.append(("scheduler step (schedule + update_from_output)", n, res))
        print(f"scheduler n={n}: {res}", flush=True)

    lines = [
        "| step | requests in flight | stock (median us/step) | kvfence (median us/step) "
        "| kvfence/stock (median of rounds) | min-max |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, n, r in rows:
        lines.append(
            f"| {name} | {n:,} | {r['stock_us']:.1f} | {r['kvfence_us']:.1f} | "
            f"{r['ratio']:.2f}x | {r['ratio_min']:.2f}-{r['ratio_max']:.2f} |"
        )
    table = "\n".join(lines)
    print("\n" + table)
    out = os.environ.get("KVFENCE_BENCH_OUT")
    if out:
        with open(out, "w") as f:
            f.write(table + "\n")
