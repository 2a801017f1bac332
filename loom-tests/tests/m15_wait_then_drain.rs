//! Model 15: a queued release is visible to "wait, then drain" (issues 40 and 42).
//!
//! * `m15_wait_then_drain`: a release goes to the queue on an ACK thread (gate mode,
//!   `Config::release_queue`) while the owner `wait_released`s on it and then drains
//!   once: that drain must deliver it. The waiter counts a release as queued only once its
//!   bit is in the queue, not when the slot's tag is stored (which comes first: a waiter
//!   that saw the tag alone and drained found nothing).
//! * `m15_bounded_drain_hides_nothing`: two releases of one bitmap word are queued; a
//!   drainer takes at most one (`drain_released_max(.., 1)`) while the owner drains
//!   everything: the owner's drain must find at least one (the other drainer cannot have
//!   taken both). Before the fix a bounded drain swapped the whole word out and put the bit
//!   past its `max` back afterwards: in between the owner saw an empty word.
//!
//! Threads: 2 each, exhaustive.
#![cfg(loom)]

mod common;

use common::{check, EXHAUSTIVE};
use kvfence::{Quiesced, RoomHandle};
use loom::thread;

#[test]
fn m15_wait_then_drain() {
    check("m15_wait_then_drain", 2, EXHAUSTIVE, || {
        let table = common::gate(1, true);
        let h = table.open_gate(&[0], 7, vec![3]).unwrap();
        assert!(table.abort(h).unwrap().released.is_none());
        let acker = {
            let table = table.clone();
            thread::spawn(move || assert_eq!(table.quiesce(h, 0), Ok(Quiesced::Queued)))
        };
        table.wait_released(h).unwrap();
        let mut got = Vec::new();
        assert_eq!(
            table.drain_released(&mut got),
            1,
            "wait_released returned but the drain found nothing"
        );
        assert_eq!((got[0].token, &got[0].pages[..]), (7, &[3][..]));
        acker.join().unwrap();
    });
}

#[test]
fn m15_bounded_drain_hides_nothing() {
    check("m15_bounded_drain_hides_nothing", 2, EXHAUSTIVE, || {
        let table = common::gate(2, true);
        let rooms: Vec<RoomHandle> = (0..2u32)
            .map(|i| {
                let h = table.open_gate(&[], u64::from(i), vec![i]).unwrap();
                assert!(table.finish(h).unwrap().is_none()); // queued
                h
            })
            .collect();
        let drainer = {
            let table = table.clone();
            thread::spawn(move || {
                let mut got = Vec::new();
                table.drain_released_max(&mut got, 1);
                got
            })
        };
        let mut mine = Vec::new();
        table.drain_released(&mut mine);
        let theirs = drainer.join().unwrap();
        assert!(theirs.len() <= 1);
        assert!(
            !mine.is_empty(),
            "the owner's drain found nothing while a drain of at most 1 ran"
        );
        assert_eq!(mine.len() + theirs.len(), 2);
        let _ = rooms;
    });
}
