//! Model 9: the page-list hand-off (opener writes the room's page list, a transfer guard
//! and the releaser read it, the next opener rewrites it) is free of data races: the list
//! is the library's loom `UnsafeCell`, so any access not ordered by the room word / room
//! bitmap protocol is reported by loom.
//!
//! A second thread holds a transfer *intent* for the first lifecycle (its handle is known
//! in advance, as a queued message would carry it) and tries it at any moment: before the
//! room is open (refused), while it is live (it reads the list through
//! `TransferGuard::with_pages` and writes the pages), or after release and reuse (refused).
//! Meanwhile the opener finishes the first lifecycle and opens a second one, rewriting the
//! list.
//!
//! Threads: 2. Exhaustive.
#![cfg(loom)]

mod common;

use common::{check, exactly_one, own_and_check, Arena, A, B, EXHAUSTIVE};
use kvfence::{Error, RankSet, RoomHandle};
use loom::thread;

#[test]
fn m9_page_list_handoff() {
    check("m9_page_list_handoff", 2, EXHAUSTIVE, || {
        // Two single-page lifecycles of one room in a 2-page pool: the second gets the
        // other page, so the list really changes.
        let table = common::table(1, 2, 1);
        let arena = Arena::new(2, 1);
        // The first lifecycle's handle, as a queued intent would carry it on the wire
        // (deterministic under loom: same table tag, room 0, generation 0).
        let first = {
            let scratch = common::table(1, 2, 1);
            let h = scratch.open(1, &RankSet::new()).unwrap().handle;
            RoomHandle::from_wire(h.to_wire())
        };

        let intent = thread::spawn({
            let (table, arena) = (table.clone(), arena.clone());
            move || match table.begin_transfer(first) {
                Ok(guard) => {
                    guard.with_pages(|pages| {
                        assert_eq!(pages.len(), 1);
                        arena.write(pages, 0, A);
                    });
                    guard.complete().into_iter().collect::<Vec<_>>()
                }
                Err(Error::StaleHandle | Error::RoomClosed { .. }) => Vec::new(),
                Err(e) => panic!("begin_transfer: {e:?}"),
            }
        });

        let a = table.open(1, &RankSet::new()).unwrap();
        assert_eq!(a.handle, first);
        let mut releases: Vec<_> = table.finish(a.handle).unwrap().into_iter().collect();
        // Reopen as soon as the room is free; it may still be held by the intent.
        let b = match table.open(1, &RankSet::new()) {
            Ok(b) => Some(b),
            Err(Error::RoomTableFull) => None,
            Err(e) => panic!("open B: {e:?}"),
        };
        if let Some(b) = &b {
            own_and_check(&arena, &b.pages, B);
        }
        releases.extend(intent.join().unwrap());
        exactly_one(&releases, a.handle);
        if let Some(b) = b {
            arena.expect(&b.pages, B);
            assert!(table.finish(b.handle).unwrap().is_some());
        }
        assert!(table.take_orphaned().is_empty());
    });
}
