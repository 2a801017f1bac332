//! Model 8b: a thread woken by (or racing with) a release can use what was released.
//!
//! Found by this suite as a library bug (fixed): `wait_released` used to return as soon as
//! the room word's release CAS was done, while the releaser was still returning the pages
//! and the room index; an `open` right after it could fail with `RoomTableFull`. The
//! interleaving: rank 0's `quiesce` wins the release CAS and is preempted before
//! `free_all` / `free_one`; the waiter sees the new generation, returns, and `open` finds
//! the room bitmap empty. Waits now key on the slot's `released_below`, which the releaser
//! advances as its last step.
#![cfg(loom)]

mod common;

use common::{check, EXHAUSTIVE};
use kvfence::Quiesced;
use loom::thread;

#[test]
fn m8_open_after_wait_released() {
    check("m8_open_after_wait_released", 2, EXHAUSTIVE, || {
        let table = common::pool(1, 2);
        let a = table.open(&[0], 2).unwrap();
        assert!(table.abort(a.handle).unwrap().released.is_none());
        let acker = {
            let table = table.clone();
            thread::spawn(move || table.quiesce(a.handle, 0).unwrap())
        };
        table.wait_released(a.handle).unwrap();
        let b = table.open(&[], 2);
        assert!(
            b.is_ok(),
            "open right after wait_released failed: {b:?} (the release has not returned the \
             room and pages yet)"
        );
        assert!(matches!(acker.join().unwrap(), Quiesced::Released(_)));
    });
}
