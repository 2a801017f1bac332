//! Model 14 (issue 18, item 2): `quarantine` of a draining room races the completion of
//! the room's last transfer (the hold whose drop releases the room).
//!
//! Guarantee: one atomic step decides the release, and the release's reason is read from
//! the value that step observed. Either the quarantine closes the room first (it returns
//! `Ok(None)`: the transfer still holds the room) and the completion's release says
//! `Quarantined`; or the completion releases the room first (`Finished`) and the
//! quarantine, refused, returns `StaleHandle` and changes nothing. Never "refused, yet
//! quarantined" (the pages of a room that drained on its own lost for good, while the call
//! that did it says it did nothing), nor "quarantined, yet freed".
//!
//! Threads: 2 (main = the transfer engine: `complete()`; one = the scheduler:
//! `quarantine`). Exhaustive.
//!
//! Mutation `kvfence_quarantine_mark_first` (the pre-fix quarantine: a separate mark
//! stored first, read by the releaser after the deciding RMW) must fail it: quarantine
//! loads the word (draining, held) and stores its mark; the completion's `fetch_sub`
//! decides the release and the releaser reads the mark (`Quarantined`); quarantine's close
//! is then refused (`StaleHandle`).
#![cfg(loom)]

mod common;

use common::{assert_at_rest_q, check, EXHAUSTIVE};
use kvfence::{Error, Reason};
use loom::thread;

#[test]
fn m14_quarantine_vs_last_completion() {
    check("m14_quarantine_vs_last_completion", 2, EXHAUSTIVE, || {
        let table = common::gate(1, false);
        let h = table.open_gate(&[], 7, vec![3]).unwrap();
        let transfer = table.begin_transfer(h).unwrap();
        assert!(table.finish(h).unwrap().is_none(), "held by its transfer");

        let scheduler = {
            let table = table.clone();
            thread::spawn(move || table.quarantine(h))
        };
        let released = transfer
            .complete()
            .expect("the transfer was the room's last hold: its completion releases it");
        let quarantined = scheduler.join().unwrap();
        assert_eq!((released.handle, &released.pages[..]), (h, &[3][..]));
        let kept = match (&quarantined, released.reason) {
            (Ok(None), Reason::Quarantined) => 1,
            (Err(Error::StaleHandle), Reason::Finished) => 0,
            (Err(Error::StaleHandle), Reason::Quarantined) => panic!(
                "quarantine was refused (StaleHandle), yet the release says Quarantined: the \
                 pages of a room that drained on its own are lost for good"
            ),
            (q, reason) => panic!("quarantine returned {q:?}, the release says {reason:?}"),
        };
        assert_eq!(table.stats().quarantined_rooms, kept as u64);
        assert_at_rest_q(&table, 1, None, kept, 1);
    });
}
