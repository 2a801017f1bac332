//! Model 10: a *failed* transfer (the transfer engine reported an error or a timeout: its
//! outcome is unknown, its bytes may still land) races the request's abort and its writer
//! rank's ACK.
//!
//! Guarantee: the room is not released, so its pages are not reused, until the failed
//! transfer's peer rank is fenced (`fence_rank(peer)`: its transport is torn down, nothing
//! of it can land any more). The late landing is modelled as a write into the pages *after*
//! `fail()` returned; the fence is issued once that write has ended (the teardown waits for
//! the NIC to go quiet) and races the abort and the ACK. Whoever performs the release (the
//! ACK, or the fence) reuses the pages for B at once: a release before the late write ended
//! is a loom data race on a page cell, and the releaser also asserts that the fence began.
//!
//! * `m10_failed_transfer`: guard form (`begin_transfer_owned(.., Some(1))` / `fail()`: the
//!   guard moves to the NIC's completion thread). Threads: 3
//!   (main = the failure detector: waits for the NIC, then fences rank 1; one = the NIC:
//!   `fail()` then the late write; one = the scheduler: `abort`, then rank 0 drains and
//!   ACKs). Preemption bound 3.
//! * `m10_failed_token_then_fence`: token form (`begin(h, Some(1))` /
//!   `end(token, Outcome::Failed)`); the NIC thread itself fences after its late write.
//!   Threads: 2. Exhaustive.
//!
//! Mutation `kvfence_failed_counts_as_drained` (a failed transfer drops its hold like a
//! completed one) fails both: the ACK releases the room while the late write is still to
//! land (data race / "released before the fence"), or `fail()` itself returns the release.
#![cfg(loom)]

mod common;

use common::{assert_at_rest, check, exactly_one, reuse, Arena, A, EXHAUSTIVE};
use kvfence::{Error, Outcome, Quiesced, Reason, Released, RoomTable};
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

/// The releaser's duty: the fence of the failed transfer's peer must have begun; then reuse.
fn on_release(
    r: Released,
    fencing: &AtomicBool,
    table: &RoomTable,
    arena: &Arena,
    out: &mut Vec<Released>,
) {
    assert!(
        fencing.load(Ordering::Relaxed),
        "the room was released before the failed transfer's peer was fenced: {r:?}"
    );
    out.push(r);
    reuse(table, arena, out);
}

/// The scheduler: abort A (nothing is released: rank 0 and the transfer hold it), then
/// rank 0 drains its last write and ACKs.
fn abort_then_ack(
    table: &RoomTable,
    arena: &Arena,
    a: &kvfence::Opened,
    fencing: &AtomicBool,
) -> Vec<Released> {
    let h = a.handle;
    let mut out = Vec::new();
    let aborted = table.abort(h).expect("first abort");
    assert!(aborted.released.is_none(), "abort released a held room");
    assert_eq!(&aborted.fanout[..], &[0]);
    arena.write(&a.pages, 1, A);
    match table.quiesce(h, 0).expect("rank 0's ACK of this lifecycle") {
        Quiesced::Released(r) => on_release(r, fencing, table, arena, &mut out),
        Quiesced::Recorded => {}
        other => panic!("rank 0's ACK: {other:?}"),
    }
    out
}

#[test]
fn m10_failed_transfer() {
    check("m10_failed_transfer", 3, Some(3), || {
        let table = common::pool_std(1, 2);
        // Slot 0: the transfer (peer rank 1); slot 1: writer rank 0.
        let arena = Arena::new(2, 2);
        let a = Arc::new(table.open(&[0], 2).unwrap());
        let h = a.handle;
        let guard = RoomTable::begin_transfer_owned(&table, h, Some(1)).unwrap();
        let fencing = Arc::new(AtomicBool::new(false));

        let scheduler = {
            let (table, arena, a, fencing) =
                (table.clone(), arena.clone(), a.clone(), fencing.clone());
            thread::spawn(move || abort_then_ack(&table, &arena, &a, &fencing))
        };
        let nic = {
            let (arena, a) = (arena.clone(), a.clone());
            thread::spawn(move || {
                // The transfer engine reports an error: the outcome is unknown.
                let released = guard.fail();
                assert!(
                    released.is_none(),
                    "a failed transfer released the room before its peer was fenced: \
                     {released:?}"
                );
                // ...and its bytes land anyway, late.
                arena.write(&a.pages, 0, A);
            })
        };

        // The failure detector: once the NIC is quiet (its late write ended), rank 1's
        // transport is torn down and the rank fenced.
        nic.join().unwrap();
        fencing.store(true, Ordering::Relaxed);
        let fenced = table.fence_rank(1).unwrap();
        let mut releases = Vec::new();
        for r in fenced.released {
            on_release(r, &fencing, &table, &arena, &mut releases);
        }
        releases.extend(scheduler.join().unwrap());
        let r = exactly_one(&releases, h);
        assert_eq!((&r.pages, r.reason), (&a.pages, Reason::Aborted));
        // Bookkeeping, checked last so that a broken rule fails on the pages first.
        assert_eq!(
            (fenced.quiesced, fenced.failed_ended),
            (0, 1),
            "the fence must end the failed transfer"
        );
        assert_eq!(table.stats().failed_transfers, 1);
        assert!(table.readmit_rank(1).unwrap());
        assert_at_rest(&table, 1, Some(2), 2);
    });
}

#[test]
fn m10_failed_token_then_fence() {
    check("m10_failed_token_then_fence", 2, EXHAUSTIVE, || {
        let table = common::pool(1, 2);
        let arena = Arena::new(2, 2);
        let a = Arc::new(table.open(&[0], 2).unwrap());
        let h = a.handle;
        let token = table.begin(h, Some(1)).unwrap();
        let fencing = Arc::new(AtomicBool::new(false));

        let scheduler = {
            let (table, arena, a, fencing) =
                (table.clone(), arena.clone(), a.clone(), fencing.clone());
            thread::spawn(move || abort_then_ack(&table, &arena, &a, &fencing))
        };

        // The NIC's completion queue reports an error for the token (over FFI: the wire
        // form), its bytes land late, then the rank's transport is torn down.
        // (Assertions in the main thread come after the join: a main-thread panic while
        // another model thread lives aborts the test process instead of failing it.)
        let released = table.end(token, Outcome::Failed).unwrap();
        let twice = table.end(token, Outcome::Completed);
        arena.write(&a.pages, 0, A);
        fencing.store(true, Ordering::Relaxed);
        let fenced = table.fence_rank(1).unwrap();
        let mut releases = scheduler.join().unwrap();
        assert!(
            released.is_none(),
            "a failed transfer released the room before its peer was fenced: {released:?}"
        );
        assert_eq!(twice, Err(Error::InvalidToken));
        for r in fenced.released {
            on_release(r, &fencing, &table, &arena, &mut releases);
        }
        let r = exactly_one(&releases, h);
        assert_eq!((&r.pages, r.reason), (&a.pages, Reason::Aborted));
        assert_eq!(
            fenced.failed_ended, 1,
            "the fence must end the failed transfer"
        );
        assert!(table.readmit_rank(1).unwrap());
        assert_at_rest(&table, 1, Some(2), 2);
    });
}
