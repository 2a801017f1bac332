//! (d) A failed transfer (its bytes may still land) vs `abort` + the writer's ACK +
//! `fence_rank(peer)`: the room is not released, and its pages not reused, before the
//! transfer's peer is fenced. Must fail under `--cfg kvfence_failed_counts_as_drained` (a
//! failed transfer drops its hold like a completed one).
#![cfg(shuttle)]

mod common;

use common::{life, pool, reuse, Pages};
use kvfence::Quiesced;
use shuttle::sync::atomic::{AtomicBool, Ordering};
use shuttle::sync::Arc;
use shuttle::thread;

const ROOMS: usize = 2;
const PAGES: usize = 2;
/// The transfer's peer rank (its transport carries the transfer).
const PEER: u32 = 1;

/// Window (asserted reachable, `common::check_windows`): the transfer's `fail()`
/// overlapped `fence_rank(PEER)`.
fn model(w: &common::Window) {
    let t = pool(ROOMS, PAGES);
    let pages = Pages::new(PAGES);
    let log = common::log();
    let a = t.open(&[0], PAGES).unwrap();
    let h = a.handle;
    pages.own(&a.pages, life(h));
    let transfer = kvfence::RoomTable::begin_transfer_owned(&t, h, Some(PEER)).unwrap();

    let mut threads = Vec::new();
    // The transfer engine reports an error: the transfer ends as failed.
    {
        let (t, pages, log, w) = (t.clone(), pages.clone(), log.clone(), w.clone());
        threads.push(thread::spawn(move || {
            // Released only if the peer was fenced already and this was the last hold.
            if let Some(r) = w.timed(0, || transfer.fail()) {
                reuse(&t, &pages, r, &log);
            }
        }));
    }
    // The peer's transport: slices of the failed transfer may still land (late) until the
    // integrator tears the transport down; then it fences the peer (nothing lands after).
    let teardown = Arc::new(AtomicBool::new(false));
    {
        let (t, pages, log, a_pages) = (t.clone(), pages.clone(), log.clone(), a.pages.clone());
        let (teardown, w) = (teardown.clone(), w.clone());
        threads.push(thread::spawn(move || {
            loop {
                let stop = teardown.load(Ordering::SeqCst);
                pages.write(&a_pages, life(h), "a late slice of the failed transfer");
                if stop {
                    break;
                }
                thread::yield_now();
            }
            let fenced = w.timed(1, || t.fence_rank(PEER).unwrap());
            for r in fenced.released {
                reuse(&t, &pages, r, &log);
            }
        }));
    }
    // Writer rank 0 drains and ACKs; then the integrator decides to tear the failed
    // transfer's transport down (the fence follows on the transport's thread).
    {
        let (t, pages, log, a_pages) = (t.clone(), pages.clone(), log.clone(), a.pages.clone());
        threads.push(thread::spawn(move || {
            pages.write(&a_pages, life(h), "prefill rank 0");
            match t.quiesce(h, 0).unwrap() {
                Quiesced::Released(r) => reuse(&t, &pages, r, &log),
                Quiesced::Recorded => {}
                other => panic!("rank 0's ACK: {other:?}"),
            }
            teardown.store(true, Ordering::SeqCst);
        }));
    }
    // The client disconnects.
    {
        let (t, pages, log) = (t.clone(), pages.clone(), log.clone());
        threads.push(thread::spawn(move || {
            if let Some(r) = t.abort(h).unwrap().released {
                reuse(&t, &pages, r, &log);
            }
        }));
    }
    for th in threads {
        th.join().unwrap();
    }
    w.hit(0, w.overlap(0, 1));
    common::exactly_one(&log, h);
    common::assert_at_rest(&t, ROOMS, Some(PAGES));
    assert!(t.readmit_rank(PEER).unwrap());
}

#[test]
fn failed_transfer_vs_fence() {
    common::check_windows(
        "failed_transfer_vs_fence",
        120000,
        120000,
        3,
        &["fail_overlapped_the_fence"],
        model,
    );
}
