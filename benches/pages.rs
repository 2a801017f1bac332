//! Claiming and freeing batches of 1, 16, 256 and 4096 pages, single thread.
//!
//! kvfence's page pool is not public: a batch claim is only reachable through `open(n)`
//! and a batch free through the release, so `kvfence/n` is `open(n)` with no writer ranks
//! followed by `abort`, which releases at once. That also claims and frees a room index
//! and allocates the returned page list: the pool's own cost is lower than what is shown.
//! `mutex_list/n` is the peers' free list: `Mutex<Vec<u32>>`, claim = `split_off` of the
//! last n entries under the lock (one allocation, like kvfence's list), free =
//! `extend_from_slice` under the lock. Throughput is pages per second.
//!
//! `pages_claim_free_threads`: the same with T = 2, 8, 16 threads each claiming and freeing
//! batches of 16 pages on one shared pool (one iteration = one batch on any thread).

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

mod common;

use common::{config, run_threads, table, Baseline, BATCHES, PAGES};

/// Batch size and thread counts of the contended variant.
const MT_BATCH: usize = 16;
const MT_THREADS: [usize; 3] = [2, 8, 16];
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvfence::RankSet;
use std::hint::black_box;

fn pages(c: &mut Criterion) {
    let mut g = c.benchmark_group("pages_claim_free");
    let table = table();
    let list = Baseline::new(PAGES);
    let nobody = RankSet::new();
    for n in BATCHES {
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new("kvfence", n), &n, |b, &n| {
            b.iter(|| {
                let room = table.open(black_box(n), &nobody).expect("open");
                let aborted = table.abort(room.handle).expect("abort");
                assert_eq!(aborted.released.map(|r| r.pages), Some(n));
                room.pages
            })
        });
        g.bench_with_input(BenchmarkId::new("mutex_list", n), &n, |b, &n| {
            b.iter(|| {
                let got = list.claim_pages(black_box(n)).expect("claim");
                list.free_pages(&got);
                got
            })
        });
    }
    g.finish();

    // Contended: T threads each claiming and freeing batches of 16 pages on one pool.
    let mut g = c.benchmark_group("pages_claim_free_threads");
    g.throughput(Throughput::Elements(MT_BATCH as u64));
    for threads in MT_THREADS {
        g.bench_with_input(BenchmarkId::new("kvfence", threads), &threads, |b, &t| {
            b.iter_custom(|iters| {
                run_threads(t, iters, |_, n| {
                    for _ in 0..n {
                        let room = table.open(MT_BATCH, &nobody).expect("open");
                        let aborted = table.abort(room.handle).expect("abort");
                        assert_eq!(aborted.released.map(|r| r.pages), Some(MT_BATCH));
                        black_box(room.pages);
                    }
                })
            })
        });
        g.bench_with_input(
            BenchmarkId::new("mutex_list", threads),
            &threads,
            |b, &t| {
                b.iter_custom(|iters| {
                    run_threads(t, iters, |_, n| {
                        for _ in 0..n {
                            let got = list.claim_pages(MT_BATCH).expect("claim");
                            list.free_pages(&got);
                            black_box(got);
                        }
                    })
                })
            },
        );
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = pages
}
criterion_main!(benches);
