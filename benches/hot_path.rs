//! The single-thread hot path of kvfence against the physical limit (a bare atomic pair).
//!
//! * `begin_complete`: `begin_transfer` + `complete` on an uncontended live room, next to
//!   `fetch_add` + `fetch_sub` on an `AtomicU64` (`bare_atomic_pair`, the physical limit),
//!   and the same pair as two load + CAS loops (`bare_cas_pair`: the limit of a design
//!   whose hold checks the room's phase and generation *before* it is taken, as kvfence's
//!   did until issue 42; it now takes it with one `fetch_add` and checks the value that
//!   returned, see `src/room_word.rs`).
//! * `quiesce`: one writer rank's ACK on a live room of 64 ranks (2 of every 64 calls also
//!   drop the mask word's hold on the room word; none releases).
//! * `abort_ack_release`: abort a room of 16 pages and 8 writer ranks, then the 8 ACKs, the
//!   last of which releases it (rooms are opened outside the timed region).
//! * `open_finish_release`: open a room of 1, 16 or 256 pages with no writer ranks, finish
//!   it (which releases it at once). Includes the `Vec<u32>` page list `open` returns.
//!
//! * `lifecycle_waiter`: one whole lifecycle (open 16 pages for 8 ranks, 2 transfers,
//!   abort, 8 ACKs, release) with nobody waiting (`no_waiter`), and with one thread parked
//!   in `wait_released` on *another* room for the whole measurement
//!   (`parked_waiter_other_room`): waits are per room, so the two should match (issue 9,
//!   finding 4: a single waiter used to cost every release of every room a shared
//!   `fetch_add` and a futex wake).
//! * `gate_lifecycle`: one whole gate-mode lifecycle (issue 10's target): `open_gate` with
//!   16 engine pages and 8 writer ranks, 2 transfers, abort, 8 ACKs (the last queues the
//!   release), `drain_released` and the engine's free, on a gate-mode table with the
//!   release queue.
//!
//! The baseline tracker runs the same workloads in `benches/baseline.rs`, under the same
//! group names, so the results table can put them side by side; both call the one
//! generic version of each workload in `benches/common`.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

mod common;

use common::{bare_pair, config, lifecycle, table, Tracker};
use criterion::{criterion_group, criterion_main, Criterion};
use kvfence::RoomTable;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

fn hot_path(c: &mut Criterion) {
    let word = AtomicU64::new(0);
    common::single_thread(c, "kvfence", table, |g| {
        g.bench_function("bare_atomic_pair", |b| b.iter(|| bare_pair(&word)));
        // Diagnostic: the same pair done as load + CAS loops, the form a hold took before
        // issue 42 (checked before it is added; now one `fetch_add`, checked after).
        g.bench_function("bare_cas_pair", |b| b.iter(|| bare_cas_pair(&word)));
    });
}

/// Lifecycles on a table with and without a thread parked on an unrelated room.
fn lifecycle_waiter(c: &mut Criterion) {
    let mut g = c.benchmark_group("lifecycle_waiter");
    let writers = <RoomTable as Tracker>::writers(common::LIFE_RANKS);
    let t = table();
    g.bench_function("no_waiter", |b| b.iter(|| lifecycle(&t, &mut (), &writers)));
    let t = table();
    // A room that stays closing (rank 0 never ACKs) while the waiter sleeps on it.
    let parked = t.open(&[0], 1).unwrap().handle;
    let _ = t.abort(parked).unwrap();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| t.wait_released(parked).unwrap());
        // Let the waiter register and park before the clock starts.
        std::thread::sleep(std::time::Duration::from_millis(50));
        g.bench_function("parked_waiter_other_room", |b| {
            b.iter(|| lifecycle(&t, &mut (), &writers))
        });
        let _ = t.quiesce(parked, 0).unwrap();
        waiter.join().unwrap();
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

criterion_group! {
    name = benches;
    config = config();
    targets = hot_path, lifecycle_waiter
}
criterion_main!(benches);
