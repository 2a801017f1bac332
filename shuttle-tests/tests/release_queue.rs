//! (c) The release queue: releases pushed by ACK threads and drained by two drainer
//! threads at the same time. Each release is delivered exactly once (and a room's pages are
//! freed by the engine once). One drainer pops (`pop_released`), the other drains
//! (`drain_released`). Must fail under `--cfg kvfence_racy_queue_pop` (the pop takes the
//! queue bit with a load and a store: a release is delivered twice, or a concurrent push
//! lost). Since issue 18 the drain takes a word's bits with one swap and the mutation
//! breaks only `pop_released`: with two `drain_released` drainers this test no longer
//! caught it.
#![cfg(shuttle)]

mod common;

use kvfence::{Quiesced, Reason, RoomHandle};
use shuttle::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use shuttle::sync::Arc;
use shuttle::thread;

const ROOMS: usize = 3;

/// Window (asserted reachable, `common::check_windows`): a drainer took a release while
/// the ACK thread was still pushing (its loop had not returned).
fn model(w: &common::Window) {
    let t = common::gate(ROOMS, true);
    // The engine's pages: room i has page i; `freed[p]` counts the engine's frees of page p.
    let freed: Arc<Vec<AtomicU64>> = Arc::new((0..ROOMS).map(|_| AtomicU64::new(0)).collect());
    let rooms: Vec<RoomHandle> = (0..ROOMS as u64)
        .map(|token| t.open_gate(&[0, 1], token, vec![token as u32]).unwrap())
        .collect();
    for &h in &rooms {
        let _ = t.abort(h).unwrap();
        assert_eq!(t.quiesce(h, 0).unwrap(), Quiesced::Recorded);
    }
    let done = Arc::new(AtomicBool::new(false));
    // Set once the ACK thread pushed all (a std atomic: no scheduling point).
    let pushed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The ACK thread: rank 1's ACKs, each the last thing its room waits on (queued).
    let acker = {
        let (t, rooms, pushed) = (t.clone(), rooms.clone(), pushed.clone());
        thread::spawn(move || {
            for &h in &rooms {
                assert_eq!(t.quiesce(h, 1).unwrap(), Quiesced::Queued);
            }
            pushed.store(true, std::sync::atomic::Ordering::SeqCst);
        })
    };
    // Two drainers (the scheduler loop and, say, a shutdown path) drain at the same time:
    // one with `pop_released` (one release per call), one with `drain_released` (one pass,
    // a swap per word), so that both ways of taking a queue bit race each other and the
    // pushes (`kvfence_racy_queue_pop` breaks the pop only).
    let drainers: Vec<_> = (0..2)
        .map(|d| {
            let (t, done, freed) = (t.clone(), done.clone(), freed.clone());
            let (w, pushed) = (w.clone(), pushed.clone());
            thread::spawn(move || {
                let mut got = Vec::new();
                let mut during = false;
                loop {
                    let finished = done.load(Ordering::SeqCst);
                    let before = got.len();
                    if d == 0 {
                        got.extend(t.pop_released());
                    } else {
                        t.drain_released(&mut got);
                    }
                    during |=
                        got.len() > before && !pushed.load(std::sync::atomic::Ordering::SeqCst);
                    for r in &got[before..] {
                        assert_eq!(r.reason, Reason::Aborted);
                        // The engine frees the release's pages.
                        for &p in &r.pages {
                            let n = freed[p as usize].fetch_add(1, Ordering::SeqCst);
                            assert_eq!(n, 0, "page {p} freed twice: a release delivered twice");
                        }
                    }
                    if finished {
                        break;
                    }
                    thread::yield_now();
                }
                w.hit(0, during);
                got
            })
        })
        .collect();
    acker.join().unwrap();
    done.store(true, Ordering::SeqCst);
    let mut tokens: Vec<u64> = drainers
        .into_iter()
        .flat_map(|d| d.join().unwrap())
        .map(|r| r.token)
        .collect();
    tokens.sort_unstable();
    assert_eq!(
        tokens,
        (0..ROOMS as u64).collect::<Vec<_>>(),
        "every release must be delivered exactly once (tokens delivered)"
    );
    for (p, f) in freed.iter().enumerate() {
        assert_eq!(
            f.load(Ordering::SeqCst),
            1,
            "page {p} not freed exactly once"
        );
    }
    common::assert_at_rest(&t, ROOMS, None);
}

#[test]
fn release_queue_two_drainers() {
    common::check_windows(
        "release_queue_two_drainers",
        100000,
        100000,
        3,
        &["drained_while_pushes_ran"],
        model,
    );
}
