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
use kvfence::{Error, Phase, Quiesced};
use loom::thread;

#[test]
fn m4_late_ack_after_reuse() {
    check("m4_late_ack_after_reuse", 2, EXHAUSTIVE, || {
        let table = common::pool(1, 2);
        let arena = Arena::new(2, 1);
        let rank0: &[u32] = &[0];
        let a = table.open(rank0, 2).unwrap();
        let h = a.handle;
        let aborted = table.abort(h).expect("first abort");
        assert!(
            aborted.released.is_none(),
            "abort released a room whose writer rank 0 has not acknowledged"
        );
        assert_eq!(&aborted.fanout[..], rank0);

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
            .open(rank0, 2)
            .expect("open B right after wait_released");
        assert_ne!(b.handle, h);
        own_and_check(&arena, &b.pages, B);
        prefill.join().unwrap();

        // B must be untouched by A's late ACK: still waiting on its own rank 0.
        assert_eq!(table.phase(b.handle).unwrap(), Phase::Owned);
        let ab = table.abort(b.handle).expect("abort B");
        assert_eq!(
            &ab.fanout[..],
            rank0,
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
        assert_at_rest(&table, 1, Some(2), 2);
    });
}

/// Known library issue (see loom-tests/README.md): a late ACK of a released lifecycle,
/// racing the room's reuse, may be answered `RankNotInRoom` instead of `StaleHandle`.
///
/// Two receive threads get the same ACK of rank 0 (a retransmission): one releases the room
/// and reopens it at once for B (no writers); the other must get `Duplicate` (it saw A
/// still live) or `StaleHandle` (A is gone), never `RankNotInRoom` (rank 0 *was* a writer
/// of the lifecycle its handle names). `quiesce` reads the room word (A, still closing),
/// then the writer list's count, already restamped by B's `open` (a `Relaxed` store, so
/// this read does not make B's later `publish` visible), finds no rank 0 in it, and
/// re-reads the room word to tell "stale" from "not a writer": nothing orders that re-read
/// after B's publish, so it may still return A's closing word, and the call reports
/// `RankNotInRoom`. Harmless for the pages (nothing is changed), but a contract violation
/// (`quiesce` documents `StaleHandle` for an ACK of an earlier lifecycle) that an
/// integrator may treat as a protocol error. Only on weakly ordered CPUs (on x86-TSO the
/// re-read sees B's publish).
///
/// Found by this model; fixed in `src/writers.rs` (`Writers::position`): the opener now
/// stores the count before the ids and the ids with `Release`, and the reader loads the ids
/// with `Acquire` and the count again after them, so a read that met the next lifecycle's
/// list says so (stale). Kept as a regression model.
#[test]
fn m4_late_ack_error_kind() {
    check("m4_late_ack_error_kind", 2, EXHAUSTIVE, || {
        let table = common::pool(1, 2);
        let a = table.open(&[0], 1).unwrap();
        let h = a.handle;
        assert!(table.abort(h).unwrap().released.is_none());
        let ack = move |table: &kvfence::RoomTable| match table.quiesce(h, 0) {
            Ok(Quiesced::Released(r)) => {
                assert_eq!(r.handle, h);
                let b = table.open(&[], 1).expect("reuse at once");
                assert!(table.finish(b.handle).unwrap().is_some());
                true
            }
            Ok(Quiesced::Duplicate) | Err(Error::StaleHandle) => false,
            other => panic!("a retransmitted ACK of rank 0 for lifecycle A: {other:?}"),
        };
        let other = {
            let table = table.clone();
            thread::spawn(move || ack(&table))
        };
        let mine = ack(&table);
        let theirs = other.join().unwrap();
        assert!(mine ^ theirs, "exactly one ACK releases A");
    });
}
