//! Stable property test: random operation sequences applied to the library and to the
//! sequential reference model in `tests/model/`, compared after every step, with the
//! invariants (occupancy and counters equal the model's, page conservation, no page in two
//! rooms, each release delivered exactly once, no reuse while held, failed transfers held
//! until their peer is fenced or the room quarantined, quarantined pool pages never reused)
//! checked after every step and after a final drain. Both modes (pool, gate) and the
//! release queue on and off are drawn per case.
//!
//! The same generator and checker run under `cargo fuzz` (`fuzz/fuzz_targets/ops.rs`);
//! here the bytes come from a seeded SplitMix64, so CI needs no nightly toolchain.
//!
//! Knobs (environment): `KVFENCE_PROP_CASES` (default 10,000; 16 under Miri),
//! `KVFENCE_PROP_SEED` (first case's seed, default 0): a failure prints the seed that
//! reproduces it alone (`KVFENCE_PROP_CASES=1 KVFENCE_PROP_SEED=<seed>`).

mod model;

use model::{decode, run_case, Op, Setup, SplitMix};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A case that runs this long is hung (a `wait_released`/`wait_idle` the model says must
/// return at once, never returned): the watchdog names its seed and aborts the process,
/// so CI fails with a reproducer instead of timing out.
const HANG_LIMIT: Duration = Duration::from_secs(60);

/// Starts the watchdog; returns the word the test stores each case's seed + 1 into.
fn watchdog() -> &'static AtomicU64 {
    static CURRENT: AtomicU64 = AtomicU64::new(0);
    if cfg!(miri) {
        // Miri interprets every poll of the watchdog too; its own deadlock detector reports
        // a wait that never returns.
        return &CURRENT;
    }
    std::thread::spawn(|| {
        let (mut seen, mut since) = (0, Instant::now());
        loop {
            std::thread::sleep(Duration::from_millis(500));
            let now = CURRENT.load(Ordering::Relaxed);
            if now == u64::MAX {
                return;
            }
            if now != seen {
                (seen, since) = (now, Instant::now());
            } else if now != 0 && since.elapsed() > HANG_LIMIT {
                eprintln!(
                    "prop_ops: case with KVFENCE_PROP_SEED={} hung for {HANG_LIMIT:?} \
                     (a wait that the model says returns at once did not): aborting",
                    now - 1
                );
                std::process::abort();
            }
        }
    });
    &CURRENT
}

/// Operations per case. Sequences this long reach table-full, pool-exhausted, reuse of
/// every room index several times and stale handles from earlier lifecycles, while 10,000
/// cases still run in well under a minute in the debug profile.
#[cfg(not(miri))]
const MAX_OPS: usize = 96;
#[cfg(miri)]
const MAX_OPS: usize = 12;

#[cfg(not(miri))]
const DEFAULT_CASES: u64 = 10_000;
#[cfg(miri)]
const DEFAULT_CASES: u64 = 16;

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not an unsigned integer")),
        Err(_) => default,
    }
}

/// The bytes of case `seed`: enough for the setup and `MAX_OPS` operations.
fn case(seed: u64) -> (Setup, Vec<Op>) {
    let bytes = SplitMix(seed).bytes(MAX_OPS * 32 + 16);
    decode(&bytes, MAX_OPS)
}

#[test]
fn ops_match_the_reference_model() {
    let cases = env_u64("KVFENCE_PROP_CASES", DEFAULT_CASES);
    let first = env_u64("KVFENCE_PROP_SEED", 0);
    let start = Instant::now();
    let current = watchdog();
    let mut steps = 0usize;
    for seed in first..first + cases {
        current.store(seed.wrapping_add(1), Ordering::Relaxed);
        let (setup, ops) = case(seed);
        steps += ops.len();
        let outcome = std::panic::catch_unwind(|| run_case(setup, &ops));
        let failure = match outcome {
            Ok(Ok(())) => continue,
            Ok(Err(divergence)) => divergence,
            Err(panic) => format!(
                "panicked: {}",
                panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            ),
        };
        panic!(
            "case {} of {cases} failed (reproduce: KVFENCE_PROP_CASES=1 KVFENCE_PROP_SEED={seed}): \
             {failure}\nops: {ops:#?}",
            seed - first + 1
        );
    }
    current.store(u64::MAX, Ordering::Relaxed);
    eprintln!(
        "prop_ops: {cases} cases, {steps} operations, all matched the model in {:.1?}",
        start.elapsed()
    );
}

/// Regression cases, each a fixed sequence that once mattered (or pins a rule the model
/// must agree with). Each would fail if the library and model disagreed on it; the comment
/// names the test-only mutation each one catches.
#[test]
fn regressions() {
    // A room of writer rank 1 (`width: 1, seed: 1` picks `RANKS[1]`).
    let open = |pages, token| Op::Open {
        kind: 1,
        width: 1,
        seed: 1,
        pages,
        token,
    };
    // Abort with a transfer in flight and a pending rank: held until both end.
    // (kvfence_naive_release: abort frees at once.)
    let held = [
        open(3, 0),
        Op::Begin {
            room: 0,
            peer: 0,
            form: 0,
        },
        Op::Abort { room: 0 },
        Op::Quiesce { room: 0, rank: 1 },
        Op::End { guard: 0, how: 0 },
    ];
    run_case(Setup::pool(1, 4, false), &held).unwrap();
    // A late ACK from a released lifecycle after the index was reused: `room: 0x81` is the
    // first lifecycle (stale), `rank: 3` one of its writers (rank 1, also in the new room).
    // (kvfence_skip_ack_gen_check.)
    let late_ack = [
        open(1, 1),
        Op::Abort { room: 0 },
        Op::Drain { room: 0 },
        open(1, 2),
        Op::Quiesce {
            room: 0x81,
            rank: 3,
        },
        Op::Quiesce {
            room: 0x82,
            rank: 3,
        },
    ];
    run_case(Setup::pool(1, 2, false), &late_ack).unwrap();
    run_case(Setup::gate(1, true), &late_ack).unwrap();
    // A failed transfer to peer 1 holds the aborted room after every ACK, until rank 1 is
    // fenced. (kvfence_failed_counts_as_drained.)
    let failed = [
        open(2, 9),
        Op::Begin {
            room: 0,
            peer: 1,
            form: 1,
        },
        Op::End { guard: 0, how: 2 },
        Op::Abort { room: 0 },
        Op::Drain { room: 0 },
        Op::Status { room: 0 },
        Op::Fence { rank: 0 },
    ];
    run_case(Setup::gate(1, false), &failed).unwrap();
    run_case(Setup::pool(2, 8, true), &failed).unwrap();
    // Quarantine: the release says Quarantined and the pool pages never come back, so the
    // next open of the whole pool is refused. (kvfence_quarantine_frees_pages.)
    let quarantined = [
        open(2, 0),
        Op::Quarantine { room: 0 },
        open(4, 0),
        Op::DrainReleased,
    ];
    run_case(Setup::pool(1, 4, false), &quarantined).unwrap();
    run_case(Setup::pool(1, 4, true), &quarantined).unwrap();
    // A guard dropped on a quarantined room: its release has no caller and is queued even
    // without a release queue; the room index comes back only when it is drained.
    let dropped = [
        open(2, 5),
        Op::Begin {
            room: 0,
            peer: 0,
            form: 2,
        },
        Op::Quarantine { room: 0 },
        Op::End { guard: 0, how: 3 },
        open(1, 6),
        Op::WaitReleased {
            room: 0x81,
            timed: true,
        },
        Op::Pop,
        open(1, 7),
    ];
    run_case(Setup::gate(1, false), &dropped).unwrap();
    run_case(Setup::pool(1, 4, false), &dropped).unwrap();
    // Token form: end twice, forged tokens, a token failed with its peer already fenced.
    let tokens = [
        open(2, 3),
        Op::Begin {
            room: 0,
            peer: 1,
            form: 4,
        },
        Op::EndToken {
            token: 0,
            how: 5,
            wire: 0,
        },
        Op::EndToken {
            token: 0,
            how: 3,
            wire: 0,
        },
        Op::EndToken {
            token: 3,
            how: 4,
            wire: 77,
        },
        Op::Begin {
            room: 0,
            peer: 1,
            form: 4,
        },
        Op::Fence { rank: 1 },
        Op::EndToken {
            token: 0,
            how: 2,
            wire: 0,
        },
        Op::Finish { room: 0 },
    ];
    run_case(Setup::gate(2, false), &tokens).unwrap();
    run_case(Setup::pool(2, 8, true), &tokens).unwrap();
}
