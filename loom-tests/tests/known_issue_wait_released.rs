//! KNOWN LIBRARY ISSUE (found by this suite; `#[ignore]`d so the suite passes until fixed).
//!
//! `wait_released(h)` returns as soon as the room word's release CAS is done, but the
//! releasing thread returns the pages to the pool and frees the room index *after* that
//! CAS (`RoomTable::release`). So a thread woken, or not even put to sleep, by a release can
//! call `open` and get `RoomTableFull` / `PoolExhausted` for resources that the release it
//! waited for is about to return. The same holds for `wait_idle` (then `stats()` can show
//! `pages.free < capacity` with every room free).
//!
//! Interleaving (loom finds it at once): rank 0's `quiesce` wins the release CAS (room word
//! -> FREE, gen + 1) and is preempted before `free_all` / `free_one`; the waiter's
//! `wait_released` loads the room word, sees the new generation and returns without
//! sleeping; its `open(2, ..)` finds the room bitmap empty: `RoomTableFull`.
//!
//! Run it: `RUSTFLAGS="--cfg loom" cargo test -p kvfence-loom --release --test
//! known_issue_wait_released -- --ignored`. It fails today; it passes once the waits also
//! wait for the release to finish (e.g. `wait_released` treats "FREE and the room index not
//! yet back in the room bitmap" as still releasing; `wait_idle` also waits for every room
//! index to be back).
#![cfg(loom)]

mod common;

use common::{check, EXHAUSTIVE};
use kvfence::{Quiesced, RankSet};
use loom::thread;

#[test]
#[ignore = "known library issue: wait_released returns before the pages are back in the pool"]
fn known_issue_open_after_wait_released() {
    check(
        "known_issue_open_after_wait_released",
        2,
        EXHAUSTIVE,
        || {
            let table = common::table(1, 2, 1);
            let a = table.open(2, &RankSet::first(1).unwrap()).unwrap();
            assert!(table.abort(a.handle).unwrap().released.is_none());
            let acker = {
                let table = table.clone();
                thread::spawn(move || table.quiesce(a.handle, 0).unwrap())
            };
            table.wait_released(a.handle).unwrap();
            let b = table.open(2, &RankSet::new());
            assert!(
                b.is_ok(),
                "open right after wait_released failed: {b:?} (the release has not returned the \
             room and pages yet)"
            );
            assert!(matches!(acker.join().unwrap(), Quiesced::Released(_)));
        },
    );
}
