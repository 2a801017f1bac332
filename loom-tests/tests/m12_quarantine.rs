//! Model 12: `quarantine` of a room that can never be proven drained (its failed transfer's
//! peer transport cannot be torn down) races the failed transfer's late write and the
//! room's writer rank's ACK.
//!
//! Guarantee: the room is released exactly once, as `Reason::Quarantined`, and its pool
//! pages are never handed to a new room: right after its `quarantine` the scheduler asks
//! for 2 pages of a 3-page pool whose other 2 pages are the quarantined room's. The request
//! must be refused (`PoolExhausted`); were it given a quarantined page, its owner's writes
//! would race the late write (a loom data race on the page cell) and the model also asserts
//! the page sets are disjoint. At rest the 2 pages are out of the pool for good
//! (`quarantined_pages == 2`, `pages.free == 1`).
//!
//! Threads: 3 (main = the scheduler: quarantine, then open; one = the NIC: `fail()` of the
//! transfer to rank 1, then its late write; one = rank 0: its last write, then its ACK).
//! Preemption bound 3.
//!
//! Mutation `kvfence_quarantine_frees_pages` (a quarantined release is treated as drained:
//! pool pages freed, reason `Aborted`) must fail it.
#![cfg(loom)]

mod common;

use common::{assert_at_rest_q, check, exactly_one, own_and_check, Arena, A, B};
use kvfence::{Error, Quiesced, Reason, RoomTable};
use loom::sync::Arc;
use loom::thread;

#[test]
fn m12_quarantine() {
    check("m12_quarantine", 3, Some(3), || {
        let table = common::pool_std(2, 3);
        // Slot 0: the failed transfer (peer rank 1); slot 1: writer rank 0.
        let arena = Arena::new(3, 2);
        let a = Arc::new(table.open(&[0], 2).unwrap());
        let h = a.handle;
        let guard = RoomTable::begin_transfer_owned(&table, h, Some(1)).unwrap();

        let nic = {
            let (arena, a) = (arena.clone(), a.clone());
            thread::spawn(move || {
                // Outcome unknown. Before the quarantine it holds the room; after it, the
                // hold ends at once (and may be the last).
                let released = guard.fail();
                arena.write(&a.pages, 0, A);
                released.into_iter().collect::<Vec<_>>()
            })
        };
        let rank0 = {
            let (table, arena, a) = (table.clone(), arena.clone(), a.clone());
            thread::spawn(move || {
                arena.write(&a.pages, 1, A);
                match table.quiesce(h, 0) {
                    Ok(Quiesced::Released(r)) => vec![r],
                    // The quarantine gave up on rank 0 first (and maybe released).
                    Ok(Quiesced::Recorded | Quiesced::Duplicate) | Err(Error::StaleHandle) => {
                        vec![]
                    }
                    other => panic!("rank 0's ACK: {other:?}"),
                }
            })
        };

        // The scheduler gives up on the room, then serves a new 2-page request.
        let mut releases: Vec<_> = table.quarantine(h).unwrap().into_iter().collect();
        match table.open(&[], 2) {
            Err(Error::PoolExhausted { requested: 2 }) => {}
            Ok(b) => {
                assert!(
                    b.pages.iter().all(|p| !a.pages.contains(p)),
                    "a quarantined page was handed to a new room: A {:?}, B {:?}",
                    a.pages,
                    b.pages
                );
                own_and_check(&arena, &b.pages, B);
                releases.extend(table.finish(b.handle).unwrap());
            }
            Err(e) => panic!("open: {e:?}"),
        }
        releases.extend(nic.join().unwrap());
        releases.extend(rank0.join().unwrap());
        // Released by now (by whichever of the three came last): still, only the one good
        // page can be had.
        match table.open(&[], 2) {
            Err(Error::PoolExhausted { requested: 2 }) => {}
            other => panic!(
                "a quarantined page was handed to a new room after the release: {other:?} \
                 (A had {:?})",
                a.pages
            ),
        }
        let r = exactly_one(&releases, h);
        assert_eq!((&r.pages, r.reason), (&a.pages, Reason::Quarantined));
        assert_eq!(releases.len(), 1, "{releases:?}");
        let stats = table.stats();
        assert_eq!(stats.quarantined_rooms, 1, "{stats:?}");
        assert_at_rest_q(&table, 2, Some(3), 2, 1);
    });
}
