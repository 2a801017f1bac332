#!/usr/bin/env bash
# Runs pytest inside the vLLM environment (e2e/vllm/setup.sh), from the fetched vLLM source
# root (its conftest imports `tests.`), with the offline HF cache and vLLM's CPU platform.
#   KVFENCE_SWAP=1 (default): vLLM's NIXL names point at kvfence.vllm (plugin kvfence_swap)
#   KVFENCE_SWAP=0: stock vLLM
# Arguments go to pytest; paths are relative to the vLLM source root (tests/...), or
# absolute.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ENV=$("$here/setup.sh" --print)
cd "$ENV/vllm-src" || exit 1
export HF_HOME="$ENV/hf" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_TARGET_DEVICE=cpu
export PYTHONPATH="$here/plugins:$ENV/vllm-src${PYTHONPATH:+:$PYTHONPATH}"
export KVFENCE_SWAP=${KVFENCE_SWAP:-1}
exec "$ENV/venv/bin/python" -m pytest -p kvfence_swap -p no:cacheprovider "$@"
