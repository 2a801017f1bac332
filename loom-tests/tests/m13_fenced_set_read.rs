//! Model 13 (issue 18, item 1): the fenced set's lock-free membership read races
//! `readmit_rank` and `fence_rank` of *other* ranks. The reader is `fail()` of a transfer
//! whose peer (rank 1) stays fenced the whole time: it reads the set (under the registry
//! lock, not under `fence_lock`) to decide whether to drop its hold at once (peer fenced:
//! nothing of the transfer can land any more) or to register the failure for the peer's
//! next fence.
//!
//! Guarantee: rank 1 is fenced before the model's threads start and is never re-admitted,
//! so `fail()` must find it and drop its hold: the aborted room (nothing else holds it) is
//! released by `fail()` itself. Were rank 1 missed, the failure would be registered after
//! rank 1's fence already swept the registry, and the room would be held until rank 1 is
//! fenced again (the model then finds `fail()` returning `None` and the room still held).
//!
//! Set-up: `max_fenced(2)`; rank 0 fenced first, rank 1 second (rank 1 is in the last
//! entry). Threads: 2 (main = the transfer engine's completion thread: `fail()`; one = the
//! failure detector: `readmit_rank(0)` then `fence_rank(2)`). Exhaustive.
//!
//! Mutation `kvfence_moving_fenced_set` (the pre-fix set: readmit moves the last entry
//! into the removed one's place, the next fence reuses the last place) must fail it: the
//! reader loads entry 0 (still rank 0), the readmit moves rank 1 into entry 0 and empties
//! entry 1, the reader loads entry 1 (empty, or rank 2): rank 1 is missed.
#![cfg(loom)]

mod common;

use common::{assert_at_rest, check, EXHAUSTIVE};
use kvfence::Reason;
use loom::thread;

#[test]
fn m13_fail_vs_readmit_and_fence_of_other_ranks() {
    check(
        "m13_fail_vs_readmit_and_fence_of_other_ranks",
        2,
        EXHAUSTIVE,
        || {
            let table = common::gate(1, false);
            let _ = table.fence_rank(0).unwrap();
            let _ = table.fence_rank(1).unwrap();
            let h = table.open_gate(&[], 7, vec![3]).unwrap();
            let transfer = table.begin_transfer_to(h, 1).unwrap();
            assert!(table.abort(h).unwrap().released.is_none());

            let detector = {
                let table = table.clone();
                thread::spawn(move || {
                    // Rank 0 has a new transport; rank 2's is torn down.
                    assert!(table.readmit_rank(0).unwrap());
                    table.fence_rank(2).unwrap()
                })
            };
            // Rank 1's transport was torn down before its fence: drop the hold at once.
            let released = transfer.fail();
            let fenced = detector.join().unwrap();
            assert!(
                fenced.released.is_empty() && fenced.failed_ended == 0,
                "{fenced:?}"
            );
            let r = released.unwrap_or_else(|| {
                panic!(
                    "fail() of a transfer to rank 1, fenced the whole time, was registered \
                     instead of dropping its hold: the room stays held until rank 1 is \
                     fenced again ({:?})",
                    table.room_status(h)
                )
            });
            assert_eq!(
                (r.handle, r.reason, &r.pages[..]),
                (h, Reason::Aborted, &[3][..])
            );
            assert_eq!(table.stats().fenced, [1, 2]);
            assert_at_rest(&table, 1, None, 1);
        },
    );
}
