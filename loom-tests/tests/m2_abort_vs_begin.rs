//! Model 2: `abort` races `begin_transfer` of a transfer intent still queued (not yet
//! submitted, so no transport timeout protects it).
//!
//! Guarantee: the intent either gets a guard, writes and completes *before* the release, or
//! is refused (`RoomClosed` / `StaleHandle`) and writes nothing; it never writes after the
//! release. Whoever releases reuses the pages at once for request B and checks them; the
//! intent's write racing B's would be a loom data race or a wrong page content.
//!
//! Threads: 2 (main = scheduler that aborts, one = the queued intent). Exhaustive.
#![cfg(loom)]

mod common;

use common::{assert_at_rest, check, drain_and_reuse, exactly_one, reuse, Arena, A, EXHAUSTIVE};
use kvfence::{Error, Phase, Reason};
use loom::thread;

#[test]
fn m2_abort_vs_begin_transfer() {
    check("m2_abort_vs_begin_transfer", 2, EXHAUSTIVE, || {
        let table = common::pool(1, 2);
        let arena = Arena::new(2, 1);
        let a = table.open(&[], 2).unwrap();
        let h = a.handle;

        let intent = {
            let (table, arena) = (table.clone(), arena.clone());
            // The intent carries the page ids it was queued with.
            let pages = a.pages.clone();
            thread::spawn(move || {
                let mut out = Vec::new();
                match table.begin_transfer(h) {
                    Ok(guard) => {
                        arena.write(&pages, 0, A);
                        if let Some(r) = guard.complete() {
                            out.push(r);
                            reuse(&table, &arena, &mut out);
                        }
                    }
                    // Refused: the room is closed, or already released (and maybe reused).
                    Err(Error::RoomClosed {
                        phase: Phase::Aborting,
                    })
                    | Err(Error::StaleHandle) => {}
                    Err(e) => panic!("unexpected begin_transfer error {e:?}"),
                }
                out
            })
        };

        let mut releases = Vec::new();
        let aborted = table.abort(h).expect("first abort");
        assert!(aborted.fanout.is_empty());
        if let Some(r) = aborted.released {
            releases.push(r);
            reuse(&table, &arena, &mut releases);
        }
        releases.extend(intent.join().unwrap());
        // A refused begin whose transient unit was the last hold queued it (issue 42).
        drain_and_reuse(&table, &arena, h, &mut releases);
        let r = exactly_one(&releases, h);
        assert_eq!((&r.pages, r.reason), (&a.pages, Reason::Aborted));
        // Whatever happened, a late intent for A is refused now.
        assert!(matches!(table.begin_transfer(h), Err(Error::StaleHandle)));
        assert_at_rest(&table, 1, Some(2), 2);
    });
}
