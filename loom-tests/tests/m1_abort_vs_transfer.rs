//! Model 1: `abort` races a local transfer already in flight.
//!
//! Guarantee: the room is released exactly once, by the transfer's `complete` (never by the
//! abort, which must find the hold), so the page's next owner never sees the transfer's
//! writes land in its pages. Whoever performs the release immediately reuses the pages for
//! a new request B and checks them.
//!
//! * `m1_abort_vs_transfer_in_flight`: pool mode, releases returned by the call that
//!   performs them. Threads: 2 (main = the transfer, one = the scheduler that aborts).
//!   Exhaustive.
//! * `m1_gate_queue_abort_vs_transfer`: the same race in gate mode with the release queue
//!   (the engine owns the pages; every release is queued and delivered by `pop_released`).
//!   The scheduler drains the queue once right after its abort, racing the transfer's
//!   `complete`; whoever pops A's release (that drain, or the scheduler's next loop after
//!   the join) hands its pages to B (the engine's allocator): a release delivered while
//!   the transfer still writes is a loom data race on a page cell or the `ending`
//!   assertion. Threads: 2. Exhaustive.
#![cfg(loom)]

mod common;

use common::{
    assert_at_rest, check, drain_and_reuse, exactly_one, reuse, reuse_gate, Arena, A, B, EXHAUSTIVE,
};
use kvfence::{Phase, Reason, Released, RoomTable};
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

#[test]
fn m1_abort_vs_transfer_in_flight() {
    check("m1_abort_vs_transfer_in_flight", 2, EXHAUSTIVE, || {
        let table = common::pool(1, 2);
        let arena = Arena::new(2, 1);
        let a = table.open(&[], 2).unwrap();
        let h = a.handle;
        let guard = table.begin_transfer(h).unwrap();
        // Set by the transfer right before `complete`: a release by the abort is legal only
        // if it happens-after this (the transfer had ended before the abort).
        let ending = Arc::new(AtomicBool::new(false));

        let scheduler = {
            let (table, arena, ending) = (table.clone(), arena.clone(), ending.clone());
            thread::spawn(move || {
                let mut out = Vec::new();
                let aborted = table.abort(h).expect("first abort of a live room");
                assert!(aborted.fanout.is_empty());
                if let Some(r) = aborted.released {
                    assert!(
                        ending.load(Ordering::Relaxed),
                        "abort released the room while a transfer was in flight"
                    );
                    out.push(r);
                    reuse(&table, &arena, &mut out);
                }
                // A queued intent after the abort is refused.
                assert!(table.begin_transfer(h).is_err());
                out
            })
        };

        // The transfer: write A's data into the pages `open` gave, then end.
        arena.write(&a.pages, 0, A);
        let mut releases = Vec::new();
        ending.store(true, Ordering::Relaxed);
        if let Some(r) = guard.complete() {
            releases.push(r);
            reuse(&table, &arena, &mut releases);
        }
        releases.extend(scheduler.join().unwrap());
        // The scheduler's refused begin may have been the last hold (issue 42): queued.
        drain_and_reuse(&table, &arena, h, &mut releases);
        let r = exactly_one(&releases, h);
        assert_eq!((&r.pages, r.reason), (&a.pages, Reason::Aborted));
        assert_eq!(table.phase(h).unwrap(), Phase::Free);
        assert_at_rest(&table, 1, Some(2), 2);
    });
}

/// Gate mode + queue: one `pop_released`; if it is A's release, the engine reuses its pages
/// for B (asserting the transfer had ended), else it is kept for the final count.
fn drain_once(
    table: &RoomTable,
    arena: &Arena,
    a: kvfence::RoomHandle,
    ending: &AtomicBool,
    out: &mut Vec<Released>,
) {
    if let Some(r) = table.pop_released() {
        if r.handle == a {
            assert!(
                ending.load(Ordering::Relaxed),
                "A's release was delivered while its transfer was in flight"
            );
            reuse_gate(table, arena, &r, out);
        }
        out.push(r);
    }
}

#[test]
fn m1_gate_queue_abort_vs_transfer() {
    check("m1_gate_queue_abort_vs_transfer", 2, EXHAUSTIVE, || {
        let table = common::gate(1, true);
        let arena = Arena::new(2, 1);
        // Request slot 7, engine pages 0 and 1.
        let h = table.open_gate(&[], 7, vec![0, 1]).unwrap();
        let guard = table.begin_transfer_to(h, 3).unwrap();
        let ending = Arc::new(AtomicBool::new(false));

        let scheduler = {
            let (table, arena, ending) = (table.clone(), arena.clone(), ending.clone());
            thread::spawn(move || {
                let mut out = Vec::new();
                let aborted = table.abort(h).expect("first abort of a live room");
                assert!(aborted.fanout.is_empty());
                assert!(
                    aborted.released.is_none(),
                    "queue mode: releases are queued"
                );
                assert!(table.begin_transfer(h).is_err());
                // The scheduler loop's drain.
                drain_once(&table, &arena, h, &ending, &mut out);
                out
            })
        };

        arena.write(&[0, 1], 0, A);
        ending.store(true, Ordering::Relaxed);
        assert!(
            guard.complete().is_none(),
            "queue mode: releases are queued"
        );
        let mut releases = scheduler.join().unwrap();
        // What the scheduler's drain did not get (queued after it looked): its next loop.
        while let Some(r) = table.pop_released() {
            if r.handle == h {
                reuse_gate(&table, &arena, &r, &mut releases);
            }
            releases.push(r);
        }
        let r = exactly_one(&releases, h);
        assert_eq!(
            (r.token, &r.pages[..], r.reason),
            (7, &[0u32, 1][..], Reason::Aborted)
        );
        let b: Vec<_> = releases.iter().filter(|r| r.token == B).collect();
        assert_eq!(b.len(), 1, "B released once: {releases:?}");
        arena.expect(&[0, 1], B);
        assert_at_rest(&table, 1, None, 2);
    });
}
