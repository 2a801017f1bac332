#!/usr/bin/env bash
# Short check of the e2e on separate hosts (network namespaces, Mooncake TCP between them):
#   1. a partition that heals: the busiest prefill host is cut off (both directions) while
#      its writes are queued and in flight, past the scaled deadlines, then healed.
#      SGLang's rule (timeout-30s, scaled) must let the healed host's bytes land on pages
#      it no longer owns (the check is able to fail); kvfence must let none land, corrupt
#      nothing, lose nothing, and fence the cut host only after the proven teardown;
#   2. a -1 recovered: 5 % of the requests' last write returns -1; kvfence must reset the
#      transport to that peer, fence and readmit its ranks, and get each failed room's
#      pages back before the load ends (not at shutdown), and never before the old
#      transport's proven teardown and fence (graceful reset: the old generation drains
#      first), 0 corrupted, 0 lost;
#   3. the in-process teardown alone (kvfence_e2e/fastnet_check.py, scratch namespace).
# Prints PASS/FAIL lines and "N passed, M failed"; exit 1 on a failed check. Prints a
# NOTICE and exits 0 only where network namespaces cannot be made (not root, no netns,
# ip/ss/tc/nft not installable) or Mooncake cannot be installed or loaded.
#   e2e/hosts/ci.sh [--mutation fence-without-teardown|no-reset|ack-at-reset]
#                                                                  (test-only: must FAIL)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
e2e=$(dirname "$here")
start=$SECONDS
if [ "${1:-}" = --mutation ]; then export KVFENCE_E2E_MUTATION=$2; echo "mutation: $2"; fi
out=$(mktemp -d)
fc_ns=kvfh-fc$$
trap 'rm -rf "$out"; ip netns del "$fc_ns" 2>/dev/null' EXIT

"$e2e/run" setup
rc=$?
if [ $rc = 77 ]; then
    echo "NOTICE: Mooncake Transfer Engine cannot be installed or loaded here; hosts e2e skipped"
    echo "0 passed, 0 failed (skipped)"
    exit 0
elif [ $rc != 0 ]; then
    echo "FAIL: e2e setup failed (rc=$rc)"
    echo "0 passed, 1 failed"
    exit 1
fi

"$e2e/run" hosts --scenarios partition,teardown --rules timeout-30s,kvfence --duration 6 \
    --json > "$out/hosts.json" 2> "$out/hosts.err"
rc=$?
if [ $rc = 78 ]; then
    grep NOTICE "$out/hosts.err" || true
    echo "NOTICE: network namespaces cannot be made here; hosts e2e skipped"
    echo "0 passed, 0 failed (skipped)"
    exit 0
fi

# The in-process teardown (fastnet: libnftables, sock_diag, SOCK_DESTROY) checked alone,
# without Mooncake, in a scratch namespace: its view equals /proc's, it waits for queued
# bytes, its filter holds, its proof is able to fail (kvfence_e2e/fastnet_check.py).
if ip netns add "$fc_ns" 2>/dev/null && ip -n "$fc_ns" link set lo up \
        && ip -n "$fc_ns" addr add 10.213.0.1/24 dev lo && ip -n "$fc_ns" addr add 10.213.0.10/24 dev lo; then
    PYTHONPATH="$e2e" timeout 120 ip netns exec "$fc_ns" "${E2E_VENV:-$e2e/.venv}/bin/python" \
        -m kvfence_e2e.fastnet_check > "$out/fastnet.txt" 2>&1
    echo "exit status $?" >> "$out/fastnet.txt"
else
    echo "FAIL fastnet checks: the scratch namespace could not be made" > "$out/fastnet.txt"
fi
ip netns del "$fc_ns" 2>/dev/null

"${E2E_VENV:-$e2e/.venv}/bin/python" - "$out" "$rc" "$e2e/run" <<'PY'
import json, subprocess, sys
out, rc, run = sys.argv[1], int(sys.argv[2]), sys.argv[3]
passed = failed = 0
def check(name, ok, detail=""):
    global passed, failed
    print(("PASS " if ok else "FAIL ") + name + (" (%s)" % detail if detail else ""))
    if ok: passed += 1
    else: failed += 1
fc = open(out + "/fastnet.txt").read().splitlines()
for ln in fc:
    if ln.startswith(("PASS ", "FAIL ")):
        check("fastnet: " + ln[5:], ln.startswith("PASS "))
if not any(ln.startswith(("PASS ", "FAIL ")) for ln in fc) or "exit status 0" not in fc:
    check("fastnet checks ran", False, " | ".join(fc[-5:]))
try:
    d = json.load(open(out + "/hosts.json"))
except Exception as e:
    check("hosts run", False, "rc=%d, %s\n%s" % (rc, e, open(out + "/hosts.err").read()[-3000:]))
    print("%d passed, %d failed" % (passed, failed)); sys.exit(1)
R = {(r["scenario"], r["rule"]): r for r in d["results"]}
check("hosts run exit status 0", rc == 0, "rc=%d" % rc)
s, k = R[("partition", "timeout-30s")], R[("partition", "kvfence")]
check("partition: the cut host had writes in transfer and was declared dead",
      all(x.get("requests_in_transfer_at_cut", 0) > 0 and x["declared_dead"] >= 1 for x in (s, k)),
      "%d / %d in transfer" % (s.get("requests_in_transfer_at_cut", 0),
                               k.get("requests_in_transfer_at_cut", 0)))
# Whether the healed host's queued bytes are retransmitted before it exits depends on TCP
# backoff timing: the stock rule's partition is retried (other seeds, at most 2 more runs)
# until it shows the landing; kvfence's check below is on its one run, no retry.
tries = 1
while s["fenced_host_landings_after_heal"] == 0 and tries < 3:
    tries += 1
    p = subprocess.run([run, "hosts", "--scenarios", "partition", "--rules", "timeout-30s",
                        "--duration", "6", "--seed", str(tries), "--json"],
                       capture_output=True, text=True)
    try:
        s = json.loads(p.stdout)["results"][0]
    except Exception:
        break
check("partition: timeout-30s lets the healed host's bytes land on pages it no longer owns",
      s["fenced_host_landings_after_heal"] > 0, "%d pages, %d corrupted requests, run %d of %d" % (
          s["fenced_host_landings_after_heal"], s["corrupted_requests"], tries, tries))
check("partition: kvfence lets no byte of the fenced host land after the heal",
      k["fenced_host_landings_after_heal"] == 0, "%d" % k["fenced_host_landings_after_heal"])
check("partition: kvfence 0 corrupted, 0 lost", k["corrupted_requests"] == 0
      and k["corrupted_pages"] == 0 and k["lost_pages"] == 0 and k["pages_unreleased_at_end"] == 0,
      "%d req, %d pages, %d lost" % (k["corrupted_requests"], k["corrupted_pages"], k["lost_pages"]))
check("partition: kvfence fenced the cut host after a proven teardown",
      k["rank_fences"] >= 2 and not k["teardown_errors"] and any(x > 0 for x in k["teardown_ms"]),
      "teardown %s ms" % k["teardown_ms"][:1])
t = R[("teardown", "kvfence")]
check("-1 recovered: kvfence reset the transport and readmitted", t["failed_writes"] > 0
      and t["transport_resets"] > 0 and t["finished"] > 0,
      "%d writes -1, %d resets, %d finished" % (t["failed_writes"], t["transport_resets"], t["finished"]))
check("-1 recovered: every failed room's pages back before the load ended",
      t["failed_rooms_held_at_end"] == 0, "%d held; fail->release max %s ms" % (
          t["failed_rooms_held_at_end"], t["fail_to_release_ms_max"]))
check("-1 recovered: no failed room released before its transport's proven teardown and fence",
      t.get("failed_rooms_released_before_fence", 1) == 0 and t["transport_resets"] > 0,
      "%s released before; %d resets" % (t.get("failed_rooms_released_before_fence"),
                                         t["transport_resets"]))
check("-1 recovered: kvfence 0 corrupted, 0 lost", t["corrupted_requests"] == 0
      and t["corrupted_pages"] == 0 and t["lost_pages"] == 0 and t["pages_unreleased_at_end"] == 0)
print("teardown ms: %s" % json.dumps(d["teardown_ms"]))
print("teardown implementation: %s" % json.dumps(d.get("teardown_impl")))
print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
PY
rc=$?
echo "e2e/hosts/ci.sh: $((SECONDS - start)) s"
exit $rc
