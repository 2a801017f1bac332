//! (b) `abort` racing a local transfer in flight and the writer ranks' ACKs: no page is
//! reused while a transfer (or a rank) of the old lifecycle can still write it. Must fail
//! under `--cfg kvfence_naive_release` (abort frees the pages at once).
#![cfg(shuttle)]

mod common;

use common::{life, pool, reuse, Pages};
use kvfence::{Error, Quiesced};
use shuttle::thread;

const ROOMS: usize = 2;
const PAGES: usize = 2;

fn model() {
    let t = pool(ROOMS, PAGES);
    let pages = Pages::new(PAGES);
    let log = common::log();
    // Request A: both pool pages, written by prefill ranks 0 and 1 and by a local transfer.
    let a = t.open(&[0, 1], PAGES).unwrap();
    let h = a.handle;
    pages.own(&a.pages, life(h));

    let mut threads = Vec::new();
    // The local transfer: a queued intent that begins (or is refused after the abort),
    // writes the pages while it holds the room, and completes.
    {
        let (t, pages, log, a_pages) = (t.clone(), pages.clone(), log.clone(), a.pages.clone());
        threads.push(thread::spawn(move || match t.begin_transfer(h) {
            Ok(guard) => {
                pages.write(&a_pages, life(h), "a local transfer");
                pages.write(&a_pages, life(h), "a local transfer");
                if let Some(r) = guard.complete() {
                    reuse(&t, &pages, r, &log);
                }
            }
            // Refused: the room is closing, or already released.
            Err(Error::RoomClosed { .. } | Error::StaleHandle) => {}
            Err(e) => panic!("begin_transfer: {e}"),
        }));
    }
    // The writer ranks: each writes its part, then ACKs (done / ABORT_ACK).
    for rank in [0u32, 1] {
        let (t, pages, log, a_pages) = (t.clone(), pages.clone(), log.clone(), a.pages.clone());
        threads.push(thread::spawn(move || {
            pages.write(&a_pages, life(h), "a prefill rank");
            match t.quiesce(h, rank) {
                Ok(Quiesced::Released(r)) => reuse(&t, &pages, r, &log),
                Ok(Quiesced::Recorded) => {}
                Err(Error::StaleHandle) => panic!(
                    "rank {rank}'s ACK was refused as stale: the room was released (and its \
                     pages handed back) before rank {rank} had acknowledged"
                ),
                other => panic!("rank {rank}'s first ACK: {other:?}"),
            }
        }));
    }
    // The client disconnects: abort.
    {
        let (t, pages, log) = (t.clone(), pages.clone(), log.clone());
        threads.push(thread::spawn(move || {
            let aborted = t.abort(h).unwrap();
            if let Some(r) = aborted.released {
                reuse(&t, &pages, r, &log);
            }
        }));
    }
    for th in threads {
        th.join().unwrap();
    }
    // A refused begin whose transient unit was the room's last hold queued the release
    // (issue 42): the owner's drain gets it and reuses A's pages (B's is only logged).
    let mut queued = Vec::new();
    t.drain_released(&mut queued);
    for r in queued {
        if r.handle == h {
            reuse(&t, &pages, r, &log);
        } else {
            log.lock().unwrap().push(r);
        }
    }
    let r = common::exactly_one(&log, h);
    assert_eq!(r.reason, kvfence::Reason::Aborted);
    common::assert_at_rest(&t, ROOMS, Some(PAGES));
}

#[test]
fn abort_vs_transfer_in_flight() {
    common::check("abort_vs_transfer_in_flight", 160000, 160000, 3, model);
}
