//! Model 8: a thread blocked in `wait_released` / `wait_idle` always wakes (no lost
//! wake-up).
//!
//! Waiters park on the room's own `Mutex` + `Condvar` (`src/wait.rs`), which are loom's under
//! `--cfg loom`, so a waiter that sleeps is *blocked* for loom: a lost wake-up shows up as a
//! loom deadlock ("all threads blocked"), never as a spin. Loom has no clock: a wait never
//! times out, the strict case for lost wake-ups.
//!
//! Threads: 2 (exhaustive: one waiter, one releasing ACK) and 3 (bound 3: two waiters,
//! `wait_released` and `wait_idle`, and a releaser of two rooms).
#![cfg(loom)]

mod common;

use common::{check, EXHAUSTIVE};
use kvfence::{Phase, Quiesced};
use loom::thread;

#[test]
fn m8_wait_released_wakes() {
    check("m8_wait_released_wakes", 2, EXHAUSTIVE, || {
        let table = common::pool(1, 1);
        let a = table.open(&[0], 1).unwrap();
        let h = a.handle;
        assert!(table.abort(h).unwrap().released.is_none());
        let acker = {
            let table = table.clone();
            thread::spawn(move || table.quiesce(h, 0).unwrap())
        };
        table.wait_released(h).unwrap();
        assert_eq!(table.phase(h).unwrap(), Phase::Free);
        assert!(matches!(acker.join().unwrap(), Quiesced::Released(r) if r.handle == h));
    });
}

#[test]
fn m8_two_waiters_wake() {
    check("m8_two_waiters_wake", 3, Some(3), || {
        let table = common::pool(2, 2);
        let a = table.open(&[0], 1).unwrap();
        let b = table.open(&[0], 1).unwrap();
        let (ha, hb) = (a.handle, b.handle);
        let idle_waiter = {
            let table = table.clone();
            thread::spawn(move || {
                table.wait_idle();
                assert_eq!(table.phase(ha).unwrap(), Phase::Free);
                assert_eq!(table.phase(hb).unwrap(), Phase::Free);
            })
        };
        let a_waiter = {
            let table = table.clone();
            thread::spawn(move || {
                table.wait_released(ha).unwrap();
                assert_eq!(table.phase(ha).unwrap(), Phase::Free);
            })
        };
        // Rank 0 is done with both rooms, then the scheduler finishes them.
        for h in [ha, hb] {
            assert_eq!(table.quiesce(h, 0).unwrap(), Quiesced::Recorded);
        }
        let mut released = 0;
        for h in [ha, hb] {
            released += table.finish(h).unwrap().is_some() as u32;
        }
        assert_eq!(released, 2);
        a_waiter.join().unwrap();
        idle_waiter.join().unwrap();
    });
}
