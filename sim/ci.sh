#!/usr/bin/env bash
# CI check for kvfence-sim: a short repro, a short default simulation (every rule) and a
# short soak, results checked.
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

echo "== kvfence-sim soak --requests 20000 --json"
set +e
"$BIN" soak --requests 20000 --json --no-progress > "$TMP/soak.json"
SRC=$?
set -e
echo "soak exit status: $SRC"

echo "== bad flags exit 2, --help exits 0"
set +e
"$BIN" --fan-in 99 >/dev/null 2>&1; A=$?
"$BIN" --bogus >/dev/null 2>&1; B=$?
"$BIN" --preset nope >/dev/null 2>&1; C=$?
"$BIN" soak --rules naive >/dev/null 2>&1; D=$?
"$BIN" --help > "$TMP/help.txt" 2>&1; H=$?
set -e

python3 - "$TMP/repro.json" "$TMP/run.json" "$TMP/plot.svg" "$RC" "$TMP/soak.json" "$SRC" \
    "$A $B $C $D" "$H" "$TMP/help.txt" <<'PY'
import json, sys
repro = json.load(open(sys.argv[1]))
run = json.load(open(sys.argv[2]))
svg = open(sys.argv[3]).read()
rc = int(sys.argv[4])
passed = failed = 0
def check(name, ok, detail):
    global passed, failed
    print(("PASS " if ok else "FAIL ") + name + ": " + detail)
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
want = ["naive", "timeout", "sglang", "vllm", "acks-only", "kvfence"]
check("run has every named rule", [x["rule"] for x in run["rules"]] == want, str([x["rule"] for x in run["rules"]]))
for x in run["rules"]:
    c = x["held_by_cause_mean"]
    tot = c["slow_ack"] + c["in_flight"] + c["dead_rank"] + c["failed"]
    check(f'{x["rule"]}: held-cause split sums to held pages', x["cause_mismatches"] == 0 and abs(tot - x["held_pages_mean"]) < 0.01,
          f'{tot:.3f} vs {x["held_pages_mean"]}, {x["cause_mismatches"]} samples off')
check("run kvfence counts failed transfers", "failed_transfers" in s["kvfence"] and "quarantined_rooms" in s["kvfence"], "")
check("run has rank deaths (the fence path ran)", s["kvfence"]["rank_deaths"] > 0, str(s["kvfence"]["rank_deaths"]))
soak = json.load(open(sys.argv[5]))
sr = soak["result"]["rules"][0]
check("soak exit status 0", int(sys.argv[6]) == 0, sys.argv[6])
check("soak kvfence 0 corrupted", sr["corrupted_requests"] == 0, str(sr["corrupted_requests"]))
check("soak exact page conservation", sr["conservation_ok"], str(sr["conservation_error"]))
check("soak ran every request", sr["opened"] == soak["requests"] and sr["completed"] + sr["aborted"] == sr["opened"],
      f'{sr["opened"]} opened, {sr["completed"]} + {sr["aborted"]}')
codes = sys.argv[7].split()
check("bad flags exit 2 (--fan-in 99, --bogus, --preset nope, soak --rules naive)", codes == ["2"] * 4, "/".join(codes))
help_text = open(sys.argv[9]).read()
check("--help exits 0", sys.argv[8] == "0", sys.argv[8])
check("--help names the teardown's source and the assumed-30s preset",
      "e2e/hosts/TEARDOWN.md" in help_text and "assumed-30s" in help_text, "")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY

