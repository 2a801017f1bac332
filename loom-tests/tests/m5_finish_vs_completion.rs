//! Model 5: `finish` (the normal, draining path) races the completion of what is still in
//! flight.
//!
//! * `m5_finish_vs_completion`: a local transfer completes while the scheduler finishes the
//!   request. Exactly one release (by `finish` only if the transfer had already ended,
//!   else by `complete`); no transfer can begin once finished; the releaser reuses the
//!   pages for B at once and checks them.
//! * `m5_finish_vs_ack_and_dropped_guard`: the same with a writer rank's "done" (`quiesce`)
//!   also racing, and the transfer guard *dropped* without `complete` (early return): a
//!   release it performs must still be reported exactly once, through `take_orphaned`.
//!
//! Threads: 2 (exhaustive) and 3 (preemption bound 3).
#![cfg(loom)]

mod common;

use common::{assert_at_rest, check, exactly_one, own_and_check, reuse, Arena, A, B, EXHAUSTIVE};
use kvfence::{Error, Phase, Quiesced, RankSet};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

#[test]
fn m5_finish_vs_completion() {
    check("m5_finish_vs_completion", 2, EXHAUSTIVE, || {
        let table = common::table(1, 2, 1);
        let arena = Arena::new(2, 1);
        let a = table.open(2, &RankSet::new()).unwrap();
        let h = a.handle;
        let guard = table.begin_transfer(h).unwrap();
        let ended = Arc::new(AtomicUsize::new(0));

        let scheduler = {
            let (table, arena, ended) = (table.clone(), arena.clone(), ended.clone());
            thread::spawn(move || {
                let mut out = Vec::new();
                if let Some(r) = table.finish(h).expect("first finish") {
                    assert_eq!(
                        ended.load(Ordering::Relaxed),
                        1,
                        "finish released the room while a transfer was in flight"
                    );
                    out.push(r);
                    reuse(&table, &arena, &mut out);
                }
                match table.begin_transfer(h) {
                    Err(Error::RoomClosed {
                        phase: Phase::Draining,
                    })
                    | Err(Error::StaleHandle) => {}
                    other => panic!("a transfer began on a finished room: {other:?}"),
                }
                match table.abort(h) {
                    // Still draining, or already released by the completion meanwhile.
                    Err(Error::AlreadyFinished | Error::StaleHandle) => {}
                    other => panic!("abort after finish: {other:?}"),
                }
                out
            })
        };

        guard.with_pages(|pages| arena.write(pages, 0, A));
        ended.store(1, Ordering::Relaxed);
        let mut releases = Vec::new();
        if let Some(r) = guard.complete() {
            releases.push(r);
            reuse(&table, &arena, &mut releases);
        }
        releases.extend(scheduler.join().unwrap());
        let r = exactly_one(&releases, h);
        assert_eq!((r.pages, r.phase), (2, Phase::Draining));
        assert_at_rest(&table, 1, 2, 2);
    });
}

#[test]
fn m5_finish_vs_ack_and_dropped_guard() {
    check("m5_finish_vs_ack_and_dropped_guard", 3, Some(3), || {
        let table = common::table(1, 2, 1);
        // Slot 0: local transfer; slot 1: rank 0.
        let arena = Arena::new(2, 2);
        let a = table.open(2, &RankSet::first(1).unwrap()).unwrap();
        let h = a.handle;
        let guard = table.begin_transfer(h).unwrap();
        let ended = Arc::new(AtomicUsize::new(0));

        let rank0 = {
            let (table, arena, ended) = (table.clone(), arena.clone(), ended.clone());
            let pages = a.pages.clone();
            thread::spawn(move || {
                arena.write(&pages, 1, A);
                ended.fetch_add(1, Ordering::Relaxed);
                match table
                    .quiesce(h, 0)
                    .expect("rank 0's done of this lifecycle")
                {
                    Quiesced::Released(r) => {
                        assert_eq!(ended.load(Ordering::Relaxed), 2, "released too early");
                        vec![r]
                    }
                    Quiesced::Recorded => vec![],
                    Quiesced::Duplicate => panic!("first done counted as duplicate"),
                }
            })
        };
        let scheduler = {
            let table = table.clone();
            thread::spawn(move || match table.finish(h).expect("first finish") {
                Some(r) => vec![r],
                None => vec![],
            })
        };

        guard.with_pages(|pages| arena.write(pages, 0, A));
        ended.fetch_add(1, Ordering::Relaxed);
        drop(guard); // early return: no `complete`
        let mut releases = rank0.join().unwrap();
        let by_finish = scheduler.join().unwrap();
        assert!(
            by_finish.is_empty() || ended.load(Ordering::Relaxed) == 2,
            "finish released while the transfer or rank 0 was still in flight"
        );
        releases.extend(by_finish);
        releases.extend(table.take_orphaned());
        let r = exactly_one(&releases, h);
        assert_eq!((r.pages, r.phase), (2, Phase::Draining));
        // Nobody wrote after the release: the next owner finds only its own data.
        let b = table.open(2, &RankSet::new()).unwrap();
        own_and_check(&arena, &b.pages, B);
        releases.push(table.finish(b.handle).unwrap().unwrap());
        assert_at_rest(&table, 1, 2, 2);
    });
}
