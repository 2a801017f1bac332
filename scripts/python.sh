#!/usr/bin/env bash
# The Python binding (python/): build it with maturin through pip, install it into a
# virtual environment, and run its tests with pytest.
#
#   scripts/python.sh            build + install + pytest
#   scripts/python.sh --bench    also run python/bench/bench_lifecycle.py (prints a table)
#
# Needs CPython >= 3.9 with pip and venv, and a Rust toolchain (stable, >= 1.85 for PyO3
# 0.30). Uses only the package registry (PyPI) for maturin and pytest. The venv lives in
# target/py-venv (override with PY_VENV); PYTHON picks the interpreter (default python3).
# The Rust build goes to the workspace target dir (or CARGO_TARGET_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

PYTHON=${PYTHON:-python3}
VENV=${PY_VENV:-$root/target/py-venv}

step() { printf '\n==== %s ====\n' "$*"; }

step "venv ($VENV)"
if [ ! -x "$VENV/bin/python" ]; then
    mkdir -p "$(dirname "$VENV")"
    "$PYTHON" -m venv "$VENV"
fi
# The maturin build backend runs `maturin` from PATH: put the venv first.
export PATH="$VENV/bin:$PATH"
export VIRTUAL_ENV="$VENV"
python -m pip install --quiet --upgrade pip
python -m pip install --quiet "maturin>=1.9,<2" "pytest>=7"

step "build + install (pip install ./python, maturin backend)"
# --no-build-isolation: use the maturin just installed instead of fetching it again.
python -m pip install --no-build-isolation --force-reinstall --no-deps ./python

step "pytest"
# Run from python/tests' parent with the `pytest` entry point (not `python -m pytest`, which
# would put python/ first on sys.path and shadow the installed package with the sources).
rc=0
(cd python && pytest -q tests) || rc=$?
if [ "$rc" -eq 5 ]; then
    echo "python.sh: pytest collected no tests" >&2
    exit 1
elif [ "$rc" -ne 0 ]; then
    echo "python.sh: pytest failed (exit $rc)" >&2
    exit "$rc"
fi

if [ "${1:-}" = "--bench" ]; then
    step "bench (python/bench/bench_lifecycle.py)"
    (cd python && python bench/bench_lifecycle.py)
fi
echo "python.sh: ok"
