//! Model 1: `abort` races a local transfer already in flight.
//!
//! Guarantee: the room is released exactly once, by the transfer's `complete` (never by the
//! abort, which must find the hold), so the page's next owner never sees the transfer's
//! writes land in its pages. Whoever performs the release immediately reuses the pages for
//! a new request B and checks them.
//!
//! Threads: 2 (main = the transfer, one = the scheduler that aborts). Exhaustive.
#![cfg(loom)]

mod common;

use common::{assert_at_rest, check, exactly_one, reuse, Arena, A, EXHAUSTIVE};
use kvfence::{Phase, RankSet};
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

/// The releaser's duty: open a new room on the freed pages, write them as B, check them,
/// and finish B (which releases it at once: nothing holds it).
#[test]
fn m1_abort_vs_transfer_in_flight() {
    check("m1_abort_vs_transfer_in_flight", 2, EXHAUSTIVE, || {
        let table = common::table(1, 2, 1);
        let arena = Arena::new(2, 1);
        let a = table.open(2, &RankSet::new()).unwrap();
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

        // The transfer: write A's data into the pages it holds, then end.
        guard.with_pages(|pages| {
            assert_eq!(pages, &a.pages[..]);
            arena.write(pages, 0, A);
        });
        let mut releases = Vec::new();
        ending.store(true, Ordering::Relaxed);
        if let Some(r) = guard.complete() {
            releases.push(r);
            reuse(&table, &arena, &mut releases);
        }
        releases.extend(scheduler.join().unwrap());
        let r = exactly_one(&releases, h);
        assert_eq!((r.pages, r.phase), (2, Phase::Aborting));
        assert_eq!(table.phase(h).unwrap(), Phase::Free);
        assert_at_rest(&table, 1, 2, 2);
    });
}
