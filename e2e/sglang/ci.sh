#!/usr/bin/env bash
# kvfence inside SGLang 0.5.23's own PD code (short form, ~4-6 min on a loaded 2-core box):
#   1. e2e/sglang/run --runs 1: every default scenario once per rule (one process pair
#      per rule; kill9_rank_ip, which restarts the prefill, only by name): stock must
#      corrupt in every racing scenario; kvfence must corrupt nothing, lose no page, hold
#      nothing at the end, and keep the normal path byte-exact;
#   2. e2e/sglang/unit/run.py: SGLang's own unit tests, stock and under kvfence (the three
#      that demand a release on timeout must fail under kvfence, every other one pass;
#      kvfence's gates must attach to their __new__-built managers).
#      They are in no package registry: when e2e/sglang/.upstream/ lacks them (a clean
#      CI clone), a NOTICE says so and that part is skipped (named in the count line);
#   1b. e2e/sglang/run --rules reset: write_failed and write_failed_inflight under kvfence's
#      transport reset (KVFENCE_SGLANG_RESET=1): the failed write's pages must come back;
#   3. python/tests/test_sglang_adapter.py, test_sglang_real_classes.py and
#      test_sglang_reset.py (SGLang's real classes, built as its unit tests build them; real
#      Mooncake engines for the reset) in the SGLang environment;
#   4. the same two files on SGLang 0.5.22 (the older supported release, unit level only:
#      SGLANG_VERSION=0.5.22 setup.sh, a small venv over the 0.5.23 one's packages, ~3 min).
#      Where its wheel cannot be had from the registry, a SKIP with the reason in the count
#      line.
# Builds the SGLang environment itself (setup.sh, cached outside the clone). Prints
# PASS/FAIL lines and "N passed, M failed[, K skipped (why)]"; exit 1 on a failed check; a NOTICE and exit 0
# only when a registry refuses a package or Mooncake cannot be loaded here.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
start=$SECONDS
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

"$here/setup.sh"
rc=$?
if [ $rc = 77 ]; then
    echo "NOTICE: the SGLang 0.5.23 environment cannot be built here (a registry refused a package, or Mooncake does not load); e2e/sglang skipped"
    echo "0 passed, 0 failed (skipped)"
    exit 0
elif [ $rc != 0 ]; then
    echo "FAIL: e2e/sglang setup failed (rc=$rc)"
    echo "0 passed, 1 failed"
    exit 1
fi
venv=$("$here/setup.sh" --print)

"$here/run" --runs "${E2E_SGLANG_RUNS:-1}" --json > "$out/e2e.json" 2> "$out/e2e.err"
e2e_rc=$?
# A stock racing scenario that did not corrupt gets up to 2 more runs (stock only): the
# timed ones (large_write: a 256 MiB write against a 10 ms deadline, no forced delay) do
# not race every time; its runs are added to the row, so the check below still asks for
# corruption in at least one of them (seen once, 2026-12-05: 0 of 1 in a clean-clone run).
for name in $("$venv/bin/python" -c 'import json,sys
try: d = json.load(open(sys.argv[1]))
except Exception: sys.exit(0)
print(" ".join(r["scenario"] for r in d["results"] if r["rule"] == "stock" and r["racing"] and r["corrupted_runs"] == 0))' "$out/e2e.json"); do
    "$here/run" --runs 2 --rules stock --scenarios "$name" --json > "$out/retry-$name.json" 2>> "$out/e2e.err"
    "$venv/bin/python" - "$out/e2e.json" "$out/retry-$name.json" "$name" <<'PY'
import json, sys
path, retry, name = sys.argv[1:4]
d = json.load(open(path))
try:
    extra = [r for r in json.load(open(retry))["results"] if r["scenario"] == name and r["rule"] == "stock"]
except Exception:
    extra = []
for r in d["results"]:
    if r["scenario"] == name and r["rule"] == "stock":
        for e in extra:
            r["runs"] += e["runs"]
            r["corrupted_runs"] += e["corrupted_runs"]
        print("e2e/sglang: stock %s did not race in its first run; retried: %d of %d runs corrupted"
              % (name, r["corrupted_runs"], r["runs"]))
json.dump(d, open(path, "w"), indent=1)
PY
done
# kvfence's transport reset (KVFENCE_SGLANG_RESET=1): a failed write, and one cut on the wire
"$here/run" --runs 1 --rules reset --scenarios write_failed,write_failed_inflight --json \
    > "$out/reset.json" 2>> "$out/e2e.err"
"$venv/bin/python" "$here/unit/run.py" --python "$venv/bin/python" > "$out/unit.txt" 2>&1
unit_rc=$?
# kvfence.sglang's own tests, in the SGLang environment (install/uninstall on the real SGLang);
# the pytest entry point, not `python -m pytest`, so that python/ cannot shadow the
# installed package.
(cd "$here/../../python" && KVFENCE_SGLANG=0 "$venv/bin/pytest" -q -p no:cacheprovider \
    tests/test_sglang_adapter.py tests/test_sglang_real_classes.py tests/test_sglang_reset.py) \
    > "$out/adapter.txt" 2>&1
adapter_rc=$?
# The same tests on SGLang 0.5.22 (its own patch table: kvfence._sglang_hooks).
SGLANG_VERSION=0.5.22 "$here/setup.sh" > "$out/setup522.txt" 2>&1
old_rc=$?
if [ $old_rc = 0 ]; then
    old_venv=$(SGLANG_VERSION=0.5.22 "$here/setup.sh" --print 2>/dev/null)
    # (python -P: python/ is not put first on sys.path, so it cannot shadow the
    # installed package; the 0.5.22 venv has no pytest script of its own)
    (cd "$here/../../python" && KVFENCE_SGLANG=0 "$old_venv/bin/python" -P -m pytest -q \
        -p no:cacheprovider tests/test_sglang_adapter.py tests/test_sglang_real_classes.py \
        tests/test_sglang_reset.py) \
        > "$out/adapter522.txt" 2>&1
    old_rc=$?
fi

"$venv/bin/python" - "$out" "$e2e_rc" "$unit_rc" "$adapter_rc" "$old_rc" <<'PY'
import json, re, sys
out, e2e_rc, unit_rc, adapter_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
old_rc = int(sys.argv[5])
passed = failed = 0
skipped = []
def check(name, ok, detail=""):
    global passed, failed
    print(("PASS " if ok else "FAIL ") + name + (" (%s)" % detail if detail else ""))
    if ok: passed += 1
    else: failed += 1
try:
    d = json.load(open(out + "/e2e.json"))
except Exception as e:
    check("e2e/sglang/run ran", False, "rc=%d %s\n%s" % (e2e_rc, e, open(out + "/e2e.err").read()[-3000:]))
    d = None
if d:
    check("e2e exit status 0", e2e_rc == 0, "rc=%d" % e2e_rc)
    rows = {(r["scenario"], r["rule"]): r for r in d["results"]}
    for (sc, rule), r in sorted(rows.items()):
        tag = "%s/%s" % (sc, rule)
        if rule == "kvfence":
            check(tag + ": 0 corrupted, 0 lost, nothing held at the end",
                  r["corrupted_runs"] == 0 and r["lost_pages"] == 0 and r["held_pages_at_end"] == 0,
                  "%d corrupted, %d lost, %d held" % (r["corrupted_runs"], r["lost_pages"], r["held_pages_at_end"]))
        elif r["racing"]:
            check(tag + ": stock SGLang corrupts (the race is real here)", r["corrupted_runs"] > 0,
                  "%d/%d runs" % (r["corrupted_runs"], r["runs"]))
        else:
            check(tag + ": stock intact (not a racing scenario)", r["corrupted_runs"] == 0)
    r = rows.get(("queued_chunk", "kvfence"))
    check("queued_chunk/kvfence: the prefill refused the aborted room's queued chunks",
          r is not None and r["refused_chunks"] >= r["runs"],
          "%s refused" % (r["refused_chunks"] if r else "?"))
    r = rows.get(("chunk_after_check", "kvfence"))
    rel = r and r["released_after_median_s"]
    # (SGLang's own in-flight count holds it too: that kvfence's transfer alone does is
    # python/tests/sglang_prefill_gate_check.py's job, run with the adapter's tests below)
    check("chunk_after_check/kvfence: released only after the chunk dequeued before the "
          "ABORT was written (held through the 1 s window)",
          rel is not None and rel >= 0.95, "released after %s s" % rel)
    for rule in ("stock", "kvfence"):
        check("normal path byte-exact (%s)" % rule, ("normal", rule) in rows
              and rows[("normal", rule)]["corrupted_runs"] == 0)
try:
    rs = {r["scenario"]: r for r in json.load(open(out + "/reset.json"))["results"]}
except Exception as e:
    rs = {}
    check("e2e/sglang/run --rules reset ran", False, "%s\n%s" % (e, open(out + "/e2e.err").read()[-3000:]))
for sc in ("write_failed", "write_failed_inflight"):
    r = rs.get(sc)
    if rs:
        check("%s/reset: the failed write's pages come back (0 corrupted, 0 lost, 0 "
              "quarantined, one proven transport reset per run)" % sc,
              r is not None and r["corrupted_runs"] == 0 and r["lost_pages"] == 0
              and r["quarantined_pages"] == 0 and r["released_after_median_s"] is not None
              and r["reset_proven"] == r["resets"] == r["runs"] > 0,
              "released after %s s, %s resets" % (r and r["released_after_median_s"],
                                                  r and r["reset_proven"]))
u = open(out + "/unit.txt").read()
if unit_rc == 77:
    print([l for l in u.splitlines() if l.startswith("NOTICE")][0])
    skipped.append("SGLang's own unit tests: not in this clone (in no package registry)")
else:
    for line in u.splitlines():
        if line.startswith(("FAIL ", "SGLang unit tests:")):
            print(line)
    m = re.search(r"^(\d+) passed, (\d+) failed$", u, re.M)
    check("SGLang's unit tests as expected (stock all pass; kvfence all but the 3 timeout-release ones)",
          unit_rc == 0 and m is not None and m.group(2) == "0",
          m.group(0) if m else "rc=%d\n%s" % (unit_rc, u[-3000:]))
a = open(out + "/adapter.txt").read()
check("kvfence.sglang's own tests (python/tests/test_sglang_adapter.py, test_sglang_real_classes.py, "
      "test_sglang_reset.py)", adapter_rc == 0,
      (a.strip().splitlines() or ["no output"])[-1] if adapter_rc == 0 else a[-3000:])
if old_rc == 77:
    print("NOTICE: the SGLang 0.5.22 environment cannot be built here: "
          + " | ".join(open(out + "/setup522.txt").read().strip().splitlines()[-2:]))
    skipped.append("SGLang 0.5.22 unit level: its environment cannot be built here "
                   "(a registry refused a package)")
else:
    try:
        a = open(out + "/adapter522.txt").read()
    except OSError:  # the setup failed
        a = "setup: " + open(out + "/setup522.txt").read()
    check("kvfence.sglang's own tests on SGLang 0.5.22 (unit level: test_sglang_adapter.py, "
          "test_sglang_real_classes.py; test_sglang_reset.py's reset tests skip: 0.5.23 only)",
          old_rc == 0,
          (a.strip().splitlines() or ["no output"])[-1] if old_rc == 0 else a[-3000:])
print("%d passed, %d failed%s" % (passed, failed, "".join(
    ", 1 skipped (%s)" % why for why in skipped)))
sys.exit(1 if failed else 0)
PY
rc=$?
echo "e2e/sglang/ci.sh: $((SECONDS - start)) s"
exit $rc
