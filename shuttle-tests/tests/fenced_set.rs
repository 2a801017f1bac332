//! (f) Issue 18, item 1: the fenced set's lock-free membership read vs `readmit_rank` and
//! `fence_rank` of *other* ranks. Rank 1 is fenced before the threads start and stays
//! fenced; the readers must always find it:
//! * `fail()` of a transfer to rank 1 on an aborted room that nothing else holds must drop
//!   its hold at once, so `fail()` itself returns the release (a miss registers the
//!   failure after rank 1's fence swept the registry: the room stays held);
//! * `stats().fenced` must list rank 1 (the same read).
//!
//! Must fail under `--cfg kvfence_moving_fenced_set` (the pre-fix set, whose readmit moves
//! the last entry into the removed one's place).
#![cfg(shuttle)]

mod common;

use kvfence::{Config, Reason, RoomTable};
use shuttle::sync::Arc;
use shuttle::thread;

/// Window (asserted reachable, `common::check_windows`): `fail()` (the lock-free read of
/// the fenced set) overlapped a `readmit_rank` of another rank.
fn model(w: &common::Window) {
    let t = Arc::new(RoomTable::new(Config::gate(2).max_fenced(3).max_tokens(2)).unwrap());
    // Rank 0 first, rank 1 second: rank 1 in the last entry (the one a pre-fix readmit
    // moves).
    let _ = t.fence_rank(0).unwrap();
    let _ = t.fence_rank(1).unwrap();
    let h = t.open_gate(&[], 7, vec![3]).unwrap();
    let transfer = RoomTable::begin_transfer_owned(&t, h, Some(1)).unwrap();
    assert!(t.abort(h).unwrap().released.is_none());

    // The failure detector: rank 0 reconnects, rank 2 goes down, rank 2 reconnects, rank 0
    // goes down again. Rank 1 is never touched.
    let detector = {
        let (t, w) = (t.clone(), w.clone());
        thread::spawn(move || {
            assert!(w.timed(1, || t.readmit_rank(0)).unwrap());
            let a = t.fence_rank(2).unwrap();
            assert!(w.timed(2, || t.readmit_rank(2)).unwrap());
            let b = t.fence_rank(0).unwrap();
            for f in [a, b] {
                assert!(f.released.is_empty() && f.failed_ended == 0, "{f:?}");
            }
        })
    };
    // A monitoring thread reads the set too.
    let monitor = {
        let t = t.clone();
        thread::spawn(move || {
            let fenced = t.stats().fenced;
            assert!(
                fenced.contains(&1),
                "stats().fenced = {fenced:?} misses rank 1, fenced the whole time"
            );
        })
    };
    // The transfer engine: the transfer to rank 1 failed (rank 1's transport is gone).
    let released = w.timed(0, || transfer.fail());
    detector.join().unwrap();
    monitor.join().unwrap();
    w.hit(0, w.overlap(0, 1) || w.overlap(0, 2));
    let r = released.unwrap_or_else(|| {
        panic!(
            "fail() of a transfer to rank 1, fenced the whole time, was registered instead \
             of dropping its hold: the room stays held until rank 1 is fenced again ({:?})",
            t.room_status(h)
        )
    });
    assert_eq!((r.handle, r.reason), (h, Reason::Aborted));
    assert_eq!(t.stats().fenced, [0, 1]);
    common::assert_at_rest(&t, 2, None);
}

#[test]
fn fail_vs_readmit_and_fence_of_other_ranks() {
    common::check_windows(
        "fail_vs_readmit_and_fence_of_other_ranks",
        20000,
        20000,
        3,
        &["fail_overlapped_a_readmit"],
        model,
    );
}
