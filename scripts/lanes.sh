# Sourced by loom-tests/run.sh and scripts/shuttle.sh: a model-checking suite on two lanes.
#
# Loom and shuttle explore a model on one OS thread, so one `cargo test --test-threads=1`
# keeps one core of CI's two busy. suite_lanes runs two `cargo test` processes at once:
# lane 1 the test files named slow, lane 2 every other file of the package (cargo holds its
# build lock while it builds, not while tests run; the binaries are built before this).
# Each lane keeps --test-threads=1 (one model at a time, its timing line its own); the
# log is lane 1's output, then lane 2's, so every `loom-model` / `shuttle-test` line a
# caller greps is there.
#
#   suite_lanes LOG PKG TESTDIR "SLOW FILE NAMES" TIMEOUT_S [TEST ARGS...]
#
# Environment: CARGO_TARGET_DIR and RUSTFLAGS as the caller built with. Returns 124 if a
# lane ran past TIMEOUT_S, else the first non-zero exit status of a lane, else 0.
suite_lanes() {
    local log="$1" pkg="$2" dir="$3" slow="$4" limit="$5"
    shift 5
    local lane1=() lane2=() f name
    for f in "$dir"/*.rs; do
        name=$(basename "$f" .rs)
        case " $slow " in
            *" $name "*) lane1+=(--test "$name") ;;
            *) lane2+=(--test "$name") ;;
        esac
    done
    local pids=()
    : >"$log.1"
    : >"$log.2"
    if [ "${#lane1[@]}" -gt 0 ]; then
        timeout "$limit" cargo test -p "$pkg" --release "${lane1[@]}" -- "$@" >"$log.1" 2>&1 &
        pids+=($!)
    fi
    if [ "${#lane2[@]}" -gt 0 ]; then
        timeout "$limit" cargo test -p "$pkg" --release "${lane2[@]}" -- "$@" >"$log.2" 2>&1 &
        pids+=($!)
    fi
    local rc=0 r p
    for p in "${pids[@]}"; do
        r=0
        wait "$p" || r=$?
        if [ "$r" -eq 124 ]; then
            rc=124
        elif [ "$r" -ne 0 ] && [ "$rc" -eq 0 ]; then
            rc=$r
        fi
    done
    cat "$log.1" "$log.2" >"$log"
    rm -f "$log.1" "$log.2"
    return "$rc"
}
