"""The open-loop load of the throughput benches, shared by both engines' (``bench.py``: vLLM,
``bench_sglang.py``: SGLang).

A round is a seeded schedule of arrivals (exponential gaps at ``rate`` per second for
``round_s`` seconds), each a client on a thread of its own, whatever the servers answer;
a share of the clients hang up (``cancel``) and every ``stall_every``-th meets the
engine's fault (the bench says which). Both rules get the same schedule, rounds
alternating which rule goes first, so that load from elsewhere on the machine falls on
both alike; the pair not measured may be paused (``hold``). Rates are over the time until
the last answer (a rule that falls behind pays for it), counting only answers in full,
each compared token for token with the reference.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

#: (arrival time, prompt index, fault "" | "stall" | "cancel", a per-client random in [0.05, 1))
Arrival = Tuple[float, int, str, float]


def schedule(seed: int, round_s: float, rate: float, n_prompts: int, stall_every: int,
             cancel: float) -> List[Arrival]:
    """The round's arrivals, the same for both rules."""
    rng = random.Random(seed)
    out: List[Arrival] = []
    t, k = 0.0, 0
    while True:
        t += rng.expovariate(rate)
        if t >= round_s:
            return out
        k += 1
        fault = "stall" if k % stall_every == 0 else ("cancel" if rng.random() < cancel else "")
        out.append((t, rng.randrange(n_prompts), fault, rng.uniform(0.05, 1.0)))


class Round:
    """What one round on one pair saw (clients' threads write it under ``lock``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = 0
        self.tokens = 0
        self.good_tokens = 0  # tokens of answers equal to the reference
        self.wrong = 0
        self.errors = 0
        self.cancelled = 0
        self.stalled = 0
        self.failed_writes = 0  # (bench_sglang --faults fail) requests whose write failed
        self.failed_write_answered = 0
        self.lat: List[float] = []

    def answered(self, out: List[int], ref: List[int], dt: float, stalled: bool) -> None:
        """A client got its answer in full after ``dt`` seconds."""
        with self.lock:
            self.done += 1
            self.stalled += stalled
            self.tokens += len(out)
            self.wrong += out != ref
            self.good_tokens += len(out) if out == ref else 0
            self.lat.append(dt)

    def count(self, what: str) -> None:
        """One more ``errors``, ``cancelled`` or ``stalled``."""
        with self.lock:
            setattr(self, what, getattr(self, what) + 1)


def run_round(client: Callable[[int, str, float, Round], None], arrivals: List[Arrival],
              round_s: float) -> Dict[str, Any]:
    """Starts ``client(prompt, fault, rnd, round)`` on a thread at each arrival time, waits
    for all of them; the round's row."""
    r = Round()
    threads = []
    t0 = time.perf_counter()
    for at, i, fault, rnd in arrivals:
        time.sleep(max(0.0, t0 + at - time.perf_counter()))
        th = threading.Thread(target=client, args=(i, fault, rnd, r), daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join(600)
    wall = max(round_s, time.perf_counter() - t0)
    lat = sorted(r.lat)
    return {"arrivals": len(arrivals), "done": r.done, "wrong": r.wrong, "errors": r.errors,
            "cancelled": r.cancelled, "stalled": r.stalled, "failed_writes": r.failed_writes,
            "wall_s": round(wall, 2),
            "req_per_s": r.done / wall, "tok_per_s": r.tokens / wall,
            "good_tok_per_s": r.good_tokens / wall,
            "p50_s": lat[len(lat) // 2] if lat else None,
            "p99_s": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None}


def alternate(rules: Tuple[str, ...], rounds: int, arrivals_of: Callable[[int], List[Arrival]],
              measure: Callable[[str, List[Arrival]], Dict[str, Any]],
              settle: Callable[[str], float], hold: Callable[[str, bool], None],
              warm_s: float) -> Dict[str, List[Dict[str, Any]]]:
    """``rounds`` rounds, each measuring every rule on the same arrivals, the order
    alternating; a rule's pair is released from ``hold`` ``warm_s`` before its load and
    held again once ``settle`` returns (the seconds it waited, recorded). Prints each row."""
    rows: Dict[str, List[Dict[str, Any]]] = {rule: [] for rule in rules}
    for rnd in range(rounds):
        arrivals = arrivals_of(rnd)
        for rule in (rules if rnd % 2 == 0 else rules[::-1]):
            hold(rule, False)
            time.sleep(warm_s)  # heartbeats and timers catch up before the load starts
            load0 = os.getloadavg()[0]
            row = measure(rule, arrivals)
            row.update(rule=rule, round=rnd, load_before=round(load0, 2),
                       load=round(os.getloadavg()[0], 2), settle_s=round(settle(rule), 1))
            hold(rule, True)
            rows[rule].append(row)
            print(json.dumps(row), flush=True)
    return rows


def summarize(rows: Dict[str, List[Dict[str, Any]]], extra: Dict[str, Any],
              baseline: str = "stock", rule: str = "kvfence") -> Dict[str, Any]:
    """Medians over rounds per rule, totals, and ``rule``/``baseline`` ratios of the medians."""

    def med(name: str, key: str) -> Optional[float]:
        vals = [r[key] for r in rows[name] if r[key] is not None]
        return statistics.median(vals) if vals else None

    summary: Dict[str, Any] = dict(extra)
    for name in rows:
        summary[name] = {
            "req_per_s_median": round(med(name, "req_per_s") or 0.0, 3),
            "tok_per_s_median": round(med(name, "tok_per_s") or 0.0, 2),
            "good_tok_per_s_median": round(med(name, "good_tok_per_s") or 0.0, 2),
            "p50_s_median": round(med(name, "p50_s") or 0.0, 3),
            "p99_s_median": round(med(name, "p99_s") or 0.0, 3),
            "done": sum(r["done"] for r in rows[name]),
            "wrong": sum(r["wrong"] for r in rows[name]),
            "errors": sum(r["errors"] for r in rows[name]),
            "cancelled": sum(r["cancelled"] for r in rows[name]),
            "stalled": sum(r["stalled"] for r in rows[name]),
            "failed_writes": sum(r.get("failed_writes", 0) for r in rows[name]),
        }
    for key in ("req_per_s_median", "tok_per_s_median", "good_tok_per_s_median"):
        b = summary[baseline][key]
        summary["ratio_" + key] = round(summary[rule][key] / b, 3) if b else None
    return summary


def report(summary: Dict[str, Any], rows: Dict[str, List[Dict[str, Any]]], out: str) -> None:
    """Prints ``summary``; writes it with every round's row to ``out`` (JSON) if given."""
    print(json.dumps(summary, indent=1))
    if out:
        with open(out, "w") as f:
            json.dump({"summary": summary, "rounds": rows}, f, indent=1)
