//! Issue 42's two single-thread targets, measured **interleaved** in one process: kvfence
//! and its reference alternate in short chunks (a few milliseconds each, the order swapped
//! every pair), so a slowdown of the host that lasts longer than a chunk hits both alike.
//!
//! Why not criterion alone: on the shared 2-core box a whole process lands in a slow or a
//! fast mode for seconds (the same executable's `begin_complete/kvfence` median was 20 ns
//! in one run and 27 ns in the next, with ASLR off and pinned to either core), and
//! criterion measures one function for seconds before the next, so the ratio of two of its
//! medians is the ratio of two modes as often as of two costs.
//!
//! Rows (each the median over `PAIRS` pairs of chunks, and the median of the per-pair
//! ratios with its 10th and 90th percentiles):
//! * `begin + complete` vs the bare `fetch_add` + `fetch_sub` pair (target <= 1.3x);
//! * `open n pages + finish + release` in pool mode vs the `Mutex<HashMap>` + `Mutex<Vec>`
//!   tracker of `benches/common` (target: the tracker / kvfence >= 1x), n = 1, 16, 256.
//!
//! `cargo bench --bench side_by_side` (about 40 s); `SIDE_BY_SIDE_PAIRS` sets the pairs
//! (default 400).

#![allow(missing_docs)]

mod common;

use common::{bare_pair, open_idle_room, table, transfer, Baseline, Tracker, OPEN_PAGES, PAGES};
use std::hint::black_box;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

/// Nanoseconds per call of `f` over `iters` calls.
fn chunk(iters: u64, f: &mut impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    start.elapsed().as_nanos() as f64 / iters as f64
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    percentile(&s, 0.5)
}

/// Alternates `ours` and `reference` in chunks of about 2 ms; prints one row.
fn side_by_side(
    what: &str,
    reference_name: &str,
    pairs: usize,
    mut ours: impl FnMut(),
    mut reference: impl FnMut(),
    reference_over_ours: bool,
) {
    // Calibrate a chunk to ~2 ms of `ours` (warming both up on the way).
    let mut iters = 64u64;
    while chunk(iters, &mut ours) * (iters as f64) < 2e6 {
        chunk(iters, &mut reference);
        iters *= 2;
    }
    let (mut a, mut b, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..pairs {
        let (x, y) = if i % 2 == 0 {
            let x = chunk(iters, &mut ours);
            (x, chunk(iters, &mut reference))
        } else {
            let y = chunk(iters, &mut reference);
            (chunk(iters, &mut ours), y)
        };
        a.push(x);
        b.push(y);
        ratio.push(if reference_over_ours { y / x } else { x / y });
    }
    ratio.sort_by(f64::total_cmp);
    println!(
        "| {what} | {:.1} ns | {reference_name} {:.1} ns | {:.3}x | {:.3}-{:.3}x |",
        median(&a),
        median(&b),
        percentile(&ratio, 0.5),
        percentile(&ratio, 0.1),
        percentile(&ratio, 0.9),
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing: run a smoke
    // pass then (a few pairs), so the target stays built and exercised by the test suite.
    let benching = std::env::args().any(|a| a == "--bench");
    let pairs = std::env::var("SIDE_BY_SIDE_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if benching { 400 } else { 4 });
    println!("| workload | kvfence | reference | ratio (median of {pairs} pairs) | p10-p90 |");
    println!("|---|---:|---:|---:|---:|");

    let word = AtomicU64::new(0);
    let t = table();
    let room = open_idle_room(&t);
    side_by_side(
        "begin + complete (kvfence / bare pair)",
        "bare `fetch_add` + `fetch_sub`",
        pairs,
        || {
            black_box(transfer(&t, black_box(room)));
        },
        || bare_pair(&word),
        false,
    );

    // `SIDE_BY_SIDE_ROOMS` (diagnostic): a pool-mode table of that many rooms instead of
    // the benches' 4096 (each lifecycle claims the next room, so 4096 rooms walk 2 MiB of
    // room slots).
    let rooms: Option<usize> = std::env::var("SIDE_BY_SIDE_ROOMS")
        .ok()
        .and_then(|v| v.parse().ok());
    for pages in OPEN_PAGES {
        let kv = match rooms {
            Some(r) => RoomTable::new(kvfence::Config::pool(r, PAGES)).expect("valid config"),
            None => table(),
        };
        let base = Baseline::new(PAGES);
        let nobody = <RoomTable as Tracker>::writers(0);
        let (mut kv_ids, mut base_ids) = (<RoomTable as Tracker>::ids(0), Baseline::ids(0));
        let base_nobody = Baseline::writers(0);
        side_by_side(
            &format!("open {pages} pages + finish + release (tracker / kvfence)"),
            "`Mutex` tracker",
            pairs,
            || {
                let (room, got) =
                    Tracker::open(&kv, &mut kv_ids, black_box(pages), &nobody).expect("open");
                assert_eq!(Tracker::finish(&kv, room).expect("finish"), Some(pages));
                black_box(got);
            },
            || {
                let (room, got) =
                    Tracker::open(&base, &mut base_ids, black_box(pages), &base_nobody)
                        .expect("open");
                assert_eq!(Tracker::finish(&base, room).expect("finish"), Some(pages));
                black_box(got);
            },
            true,
        );
    }
}

use kvfence::RoomTable;
