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
//! group names, so the results table can put them side by side; both call the one
//! generic version of each workload in `benches/common`.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

mod common;

use common::{bare_pair, config, table};
use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

fn hot_path(c: &mut Criterion) {
    let word = AtomicU64::new(0);
    common::single_thread(c, "kvfence", table, |g| {
        g.bench_function("bare_atomic_pair", |b| b.iter(|| bare_pair(&word)));
        // Diagnostic: the same pair done as load + CAS loops, the form every room-word
        // transition takes (it must check phase and generation before adding a hold).
        g.bench_function("bare_cas_pair", |b| b.iter(|| bare_cas_pair(&word)));
    });
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

criterion_group! {
    name = benches;
    config = config();
    targets = hot_path
}
criterion_main!(benches);
