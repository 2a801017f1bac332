//! Model 4: a room is released by its last ACK and immediately reused by a new `open`,
//! racing a late duplicate ACK of the old generation.
//!
//! Guarantee: the late ACK is refused (`StaleHandle`) and changes nothing in the new
//! lifecycle: the new room B still waits on its own rank 0 (its abort fans out to rank 0
//! and does not release), and B's pages hold only B's data.
//!
//! Threads: 2 (main = decode scheduler that reuses, one = prefill rank 0 of request A).
//! Exhaustive.
#![cfg(loom)]

mod common;

use common::{assert_at_rest, check, own_and_check, Arena, A, B, EXHAUSTIVE};
use kvfence::{Error, Phase, Quiesced, RankSet};
use loom::thread;

#[test]
fn m4_late_ack_after_reuse() {
    check("m4_late_ack_after_reuse", 2, EXHAUSTIVE, || {
        let table = common::table(1, 2, 1);
        let arena = Arena::new(2, 1);
        let rank0 = RankSet::first(1).unwrap();
        let a = table.open(2, &rank0).unwrap();
        let h = a.handle;
        let aborted = table.abort(h).expect("first abort");
        assert!(
            aborted.released.is_none(),
            "abort released a room whose writer rank 0 has not acknowledged"
        );
        assert_eq!(aborted.fanout, rank0);

        let prefill = {
            let (table, arena) = (table.clone(), arena.clone());
            let pages = a.pages.clone();
            thread::spawn(move || {
                // Rank 0 drains its last writes into A's pages, then ACKs: that releases A.
                arena.write(&pages, 0, A);
                let released = match table.quiesce(h, 0) {
                    Ok(Quiesced::Released(r)) => r,
                    other => panic!("the only pending ACK must release A, got {other:?}"),
                };
                assert_eq!(released.handle, h);
                // The ACK is retransmitted (or a late copy arrives): it must be refused,
                // whether or not the room was reused meanwhile.
                match table.quiesce(h, 0) {
                    Err(Error::StaleHandle) => {}
                    other => panic!("a late ACK of the old generation was accepted: {other:?}"),
                }
            })
        };

        // Decode: wait for A's release, reuse the room and pages for B (same rank 0).
        table.wait_released(h).unwrap();
        // `wait_released` returns only once A's pages and room index are back in the pool.
        let b = table
            .open(2, &rank0)
            .expect("open B right after wait_released");
        assert_ne!(b.handle, h);
        own_and_check(&arena, &b.pages, B);
        prefill.join().unwrap();

        // B must be untouched by A's late ACK: still waiting on its own rank 0.
        assert_eq!(table.phase(b.handle).unwrap(), Phase::Owned);
        let ab = table.abort(b.handle).expect("abort B");
        assert_eq!(
            ab.fanout, rank0,
            "B's rank 0 was cleared by a late ACK of the previous lifecycle"
        );
        assert!(
            ab.released.is_none(),
            "B was released without its rank 0's ACK (a late ACK of A counted toward B)"
        );
        arena.expect(&b.pages, B);
        match table.quiesce(b.handle, 0) {
            Ok(Quiesced::Released(r)) => assert_eq!(r.handle, b.handle),
            other => panic!("B's own ACK must release it, got {other:?}"),
        }
        assert_at_rest(&table, 1, 2, 2);
    });
}
