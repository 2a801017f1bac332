//! The worst case: T = 1, 2, 4, 8, 16 threads all doing `begin_transfer` + `complete` on
//! ONE room (every operation CASes the same room word), against T threads doing
//! `fetch_add` + `fetch_sub` on one shared `AtomicU64` (the physical limit of a shared
//! counter). One iteration is one begin/complete pair on any thread: the reported time is
//! wall time per pair of the whole machine.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

mod common;

use common::{bare_pair, bench_threads, config, open_idle_room, table, transfer, THREADS};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use std::sync::atomic::AtomicU64;

/// A word alone on its cache lines, like a room word in its padded slot.
#[repr(align(128))]
struct Line(AtomicU64);

fn hot_room(c: &mut Criterion) {
    let mut g = c.benchmark_group("hot_room");
    g.throughput(Throughput::Elements(1));
    let word = Line(AtomicU64::new(0));
    for threads in THREADS {
        bench_threads(&mut g, "bare_atomic_pair", threads, |_, n| {
            for _ in 0..n {
                bare_pair(&word.0);
            }
        });
    }
    let table = table();
    let room = open_idle_room(&table);
    for threads in THREADS {
        bench_threads(&mut g, "kvfence", threads, |_, n| {
            for _ in 0..n {
                assert!(transfer(&table, black_box(room)).is_none());
            }
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = hot_room
}
criterion_main!(benches);
