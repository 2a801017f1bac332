//! Model 3: the ACKs of two writer ranks and the last local transfer completion race after
//! an abort (one rank also sends a duplicate ACK).
//!
//! Guarantee: exactly one release, performed by the last of the three and reported once
//! (by the call that made it); a duplicate ACK never counts; no party's write can land
//! after the release (the releaser reuses the pages for request B at once and checks them).
//!
//! Threads: 3 (main = local transfer, two = writer ranks 0 and 1). Preemption bound 3.
#![cfg(loom)]

mod common;

use common::{assert_at_rest, check, exactly_one, own_and_check, Arena, A, B};
use kvfence::{Error, Quiesced, Reason, Released, RoomTable};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

/// Releaser's duty: assert it was the last of the three, then reuse the pages for B.
fn on_release(r: Released, ended: &AtomicUsize, table: &RoomTable, arena: &Arena) -> Vec<Released> {
    assert_eq!(
        ended.load(Ordering::Relaxed),
        3,
        "released before all three parties (2 ACKs + 1 completion) were done"
    );
    let b = table
        .open(&[], 2)
        .expect("the releaser must be able to reuse the pages at once");
    own_and_check(arena, &b.pages, B);
    vec![
        r,
        table.finish(b.handle).unwrap().expect("finish releases B"),
    ]
}

#[test]
fn m3_two_acks_and_last_completion() {
    check("m3_two_acks_and_last_completion", 3, Some(3), || {
        let table = common::pool(1, 2);
        // Slot 0: local transfer, slots 1 and 2: ranks 0 and 1 (each writes its own part).
        let arena = Arena::new(2, 3);
        let a = table.open(&[0, 1], 2).unwrap();
        let h = a.handle;
        let guard = table.begin_transfer(h).unwrap();
        let aborted = table.abort(h).expect("first abort");
        assert!(
            aborted.released.is_none(),
            "abort released a room with a transfer in flight and two ranks pending"
        );
        assert_eq!(&aborted.fanout[..], &[0, 1]);
        let ended = Arc::new(AtomicUsize::new(0));

        let ranks: Vec<_> = (0..2u32)
            .map(|rank| {
                let (table, arena, ended) = (table.clone(), arena.clone(), ended.clone());
                let pages = a.pages.clone();
                thread::spawn(move || {
                    // Rank drains: its last writes land, then it ACKs.
                    arena.write(&pages, 1 + rank as usize, A);
                    ended.fetch_add(1, Ordering::Relaxed);
                    let mut out = Vec::new();
                    match table.quiesce(h, rank).expect("first ACK of this lifecycle") {
                        Quiesced::Released(r) => out = on_release(r, &ended, &table, &arena),
                        Quiesced::Recorded => {}
                        other => panic!("first ACK: {other:?}"),
                    }
                    if rank == 0 {
                        // A duplicate ACK: harmless, whatever the moment it lands.
                        match table.quiesce(h, rank) {
                            Ok(Quiesced::Duplicate) | Err(Error::StaleHandle) => {}
                            other => panic!("duplicate ACK was not ignored: {other:?}"),
                        }
                    }
                    out
                })
            })
            .collect();

        arena.write(&a.pages, 0, A);
        ended.fetch_add(1, Ordering::Relaxed);
        let mut releases = match guard.complete() {
            Some(r) => on_release(r, &ended, &table, &arena),
            None => Vec::new(),
        };
        for t in ranks {
            releases.extend(t.join().unwrap());
        }
        let r = exactly_one(&releases, h);
        assert_eq!((&r.pages, r.reason), (&a.pages, Reason::Aborted));
        assert_at_rest(&table, 1, Some(2), 2);
        assert_eq!(table.stats().releases, releases.len() as u64);
    });
}
