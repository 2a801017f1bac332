//! (a) A fence scan racing a readmit of the same rank and an open for the rank's new
//! transport: the room opened after `readmit_rank` returned must not be quiesced by the old
//! scan (so `abort` must not release it at once, and nothing but the new incarnation's ACK
//! may release it).
//!
//! This is the race loom misses (its "last access" per atomic hides the scan's load of a
//! room word racing the opener's load-then-publish; see loom-tests/README.md): the loom model
//! passes under `--cfg kvfence_unserialized_readmit`, this test must fail there.
#![cfg(shuttle)]

mod common;

use common::{life, pool, reuse, Pages};
use kvfence::{Error, Phase, Quiesced};
use shuttle::thread;

/// 4 rooms: 3 background rooms (writer rank 1, never fenced) keep the scan busy, so the
/// room opened after the readmit takes the last index, the one the scan visits last.
const ROOMS: usize = 4;
const PAGES: usize = 6;

/// Window (asserted reachable, `common::check_windows`): the successful `readmit_rank(0)`
/// began while the fence was still running (it had not returned before the call), as in
/// `tests/scanner_races.rs`. (Not "the open returned before the fence did": readmit waits
/// for a running fence scan, so that is unreachable by design; it is what the mutation
/// `kvfence_unserialized_readmit` makes possible.)
fn model(w: &common::Window) {
    let t = pool(ROOMS, PAGES);
    let pages = Pages::new(PAGES);
    let log = common::log();
    for _ in 0..ROOMS - 1 {
        let bg = t.open(&[1], 1).unwrap();
        pages.own(&bg.pages, life(bg.handle));
    }

    // Set once the fence returned (a std atomic: no scheduling point).
    let fence_done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The transport of rank 0 is torn down: fence it (the scan walks the 4 rooms).
    let fencer = {
        let (t, pages, log) = (t.clone(), pages.clone(), log.clone());
        let fence_done = fence_done.clone();
        thread::spawn(move || {
            let fenced = t.fence_rank(0).unwrap();
            fence_done.store(true, std::sync::atomic::Ordering::SeqCst);
            // The only room naming rank 0 is the one opened after `readmit_rank(0)`
            // returned: the scan must never reach it.
            assert_eq!(
                fenced.quiesced, 0,
                "the fence's scan quiesced rank 0 in the room opened after readmit_rank(0) \
                 returned (its new transport never acknowledged)"
            );
            for r in fenced.released {
                reuse(&t, &pages, r, &log);
            }
        })
    };

    // Rank 0 reconnects: readmit it as soon as the fence has set its bit (the scan may then
    // still be running), then open a room for its new transport.
    let during_fence = loop {
        let before = fence_done.load(std::sync::atomic::Ordering::SeqCst);
        if t.readmit_rank(0).unwrap() {
            break !before;
        }
        thread::yield_now();
    };
    w.hit(0, during_fence);
    let room = match t.open(&[0], 2) {
        Ok(room) => room,
        // Refused: the open saw the fence's work (its own re-check): nothing was handed out.
        Err(Error::RankFenced { rank: 0 }) => {
            fencer.join().unwrap();
            return;
        }
        Err(e) => panic!("open after readmit: {e}"),
    };
    // The new incarnation writes the new room's pages.
    pages.own(&room.pages, life(room.handle));
    pages.write(&room.pages, life(room.handle), "rank 0 (new transport)");
    let h = room.handle;
    let aborted = t.abort(h).unwrap();
    assert!(
        aborted.released.is_none() && aborted.fanout.contains(0),
        "the room opened after readmit_rank(0) returned was released at once by abort (fan-out \
         {:?}): the earlier fence's scan quiesced rank 0 in it although its new transport never \
         acknowledged",
        &aborted.fanout[..]
    );
    fencer.join().unwrap();
    assert_eq!(
        t.phase(h).unwrap(),
        Phase::Aborting,
        "the room opened after readmit_rank(0) was released without rank 0's ACK (the old \
         fence's scan reached it)"
    );
    // Rank 0's new transport drains (one more write) and ACKs: that releases it.
    pages.write(&room.pages, life(h), "rank 0 (new transport)");
    match t.quiesce(h, 0).unwrap() {
        Quiesced::Released(r) => reuse(&t, &pages, r, &log),
        other => panic!("rank 0's ACK must release the room: {other:?}"),
    }
    common::exactly_one(&log, h);
}

#[test]
fn fence_vs_readmit_then_open() {
    common::check_windows(
        "fence_vs_readmit_then_open",
        160000,
        160000,
        3,
        &["readmit_during_the_fence"],
        model,
    );
}
