//! Draining `k` queued releases out of a 2^18-room table (issue 18, item 6), single thread.
//!
//! `one_pass/k/where`: [`RoomTable::drain_released`] (one pass over the queue's bitmap,
//! every bit of a word taken with one `swap`). `pop_loop/k/where`: the drain before issue
//! 18, one [`RoomTable::pop_released`] per release, each scanning from word 0 (the same
//! loop `drain_released` was). `where` is `bottom` (the k lowest room indices) or `top`
//! (the k highest: the worst case of the pop loop). Only the drain is timed: before each
//! drain `k` owned rooms are finished (queued), after it they are opened again.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvfence::{Config, Released, RoomHandle, RoomTable};
use std::hint::black_box;
use std::time::{Duration, Instant};

const ROOMS: usize = 1 << 18;

struct Setup {
    table: RoomTable,
    handles: Vec<RoomHandle>,
}

impl Setup {
    fn new() -> Setup {
        let table = RoomTable::new(Config::gate(ROOMS).release_queue(true)).expect("table");
        let mut handles: Vec<RoomHandle> = (0..ROOMS)
            .map(|i| table.open_gate(&[], i as u64, vec![]).expect("open"))
            .collect();
        handles.sort_by_key(|h| h.index());
        Setup { table, handles }
    }

    /// Finishes rooms `range` (queued), runs `drain`, re-opens them; the drain's time.
    fn once(
        &mut self,
        range: std::ops::Range<usize>,
        drain: &dyn Fn(&RoomTable, &mut Vec<Released>),
    ) -> Duration {
        for h in &self.handles[range.clone()] {
            assert!(self.table.finish(*h).expect("finish").is_none());
        }
        let mut out = Vec::with_capacity(range.len());
        let start = Instant::now();
        drain(&self.table, &mut out);
        let took = start.elapsed();
        assert_eq!(out.len(), range.len());
        black_box(&out);
        for i in range {
            let h = self.table.open_gate(&[], i as u64, vec![]).expect("reopen");
            self.handles[h.index()] = h;
        }
        took
    }
}

fn one_pass(table: &RoomTable, out: &mut Vec<Released>) {
    table.drain_released(out);
}

fn pop_loop(table: &RoomTable, out: &mut Vec<Released>) {
    while let Some(r) = table.pop_released() {
        out.push(r);
    }
}

fn bench(c: &mut Criterion) {
    let mut setup = Setup::new();
    let mut group = c.benchmark_group("drain");
    for k in [1usize, 64, 2048] {
        group.throughput(Throughput::Elements(k as u64));
        for (place, range) in [("bottom", 0..k), ("top", ROOMS - k..ROOMS)] {
            for (name, f) in [
                (
                    "one_pass",
                    &one_pass as &dyn Fn(&RoomTable, &mut Vec<Released>),
                ),
                ("pop_loop", &pop_loop),
            ] {
                group.bench_function(BenchmarkId::new(format!("{name}/{k}"), place), |b| {
                    b.iter_custom(|iters| (0..iters).map(|_| setup.once(range.clone(), f)).sum())
                });
            }
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
