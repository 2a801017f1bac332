"""Settings of :mod:`kvfence.sglang`, read from the environment at ``install()``."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Mapping, Optional

__all__ = ["Config"]


def _float(env: Mapping[str, str], name: str, default: Optional[float]) -> Optional[float]:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("never", "none", "inf"):
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("%s=%r: not a number of seconds (or 'never')" % (name, raw)) from None
    if not math.isfinite(value) or value < 0:
        raise ValueError("%s=%r: must be >= 0 seconds (or 'never')" % (name, raw))
    return value


def _int(env: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError("%s=%r: not an integer" % (name, raw)) from None
    if not lo <= value <= hi:
        raise ValueError("%s=%r: must be in %d..%d" % (name, raw, lo, hi))
    return value


@dataclass(frozen=True)
class Config:
    """What the adapter may be told (environment variable in brackets).

    * ``rooms`` (``KVFENCE_SGLANG_ROOMS``, 65536): rooms per kvfence table, one table per
      SGLang KV manager. Prefill: a room per request in flight (a request aborted in the
      waiting queue gives its room back); a request that finds none free is failed when
      its sender is made (SGLang's failure path, logged, counted in
      ``kvfence_sglang_refused_rooms_total``), and every chunk of it is refused: never
      written without kvfence. Decode: a room per aborted request still held
      (a successful one never has one); keep it at least the decode's request pool
      (``--max-running-requests`` plus its pre-allocation), which bounds the requests
      held at once: an abort that still finds no room free holds that request's pages
      for good (logged, counted, never released).
    * ``quarantine_after`` (``KVFENCE_SGLANG_QUARANTINE_AFTER``, ``never``): the
      quarantine policy. An aborted room whose writers neither ACKed nor were fenced for
      this many seconds is quarantined: its pages, metadata slot and request slot are
      taken out of circulation for good (counted, never reused, never freed). ``never``:
      held until its writers ACK or are fenced. Time never *frees* a page.
    * ``overdue_after`` (``KVFENCE_SGLANG_OVERDUE_AFTER``, 30): a held room older than this
      counts as overdue in the metrics (SGLang's own release-anyway deadline is 30 s).
    * ``teardown_poll`` (``KVFENCE_SGLANG_TEARDOWN_POLL``, 0.1): how often a prefill that
      the heartbeat declared dead is checked for a torn-down transport before its ranks
      are fenced.
    * ``metrics`` (``KVFENCE_SGLANG_METRICS``, 1): register the Prometheus collector.
    * ``reset`` (``KVFENCE_SGLANG_RESET``, 0): the transport reset (:mod:`.reset`): each
      prefill instance writes to a Mooncake engine of this decode of its own, and a
      failed write (-1) resets it (engine destroyed, proven, its writer ids fenced), so a
      -1 costs its pages for the teardown's time instead of for good. Mooncake TCP,
      SGLang 0.5.23, no staging.
    * ``reset_after`` (``KVFENCE_SGLANG_RESET_AFTER``, 5): with ``reset``, an aborted
      room of the current generation still waiting for an ACK after this many seconds
      resets its prefill's transport too (``never``: only a reported failed write does).
      Time starts a reset; only the teardown proof releases pages.
    """

    rooms: int = 65536
    quarantine_after: Optional[float] = None
    overdue_after: float = 30.0
    teardown_poll: float = 0.1
    metrics: bool = True
    reset: bool = False
    reset_after: Optional[float] = 5.0

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> "Config":
        """The configuration the environment describes; ``ValueError`` on a bad value."""
        e = os.environ if env is None else env
        overdue = _float(e, "KVFENCE_SGLANG_OVERDUE_AFTER", 30.0)
        poll = _float(e, "KVFENCE_SGLANG_TEARDOWN_POLL", 0.1)
        return cls(
            rooms=_int(e, "KVFENCE_SGLANG_ROOMS", 65536, 1, 1 << 24),
            quarantine_after=_float(e, "KVFENCE_SGLANG_QUARANTINE_AFTER", None),
            overdue_after=30.0 if overdue is None else overdue,
            teardown_poll=0.1 if poll is None or poll == 0 else poll,
            metrics=e.get("KVFENCE_SGLANG_METRICS", "1") not in ("0", "false", "no"),
            reset=e.get("KVFENCE_SGLANG_RESET", "0") not in ("0", "false", "no", ""),
            reset_after=_float(e, "KVFENCE_SGLANG_RESET_AFTER", 5.0),
        )
