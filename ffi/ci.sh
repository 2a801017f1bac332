#!/usr/bin/env bash
# CI for the C ABI (ffi/): one PASS/FAIL line per check, then "N passed, M failed".
#
#   1. cargo build --release -p kvfence-ffi: libkvfence.a and libkvfence.so (soname
#      libkvfence.so.0) in target/release/
#   2. the committed include/kvfence.h is what cbindgen generates now (check-header.sh)
#   3. every function of the header is called by the C/C++ tests, every status is asserted
#   4. Rust unit tests of the boundary (every core error's status, a panic caught)
#   5. the C API test, the threaded C test, the C++ wrapper test (C++17 and C++20), a
#      -fno-exceptions build of the wrapper, the benchmark programs (smoke run); issue 40's
#      tests: test_wait_drain (wait then drain), test_oom (KVFENCE_OUT_OF_MEMORY, no
#      abort), test_cpp_release (a Release destroyed unread is requeued), test_cpp_result
#      (lazy messages, bad_alloc loses nothing), test_misuse (used correctly)
#   6. mutations the threaded test must catch (writes after a refused begin, pages reused
#      at abort, a lost release); with KVFENCE_FFI_MUTATIONS=1 also two mutations of the
#      library itself (a dropped overflow release, no null check) that test_api must catch
#   7. AddressSanitizer + UndefinedBehaviorSanitizer (C side instrumented; LeakSanitizer
#      also checks that every release's page array was freed): all tests + a leak mutation
#   8. ThreadSanitizer, with libkvfence.a itself built by nightly Rust with
#      -Zsanitizer=thread -Zbuild-std (so TSan sees the happens-before edges of kvfence's
#      atomics, and std's), linked with Rust's TSan runtime: all tests, and the threaded
#      test's stale-write mutation must be reported as a data race
#   9. valgrind memcheck (leaks, invalid accesses): all tests + a leak mutation, and the
#      misuses the header warns about (a use after free of the table, a double free)
#  10. install.sh into a temporary prefix (stripped libraries, or the debug info apart);
#      ffi/README.md's build commands run verbatim against it (tests/readme_build.sh: the
#      pkg-config shared build runs without LD_LIBRARY_PATH, kvfence-static and
#      cc -static); a CMake find_package(kvfence) consumer (shared, static, C++)
#
# Installs with apt what is missing (valgrind, cmake, pkg-config). A tool that cannot be
# installed, or no nightly toolchain / rust-src for TSan (or SKIP_NIGHTLY=1), is skipped
# with a NOTICE, not failed. Exit status: non-zero iff a check failed.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
start=$(date +%s)
work=$(mktemp -d "${TMPDIR:-/tmp}/kvfence-ffi-ci.XXXXXX")
trap 'rm -rf "$work"' EXIT
passed=0
failed=0
pass() { echo "PASS: $*"; passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
notice() { printf '\n*** NOTICE: %s ***\n\n' "$*"; }

nlog=0
# took T0: " [N.Ns]", the wall time since T0 (an $EPOCHREALTIME), for the PASS/FAIL line.
took() { printf ' [%.1fs]' "$(echo "${EPOCHREALTIME/,/.} - $1" | bc 2>/dev/null || echo 0)"; }
# run NAME CMD...: passes if CMD exits 0.
run() {
    local name=$1 log="$work/log.$((++nlog))" t0=${EPOCHREALTIME/,/.}
    shift
    if "$@" >"$log" 2>&1; then
        pass "$name$(grep -m1 -o '[0-9]* passed, [0-9]* failed' "$log" | sed 's/^/ (/; s/$/)/')$(took "$t0")"
    else
        fail "$name$(took "$t0")"
        tail -40 "$log"
    fi
}
# expect_fail NAME CMD...: passes if CMD fails (a mutation the check must catch).
expect_fail() {
    local name=$1 log="$work/log.$((++nlog))" t0=${EPOCHREALTIME/,/.}
    shift
    if "$@" >"$log" 2>&1; then
        fail "$name: the mutation was NOT caught$(took "$t0")"
        tail -20 "$log"
    else
        pass "$name (caught: $(grep -m1 -E 'FAIL|ERROR|WARNING|SUMMARY|definitely lost|Invalid' "$log" | cut -c1-100))$(took "$t0")"
    fi
}

apt_updated=0
# need CMD PACKAGE: installs PACKAGE with apt when CMD is missing; false if impossible.
need() {
    command -v "$1" >/dev/null 2>&1 && return 0
    if [ "$apt_updated" = 0 ]; then
        apt-get update -qq >/dev/null 2>&1 || true
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null 2>&1 || true
    command -v "$1" >/dev/null 2>&1
}

need cc gcc || { notice "no C compiler and gcc cannot be installed: the C ABI tests SKIPPED"; exit 0; }
need c++ g++ || { notice "no C++ compiler and g++ cannot be installed: the C ABI tests SKIPPED"; exit 0; }

inc="-Iffi/include"
libs="-lpthread -ldl -lm"
cflags="-std=c11 -pedantic -Wall -Wextra -Werror -g -O1"
cxxflags="-pedantic -Wall -Wextra -Werror -g -O1"
lib=target/release/libkvfence.a

# ---- 1. build ----
run "build: cargo build --release -p kvfence-ffi" cargo build --release -p kvfence-ffi
soname() { readelf -d target/release/libkvfence.so | grep -q 'SONAME.*\[libkvfence.so.0\]'; }
run "artifacts: libkvfence.a, libkvfence.so with soname libkvfence.so.0" \
    bash -c "test -f target/release/libkvfence.a && test -f target/release/libkvfence.so && $(declare -f soname); soname"
# Every exported symbol is kvfence_-prefixed (no Rust symbol leaks from the shared library).
leaks() {
    nm -D --defined-only target/release/libkvfence.so | awk '$2 ~ /^[TDB]$/ {print $3}' |
        grep -v '^kvfence_' | grep -v -E '^(_init|_fini|__bss_start|_edata|_end)$' || true
}
run "exports: every dynamic symbol of libkvfence.so starts with kvfence_" \
    bash -c "$(declare -f leaks); out=\$(leaks); [ -z \"\$out\" ] || { echo \"\$out\"; exit 1; }"

# ---- 2. header freshness ----
if bash ffi/check-header.sh >"$work/header.log" 2>&1; then
    if grep -q NOTICE "$work/header.log"; then
        cat "$work/header.log"
    else
        pass "header: ffi/include/kvfence.h is fresh (cbindgen)"
    fi
else
    fail "header: ffi/include/kvfence.h is stale"
    tail -30 "$work/header.log"
fi

# The header alone, in the oldest dialects it promises (C99, C++11), warnings as errors.
header_alone() {
    printf '#include "kvfence.h"\nint main(void) { return kvfence_abi_version() == KVFENCE_ABI_VERSION ? 0 : 1; }\n' >"$work/h.c"
    cp "$work/h.c" "$work/h.cpp"
    cc -std=c99 -pedantic -Wall -Wextra -Werror $inc -c "$work/h.c" -o "$work/h99.o" &&
        cc -std=c11 -pedantic -Wall -Wextra -Werror $inc -c "$work/h.c" -o "$work/h11.o" &&
        c++ -std=c++11 -pedantic -Wall -Wextra -Werror $inc -c "$work/h.cpp" -o "$work/hcc.o"
}
run "header: kvfence.h compiles alone as C99, C11 and C++11 (-pedantic -Werror)" header_alone

# ---- 3. coverage of the header by the tests ----
coverage() {
    local missing=0
    for f in $(grep -o -E '\bkvfence_[a-z_]+\(' ffi/include/kvfence.h | tr -d '(' | sort -u); do
        if ! grep -q -w "$f" ffi/tests/*.c ffi/tests/*.cpp; then
            echo "function $f is not called by any C/C++ test"
            missing=1
        fi
    done
    # Statuses no C caller can reach are asserted by the Rust tests (ffi/src/tests.rs).
    local rust_only="KVFENCE_UNKNOWN_ROOM KVFENCE_TOO_MANY_TRANSFERS KVFENCE_PANIC KVFENCE_INTERNAL_ERROR"
    for s in $(sed -n '/^enum kvfence_status/,/^};/p' ffi/include/kvfence.h | grep -o -E 'KVFENCE_[A-Z_]+ =' | tr -d ' ='); do
        if grep -q -w "$s" ffi/tests/test_api.c; then continue; fi
        if [[ " $rust_only " == *" $s "* ]]; then continue; fi
        echo "status $s is asserted by no test"
        missing=1
    done
    return $missing
}
run "coverage: every header function called, every status asserted" coverage
# Every function's comment in the header says how it behaves across threads, and every
# function returning a status lists its errors.
header_docs() {
    python3 - <<'PY'
import re, sys
h = open("ffi/include/kvfence.h").read()
bad, n = [], 0
for m in re.finditer(r"/\*\*(.*?)\*/\s*\n([^;{]*?\b(kvfence_[a-z_]+)\()", h, re.S):
    doc, decl, name = m.group(1), m.group(2), m.group(3)
    n += 1
    if "hread" not in doc:
        bad.append(name + ": no thread-safety")
    if "kvfence_status" in decl.split(name)[0] and "Errors" not in doc:
        bad.append(name + ": no errors")
print(n, "functions documented")
print("\n".join(bad))
sys.exit(1 if bad or n < 30 else 0)
PY
}
run "header docs: every function states its thread-safety and its errors" header_docs
# Issue 40 #6: what a C/C++ user must know and could not read before.
header_warnings() {
    local h=ffi/include/kvfence.h missing=0 want
    for want in "free exactly one copy" "freeing both is a double free" \
        "kvfence_room_status, kvfence_fenced" "are not versioned" "a new soname" \
        "AddressSanitizer does not" "valgrind" "KVFENCE_OUT_OF_MEMORY wherever" \
        "still abort the process"; do
        grep -q -F "$want" "$h" || { echo "kvfence.h does not say: $want"; missing=1; }
    done
    return $missing
}
run "header docs: double free of a copied release, unversioned structs, ASan vs valgrind, memory" \
    header_warnings

# ---- 4. Rust unit tests of the boundary ----
run "rust: cargo test -p kvfence-ffi (status per core error, panic caught)" \
    cargo test -q -p kvfence-ffi --lib

# ---- 5. the tests, plain ----
build_c() { # OUT SRC EXTRA-FLAGS... (links $lib)
    local out=$1 src=$2
    shift 2
    cc $cflags $inc "$@" "$src" "$lib" $libs -o "$work/$out"
}
build_cxx() {
    local out=$1 src=$2
    shift 2
    c++ $cxxflags $inc "$@" "$src" "$lib" $libs -o "$work/$out"
}
# Builds run in parallel (the C++ ones take seconds each): `par` starts a job, `par_wait`
# waits for all and fails if any failed.
par_pids=()
par() { "$@" & par_pids+=($!); }
par_wait() {
    local p st=0
    for p in "${par_pids[@]}"; do wait "$p" || st=1; done
    par_pids=()
    return $st
}
compile_all() {
    par build_c test_api ffi/tests/test_api.c
    par build_c test_threads ffi/tests/test_threads.c -DREQUESTS=20000
    par build_c test_wait_drain ffi/tests/test_wait_drain.c
    par build_c test_oom ffi/tests/test_oom.c
    par build_c test_misuse ffi/tests/test_misuse.c
    par build_cxx test_cpp17 ffi/tests/test_cpp.cpp -std=c++17
    par build_cxx test_cpp20 ffi/tests/test_cpp.cpp -std=c++20
    par build_cxx test_cpp_release ffi/tests/test_cpp_release.cpp -std=c++17
    par build_cxx test_cpp_result ffi/tests/test_cpp_result.cpp -std=c++17
    par_wait
}
run "compile: C tests and the C++ tests (C++17, C++20)" compile_all
run "test_api (every function, every status)" "$work/test_api"
run "test_threads (20000 requests: no write after reuse, every release once)" "$work/test_threads"
run "test_wait_drain (issue 40 #1: wait, then drain, finds a release queued by end_queued / a fence)" \
    "$work/test_wait_drain"
run "test_oom (issue 40 #2: memory running out is KVFENCE_OUT_OF_MEMORY, not an abort)" "$work/test_oom"
run "test_misuse, used correctly (one free of a release, the table freed last)" "$work/test_misuse"
run "test_cpp C++17 (RAII, guard destructor fails the transfer)" "$work/test_cpp17"
run "test_cpp C++20 (and std::span overloads)" "$work/test_cpp20"
run "test_cpp_release (issue 40 #3: a Release destroyed unread goes back to the queue)" \
    "$work/test_cpp_release"
run "test_cpp_result (issue 40 #5: a refusal allocates nothing; bad_alloc loses no release)" \
    "$work/test_cpp_result"
grep -h '^test_cpp_result: a late ACK' "$work"/log.* 2>/dev/null | head -1
printf '#include "kvfence.hpp"\nint main() { auto t = kvfence::Table::create(kvfence::Table::gate(4)); return t.ok() ? 0 : 1; }\n' >"$work/noexc.cpp"
run "kvfence.hpp builds and runs with -fno-exceptions" bash -c \
    "c++ -std=c++17 -fno-exceptions $cxxflags $inc $work/noexc.cpp $lib $libs -o $work/noexc && $work/noexc"
run "bench programs build and run (smoke; figures: ffi/bench/run.sh)" bash -c \
    "cc -std=c11 -O2 $inc ffi/bench/lifecycle.c $lib $libs -o $work/c_bench && $work/c_bench 1 2000 &&
     target/release/kvfence-ffi-bench 1 2000 && target/release/kvfence-ffi-bench --guards 1 2000"

# ---- 6. mutations the threaded test must catch ----
for m in MUTATION_IGNORE_REFUSAL MUTATION_REUSE_ON_ABORT MUTATION_LOSE_RELEASE; do
    if build_c "mut_$m" ffi/tests/test_threads.c "-D$m" >"$work/mut_build.log" 2>&1; then
        expect_fail "mutation $m caught by test_threads" "$work/mut_$m"
    else
        fail "mutation $m: does not build"
        cat "$work/mut_build.log"
    fi
done

# ---- 6b. (optional) mutations of the library that test_api must catch ----
# KVFENCE_FFI_MUTATIONS=1: each mutation rebuilds the core and the boundary with its
# --cfg (about 2 minutes each on 2 cores the first time; target directories are cached).
if [ "${KVFENCE_FFI_MUTATIONS:-0}" = 1 ]; then
    for m in kvfence_ffi_drop_overflow kvfence_ffi_no_null_check; do
        mdir="${KVFENCE_CACHE:-$HOME/.cache/kvfence}/ffi-mutation-$m"
        if RUSTFLAGS="--cfg $m" CARGO_TARGET_DIR="$mdir" cargo build --release -p kvfence-ffi --lib \
            >"$work/mut_lib.log" 2>&1 &&
            cc $cflags $inc ffi/tests/test_api.c "$mdir/release/libkvfence.a" $libs -o "$work/mut_$m"; then
            expect_fail "library mutation --cfg $m caught by test_api" "$work/mut_$m"
        else
            fail "library mutation $m: does not build"
            tail -20 "$work/mut_lib.log"
        fi
    done
fi

# ---- 7. ASan + UBSan ----
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
asan_all() {
    par build_c asan_api ffi/tests/test_api.c $san
    par build_c asan_threads ffi/tests/test_threads.c $san
    par build_cxx asan_cpp ffi/tests/test_cpp.cpp -std=c++20 $san
    par build_cxx asan_cpp_release ffi/tests/test_cpp_release.cpp -std=c++17 $san
    par build_c asan_wait_drain ffi/tests/test_wait_drain.c $san
    par build_c asan_leak ffi/tests/test_threads.c $san -DMUTATION_LEAK_RELEASE
    par_wait
}
if asan_all >"$work/asan_build.log" 2>&1; then
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1
    run "asan+ubsan: test_api" env KVFENCE_NO_RLIMIT=asan "$work/asan_api"
    run "asan+ubsan: test_threads" "$work/asan_threads"
    run "asan+ubsan: test_cpp" "$work/asan_cpp"
    run "asan+ubsan: test_cpp_release (a Release outliving its Table)" "$work/asan_cpp_release"
    run "asan+ubsan: test_wait_drain" "$work/asan_wait_drain"
    expect_fail "asan: a leaked release (MUTATION_LEAK_RELEASE) is reported" "$work/asan_leak"
else
    fail "asan+ubsan: the tests do not build"
    tail -20 "$work/asan_build.log"
fi

# ---- 8. ThreadSanitizer (instrumented Rust library) ----
tsan() {
    if [ "${SKIP_NIGHTLY:-0}" = 1 ]; then
        notice "SKIP_NIGHTLY=1: ThreadSanitizer of the C ABI SKIPPED"
        return
    fi
    if ! cargo +nightly --version >/dev/null 2>&1; then
        notice "no nightly toolchain: ThreadSanitizer of the C ABI SKIPPED"
        return
    fi
    if ! rustup component add rust-src --toolchain nightly >/dev/null 2>&1; then
        notice "rust-src cannot be installed: ThreadSanitizer of the C ABI SKIPPED"
        return
    fi
    local host rt tlib
    host=$(rustc +nightly -vV | sed -n 's/^host: //p')
    rt="$(rustc +nightly --print sysroot)/lib/rustlib/$host/lib/librustc-nightly_rt.tsan.a"
    # The same target directory, profile and flags as scripts/tsan.sh: the instrumented
    # std is built once per CI run, for both.
    tlib="target/$host/debug/libkvfence.a"
    run "tsan: build libkvfence.a with nightly -Zsanitizer=thread -Zbuild-std" \
        env RUSTFLAGS="-Zsanitizer=thread" cargo +nightly build -Zbuild-std --target "$host" -p kvfence-ffi --lib
    [ -f "$tlib" ] || return
    # C/C++ instrumented by gcc, linked against Rust's TSan runtime (the one the library
    # was instrumented for; gcc's older libtsan lacks symbols LLVM's instrumentation uses).
    tbuild() { # OUT SRC COMPILER FLAGS...
        local out=$1 src=$2 compiler=$3
        shift 3
        $compiler -g -O1 -fsanitize=thread $inc "$@" -c "$src" -o "$work/$out.o" &&
            $compiler "$work/$out.o" "$tlib" -Wl,--whole-archive "$rt" -Wl,--no-whole-archive \
                $libs -lrt -o "$work/$out"
    }
    tsan_all() {
        par tbuild tsan_threads ffi/tests/test_threads.c cc -std=c11
        par tbuild tsan_api ffi/tests/test_api.c cc -std=c11
        par tbuild tsan_wait_drain ffi/tests/test_wait_drain.c cc -std=c11 -DROUNDS=2000
        par tbuild tsan_cpp ffi/tests/test_cpp.cpp c++ -std=c++17
        par tbuild tsan_mut ffi/tests/test_threads.c cc -std=c11 -DMUTATION_IGNORE_REFUSAL
        par_wait
    }
    if tsan_all >"$work/tsan_build.log" 2>&1; then
        export TSAN_OPTIONS="halt_on_error=1 ${TSAN_OPTIONS:-}"
        run "tsan: test_threads (no data race on the page arena)" "$work/tsan_threads"
        run "tsan: test_api" env KVFENCE_NO_RLIMIT=tsan "$work/tsan_api"
        run "tsan: test_wait_drain" "$work/tsan_wait_drain"
        run "tsan: test_cpp" "$work/tsan_cpp"
        expect_fail "tsan: stale writes (MUTATION_IGNORE_REFUSAL) reported as a data race" "$work/tsan_mut"
    else
        fail "tsan: the tests do not build"
        tail -20 "$work/tsan_build.log"
    fi
}
tsan

# ---- 9. valgrind memcheck ----
if need valgrind valgrind; then
    vg="valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite"
    build_c vg_threads ffi/tests/test_threads.c >/dev/null 2>&1
    build_c vg_leak ffi/tests/test_threads.c -DMUTATION_LEAK_RELEASE >/dev/null 2>&1
    run "valgrind: test_api" env KVFENCE_NO_RLIMIT=valgrind $vg "$work/test_api"
    run "valgrind: test_threads" $vg "$work/vg_threads"
    run "valgrind: test_cpp" $vg "$work/test_cpp20"
    run "valgrind: test_cpp_release (a Release outliving its Table)" $vg "$work/test_cpp_release"
    expect_fail "valgrind: a leaked release (MUTATION_LEAK_RELEASE) is reported" $vg "$work/vg_leak"
    # Issue 40 #6: what the header tells C/C++ users to run valgrind for.
    expect_fail "valgrind: a guard's end after its table was freed is reported" \
        $vg "$work/test_misuse" use-after-free
    expect_fail "valgrind: both copies of a release freed is reported" \
        $vg "$work/test_misuse" double-free
else
    notice "valgrind cannot be installed: valgrind memcheck SKIPPED"
fi

# ---- 10. install, pkg-config and CMake consumers ----
prefix="$work/prefix"
run "install: ffi/install.sh PREFIX" env KVFENCE_NO_BUILD=1 bash ffi/install.sh "$prefix"
if need pkg-config pkg-config; then
    # The README's commands verbatim (shared through an rpath, kvfence-static, cc -static):
    # each program runs with no LD_LIBRARY_PATH and no ldconfig.
    run "pkg-config: ffi/README.md's cc/./app commands run verbatim from the prefix (shared, static)" \
        bash ffi/tests/readme_build.sh "$prefix"
else
    notice "pkg-config cannot be installed: the pkg-config consumer SKIPPED"
fi
# The installed libraries are stripped; KVFENCE_DEBUG_INFO=1 keeps the debug info apart.
stripped() {
    local so="$prefix/lib/libkvfence.so.0.1.0" a="$prefix/lib/libkvfence.a" d="$work/prefix-debug"
    echo "installed: libkvfence.so.0.1.0 $(stat -c %s "$so") bytes, libkvfence.a $(stat -c %s "$a") bytes"
    [ "$(stat -c %s "$so")" -lt 2000000 ] || { echo "the .so is not stripped"; return 1; }
    ! readelf -S "$a" | grep -q '\.debug_info' || { echo "the .a has debug info"; return 1; }
    KVFENCE_NO_BUILD=1 KVFENCE_DEBUG_INFO=1 bash ffi/install.sh "$d" >/dev/null &&
        readelf -S "$d/lib/libkvfence.so.0.1.0" | grep -q gnu_debuglink &&
        readelf -S "$d/lib/debug/libkvfence.so.0.1.0.debug" | grep -q '\.debug_info'
}
run "install: stripped libraries; KVFENCE_DEBUG_INFO=1 installs the debug info apart (debuglink)" stripped
grep -h '^installed:' "$work"/log.* | tail -1
if need cmake cmake; then
    run "cmake: find_package(kvfence) consumer (shared, static, C++) builds and runs" bash -c "
        cmake -S ffi/tests/consumer -B $work/cmake -DCMAKE_PREFIX_PATH=$prefix -DCMAKE_BUILD_TYPE=Release &&
        cmake --build $work/cmake -j2 && $work/cmake/decode_shared && $work/cmake/decode_static &&
        $work/cmake/cpp_consumer"
    # The version file: 0.1 is found, 0.2 and 1.0 are refused (0.x: same minor).
    cmake_version() {
        local v want got d
        for v in "0.1:1" "0.1.0:1" "0.2:0" "1.0:0"; do
            want=${v#*:}
            d="$work/cmake-v-${v%%:*}"
            mkdir -p "$d"
            printf 'cmake_minimum_required(VERSION 3.16)\nproject(v C)\nfind_package(kvfence %s QUIET)\nmessage(STATUS "found=${kvfence_FOUND}")\n' "${v%%:*}" >"$d/CMakeLists.txt"
            got=$(cmake -S "$d" -B "$d/b" -DCMAKE_PREFIX_PATH="$prefix" 2>&1 | sed -n 's/.*found=//p')
            [ "${got:-0}" = "$want" ] || { echo "find_package(kvfence ${v%%:*}): found=$got, want $want"; return 1; }
        done
    }
    run "cmake: kvfenceConfigVersion accepts 0.1, refuses 0.2 and 1.0" cmake_version
else
    notice "cmake cannot be installed: the CMake consumer SKIPPED"
fi

echo
echo "ffi/ci.sh took $(($(date +%s) - start))s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
