"""kvfence end to end on Mooncake Transfer Engine (TCP loopback, separate processes).

    python -m kvfence_e2e [mixed] [--duration S] [--json] ...   seeded mixed load + faults
    python -m kvfence_e2e repro --runs N [--json]               the race, forced

Exit status: 0; 1 if the kvfence rule ever corrupts or loses a page; 2 on bad flags;
77 if Mooncake cannot be imported.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from types import SimpleNamespace

from .common import RULES


def parse(argv):
    ap = argparse.ArgumentParser(prog="e2e/run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", nargs="?", default="mixed", choices=("mixed", "repro"))
    ap.add_argument("--runs", type=int, default=10, help="repro: number of forced races")
    ap.add_argument("--rules", default=",".join(RULES),
                    help="comma list of %s (default: all)" % ",".join(RULES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=20.0, help="mixed: seconds of load per rule")
    ap.add_argument("--instances", type=int, default=3, help="mixed: prefill processes (>= 2)")
    ap.add_argument("--ranks-per-instance", type=int, default=2)
    ap.add_argument("--pages", type=int, default=192, help="decode KV pages")
    ap.add_argument("--page-size", type=int, default=32768)
    ap.add_argument("--pages-per-request", type=int, default=8)
    ap.add_argument("--max-inflight", type=int, default=16)
    ap.add_argument("--abort-share", type=float, default=0.3)
    ap.add_argument("--abort-max-ms", type=float, default=20.0)
    ap.add_argument("--slow-share", type=float, default=0.3,
                    help="share of requests whose chunk submissions are throttled")
    ap.add_argument("--delay-ms", type=float, default=None,
                    help="throttle of a slow chunk (default: mixed 80, repro 150)")
    ap.add_argument("--fail-share", type=float, default=0.003,
                    help="share of requests whose last chunk write returns -1")
    ap.add_argument("--decode-ms", type=float, default=None,
                    help="how long a request's KV is read (default: mixed 40, repro 500)")
    ap.add_argument("--kill-at", type=float, default=None,
                    help="mixed: kill -9 a prefill at this second (default: duration*0.4)")
    ap.add_argument("--no-kill", action="store_true")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    a = ap.parse_args(argv)
    rules = [r.strip() for r in a.rules.split(",") if r.strip()]
    bad = [r for r in rules if r not in RULES]

    def fail(msg):
        ap.print_usage(sys.stderr)
        print("e2e/run: error: " + msg, file=sys.stderr)
        sys.exit(2)

    if bad or not rules:
        fail("unknown rule(s) %s; choose from %s" % (",".join(bad) or "''", ",".join(RULES)))
    if a.runs < 1:
        fail("--runs must be >= 1")
    if a.duration <= 0:
        fail("--duration must be > 0")
    if a.instances < 2 or a.ranks_per_instance < 1:
        fail("--instances must be >= 2 and --ranks-per-instance >= 1")
    if a.page_size < 4096 or a.page_size % 4:
        fail("--page-size must be >= 4096 and a multiple of 4")
    if a.pages_per_request < 1 or a.pages < 2 * a.pages_per_request:
        fail("--pages must hold at least two requests")
    for k in ("abort_share", "slow_share", "fail_share"):
        if not 0.0 <= getattr(a, k) <= 1.0:
            fail("--%s must be in [0, 1]" % k.replace("_", "-"))
    if a.max_inflight < 1:
        fail("--max-inflight must be >= 1")
    if a.delay_ms is None:
        a.delay_ms = 150.0 if a.mode == "repro" else 80.0
    if a.decode_ms is None:
        a.decode_ms = 500.0 if a.mode == "repro" else 40.0
    if a.delay_ms < 0 or a.decode_ms < 0:
        fail("--delay-ms and --decode-ms must be >= 0")
    if a.mode == "repro" and a.decode_ms <= a.delay_ms + 100:
        fail("repro needs --decode-ms > --delay-ms + 100 (the stale write must land while B is read)")
    if a.kill_at is None:
        a.kill_at = a.duration * 0.4
    if a.no_kill:
        a.kill_at = None
    a.rules = rules
    return a


COLS_MIXED = [("rule", "rule", 13), ("requests", "requests", 8), ("finished", "finished", 8),
              ("aborted", "aborted", 7), ("corrupted_requests", "corr.req", 8),
              ("corrupted_pages", "corr.pages", 10), ("stale_writes_refused", "refused", 7),
              ("failed_writes", "w=-1", 4), ("rank_fences", "fences", 6),
              ("peak_pages_held_awaiting_drain", "held.peak", 9),
              ("pages_held_awaiting_drain_at_end", "held.end", 8),
              ("abort_to_release_ms_p50", "a2r.p50ms", 9), ("abort_to_release_ms_p99", "a2r.p99ms", 9),
              ("fence_wait_ms_max", "fence.wait", 10),
              ("throughput_rps", "rps", 6), ("lost_pages", "lost", 4)]
COLS_REPRO = [("rule", "rule", 13), ("runs", "runs", 4), ("corrupted_runs", "corrupted_runs", 14),
              ("corrupted_requests", "corr.req", 8), ("corrupted_pages", "corr.pages", 10),
              ("stale_landings_on_free_pages", "free.landings", 13),
              ("abort_to_release_ms_p50", "a2r.p50ms", 9), ("abort_to_release_ms_p99", "a2r.p99ms", 9),
              ("lost_pages", "lost", 4)]


def table(rows, cols):
    head = " ".join(h.rjust(w) if i else h.ljust(w) for i, (_, h, w) in enumerate(cols))
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = []
        for i, (k, _, w) in enumerate(cols):
            v = r.get(k)
            v = "-" if v is None else str(v)
            cells.append(v.rjust(w) if i else v.ljust(w))
        lines.append(" ".join(cells))
    return "\n".join(lines)


def quiet_native_logs():
    """Mooncake logs (glog) to fd 2 and ignores GLOG_minloglevel: send fd 2 to a file,
    keep Python's own stderr on the terminal. E2E_VERBOSE=1 keeps everything."""
    if os.environ.get("E2E_VERBOSE"):
        return None
    import tempfile
    path = os.path.join(tempfile.gettempdir(), "kvfence-e2e-mooncake-%d.log" % os.getpid())
    keep = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stderr = os.fdopen(keep, "w", buffering=1)
    return path


def main(argv=None):
    a = parse(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("GLOG_minloglevel", "3")
    quiet_native_logs()
    try:
        import mooncake.engine  # noqa: F401
    except Exception as e:  # pragma: no cover - depends on the platform
        print("e2e: Mooncake Transfer Engine unavailable: %s" % e, file=sys.stderr)
        return 77
    from . import decode
    cfg = SimpleNamespace(seed=a.seed, duration=a.duration, instances=a.instances,
                          ranks_per_instance=a.ranks_per_instance if a.mode == "mixed" else 1,
                          pages=a.pages, page_size=a.page_size,
                          pages_per_request=a.pages_per_request if a.mode == "mixed" else 4,
                          max_inflight=a.max_inflight, abort_share=a.abort_share,
                          abort_max_ms=a.abort_max_ms, slow_share=a.slow_share,
                          delay_ms=a.delay_ms, fail_share=a.fail_share, decode_ms=a.decode_ms,
                          kill_at=a.kill_at)
    rows = []
    t0 = time.monotonic()
    for rule in a.rules:
        if not a.json:
            print("running %s (%s)..." % (rule, a.mode), file=sys.stderr, flush=True)
        if a.mode == "repro":
            rows.append(decode.run_repro(cfg, rule, a.runs))
        else:
            rows.append(decode.run_mixed(cfg, rule))
    bad = []
    for r in rows:
        if r["rule"] == "kvfence":
            if r["corrupted_pages"] or r["corrupted_requests"] or r.get("lost_pages") \
                    or r.get("pages_unreleased_at_end"):
                bad.append(r)
    wall = round(time.monotonic() - t0, 1)
    if a.json:
        doc = {"mode": a.mode, "seed": a.seed, "wall_s": wall, "rules": rows,
               "config": {k: v for k, v in vars(cfg).items()}}
        if a.mode == "repro":
            doc["runs"] = a.runs
        print(json.dumps(doc, indent=1))
    else:
        if a.mode == "repro":
            print("repro: %d forced races per rule (throttle %.0f ms, B read for %.0f ms)"
                  % (a.runs, a.delay_ms, a.decode_ms))
            print(table(rows, COLS_REPRO))
        else:
            print("mixed: %.0f s per rule, seed %d, %d prefill processes x %d ranks, kill -9 at %s"
                  % (a.duration, a.seed, a.instances, a.ranks_per_instance,
                     "%.1f s" % a.kill_at if a.kill_at is not None else "never"))
            print(table(rows, COLS_MIXED))
        print("wall %.1f s" % wall)
    if bad:
        print("FAIL: kvfence corrupted or lost pages: %s" % json.dumps(
            [{k: r.get(k) for k in ("corrupted_requests", "corrupted_pages", "lost_pages",
                                    "pages_unreleased_at_end")} for r in bad]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
