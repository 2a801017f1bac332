# Sourced by the engine setups (e2e/sglang/setup.sh, e2e/vllm/setup.sh): installs kvfence
# from ./python into an engine's virtual environment, again only when its sources changed.
#
#   install_kvfence VENV MODULE CARGO_TARGET
#
# VENV: the engine's venv; MODULE: what must import afterwards (kvfence.sglang, ...);
# CARGO_TARGET: the cargo target directory of that build (unless $CARGO_TARGET_DIR is set).
# Needs $root (the repository) and a log function from the caller; exits 1 if the build
# fails. The sources' hash is kept in $VENV/.kvfence-src, written only after an install.
install_kvfence() {
    local venv=$1 module=$2 target=$3 hash
    hash=$(cd "$root" && find python src Cargo.toml Cargo.lock -type f \
            \( -name '*.rs' -o -name '*.toml' -o -name '*.py' -o -name '*.pyi' -o -name '*.lock' -o -name py.typed \) \
            -not -path '*/target/*' -not -path '*/tests/*' -not -path '*/__pycache__/*' 2>/dev/null \
        | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)
    if [ "$(cat "$venv/.kvfence-src" 2>/dev/null)" = "$hash" ] \
        && "$venv/bin/python" -c "import $module" 2>/dev/null; then
        return 0
    fi
    log "installing kvfence from $root/python (pip install ./python, maturin)"
    (cd "$root" && PATH="$venv/bin:$PATH" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$target}" \
        "$venv/bin/python" -m pip install -q --no-build-isolation --force-reinstall --no-deps ./python) \
        || { log "building kvfence failed"; exit 1; }
    # (through a new file: a venv made with `cp -al` shares this one's inode)
    echo "$hash" > "$venv/.kvfence-src.tmp" && mv "$venv/.kvfence-src.tmp" "$venv/.kvfence-src"
}
