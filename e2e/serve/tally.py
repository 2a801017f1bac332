"""What one scenario run under one rule saw: requests, wrong answers (with the first wrong
token of each), HTTP errors, latency. Shared by the vLLM harness (``serve.py``, which adds
its forcing counts) and the SGLang one (``serve_sglang.py``, which adds its fault and
victim counts); each subclass adds its fields to :meth:`Tally.row`."""

from __future__ import annotations

from typing import Any, Dict, List, Optional


class Tally:
    """Answers compared token for token with the reference, and their latencies."""

    def __init__(self) -> None:
        self.requests = 0
        self.wrong = 0
        self.errors = 0
        self.lat: List[float] = []
        self.first_wrong: List[int] = []

    def check(self, got: Optional[List[int]], want: List[int], lat: float) -> bool:
        """Counts one answer (``None``: an HTTP error); True when it is right."""
        self.requests += 1
        if got is None:
            self.errors += 1
            return False
        self.lat.append(lat)
        if got != want:
            self.wrong += 1
            self.first_wrong.append(next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                                         min(len(got), len(want))))
            return False
        return True

    def row(self) -> Dict[str, Any]:
        """The counts and p50/p99 latency, as one table row."""
        lat = sorted(self.lat)
        p = (lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))], 3)) if lat else (lambda q: None)
        return {"requests": self.requests, "wrong_tokens": self.wrong, "http_errors": self.errors,
                "p50_s": p(0.5), "p99_s": p(0.99), "first_wrong_token": self.first_wrong}
