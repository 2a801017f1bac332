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

use common::{bench_threads, config, table, Baseline, BATCHES, PAGES};

/// Batch size and thread counts of the contended variant.
const MT_BATCH: usize = 16;
const MT_THREADS: [usize; 3] = [2, 8, 16];
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvfence::RoomTable;
use std::hint::black_box;

/// kvfence's batch claim + free: `open(n)` with no writer ranks, then `abort` (which
/// releases at once); returns the page list `open` allocated.
#[inline]
fn claim_free(table: &RoomTable, nobody: &[u32], n: usize) -> Vec<u32> {
    let room = table.open(nobody, n).expect("open");
    let aborted = table.abort(room.handle).expect("abort");
    assert_eq!(aborted.released.map(|r| r.pages.len()), Some(n));
    room.pages
}

/// The peers' batch claim + free on the baseline's `Mutex<Vec<u32>>` free list.
#[inline]
fn list_claim_free(list: &Baseline, n: usize) -> Vec<u32> {
    let got = list.claim_pages(n).expect("claim");
    list.free_pages(&got);
    got
}

fn pages(c: &mut Criterion) {
    let mut g = c.benchmark_group("pages_claim_free");
    let table = table();
    let list = Baseline::new(PAGES);
    let nobody: [u32; 0] = [];
    for n in BATCHES {
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new("kvfence", n), &n, |b, &n| {
            b.iter(|| claim_free(&table, &nobody, black_box(n)))
        });
        g.bench_with_input(BenchmarkId::new("mutex_list", n), &n, |b, &n| {
            b.iter(|| list_claim_free(&list, black_box(n)))
        });
    }
    g.finish();

    // Contended: T threads each claiming and freeing batches of 16 pages on one pool.
    let mut g = c.benchmark_group("pages_claim_free_threads");
    g.throughput(Throughput::Elements(MT_BATCH as u64));
    for threads in MT_THREADS {
        bench_threads(&mut g, "kvfence", threads, |_, n| {
            for _ in 0..n {
                black_box(claim_free(&table, &nobody, MT_BATCH));
            }
        });
        bench_threads(&mut g, "mutex_list", threads, |_, n| {
            for _ in 0..n {
                black_box(list_claim_free(&list, MT_BATCH));
            }
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = pages
}
criterion_main!(benches);
