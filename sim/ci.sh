#!/usr/bin/env bash
# CI check for kvfence-sim: a short repro and a short default simulation, results checked.
# Usage: bash sim/ci.sh   (from anywhere; uses $CARGO_TARGET_DIR if set)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p kvfence-sim
BIN="${CARGO_TARGET_DIR:-target}/release/kvfence-sim"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

echo "== kvfence-sim repro --runs 20 --json"
"$BIN" repro --runs 20 --json > "$TMP/repro.json"
echo "== kvfence-sim --seconds 2 --json --plot"
set +e
"$BIN" --seconds 2 --json --no-progress --plot "$TMP/plot.svg" > "$TMP/run.json"
RC=$?
set -e
echo "simulation exit status: $RC"

python3 - "$TMP/repro.json" "$TMP/run.json" "$TMP/plot.svg" "$RC" <<'PY'
import json, sys
repro = json.load(open(sys.argv[1]))
run = json.load(open(sys.argv[2]))
svg = open(sys.argv[3]).read()
rc = int(sys.argv[4])
passed = failed = 0
def check(name, ok, detail):
    global passed, failed
    print(("ok   " if ok else "FAIL ") + name + ": " + detail)
    if ok: passed += 1
    else: failed += 1
r = {x["rule"]: x for x in repro["rules"]}
n = repro["runs"]
check("repro naive corrupts every run", r["naive"]["corrupted_runs"] == n, f'{r["naive"]["corrupted_runs"]}/{n}')
check("repro timeout corrupts every run", r["timeout"]["corrupted_runs"] == n, f'{r["timeout"]["corrupted_runs"]}/{n}')
check("repro kvfence never corrupts", r["kvfence"]["corrupted_runs"] == 0, f'{r["kvfence"]["corrupted_runs"]}/{n}')
s = {x["rule"]: x for x in run["rules"]}
for k in ("rule", "completed", "aborted", "corrupted_requests", "corrupted_pages", "throughput_rps"):
    check(f"run json has {k}", all(k in x for x in run["rules"]), "")
check("run naive corrupts", s["naive"]["corrupted_requests"] > 0, str(s["naive"]["corrupted_requests"]))
check("run kvfence 0 corrupted requests", s["kvfence"]["corrupted_requests"] == 0, str(s["kvfence"]["corrupted_requests"]))
check("run kvfence 0 corrupted pages", s["kvfence"]["corrupted_pages"] == 0, str(s["kvfence"]["corrupted_pages"]))
check("run kvfence conserves pages", s["kvfence"]["conservation_ok"], str(s["kvfence"]["conservation_error"]))
check("run kvfence completes requests", s["kvfence"]["completed"] > 0, str(s["kvfence"]["completed"]))
check("run exit status 0", rc == 0, str(rc))
check("plot has a panel per rule", svg.count("<polyline") == 3 * len(run["rules"]), "")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY

echo "== bad flags exit 2"
set +e
"$BIN" --fan-in 99 >/dev/null 2>&1; A=$?
"$BIN" --bogus >/dev/null 2>&1; B=$?
set -e
if [ "$A" != 2 ] || [ "$B" != 2 ]; then echo "FAIL: bad flags exit $A/$B, want 2"; exit 1; fi
echo "ok   bad flags exit 2"
