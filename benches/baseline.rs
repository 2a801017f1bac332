//! The peer-style tracker (`benches/common`: `Mutex<HashMap>` of room state with a set of
//! ACKed ranks, `Mutex<Vec<u32>>` free page list) on the workloads of `hot_path.rs`, under
//! the same group names, as function `baseline`:
//!
//! * `begin_complete`: begin + complete a transfer on a live room;
//! * `quiesce`: one rank's ACK on a live room of 64 ranks;
//! * `abort_ack_release`: abort a room of 16 pages and 8 ranks, 8 ACKs, release;
//! * `open_finish_release`: open 1, 16 or 256 pages with no writer ranks, finish, release.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

mod common;

use common::{config, BQuiesced, Baseline, OPEN_PAGES, PAGES};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::hint::black_box;
use std::time::{Duration, Instant};

const Q_RANKS: u32 = 64;
const BATCH_ROOMS: u64 = 256;

fn begin_complete(c: &mut Criterion) {
    let mut g = c.benchmark_group("begin_complete");
    let tracker = Baseline::new(PAGES);
    tracker.open(7, 1, &[]).expect("open");
    g.bench_function("baseline", |b| {
        b.iter(|| {
            tracker
                .begin_transfer(black_box(7))
                .expect("begin_transfer");
            black_box(tracker.complete(7).expect("complete"))
        })
    });
    g.finish();
}

/// Opens `n` rooms with fresh ids (untimed setup); returns their ids.
fn open_rooms(tracker: &Baseline, next: &mut u64, n: u64, pages: usize, ranks: u32) -> Vec<u64> {
    let writers: Vec<u32> = (0..ranks).collect();
    (0..n)
        .map(|_| {
            *next += 1;
            tracker.open(*next, pages, &writers).expect("open");
            *next
        })
        .collect()
}

fn quiesce(c: &mut Criterion) {
    let mut g = c.benchmark_group("quiesce");
    let tracker = Baseline::new(PAGES);
    let mut next = 0;
    g.bench_function("baseline", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let rooms = open_rooms(
                    &tracker,
                    &mut next,
                    left.div_ceil(Q_RANKS as u64).min(BATCH_ROOMS),
                    1,
                    Q_RANKS,
                );
                let n = left.min(rooms.len() as u64 * Q_RANKS as u64);
                let start = Instant::now();
                for i in 0..n {
                    let room = rooms[(i / Q_RANKS as u64) as usize];
                    let out = tracker.quiesce(black_box(room), (i % Q_RANKS as u64) as u32);
                    assert_eq!(out, Ok(BQuiesced::Recorded));
                }
                total += start.elapsed();
                left -= n;
                for i in n..rooms.len() as u64 * Q_RANKS as u64 {
                    let room = rooms[(i / Q_RANKS as u64) as usize];
                    let _ = tracker
                        .quiesce(room, (i % Q_RANKS as u64) as u32)
                        .expect("quiesce");
                }
                for room in rooms {
                    assert!(tracker.finish(room).expect("finish").is_some());
                }
            }
            total
        })
    });
    g.finish();
}

fn abort_ack_release(c: &mut Criterion) {
    let mut g = c.benchmark_group("abort_ack_release");
    let tracker = Baseline::new(PAGES);
    let mut next = 0;
    g.bench_function("baseline", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let rooms = open_rooms(&tracker, &mut next, left.min(BATCH_ROOMS), 16, 8);
                let start = Instant::now();
                for &room in &rooms {
                    let aborted = tracker.abort(black_box(room)).expect("abort");
                    let mut released = false;
                    for rank in 0..aborted.fanout as u32 {
                        released |= matches!(
                            tracker.quiesce(room, rank).expect("quiesce"),
                            BQuiesced::Released(_)
                        );
                    }
                    assert!(released);
                }
                total += start.elapsed();
                left -= rooms.len() as u64;
            }
            total
        })
    });
    g.finish();
}

fn open_finish_release(c: &mut Criterion) {
    let mut g = c.benchmark_group("open_finish_release");
    let tracker = Baseline::new(PAGES);
    let mut next = 0u64;
    for pages in OPEN_PAGES {
        g.bench_with_input(BenchmarkId::new("baseline", pages), &pages, |b, &pages| {
            b.iter(|| {
                next += 1;
                let got = tracker.open(next, black_box(pages), &[]).expect("open");
                assert_eq!(tracker.finish(next).expect("finish"), Some(pages));
                got
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = begin_complete, quiesce, abort_ack_release, open_finish_release
}
criterion_main!(benches);
