//! The single-thread hot path of kvfence against the physical limit (a bare atomic pair).
//!
//! * `begin_complete`: `begin_transfer` + `complete` on an uncontended live room, next to
//!   `fetch_add` + `fetch_sub` on an `AtomicU64` (`bare_atomic_pair`, the physical limit),
//!   and the same pair as two load + CAS loops (`bare_cas_pair`, the limit of any design
//!   whose hold must check the room's phase and generation before it is taken).
//! * `quiesce`: one writer rank's ACK on a live room of 64 ranks (2 of every 64 calls also
//!   drop the mask word's hold on the room word; none releases).
//! * `abort_ack_release`: abort a room of 16 pages and 8 writer ranks, then the 8 ACKs, the
//!   last of which releases it (rooms are opened outside the timed region).
//! * `open_finish_release`: open a room of 1, 16 or 256 pages with no writer ranks, finish
//!   it (which releases it at once). Includes the `Vec<u32>` page list `open` returns.
//!
//! The baseline tracker runs the same workloads in `benches/baseline.rs`, under the same
//! group names, so the results table can put them side by side.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

mod common;

use common::{bare_pair, config, open_idle_room, table, OPEN_PAGES};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use kvfence::{Quiesced, RankSet, RoomHandle, RoomTable};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Ranks per room in the quiesce benchmark.
const Q_RANKS: u32 = 64;
/// Rooms opened per untimed setup round.
const BATCH_ROOMS: u64 = 256;

fn begin_complete(c: &mut Criterion) {
    let mut g = c.benchmark_group("begin_complete");
    let word = AtomicU64::new(0);
    g.bench_function("bare_atomic_pair", |b| b.iter(|| bare_pair(&word)));
    // Diagnostic: the same pair done as load + CAS loops, the form every room-word
    // transition takes (it must check phase and generation before adding a hold).
    g.bench_function("bare_cas_pair", |b| b.iter(|| bare_cas_pair(&word)));
    let table = table();
    let room = open_idle_room(&table);
    g.bench_function("kvfence", |b| {
        b.iter(|| {
            let guard = table
                .begin_transfer(black_box(room))
                .expect("begin_transfer");
            black_box(guard.complete())
        })
    });
    g.finish();
}

/// `+1` then `-1` on `word`, each as a load followed by a `compare_exchange_weak` loop.
#[inline(always)]
fn bare_cas_pair(word: &AtomicU64) {
    let word = black_box(word);
    for delta in [1u64, u64::MAX] {
        let mut cur = word.load(Ordering::Acquire);
        while let Err(actual) = word.compare_exchange_weak(
            cur,
            cur.wrapping_add(delta),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            cur = actual;
        }
    }
}

/// Opens `n` rooms of `pages` pages for `ranks` writer ranks (untimed setup).
fn open_rooms(table: &RoomTable, n: u64, pages: usize, ranks: u32) -> Vec<RoomHandle> {
    let writers = RankSet::first(ranks as usize).expect("ranks in range");
    (0..n)
        .map(|_| table.open(pages, &writers).expect("open").handle)
        .collect()
}

fn quiesce(c: &mut Criterion) {
    let mut g = c.benchmark_group("quiesce");
    let table = table();
    g.bench_function("kvfence", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let rooms = open_rooms(
                    &table,
                    left.div_ceil(Q_RANKS as u64).min(BATCH_ROOMS),
                    1,
                    Q_RANKS,
                );
                let n = left.min(rooms.len() as u64 * Q_RANKS as u64);
                let start = Instant::now();
                for i in 0..n {
                    let room = rooms[(i / Q_RANKS as u64) as usize];
                    let out = table.quiesce(black_box(room), (i % Q_RANKS as u64) as u32);
                    assert_eq!(out, Ok(Quiesced::Recorded));
                }
                total += start.elapsed();
                left -= n;
                // Untimed cleanup: the rest of the ACKs, then finish releases each room.
                for i in n..rooms.len() as u64 * Q_RANKS as u64 {
                    let room = rooms[(i / Q_RANKS as u64) as usize];
                    let _ = table
                        .quiesce(room, (i % Q_RANKS as u64) as u32)
                        .expect("quiesce");
                }
                for room in rooms {
                    assert!(table.finish(room).expect("finish").is_some());
                }
            }
            total
        })
    });
    g.finish();
}

fn abort_ack_release(c: &mut Criterion) {
    let mut g = c.benchmark_group("abort_ack_release");
    let table = table();
    g.bench_function("kvfence", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let rooms = open_rooms(&table, left.min(BATCH_ROOMS), 16, 8);
                let start = Instant::now();
                for &room in &rooms {
                    let aborted = table.abort(black_box(room)).expect("abort");
                    let mut released = false;
                    for rank in aborted.fanout.iter() {
                        released |= matches!(
                            table.quiesce(room, rank).expect("quiesce"),
                            Quiesced::Released(_)
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
    let table = table();
    let nobody = RankSet::new();
    for pages in OPEN_PAGES {
        g.bench_with_input(BenchmarkId::new("kvfence", pages), &pages, |b, &pages| {
            b.iter(|| {
                let room = table.open(black_box(pages), &nobody).expect("open");
                let released = table.finish(room.handle).expect("finish");
                assert_eq!(released.map(|r| r.pages), Some(pages));
                room.pages
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
