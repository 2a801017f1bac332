#!/usr/bin/env bash
# The SGLang half of e2e/serve: a real SGLang 0.5.23 prefill/decode pair (its in-tree CPU
# platform, Mooncake over TCP) serving the model of model.py, stock vs kvfence enabled as a
# user enables it (SGLANG_PLUGINS=kvfence), every answer compared token for token with
# transformers. Called by e2e/serve/run (--engine sglang|all); runs alone too:
#
#   RUNS=2 SHORT=1 OUT=/tmp/x e2e/serve/sglang.sh
#
# Env: RUNS (runs of each scenario per rule, default 3), SHORT (1: the CI form: the control
# `normal` and the racing `write_failed`; else also `deadline_expired`, which starts a
# second prefill instance per pair, `client_disconnect` and `prefill_killed`), SCENARIOS (a comma-separated
# list instead of those; "-": none), BENCH (1: then the throughput comparison, bench_sglang.py,
# ~15 min), OUT (log directory, default a new /tmp/kvfence-serve-sglang.XXXX), KVFENCE_CACHE.
# Prints "PASS what" / "FAIL what" lines and "SKIP: reason" lines; writes the rows to
# $OUT/serve-sglang.json. Exit status: 0 every check passed, 1 one failed, 77 it cannot run
# here at all (the environment cannot be installed).
#
# Environment: e2e/sglang/setup.sh builds (or reuses) SGLang 0.5.23's venv with kvfence
# installed; a server needs more of SGLang's requirements than that venv has (jsonschema,
# outlines, xgrammar, ...), so this script layers a second venv over it (a .pth adds the
# first one's site-packages), keyed by the same pinned versions:
#   $KVFENCE_CACHE/sglang-serve-0.5.23-torch2.14.1-pyX.Y   (~0.3 GB, ~1-2 min once)
# The CUDA-only kernel packages are left out; SGLang's CPU kernel package (sgl_kernel) is
# stood in for by sglang_site/sgl_kernel (fails loudly if called; proven uncalled here).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
RUNS=${RUNS:-3}
SHORT=${SHORT:-0}
BENCH=${BENCH:-0}
OUT=${OUT:-$(mktemp -d /tmp/kvfence-serve-sglang.XXXX)}
CACHE=${KVFENCE_CACHE:-$HOME/.cache/kvfence}
mkdir -p "$OUT"
start=$SECONDS
log() { echo "sglang.sh: $*" >&2; }

echo "== SGLang 0.5.23 (CPU platform, Mooncake TCP): environment"
"$root/e2e/sglang/setup.sh" --print > "$OUT/setup-sglang.log" 2>&1
rc=$?
if [ $rc = 77 ]; then
    echo "SKIP: the SGLang environment cannot be installed here ($(grep 'sglang/setup:' "$OUT/setup-sglang.log" | tail -1))"
    exit 77
elif [ $rc != 0 ]; then
    tail -20 "$OUT/setup-sglang.log"; echo "FAIL sglang: e2e/sglang/setup.sh (exit $rc)"; exit 1
fi
BASE=$(tail -1 "$OUT/setup-sglang.log")
pyver=$("$BASE/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
SERVE=$CACHE/sglang-serve-0.5.23-torch2.14.1-py$pyver
if [ ! -f "$SERVE/.complete" ]; then
    log "building $SERVE (over $BASE)"
    rm -rf "$SERVE"
    "$BASE/bin/python" -c 'import sys; print(sys._base_executable)' > "$OUT/base-python.txt"
    "$(cat "$OUT/base-python.txt")" -m venv "$SERVE" >> "$OUT/setup-sglang.log" 2>&1 \
        || { echo "FAIL sglang: python -m venv $SERVE"; exit 1; }
    echo "import site; site.addsitedir('$BASE/lib/python$pyver/site-packages')" \
        > "$SERVE/lib/python$pyver/site-packages/zz_kvfence_sglang_base.pth"
    # SGLang 0.5.23's Requires-Dist that the base venv lacks, minus the CUDA-only kernels
    # (cuda-python, flash-attn-4, flashinfer, humming-kernels, cutlass-dsl, mathdx,
    # nvshmem4py, quack-kernels, sgl-deep-ep/-gemm/-flash-mla, sglang-kernel, tilelang,
    # torch_memory_saver) and the audio/video ones (torchaudio/torchcodec pin another torch);
    # plus jsonschema, which the server imports without declaring it.
    (cd /tmp && "$SERVE/bin/python" -m pip install -q --disable-pip-version-check \
        'torch==2.14.1' 'transformers==5.19.0' jsonschema anthropic build \
        'kernels<0.15,>=0.14.1' 'llguidance<2.0.0,>=1.7.6' 'mistral_common>=1.11.5' modelscope \
        ninja numba==0.65.1 openai==2.8.0 openai-harmony==0.0.4 outlines==0.1.11 py-spy \
        'smg-grpc-servicer>=0.9.0' soundfile==0.13.1 timm==1.0.25 watchfiles xgrammar==0.2.7) \
        >> "$OUT/setup-sglang.log" 2>&1
    rc=$?
    if [ $rc != 0 ]; then
        tail -5 "$OUT/setup-sglang.log"
        echo "SKIP: a package of SGLang's server was refused by the registry (see $OUT/setup-sglang.log)"
        exit 77
    fi
    PYTHONPATH=$here/sglang_site "$SERVE/bin/python" -c 'import sglang.launch_server, kvfence.sglang' \
        >> "$OUT/setup-sglang.log" 2>&1 \
        || { tail -5 "$OUT/setup-sglang.log"; echo "FAIL sglang: sglang.launch_server does not import"; exit 1; }
    date -u > "$SERVE/.complete"
fi
PY=$SERVE/bin/python
echo "   environment ready in $((SECONDS - start)) s: $SERVE"

MODEL=$CACHE/serve-model-$(sha256sum "$here/model.py" | cut -c1-12)
echo "== the model and its transformers reference: $MODEL"
(cd "$here" && "$PY" model.py "$MODEL") > "$OUT/model-sglang.log" 2>&1 \
    || { tail -20 "$OUT/model-sglang.log"; echo "FAIL sglang: model.py"; exit 1; }

scen=${SCENARIOS:-normal,write_failed,deadline_expired,client_disconnect,prefill_killed}
[ "$SHORT" = 1 ] && scen=${SCENARIOS:-normal,write_failed}
# prefill_killed's race holds bytes on the wire with nftables (e2e/serve/inflight.py): as
# root, install nft if it is missing; without it the scenario runs unraced (a SKIP line).
case ",$scen," in *,prefill_killed,*)
    if [ "$(id -u)" -eq 0 ] && ! command -v nft >/dev/null 2>&1; then
        echo "   nft not found: apt-get install -y nftables (for prefill_killed's race)"
        { apt-get update && apt-get install -y nftables; } >> "$OUT/setup-sglang.log" 2>&1 \
            || echo "   nftables could not be installed: prefill_killed runs unraced"
    fi ;;
esac
: > "$OUT/checks-sglang.txt"
if [ "$scen" != - ]; then
echo "== SGLang pairs, ${RULES:-stock,kvfence,reset} started at once; scenarios $scen, $RUNS run(s) each (reset: normal, write_failed)"
t0=$SECONDS
(cd "$here" && "$PY" serve_sglang.py "$MODEL" "$OUT/sglang" --runs "$RUNS" --scenarios "$scen" \
    --rules "${RULES:-stock,kvfence,reset}" \
    --out "$OUT/serve-sglang.json") 2>&1 | tee "$OUT/serve-sglang.out"
echo "   scenarios done in $((SECONDS - t0)) s"
if [ ! -s "$OUT/serve-sglang.json" ]; then
    echo "FAIL sglang: no rows (see $OUT/serve-sglang.out and $OUT/sglang/*.log)"
    exit 1
fi
"$PY" - "$OUT/serve-sglang.json" "$OUT/sglang" > "$OUT/checks-sglang.txt" <<'PY'
import glob, json, sys
rows = json.load(open(sys.argv[1]))
logs = {p: open(p, errors="replace").read() for p in glob.glob(sys.argv[2] + "/*.log")}
PROMPT = 100
def check(ok, what):
    print(("PASS " if ok else "FAIL ") + what)
for r in rows:
    if r["scenario"].startswith("("):
        continue
    tag = "sglang %s %s" % (r["rule"], r["scenario"])
    n = "%d requests" % r["requests"]
    if r["scenario"] == "prefill_killed" and not r["racing"]:
        # its race needs root, nft and cgroup v2 (e2e/serve/inflight.py): run unraced
        why = [x for x in r["notes"] if x.startswith("not raced: ")]
        print("SKIP: %s: its race (bytes on the wire past the kill) not forced, %s" % (
            tag, why[0] if why else "not raced"))
    # slots this scenario left in use (an earlier one on the same pair may hold some)
    at = r["kv_used_tokens_at_idle"]
    left = (at if at is not None else 10**9) - (r.get("kv_used_tokens_before") or 0)
    if r["racing"]:
        # without F's slots from the page log, "nobody was given them" would hold vacuously
        check(r["faulted_slots_read"] == r["faulted"] > 0,
              "%s: the decode's page log gave the faulted request's KV slots (%d of %d faults)"
              % (tag, r["faulted_slots_read"], r["faulted"]))
    if r["rule"] == "stock" and r["racing"]:
        check(left == 0, "%s: the decode's KV slots back at idle (%d left in use)" % (tag, left))
        check(r["wrong_tokens"] > 0 and r["victims"] > 0,
              "%s: stock answers wrong tokens (%d of %s; %d victim(s) given the failed request's slots, HTTP 200)"
              % (tag, r["wrong_tokens"], n, r["victims"]))
    elif r["rule"] == "stock" and r["scenario"] == "client_disconnect":
        # Not forced: whether a hang-up hits a write in flight is up to the timing, so stock
        # may or may not answer wrong; its count is reported, not required.
        check(r["http_errors"] == 0 and r["requests"] > 0,
              "%s: no HTTP errors (%s, %d hung up; wrong tokens: %d, not forced)"
              % (tag, n, r["cancelled"], r["wrong_tokens"]))
        check(left == 0, "%s: the decode's KV slots back at idle (%d left in use)" % (tag, left))
    elif r["rule"] == "stock":
        check(r["wrong_tokens"] == 0 and r["http_errors"] == 0, "%s: the control is right (%s)" % (tag, n))
        check(left == 0, "%s: the decode's KV slots back at idle (%d left in use)" % (tag, left))
    else:
        check(r["wrong_tokens"] == 0 and r["http_errors"] == 0 and r["requests"] > 0,
              "%s: 0 wrong tokens, 0 HTTP errors (%s)" % (tag, n))
        if r["scenario"] == "prefill_killed" and r["racing"]:
            check(r["victims"] == 0 and r["late_writes_landed"] == r["faulted"],
                  "%s: nobody was given the killed prefill's request's slots while its bytes were on the wire (%d of %d landed on held slots)"
                  % (tag, r["late_writes_landed"], r["faulted"]))
            check(r["fenced"] == r["faulted"] and left == 0,
                  "%s: once they landed and the socket closed, kvfence fenced the dead prefill (%d of %d kills) and its slots came back (%d left in use)"
                  % (tag, r["fenced"], r["faulted"], left))
        elif r["scenario"] == "deadline_expired":
            check(r["victims"] == 0 and r["late_writes_landed"] == r["faulted"],
                  "%s: nobody was given the aborted request's slots while its write was in flight (%d of %d writes done on held slots)"
                  % (tag, r["late_writes_landed"], r["faulted"]))
            check(left == 0,
                  "%s: the decode's KV slots back at idle once the held writes drained and prefill A ACKed (%d left in use)"
                  % (tag, left))
        elif r["racing"] and r["rule"] == "reset":
            # kvfence with its transport reset: the -1 room's slots come back once the old
            # engine is proven gone, and the late bytes can no longer land anywhere.
            check(r["victims"] > 0 and r["late_writes_refused"] == r["faulted"] > 0,
                  "%s: the failed request's slots came back and were given to a later request "
                  "(%d victim(s)), and its late write was refused by the torn-down transport "
                  "(%d of %d), so they answered right" % (tag, r["victims"],
                                                         r["late_writes_refused"], r["faulted"]))
            check(left == 0, "%s: the decode's KV slots back at idle (%d left in use)" % (tag, left))
        elif r["racing"]:
            held = r["faulted"] * PROMPT
            check(r["victims"] == 0 and r["late_writes_landed"] == r["faulted"],
                  "%s: nobody was given the failed request's slots; its late bytes landed on held slots (%d of %d)"
                  % (tag, r["late_writes_landed"], r["faulted"]))
            check(left == held,
                  "%s: at idle exactly the failed requests' KV slots are held, counted by SGLang's own state "
                  "(num_used_tokens up by %d = %d x %d): a write that returned -1 can never be ACKed, so kvfence never frees its slots"
                  % (tag, left, r["faulted"], PROMPT))
        else:
            check(left == 0, "%s: the decode's KV slots back at idle (%d left in use)" % (tag, left))
            if r["scenario"] == "prefill_killed":
                check(r["fenced"] == r["faulted"] > 0,
                      "%s: kvfence fenced the killed prefill's ranks (%d of %d kills), which freed F's slots"
                      % (tag, r["fenced"], r["faulted"]))
for r in rows:
    if r["scenario"] == "(log)":
        if r["rule"] in ("kvfence", "reset"):
            check(r["released_anyway"] == 0, "sglang %s: the decode never released a page on SGLang's deadline (%d 'releasing anyway')" % (r["rule"], r["released_anyway"]))
        if r["rule"] == "reset":
            check(r["resets_torn_down"] == r["transport_resets"] == r["injected_failures"] > 0,
                  "sglang reset: one transport reset per failed write, each proven torn down "
                  "(%d failed writes, %d resets, %d torn down)" % (
                      r["injected_failures"], r["transport_resets"], r["resets_torn_down"]))
    if r["scenario"] == "(stand-in)":
        called = [p for p, t in logs.items() if "KVFENCE-STANDIN-CALLED" in t]
        check(r["sgl_kernel_calls"] == 0 and not called,
              "sglang: the sgl_kernel stand-in was never called (%d calls recorded, %d logs name it)" % (r["sgl_kernel_calls"], len(called)))
for rule in sorted({r["rule"] for r in rows if r["rule"] in ("stock", "kvfence", "reset")}):
    text = "".join(t for p, t in logs.items() if "-%s-" % rule in p)
    on = text.count("installed in this process") and "installed in this process" in text
    yes = text.count("): True")
    no = text.count("): False")
    want_on = rule != "stock"
    check(on and (yes > 0 and no == 0) == want_on and (no > 0 and yes == 0) == (not want_on),
          "sglang %s: kvfence.sglang %s in the servers' KV-manager processes (%d say installed, %d not)"
          % (rule, "installed" if want_on else "absent", yes, no))
PY
fi
if [ "$BENCH" = 1 ]; then
    echo "== SGLang throughput under load with faults: stock and kvfence side by side (bench_sglang.py)"
    t0=$SECONDS
    (cd "$here" && "$PY" bench_sglang.py "$MODEL" "$OUT/bench-sglang" --out "$OUT/bench-sglang.json") 2>&1 \
        | tee "$OUT/bench-sglang.out"
    echo "   bench done in $((SECONDS - t0)) s"
    if [ -s "$OUT/bench-sglang.json" ]; then
        "$PY" - "$OUT/bench-sglang.json" >> "$OUT/checks-sglang.txt" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["summary"]
def check(ok, what):
    print(("PASS " if ok else "FAIL ") + what)
k, st = s["kvfence"], s["stock"]
check((s["ratio_tok_per_s_median"] or 0) >= 0.98 and (s["ratio_req_per_s_median"] or 0) >= 0.98,
      "sglang throughput: kvfence/stock tokens/s %s, requests/s %s (>= 0.98; medians of %d rounds)"
      % (s["ratio_tok_per_s_median"], s["ratio_req_per_s_median"], s["rounds"]))
check(k["wrong"] == 0 and k["errors"] == 0 and k["done"] > 0,
      "sglang throughput run: kvfence 0 wrong answers, 0 HTTP errors (%d answers, %d slow writes; stock %d wrong of %d)"
      % (k["done"], k["stalled"], st["wrong"], st["done"]))
i, j = s["idle"]["kvfence"], s["idle"]["stock"]
check(i["decode_kv_used_tokens"] == 0 and i["released_anyway"] == 0,
      "sglang throughput run: kvfence's decode KV slots all back at idle (%s in use), none released on a deadline (%d)"
      % (i["decode_kv_used_tokens"], i["released_anyway"]))
check(i["kvfence_installed"]["True"] > 0 and i["kvfence_installed"]["False"] == 0
      and j["kvfence_installed"]["False"] > 0 and j["kvfence_installed"]["True"] == 0,
      "sglang throughput run: kvfence.sglang installed in every kvfence server process that wrote or allocated KV "
      "(%d say so, %d not) and in no stock one (%d not, %d say so)"
      % (i["kvfence_installed"]["True"], i["kvfence_installed"]["False"],
         j["kvfence_installed"]["False"], j["kvfence_installed"]["True"]))
check(i["exposed"] == 0 and i["slow_writes_landed"] == k["stalled"] > 0,
      "sglang throughput run: kvfence gave no request the slots of a slow write before it had landed "
      "(%d requests exposed, %d slow writes; stock: %d released on the deadline, %d requests exposed, %d of them answered wrong)"
      % (i["exposed"], i["slow_writes_landed"], j["released_anyway"], j["exposed"], j["exposed_and_wrong"]))
PY
    else
        echo "FAIL sglang throughput: no summary (see $OUT/bench-sglang.out)" >> "$OUT/checks-sglang.txt"
    fi
fi
cat "$OUT/checks-sglang.txt"
echo "e2e/serve/sglang.sh: $((SECONDS - start)) s; logs in $OUT"
grep -q '^FAIL' "$OUT/checks-sglang.txt" && exit 1
[ -s "$OUT/checks-sglang.txt" ] || exit 1
exit 0
