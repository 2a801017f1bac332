//! Model 5: `finish` (the normal, draining path) races the completion of what is still in
//! flight.
//!
//! * `m5_finish_vs_completion`: a local transfer completes while the scheduler finishes the
//!   request. Exactly one release (by `finish` only if the transfer had already ended,
//!   else by `complete`); no transfer can begin once finished; an abort after the finish
//!   (the client left while the last chunk landed) turns the draining room into an
//!   aborting one, or finds it released; the releaser reuses the pages for B at once and
//!   checks them.
//! * `m5_finish_vs_ack_and_dropped_guard`: the same with a writer rank's "done" (`quiesce`)
//!   also racing, and the transfer guard *dropped* without an outcome (early return). A
//!   dropped guard is a *failed* transfer, which holds the room until its peer is fenced:
//!   here the transfer's bytes landed, then its peer rank 1's transport was torn down
//!   (`fence_rank(1)`), then the code path returned early. The drop therefore ends the
//!   hold at once, and a release it performs has no caller to go to: it must be delivered
//!   exactly once, through the release queue (`drain_released`).
//!
//! Threads: 2 (exhaustive) and 3 (preemption bound 3).
#![cfg(loom)]

mod common;

use common::{
    assert_at_rest, check, drain_and_reuse, exactly_one, own_and_check, reuse, Arena, A, B,
    EXHAUSTIVE,
};
use kvfence::{Error, Phase, Quiesced, Reason};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

#[test]
fn m5_finish_vs_completion() {
    check("m5_finish_vs_completion", 2, EXHAUSTIVE, || {
        let table = common::pool(1, 2);
        let arena = Arena::new(2, 1);
        let a = table.open(&[], 2).unwrap();
        let h = a.handle;
        let guard = table.begin_transfer(h).unwrap();
        let ended = Arc::new(AtomicUsize::new(0));

        let scheduler = {
            let (table, arena, ended) = (table.clone(), arena.clone(), ended.clone());
            thread::spawn(move || {
                let mut out = Vec::new();
                if let Some(r) = table.finish(h).expect("first finish") {
                    assert_eq!(
                        ended.load(Ordering::Relaxed),
                        1,
                        "finish released the room while a transfer was in flight"
                    );
                    out.push(r);
                    reuse(&table, &arena, &mut out);
                }
                match table.begin_transfer(h) {
                    Err(Error::RoomClosed {
                        phase: Phase::Draining,
                    })
                    | Err(Error::StaleHandle) => {}
                    other => panic!("a transfer began on a finished room: {other:?}"),
                }
                // The client leaves while the last chunk lands: an abort of a draining room
                // turns it into an aborting one (its release then says `Aborted`), or finds
                // it already released by the completion.
                let aborted = match table.abort(h) {
                    Ok(ab) => {
                        assert!(ab.fanout.is_empty() && ab.released.is_none(), "{ab:?}");
                        match table.abort(h) {
                            // Still aborting, or released by the completion meanwhile.
                            Err(Error::AlreadyAborted | Error::StaleHandle) => {}
                            other => panic!("second abort: {other:?}"),
                        }
                        true
                    }
                    Err(Error::StaleHandle) => false,
                    other => panic!("abort after finish: {other:?}"),
                };
                (out, aborted)
            })
        };

        arena.write(&a.pages, 0, A);
        ended.store(1, Ordering::Relaxed);
        let mut releases = Vec::new();
        if let Some(r) = guard.complete() {
            releases.push(r);
            reuse(&table, &arena, &mut releases);
        }
        let (out, aborted) = scheduler.join().unwrap();
        releases.extend(out);
        // The scheduler's refused begin may have been the last hold (issue 42): queued.
        drain_and_reuse(&table, &arena, h, &mut releases);
        let r = exactly_one(&releases, h);
        let reason = if aborted {
            Reason::Aborted
        } else {
            Reason::Finished
        };
        assert_eq!((&r.pages, r.reason), (&a.pages, reason));
        assert_at_rest(&table, 1, Some(2), 2);
    });
}

#[test]
fn m5_finish_vs_ack_and_dropped_guard() {
    check("m5_finish_vs_ack_and_dropped_guard", 3, Some(3), || {
        let table = common::pool(1, 2);
        // Slot 0: local transfer; slot 1: rank 0.
        let arena = Arena::new(2, 2);
        let a = table.open(&[0], 2).unwrap();
        let h = a.handle;
        // The transfer's peer: rank 1 (its transport carries the writes).
        let guard = table.begin_transfer_to(h, 1).unwrap();
        let ended = Arc::new(AtomicUsize::new(0));

        let rank0 = {
            let (table, arena, ended) = (table.clone(), arena.clone(), ended.clone());
            let pages = a.pages.clone();
            thread::spawn(move || {
                arena.write(&pages, 1, A);
                ended.fetch_add(1, Ordering::Relaxed);
                match table
                    .quiesce(h, 0)
                    .expect("rank 0's done of this lifecycle")
                {
                    Quiesced::Released(r) => {
                        assert_eq!(ended.load(Ordering::Relaxed), 2, "released too early");
                        vec![r]
                    }
                    Quiesced::Recorded => vec![],
                    other => panic!("first done: {other:?}"),
                }
            })
        };
        let scheduler = {
            let (table, ended) = (table.clone(), ended.clone());
            thread::spawn(move || match table.finish(h).expect("first finish") {
                Some(r) => {
                    assert_eq!(
                        ended.load(Ordering::Relaxed),
                        2,
                        "finish released while the transfer or rank 0 was still in flight"
                    );
                    vec![r]
                }
                None => vec![],
            })
        };

        arena.write(&a.pages, 0, A);
        ended.fetch_add(1, Ordering::Relaxed);
        // Rank 1's transport is torn down (its writes landed): nothing of it can land now.
        let fenced = table.fence_rank(1).unwrap();
        assert_eq!((fenced.quiesced, fenced.failed_ended), (0, 0));
        assert!(fenced.released.is_empty(), "the guard still holds the room");
        drop(guard); // early return: no outcome (failed, peer fenced: the hold ends)
        let mut releases = rank0.join().unwrap();
        releases.extend(scheduler.join().unwrap());
        // The drop's release (if it was the last hold) went to the queue.
        table.drain_released(&mut releases);
        let r = exactly_one(&releases, h);
        assert_eq!((&r.pages, r.reason), (&a.pages, Reason::Finished));
        // Nobody wrote after the release: the next owner finds only its own data.
        let b = table.open(&[], 2).unwrap();
        own_and_check(&arena, &b.pages, B);
        releases.push(table.finish(b.handle).unwrap().unwrap());
        assert!(table.readmit_rank(1).unwrap());
        assert_at_rest(&table, 1, Some(2), 2);
    });
}
