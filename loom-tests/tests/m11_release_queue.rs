//! Model 11: the release queue. Two releases are decided on two ACK threads (gate mode,
//! `Config::release_queue`: the last ACK of each aborted room returns `Quiesced::Queued`)
//! while two drainer threads (the scheduler loops, `pop_released`) drain the queue
//! concurrently.
//!
//! Guarantee: every release is delivered exactly once (to one drainer), and the engine
//! reuses its pages only after the delivery. Each writer rank writes its room's page before
//! its ACK; each drainer hands every page it is delivered to a new request of its own (a
//! distinct id) and writes and re-reads it. A release delivered twice is two owners writing
//! one page (a loom data race on the page cell, or on the library's page list, which
//! `deliver` takes) or a duplicate in the delivered list; a delivery not ordered after the
//! ACK's write is a loom data race; a lost release is missing after the final drain.
//!
//! Threads: 4 (main = drainer 2, two ACK threads, drainer 1). Preemption bound 2.
//!
//! Mutation `kvfence_racy_queue_pop` (pop takes the room's bit with a load and a store
//! instead of one RMW) must fail it.
#![cfg(loom)]

mod common;

use common::{check, own_and_check, Arena, A};
use kvfence::{Quiesced, Reason, Released, RoomHandle, RoomTable};
use loom::thread;

/// One scheduler loop: drain what is queued now; the engine hands each delivered page to a
/// new request `reuser` at once.
fn drain(table: &RoomTable, arena: &Arena, reuser: u64) -> Vec<Released> {
    let mut got = Vec::new();
    while let Some(r) = table.pop_released() {
        assert_eq!(r.reason, Reason::Aborted);
        own_and_check(arena, &r.pages, reuser);
        got.push(r);
    }
    got
}

#[test]
fn m11_release_queue() {
    check("m11_release_queue", 4, Some(2), || {
        let table = common::gate(2, true);
        let arena = Arena::new(2, 1);
        // Two requests, one engine page each (pages 0 and 1), written by ranks 0 and 1.
        let rooms: Vec<RoomHandle> = (0..2u32)
            .map(|i| {
                let h = table.open_gate(&[i], u64::from(i), vec![i]).unwrap();
                let aborted = table.abort(h).unwrap();
                assert!(aborted.released.is_none());
                assert_eq!(&aborted.fanout[..], &[i]);
                h
            })
            .collect();

        let acks: Vec<_> = (0..2u32)
            .map(|i| {
                let (table, arena, h) = (table.clone(), arena.clone(), rooms[i as usize]);
                thread::spawn(move || {
                    // Rank i drains its last write, then ACKs: that decides the release.
                    arena.write(&[i], 0, A);
                    assert_eq!(table.quiesce(h, i), Ok(Quiesced::Queued));
                })
            })
            .collect();
        let drainer = {
            let (table, arena) = (table.clone(), arena.clone());
            thread::spawn(move || drain(&table, &arena, 10))
        };
        let mut delivered = drain(&table, &arena, 20);
        for t in acks {
            t.join().unwrap();
        }
        delivered.extend(drainer.join().unwrap());
        // The owner's next loop gets whatever was queued after both drains looked.
        delivered.extend(drain(&table, &arena, 30));

        for (i, &h) in rooms.iter().enumerate() {
            let of_it: Vec<_> = delivered.iter().filter(|r| r.handle == h).collect();
            assert_eq!(
                of_it.len(),
                1,
                "release of room {i} delivered {} times: {delivered:?}",
                of_it.len()
            );
            assert_eq!(
                (of_it[0].token, &of_it[0].pages[..]),
                (i as u64, &[i as u32][..])
            );
        }
        assert_eq!(delivered.len(), 2, "{delivered:?}");
        assert_eq!(table.queued_releases(), 0);
        let stats = table.stats();
        assert_eq!(
            (stats.rooms.free, stats.rooms.queued, stats.releases),
            (2, 0, 2)
        );
    });
}
