//! (g) Issue 18, item 2: `quarantine` of a draining room vs the completion of its last
//! transfer. One step decides: the quarantine closed the room first (`Ok(None)`, and the
//! completion's release says `Quarantined`), or the completion released it first
//! (`Finished`, and the quarantine is refused with `StaleHandle`). Never "refused, yet
//! quarantined". A second room also has a writer rank whose ACK races both (the
//! quarantine gives the rank up), so the deciding step can be any of the three.
//!
//! Must fail under `--cfg kvfence_quarantine_mark_first` (the pre-fix quarantine: a
//! separate mark stored first, read by the releaser after the deciding RMW).
#![cfg(shuttle)]

mod common;

use kvfence::{Error, Quiesced, Reason, RoomTable};
use shuttle::thread;

/// Windows (asserted reachable, `common::check_windows`): room 1's quarantine overlapped
/// its transfer's completion; a quarantine won (`Ok`, released as `Quarantined`); a
/// completion won (refused, released as `Finished`). The real-thread test of
/// `tests/scanner_races.rs` only reports which side won how often.
fn model(w: &common::Window) {
    let t = common::gate(2, false);
    let h = t.open_gate(&[], 7, vec![3]).unwrap();
    let transfer = RoomTable::begin_transfer_owned(&t, h, None).unwrap();
    assert!(t.finish(h).unwrap().is_none(), "held by its transfer");
    // Room 2: writer rank 0 and a transfer.
    let h2 = t.open_gate(&[0], 8, vec![4]).unwrap();
    let transfer2 = RoomTable::begin_transfer_owned(&t, h2, None).unwrap();
    assert!(t.finish(h2).unwrap().is_none());

    let engine = {
        let w = w.clone();
        thread::spawn(move || {
            let a = w.timed(1, || transfer.complete());
            let b = transfer2.complete();
            (a, b)
        })
    };
    let rank0 = {
        let t = t.clone();
        thread::spawn(move || match t.quiesce(h2, 0) {
            Ok(Quiesced::Released(r)) => Some(r),
            Ok(Quiesced::Recorded | Quiesced::Duplicate) | Err(Error::StaleHandle) => None,
            other => panic!("rank 0's ACK: {other:?}"),
        })
    };
    let q1 = w.timed(0, || t.quarantine(h));
    let q2 = t.quarantine(h2);
    let (a, b) = engine.join().unwrap();
    let c = rank0.join().unwrap();
    w.hit(0, w.overlap(0, 1));

    let a = a.expect("the transfer was room 1's last hold: its completion releases it");
    let mut releases_2: Vec<_> = b.into_iter().chain(c).collect();
    if let Ok(Some(r)) = &q2 {
        releases_2.push(r.clone());
    }
    assert_eq!(releases_2.len(), 1, "room 2 released once: {releases_2:?}");
    let mut kept = 0;
    for (q, r) in [(q1, a), (q2, releases_2.pop().unwrap())] {
        match (&q, r.reason) {
            (Ok(_), Reason::Quarantined) => {
                kept += 1;
                w.hit(1, true);
            }
            (Err(Error::StaleHandle), Reason::Finished) => w.hit(2, true),
            (Err(Error::StaleHandle), Reason::Quarantined) => panic!(
                "quarantine of {:?} was refused (StaleHandle), yet the release says \
                 Quarantined: the pages of a room that drained on its own are lost for good",
                r.handle
            ),
            (q, reason) => panic!(
                "quarantine of {:?} returned {q:?}, the release says {reason:?}",
                r.handle
            ),
        }
    }
    let s = t.stats();
    assert_eq!(
        (s.quarantined_rooms, s.quarantined_pages),
        (kept, kept),
        "{s:?}"
    );
    common::assert_at_rest(&t, 2, None);
}

#[test]
fn quarantine_vs_last_completion() {
    common::check_windows(
        "quarantine_vs_last_completion",
        20000,
        20000,
        3,
        &[
            "quarantine_overlapped_the_completion",
            "quarantine_won",
            "completion_won",
        ],
        model,
    );
}
