//! Stable property test: random operation sequences applied to the library and to the
//! sequential reference model in `tests/model/`, compared after every step, with the
//! invariants (page conservation, no page in two rooms, each release reported exactly
//! once, no reuse while held) checked after every step and after a final drain.
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
    let bytes = SplitMix(seed).bytes(MAX_OPS * 24 + 8);
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
/// must agree with). Each would fail if the library and model disagreed on it.
#[test]
fn regressions() {
    let setup = |rooms, pages, ranks| Setup::from_sizes(rooms, pages, ranks);
    // Abort with a transfer in flight and a pending rank: held until both end; the guard's
    // drop releases it through take_orphaned. (The naive-release mutation fails here.)
    let held = [
        Op::Open {
            pages: 3,
            width: 1,
            mask: 0,
            extra: 1,
        },
        Op::Begin { room: 0 },
        Op::Abort { room: 0 },
        Op::Quiesce { room: 0, rank: 1 },
        Op::DropGuard { guard: 0 },
        Op::TakeOrphaned,
    ];
    run_case(setup(1, 4, 2), &held).unwrap();
    // A late ACK from a released lifecycle after the index was reused.
    let late_ack = [
        Op::Open {
            pages: 1,
            width: 1,
            mask: 0,
            extra: 1,
        },
        Op::Abort { room: 0 },
        Op::Drain { room: 0 },
        Op::Open {
            pages: 1,
            width: 1,
            mask: 0,
            extra: 1,
        },
        Op::Quiesce {
            room: 0x80,
            rank: 0,
        },
        Op::Quiesce {
            room: 0x81,
            rank: 0,
        },
    ];
    run_case(setup(1, 2, 1), &late_ack).unwrap();
}
