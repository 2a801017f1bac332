#!/usr/bin/env bash
# The Python binding (python/): build it with maturin through pip, install it into a
# virtual environment, and run its tests with pytest.
#
#   scripts/python.sh              build + install + pytest
#   scripts/python.sh --mutations  also check that the tests catch the binding's mutations
#   scripts/python.sh --bench      also run python/bench/bench_lifecycle.py (prints a table)
#
# Needs CPython >= 3.10 with pip and venv, and a Rust toolchain (stable, >= 1.85 for PyO3
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
# mypy: stubtest checks the type stubs against the built module (below).
python -m pip install --quiet "maturin>=1.9,<2" "pytest>=7" "mypy>=1.10"

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

step "type stubs: mypy stubtest against the built module; a typed use under --strict"
# From a scratch directory, so that the sources cannot shadow the installed package.
scratch=$(mktemp -d)
(cd "$scratch" &&
    python -m mypy.stubtest kvfence --allowlist "$root/python/stubtest-allowlist.txt" &&
    python -m mypy --strict "$root/python/tests/test_typed_use.py")
rm -rf "$scratch"

# The binding's own test-only mutations (python/Cargo.toml): all of them are built once into
# a bare extension module (cargo, no wheel; `--cfg kvfence_py_mutants`, each mutation off
# unless chosen at run time by KVFENCE_PY_MUTANT), put first on PYTHONPATH, and with each
# mutation chosen in turn the named tests of the named file in python/tests must FAIL.
mutants_built=""
mutation() {
    local cfg="$1" file="$2" filter="$3"
    local target="${CARGO_TARGET_DIR:-$root/target}/py-mutants" dir log
    dir=$(mktemp -d)
    log=$(mktemp)
    echo "== mutation check: KVFENCE_PY_MUTANT=$cfg must make $file -k $filter fail"
    if [ -z "$mutants_built" ]; then
        if ! CARGO_TARGET_DIR="$target" RUSTFLAGS="${RUSTFLAGS:-} --cfg kvfence_py_mutants" \
            PYO3_BUILD_EXTENSION_MODULE=1 PYO3_PYTHON="$VENV/bin/python" \
            cargo build --quiet --release -p kvfence-python >"$log" 2>&1; then
            cat "$log"
            echo "python.sh: building the mutants (--cfg kvfence_py_mutants) failed" >&2
            return 1
        fi
        mutants_built=1
    fi
    mkdir "$dir/kvfence"
    cp python/kvfence/*.py python/kvfence/*.pyi python/kvfence/py.typed "$dir/kvfence/"
    cp "$target/release/lib_kvfence.so" "$dir/kvfence/_kvfence.abi3.so"
    # The mutant, not the installed package, must be what the tests import.
    PYTHONPATH="$dir" python -c 'import kvfence, sys; assert kvfence.__file__.startswith(sys.argv[1]), kvfence.__file__' "$dir"
    local rc=0
    (cd python && KVFENCE_PY_MUTANT="$cfg" PYTHONPATH="$dir" \
        pytest -q -p no:cacheprovider "tests/$file" -k "$filter") \
        >"$log" 2>&1 || rc=$?
    if [ "$rc" -eq 1 ]; then
        grep -m1 -E "^FAILED" "$log" | sed 's/^/   caught: /'
    else
        tail -n 30 "$log"
        echo "python.sh: $cfg was not caught (pytest exit $rc)" >&2
        return 1
    fi
    rm -rf "$dir" "$log"
}

for arg in "$@"; do
    case "$arg" in
    --mutations)
        step "binding mutations"
        mutation kvfence_py_cache_trusts_low_bits test_conversions.py test_forged_high_bits
        mutation kvfence_py_truncating_items test_conversions.py test_bad_items
        mutation kvfence_py_queue_holds_nothing test_transfer_queue.py test_an_item_holds
        # That test injects allocation failures with CPython's _testcapi (not in every
        # build of CPython: then pytest skips it, and so does this check).
        if python -c 'import _testcapi' 2>/dev/null; then
            mutation kvfence_py_drain_loses test_release_never_lost.py test_no_release_is_lost
            mutation kvfence_py_drain_loses test_drain_reasons.py test_no_release_lost
            mutation kvfence_py_open_leaks_room test_allocation_failures.py test_open_that
        else
            echo "NOTICE: this CPython has no _testcapi: --cfg kvfence_py_drain_loses and kvfence_py_open_leaks_room not checked"
        fi
        echo "ok: every binding mutation is caught"
        # No free-threaded interpreter here to build against: at least compile the
        # binding's free-threaded paths (`--cfg Py_GIL_DISABLED` for this crate only).
        step "binding: the free-threaded code paths compile"
        CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}/py-mutant-free-threaded" \
            PYO3_PYTHON="$VENV/bin/python" \
            cargo rustc --quiet -p kvfence-python --lib -- --cfg Py_GIL_DISABLED -D warnings
        echo "ok"
        ;;
    --bench)
        step "bench (python/bench/bench_lifecycle.py)"
        (cd python && python bench/bench_lifecycle.py)
        ;;
    *)
        echo "python.sh: unknown argument $arg" >&2
        exit 2
        ;;
    esac
done
echo "python.sh: ok"
