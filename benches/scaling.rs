//! Independent room lifecycles on one shared table, T = 1, 2, 4, 8, 16 threads.
//!
//! Each thread runs whole lifecycles: open 16 pages for 8 writer ranks, 2 local transfers
//! (begin + complete), abort, 8 ACKs (the last releases). One criterion iteration is one
//! lifecycle, whichever thread runs it, so the reported time is wall time per lifecycle
//! of the whole machine and the throughput is total lifecycles per second. Threads are
//! spawned before the clock starts (see `common::run_threads`; the workload is
//! `common::scaling`, generic over the tracker).
//!
//! `kvfence/T` runs on one shared `RoomTable`, `baseline/T` on the peer-style tracker, and
//! `kvfence_private/T` (a diagnostic) gives each thread a table of its own: the ideal with
//! nothing shared, against which `kvfence/T` shows what sharing the table costs.
//!
//! `scaling_gate_lifecycle` does the same with gate-mode lifecycles (issue 10's target):
//! `open_gate` with 16 engine pages and 8 writer ranks, 2 transfers, abort, 8 ACKs (the last
//! queues the release), the thread drains the release queue and frees the pages (it may
//! drain another thread's release: each is delivered once). `kvfence/T` on one shared
//! gate-mode table with the release queue, `baseline/T` on the peer-style tracker recording
//! the engine's pages and queueing releases on a `Mutex<Vec<_>>`.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

mod common;

use common::{config, gate_table, table, Baseline, Tracker, PAGES, ROOMS, THREADS};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

fn scaling(c: &mut Criterion) {
    let mut g = c.benchmark_group("scaling_lifecycle");
    g.throughput(Throughput::Elements(1));
    let table = table();
    common::scaling(&mut g, "kvfence", |_| &table);
    assert_eq!(table.stats().pages.free, PAGES, "kvfence leaked pages");
    // Diagnostic: the same lifecycles, each thread on a table of its own (nothing shared
    // at all). If `kvfence/T` falls behind `kvfence_private/T`, something in the shared
    // table (a cache line every lifecycle writes) costs the difference.
    let most = THREADS.iter().copied().max().unwrap_or(1);
    let tables: Vec<_> = (0..most).map(|_| common::table()).collect();
    common::scaling(&mut g, "kvfence_private", |thread| &tables[thread]);
    let tracker = Baseline::new(PAGES);
    common::scaling(&mut g, "baseline", |_| &tracker);
    assert_eq!(
        tracker.usage(),
        (PAGES, 0),
        "baseline leaked pages or rooms"
    );
    g.finish();

    let mut g = c.benchmark_group("scaling_gate_lifecycle");
    g.throughput(Throughput::Elements(1));
    let table = gate_table();
    common::scaling_gate(&mut g, "kvfence", |_| &table);
    let s = table.stats();
    assert_eq!(
        (s.rooms.free, s.rooms.queued, table.queued_releases()),
        (ROOMS, 0, 0),
        "kvfence gate mode leaked rooms or releases"
    );
    let tracker = <Baseline as Tracker>::gate();
    common::scaling_gate(&mut g, "baseline", |_| &tracker);
    assert_eq!(tracker.usage(), (0, 0), "baseline leaked rooms");
    g.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = scaling
}
criterion_main!(benches);
