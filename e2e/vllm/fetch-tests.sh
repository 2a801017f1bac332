# Sourced by setup.sh and setup-cpu.sh: puts the tests/ of vLLM's PyPI sdist of a release
# into an environment (never committed; vLLM's wheels do not ship them).
#
#   fetch_vllm_tests PYTHON VERSION ENV_DIR
#
# Downloads the sdist without building it (VLLM_TARGET_DEVICE=empty, no build isolation:
# with isolation pip fetches torch again just to read the metadata) and unpacks its
# tests/ as ENV_DIR/vllm-src/tests (run from vllm-src/: vLLM's conftest imports `tests.`).
# Needs log() and unavailable() from the caller; does nothing if the tests are there.
fetch_vllm_tests() {
    local py=$1 version=$2 env=$3 dl
    [ -d "$env/vllm-src/tests/v1/kv_connector/unit" ] && return 0
    log "fetching the vllm==$version sdist for its tests/"
    dl=$(mktemp -d)
    (cd "$dl" && VLLM_TARGET_DEVICE=empty VLLM_SKIP_VERSION_SUFFIX=1 \
        "$py" -m pip download -q --no-deps --no-binary :all: \
        --no-build-isolation "vllm==$version" -d "$dl") \
        || unavailable "pip could not download the vllm==$version sdist"
    rm -rf "$env/vllm-src.tmp" && mkdir -p "$env/vllm-src.tmp"
    tar -xzf "$dl"/vllm-*.tar.gz -C "$env/vllm-src.tmp" --strip-components=1 \
        "vllm-$version/tests" || { log "untar of tests/ failed"; exit 1; }
    rm -rf "$env/vllm-src" && mv "$env/vllm-src.tmp" "$env/vllm-src"
    rm -rf "$dl"
}
