"""Prometheus metrics of :mod:`kvfence.sglang`, next to SGLang's own.

A collector registered with ``prometheus_client``'s default registry (the one SGLang's
``/metrics`` exports when it is not in multiprocess mode); every value is read from the
gates at scrape time, so the request path pays nothing for it.

=========================================  =====  ==============================================
metric                                     type   meaning
=========================================  =====  ==============================================
``kvfence_sglang_held_rooms``              gauge  aborted rooms still held (decode)
``kvfence_sglang_held_pages``              gauge  their KV pages + metadata rows + state slots
``kvfence_sglang_overdue_rooms``           gauge  held longer than ``overdue_after`` (30 s)
``kvfence_sglang_fenced_ranks_total``      count  prefill ranks fenced after a proven teardown
``kvfence_sglang_quarantined_rooms_total`` count  rooms taken out of circulation (decode)
``kvfence_sglang_quarantined_pages_total`` count  their pages (never reused)
``kvfence_sglang_refused_chunks_total``    count  queued chunks of aborted rooms not written
``kvfence_sglang_failed_writes_total``     count  writes that returned -1 (prefill)
``kvfence_sglang_unguarded_rooms_total``   count  aborted requests whose room kvfence could
                                                  not open (not expected): their pages are
                                                  held for good, counted as quarantined
``kvfence_sglang_refused_rooms_total``     count  prefill requests failed: no room free
``kvfence_sglang_dropped_rooms_total``     count  held requests SGLang dropped unfreed
                                                  (``release_memory_occupation``)
``kvfence_sglang_transport_resets_total``  count  prefill transports reset (``.reset``)
``kvfence_sglang_reset_refused_total``     count  requests failed by a reset (registered
                                                  under the generation reset, not sent)
``kvfence_sglang_reset_rooms_total``       count  held rooms released by a reset's fence
=========================================  =====  ==============================================
"""

from __future__ import annotations

import time
from typing import Any, Dict, Iterator, Optional

from . import _state

__all__ = ["values", "register", "unregister"]

_collector: Optional[Any] = None


def values() -> Dict[str, float]:
    """The metrics' current values, summed over every gate of this process."""
    now = time.monotonic()
    overdue_after = _state.config.overdue_after
    v: Dict[str, float] = dict.fromkeys(
        ["held_rooms", "held_pages", "overdue_rooms", "fenced_ranks", "quarantined_rooms",
         "quarantined_pages", "refused_chunks", "failed_writes", "unguarded_rooms",
         "refused_rooms", "dropped_rooms", "transport_resets", "reset_refused",
         "reset_rooms"], 0.0)
    for g in list(_state.decode_gates):
        # The aborted rooms whose pages are not freed yet (open, or released by kvfence
        # and waiting for SGLang's next scan to free them).
        for h, aborted_at in list(g.aborted.items()):
            rec = g.records.get(h)
            if rec is None:
                continue
            v["held_rooms"] += 1
            v["held_pages"] += rec.held_pages
            if now - aborted_at >= overdue_after:
                v["overdue_rooms"] += 1
        v["fenced_ranks"] += g.fenced_ranks
        v["quarantined_rooms"] += g.quarantined_rooms
        v["quarantined_pages"] += g.quarantined_pages
        v["unguarded_rooms"] += g.unguarded_rooms
        v["dropped_rooms"] += g.dropped_rooms
        rs = g.resets
        if rs is not None:
            v["transport_resets"] += rs.resets
            v["reset_refused"] += rs.refused
            v["reset_rooms"] += rs.released_rooms
    for p in list(_state.prefill_gates):
        v["refused_chunks"] += p.refused_chunks
        v["failed_writes"] += p.failed_transfers
        v["refused_rooms"] += p.refused_rooms
    return v


_HELP = {
    "held_rooms": ("gauge", "Aborted requests whose pages kvfence still holds"),
    "held_pages": ("gauge", "KV pages, metadata rows and state slots held by kvfence"),
    "overdue_rooms": ("gauge", "Held rooms older than KVFENCE_SGLANG_OVERDUE_AFTER"),
    "fenced_ranks": ("counter", "Prefill ranks fenced after their transport was torn down"),
    "quarantined_rooms": ("counter", "Rooms quarantined (their pages are never reused)"),
    "quarantined_pages": ("counter", "Pages quarantined (never reused)"),
    "refused_chunks": ("counter", "Queued chunks of aborted rooms that were not written"),
    "failed_writes": ("counter", "Prefill writes that returned -1 (room never ACKed)"),
    "unguarded_rooms": ("counter", "Aborted requests whose room kvfence could not open "
                                   "(held for good, counted as quarantined)"),
    "refused_rooms": ("counter", "Prefill requests failed because no kvfence room was free"),
    "dropped_rooms": ("counter", "Held requests SGLang dropped without freeing them "
                                 "(release_memory_occupation)"),
    "transport_resets": ("counter", "Prefill transports to this decode reset "
                                    "(KVFENCE_SGLANG_RESET)"),
    "reset_refused": ("counter", "Requests failed because their prefill's transport was "
                                 "reset before their metadata went out"),
    "reset_rooms": ("counter", "Held rooms released by a transport reset's fence"),
}


class _Collector:
    """The prometheus_client collector: reads :func:`values` at each scrape."""

    def collect(self) -> Iterator[Any]:
        """One metric family per value."""
        from prometheus_client.core import (  # type: ignore[import-untyped,import-not-found,unused-ignore]
            CounterMetricFamily,
            GaugeMetricFamily,
        )

        for key, value in values().items():
            kind, doc = _HELP[key]
            if kind == "gauge":
                yield GaugeMetricFamily("kvfence_sglang_" + key, doc, value=value)
            else:
                yield CounterMetricFamily("kvfence_sglang_" + key, doc, value=value)


def register() -> bool:
    """Registers the collector (once); ``False`` if ``prometheus_client`` is missing."""
    global _collector
    if _collector is not None:
        return True
    try:
        from prometheus_client.core import REGISTRY  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        return False
    _collector = _Collector()
    REGISTRY.register(_collector)
    return True


def unregister() -> None:
    """Removes the collector."""
    global _collector
    if _collector is None:
        return
    from prometheus_client.core import REGISTRY  # type: ignore[import-untyped,import-not-found,unused-ignore]

    try:
        REGISTRY.unregister(_collector)
    finally:
        _collector = None
