//! Model 9: the page-list hand-off (the opener writes the room's page list, `pages_of` and
//! the releaser read it, the next opener rewrites it) is free of data races: the list is
//! the library's loom `UnsafeCell`, so any access not ordered by the room word / room
//! bitmap protocol is reported by loom.
//!
//! A second thread holds a transfer *intent* for the first lifecycle (its handle is known
//! in advance, as a queued message would carry it) and acts on it at any moment: it looks
//! the room's pages up (`pages_of`: a hold of its own plus the grow lock while it copies
//! the list; if that hold is the last of a finishing room, its release goes to the release
//! queue), then begins a transfer (which re-validates the lifecycle), writes the pages it
//! looked up and completes. Before the room is open, after it is finished, or after it is
//! released and reused, each step is refused and nothing is written. Meanwhile the opener
//! finishes the first lifecycle and opens a second one, rewriting the list.
//!
//! Threads: 2. Exhaustive.
#![cfg(loom)]

mod common;

use common::{check, exactly_one, own_and_check, Arena, A, B, EXHAUSTIVE};
use kvfence::{Error, RoomHandle};
use loom::thread;

#[test]
fn m9_page_list_handoff() {
    check("m9_page_list_handoff", 2, EXHAUSTIVE, || {
        // Two single-page lifecycles of one room in a 2-page pool: the second gets the
        // other page, so the list really changes.
        let table = common::pool(1, 2);
        let arena = Arena::new(2, 1);
        // The first lifecycle's handle, as a queued intent would carry it on the wire
        // (deterministic under loom: same table key, room 0, generation 0).
        let first = {
            let scratch = common::pool(1, 2);
            let h = scratch.open(&[], 1).unwrap().handle;
            RoomHandle::from_wire(h.to_wire())
        };

        let intent = thread::spawn({
            let (table, arena) = (table.clone(), arena.clone());
            move || {
                let pages = match table.pages_of(first) {
                    Ok(pages) => pages,
                    Err(Error::StaleHandle | Error::RoomClosed { .. }) => return Vec::new(),
                    Err(e) => panic!("pages_of: {e:?}"),
                };
                assert_eq!(pages.len(), 1);
                match table.begin_transfer(first) {
                    Ok(guard) => {
                        arena.write(&pages, 0, A);
                        guard.complete().into_iter().collect::<Vec<_>>()
                    }
                    Err(Error::StaleHandle | Error::RoomClosed { .. }) => Vec::new(),
                    Err(e) => panic!("begin_transfer: {e:?}"),
                }
            }
        });

        let a = table.open(&[], 1).unwrap();
        assert_eq!(a.handle, first);
        let mut releases: Vec<_> = table.finish(a.handle).unwrap().into_iter().collect();
        // Reopen as soon as the room is free; it may still be held by the intent (or its
        // release wait in the queue).
        let b = match table.open(&[], 1) {
            Ok(b) => Some(b),
            Err(Error::RoomTableFull) => None,
            Err(e) => panic!("open B: {e:?}"),
        };
        if let Some(b) = &b {
            own_and_check(&arena, &b.pages, B);
        }
        releases.extend(intent.join().unwrap());
        // A release performed by `pages_of`'s hold has no caller: it was queued.
        table.drain_released(&mut releases);
        let r = exactly_one(&releases, a.handle);
        assert_eq!(r.pages, a.pages);
        if let Some(b) = b {
            arena.expect(&b.pages, B);
            assert!(table.finish(b.handle).unwrap().is_some());
        }
        assert_eq!(table.queued_releases(), 0);
    });
}
