#!/usr/bin/env bash
# Build (or reuse) the SGLang 0.5.23 environment that e2e/sglang/ runs in, then install the
# kvfence package from ./python into it.
#
#   e2e/sglang/setup.sh            build when missing, reinstall kvfence when its sources changed
#   e2e/sglang/setup.sh --print    print the venv path (after making sure it is ready)
#   SGLANG_VERSION=0.5.22 e2e/sglang/setup.sh [--print]
#                                  the older supported release, for the unit-level checks:
#                                  a small venv (sglang 0.5.22's wheel, ~35 MB, and kvfence)
#                                  that takes every other package from the 0.5.23 venv
#                                  (built first) through a .pth file: torch, Mooncake and
#                                  the rest are shared, not downloaded again (~30 s)
#
# The venv lives outside the clone, keyed by the pinned versions:
#   ${KVFENCE_CACHE:-$HOME/.cache/kvfence}/sglang-0.5.23-torch2.14.1-py3.X
# (~6.5 GB; a few minutes on a fresh 2-core machine: all the engine environments together took 12-18 minutes there). Its marker file `.complete` is written only after
# every package installed and `import sglang.srt.disaggregation.mooncake.conn` worked; a venv
# without it is removed and rebuilt. kvfence is reinstalled (maturin, through pip) when the
# content hash of python/, src/ and the Cargo files differs from the one recorded at the
# last install (several clones may share the venv: each reinstalls its own sources).
#
# Recipe: ../../../shared/SGLANG.md section 1 (torch from PyPI imports without a GPU;
# sglang --no-deps, then the subset of its dependencies that the disaggregation code
# imports; the non-CUDA Mooncake wheel, which links Debian's libibverbs1).
#
# Exit status: 0 ready; 77 a registry refused a package or Mooncake cannot be loaded here
# (callers print a NOTICE); 1 anything else.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
PY=${PYTHON:-python3}
log() { echo "sglang/setup: $*" >&2; }

pyver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || { log "no $PY"; exit 1; }
SGLANG_VERSION=${SGLANG_VERSION:-0.5.23}
TORCH_VERSION=2.14.1
VENV=${KVFENCE_SGLANG_VENV:-${KVFENCE_CACHE:-$HOME/.cache/kvfence}/sglang-$SGLANG_VERSION-torch$TORCH_VERSION-py$pyver}
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
refused() { log "$*"; exit 77; }

need_ibverbs() {
    if ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1'; then return 0; fi
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        log "installing libibverbs1 (apt-get)"
        apt-get update -qq >/dev/null 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 >/dev/null 2>&1 \
            || refused "apt-get install libibverbs1 failed"
    else
        refused "libibverbs1 is missing and cannot be installed here (not root or no apt-get)"
    fi
}

build_venv() {
    if [ -f "$VENV/.complete" ]; then return 0; fi
    if [ -e "$VENV" ]; then log "removing incomplete $VENV"; rm -rf "$VENV"; fi
    mkdir -p "$(dirname "$VENV")"
    log "building $VENV (~6.5 GB, several minutes)"
    "$PY" -m venv "$VENV" || { log "venv failed"; exit 1; }
    pip install --upgrade pip || refused "pip upgrade refused"
    pip install "torch==$TORCH_VERSION" || refused "torch==$TORCH_VERSION refused"
    pip install --no-deps "sglang==$SGLANG_VERSION" || refused "sglang==$SGLANG_VERSION refused"
    # What the disaggregation stack imports (sglang.srt.utils.common imports starlette,
    # hence fastapi); pip's pin complaints about tokenizers/sentencepiece are harmless.
    pip install msgspec requests 'pyzmq>=25.1.2' aiohttp pytest orjson apache-tvm-ffi==0.1.11 \
        sentencepiece compressed-tensors gguf openai partial-json-parser einops prometheus-client \
        datasets transformers==5.19.0 tokenizers pillow psutil pybase64 pydantic python-dateutil \
        regex tqdm xxhash ipython torchvision mooncake-transfer-engine-non-cuda \
        fastapi 'uvicorn>=0.51' uvloop python-multipart setproctitle scipy easydict distro \
        interegular blobfile tiktoken zstandard nvidia-ml-py \
        "maturin>=1.9,<2" "mypy>=1.10" \
        || refused "a dependency of sglang was refused"
    need_ibverbs
    "$VENV/bin/python" -c 'from mooncake.engine import TransferEngine' \
        || refused "Mooncake Transfer Engine does not load here"
    "$VENV/bin/python" -c 'import sglang.srt.disaggregation.mooncake.conn, sglang.srt.disaggregation.decode' \
        || { log "sglang's disaggregation modules do not import"; exit 1; }
    date -u > "$VENV/.complete"
}

# install_kvfence VENV MODULE CARGO_TARGET
. "$root/e2e/install-kvfence.sh"

# The older release over the newest one's packages (see the top). Its own site-packages
# come first on sys.path, so `import sglang` and importlib.metadata's version("sglang")
# find 0.5.22; everything else comes from the 0.5.23 venv's site-packages.
build_overlay() {
    if [ -f "$VENV/.complete" ]; then return 0; fi
    if [ -e "$VENV" ]; then log "removing incomplete $VENV"; rm -rf "$VENV"; fi
    local base
    base=$(SGLANG_VERSION=0.5.23 "$here/setup.sh" --print) || exit $?
    log "building $VENV over $base"
    "$PY" -m venv "$VENV" || { log "venv failed"; exit 1; }
    ln -sf "$base/bin/maturin" "$VENV/bin/maturin"  # (a native binary: kvfence's build)
    local own shared
    own=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    shared=$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "import site; site.addsitedir('$shared')" > "$own/zz-kvfence-sglang-shared.pth"
    pip install --no-deps "sglang==$SGLANG_VERSION" || refused "sglang==$SGLANG_VERSION refused"
    "$VENV/bin/python" - "$SGLANG_VERSION" <<'PYCHECK' || { log "the overlay does not see sglang $SGLANG_VERSION first"; exit 1; }
import sys
from importlib.metadata import version
import sglang.srt.disaggregation.mooncake.conn, sglang.srt.disaggregation.decode
assert version("sglang") == sys.argv[1], version("sglang")
assert "/sglang-" + sys.argv[1] + "-" in sglang.__file__, sglang.__file__
PYCHECK
    date -u > "$VENV/.complete"
}

if [ "$SGLANG_VERSION" = 0.5.23 ]; then
    build_venv
else
    build_overlay
fi
install_kvfence "$VENV" kvfence.sglang "$root/target/sglang-cargo"
if [ "${1:-}" = --print ]; then echo "$VENV"; else log "ready: $VENV"; fi
