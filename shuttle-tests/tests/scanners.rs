//! (e) The scanners racing lifecycles: `wait_released` vs the release (no lost wake-up, the
//! pages are back when it returns), `wait_idle` vs releases of several rooms, `stats` vs
//! lifecycles on the same rooms (each reported room consistent with one lifecycle), and
//! `fence_rank` vs `open` (the store-buffer pair), and `fence_rank` vs `finish_drained`
//! (both clear the same room's writer bits: one release, delivered once).
//!
//! A lost wake-up is a shuttle deadlock (every thread blocked): shuttle fails the test.
//!
//! Each model also asserts that its race's window is reachable (`common::check_windows`):
//! the real-thread tests of `tests/scanner_races.rs` only report how often they hit it.
#![cfg(shuttle)]

mod common;

use common::{gate, life, pool, Pages, Window};
use kvfence::{Error, Phase, Quiesced, RoomHandle};
use shuttle::sync::atomic::{AtomicBool, Ordering};
use shuttle::sync::{Arc, Mutex};
use shuttle::thread;
use std::collections::HashMap;

/// `wait_released` (and a `wait_idle` waiter) racing the ACK that releases the room: both
/// return (a lost wake-up is a deadlock), and once `wait_released` returns every page is
/// back (an `open` of the whole pool succeeds at once).
///
/// Window: `wait_released` overlapped the releasing ACK.
fn wait_released_model(w: &Window) {
    const PAGES: usize = 4;
    let t = pool(2, PAGES);
    let pages = Pages::new(PAGES);
    let a = t.open(&[0], PAGES).unwrap();
    let h = a.handle;
    pages.own(&a.pages, life(h));
    let _ = t.abort(h).unwrap();
    let acker = {
        let (t, pages, a_pages, w) = (t.clone(), pages.clone(), a.pages.clone(), w.clone());
        thread::spawn(move || {
            pages.write(&a_pages, life(h), "prefill rank 0");
            let acked = w.timed(1, || t.quiesce(h, 0));
            assert!(matches!(acked, Ok(Quiesced::Released(_))));
        })
    };
    let idler = {
        let t = t.clone();
        thread::spawn(move || {
            t.wait_idle();
            // The main thread may have opened its next room since: only A is checked.
            assert_eq!(
                t.phase(h).unwrap(),
                Phase::Free,
                "wait_idle returned before A's release"
            );
            // Not checked: `stats().releases` here. `deliver` bumps that counter after it
            // wakes the waiters, so a snapshot taken right after the wake-up can miss the
            // release that caused it (found by this model; see the README).
        })
    };
    w.timed(0, || t.wait_released(h)).unwrap();
    // The whole pool is free again: an open of every page succeeds at once.
    let b = t
        .open(&[], PAGES)
        .unwrap_or_else(|e| panic!("pages not back after wait_released: {e}"));
    pages.own(&b.pages, life(b.handle));
    pages.write(&b.pages, life(b.handle), "the new owner");
    pages.expect(&b.pages, life(b.handle));
    assert!(t.finish(b.handle).unwrap().is_some());
    acker.join().unwrap();
    idler.join().unwrap();
    w.hit(0, w.overlap(0, 1));
}

#[test]
fn wait_released_vs_release() {
    common::check_windows(
        "wait_released_vs_release",
        200000,
        200000,
        3,
        &["wait_released_overlapped_the_ack"],
        wait_released_model,
    );
}

/// `wait_idle` racing two ACK threads that release two rooms: it never returns before
/// every page is back, and never sleeps through the last release.
///
/// Window: `wait_idle` overlapped an ACK thread's releases.
fn wait_idle_model(w: &Window) {
    const ROOMS: usize = 2;
    const PER_ROOM: usize = 2;
    let t = pool(ROOMS, ROOMS * PER_ROOM);
    let rooms: Vec<RoomHandle> = (0..ROOMS)
        .map(|_| t.open(&[0, 1], PER_ROOM).unwrap().handle)
        .collect();
    for &h in &rooms {
        let _ = t.abort(h).unwrap();
    }
    let ackers: Vec<_> = [0u32, 1]
        .into_iter()
        .map(|rank| {
            let (t, rooms, w) = (t.clone(), rooms.clone(), w.clone());
            thread::spawn(move || {
                w.timed(1 + rank as usize, || {
                    for &h in &rooms {
                        let _ = t.quiesce(h, rank).unwrap();
                    }
                })
            })
        })
        .collect();
    w.timed(0, || t.wait_idle());
    let s = t.stats();
    assert_eq!(
        (s.pages.free, s.rooms.free),
        (ROOMS * PER_ROOM, ROOMS),
        "wait_idle returned before every page was back: {s:?}"
    );
    for a in ackers {
        a.join().unwrap();
    }
    w.hit(0, w.overlap(0, 1) || w.overlap(0, 2));
}

#[test]
fn wait_idle_vs_releases() {
    common::check_windows(
        "wait_idle_vs_releases",
        200000,
        200000,
        3,
        &["wait_idle_overlapped_an_ack"],
        wait_idle_model,
    );
}

/// `stats` racing two workers that open (with a page count that differs between
/// consecutive lifecycles), abort and ACK rooms of a 2-room table: every closing room a
/// snapshot reports is one the workers aborted, and its page count, phase and pending
/// writers are those of that one lifecycle.
///
/// Window: a snapshot during which the workers changed a room's lifecycle (an open, abort
/// or ACK returned while `stats` ran).
fn stats_model(w: &Window) {
    const ROOMS: usize = 2;
    const ROUNDS: usize = 2;
    let t = pool(ROOMS, 16);
    // handle -> page count; filled before the room can be closing.
    let known: Arc<Mutex<HashMap<RoomHandle, usize>>> = Arc::new(Mutex::new(HashMap::new()));
    let done = Arc::new(AtomicBool::new(false));
    // Bumped by the workers after every open, abort and ACK (a std atomic: no scheduling
    // point, so the schedules explored are unchanged).
    let events = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let bump = |events: &std::sync::atomic::AtomicU64| {
        events.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    };
    let workers: Vec<_> = (0..2usize)
        .map(|id| {
            let (t, known, events) = (t.clone(), known.clone(), events.clone());
            thread::spawn(move || {
                for i in 0..ROUNDS {
                    let n = 1 + id * ROUNDS + i; // 1, 2 | 3, 4: every lifecycle differs
                    let room = match t.open(&[0], n) {
                        Ok(room) => room,
                        Err(Error::RoomTableFull) => continue,
                        Err(e) => panic!("open: {e}"),
                    };
                    bump(&events);
                    known.lock().unwrap().insert(room.handle, n);
                    let _ = t.abort(room.handle).unwrap();
                    bump(&events);
                    assert!(matches!(
                        t.quiesce(room.handle, 0),
                        Ok(Quiesced::Released(_))
                    ));
                    bump(&events);
                }
            })
        })
        .collect();
    let snapshotter = {
        let (t, known, done, w) = (t.clone(), known.clone(), done.clone(), w.clone());
        thread::spawn(move || loop {
            let finished = done.load(Ordering::SeqCst);
            let before = events.load(std::sync::atomic::Ordering::SeqCst);
            let s = t.stats();
            w.hit(
                0,
                events.load(std::sync::atomic::Ordering::SeqCst) != before,
            );
            let known = known.lock().unwrap();
            for room in &s.closing {
                let Some(&n) = known.get(&room.handle) else {
                    panic!("stats reported a closing room no worker aborted: {room:?}");
                };
                assert_eq!(room.phase, Phase::Aborting, "{room:?}");
                assert_eq!(
                    room.pages, n,
                    "stats mixed lifecycles: {:?} reported {} pages, its lifecycle has {n}",
                    room.handle, room.pages
                );
                assert!(
                    room.waiting_on.iter().all(|&r| r == 0),
                    "stats reported a writer the lifecycle does not have: {room:?}"
                );
            }
            assert!(s.rooms.owned + s.rooms.held <= ROOMS, "{s:?}");
            drop(known);
            if finished {
                break;
            }
            thread::yield_now();
        })
    };
    for w in workers {
        w.join().unwrap();
    }
    done.store(true, Ordering::SeqCst);
    snapshotter.join().unwrap();
    common::assert_at_rest(&t, ROOMS, Some(16));
}

#[test]
fn stats_vs_lifecycles() {
    common::check_windows(
        "stats_vs_lifecycles",
        80000,
        80000,
        3,
        &["lifecycle_changed_during_stats"],
        stats_model,
    );
}

/// `fence_rank(0)` racing `open` of a room naming rank 0 (the store-buffer pair): the open
/// is refused, or the room it returns no longer waits on rank 0 once the fence returned;
/// never a room left waiting on a rank that can no longer answer. A rolled-back open is
/// never reported as a release.
///
/// Window: the open overlapped the fence.
fn fence_vs_open_model(w: &Window) {
    let t = pool(3, 4);
    // A background room (rank 1) before the new one, so the scan has work around it.
    let bg = t.open(&[1], 1).unwrap();
    let fencer = {
        let (t, w) = (t.clone(), w.clone());
        thread::spawn(move || w.timed(1, || t.fence_rank(0).unwrap()))
    };
    let opened = w.timed(0, || t.open(&[0], 2));
    let fenced = fencer.join().unwrap();
    w.hit(0, w.overlap(0, 1));
    assert!(fenced.released.is_empty(), "{fenced:?}");
    assert_eq!(fenced.queued, 0, "{fenced:?}");
    match opened {
        Ok(room) => {
            let aborted = t.abort(room.handle).unwrap();
            assert!(
                aborted.fanout.is_empty() && aborted.released.is_some(),
                "a room opened during fence_rank(0) still waits on the fenced rank 0 (fan-out \
                 {:?})",
                &aborted.fanout[..]
            );
        }
        Err(Error::RankFenced { rank: 0 }) => {}
        Err(e) => panic!("open: {e}"),
    }
    assert_eq!(t.queued_releases(), 0, "a rolled-back open was reported");
    assert!(t.readmit_rank(0).unwrap());
    let _ = t.quiesce(bg.handle, 1).unwrap();
    assert!(t.finish(bg.handle).unwrap().is_some());
    common::assert_at_rest(&t, 3, Some(4));
}

#[test]
fn fence_vs_open() {
    common::check_windows(
        "fence_vs_open",
        140000,
        140000,
        3,
        &["open_overlapped_the_fence"],
        fence_vs_open_model,
    );
}

/// `finish_drained` (the scheduler: a successful transfer of two writers) racing
/// `fence_rank(1)` (the heartbeat thread), on a gate table with a release queue: the room
/// is released exactly once, returned by `finish_drained` or queued by the fence, never
/// both, never neither. A second room, owned by rank 1 only, gives the scan work around it.
///
/// Windows: the two calls overlapped; and each side delivered the release in some
/// execution (both outcomes are reachable).
fn finish_drained_vs_fence_model(w: &Window) {
    let t = gate(3, true);
    let other = t.open_gate(&[1], 9, vec![]).unwrap();
    let h = t.open_gate(&[0, 1], 7, vec![]).unwrap();
    let fencer = {
        let (t, w) = (t.clone(), w.clone());
        thread::spawn(move || w.timed(1, || t.fence_rank(1).unwrap()))
    };
    let direct = w.timed(0, || t.finish_drained(h)).unwrap();
    let fenced = fencer.join().unwrap();
    w.hit(0, w.overlap(0, 1));
    w.hit(1, direct.is_some());
    w.hit(2, direct.is_none());
    let mut queued = Vec::new();
    t.drain_released(&mut queued);
    assert_eq!(queued.len(), fenced.queued, "{fenced:?}");
    let ours = direct
        .iter()
        .chain(queued.iter().filter(|r| r.handle == h))
        .count();
    assert_eq!(
        ours, 1,
        "the room was released {ours} times (direct {direct:?}, queued {queued:?})"
    );
    if let Some(r) = &direct {
        assert_eq!((r.token, r.reason), (7, kvfence::Reason::Finished));
    }
    assert!(t.readmit_rank(1).unwrap());
    // The other room: rank 1 was fenced in it too (it was live: quiesced, not released).
    assert!(
        t.finish(other).unwrap().is_none(),
        "queued, as the table is configured"
    );
    t.drain_released(&mut queued);
    common::assert_at_rest(&t, 3, None);
}

#[test]
fn finish_drained_vs_fence() {
    common::check_windows(
        "finish_drained_vs_fence",
        140000,
        140000,
        3,
        &[
            "finish_drained_overlapped_the_fence",
            "released_by_finish_drained",
            "released_by_the_fence",
        ],
        finish_drained_vs_fence_model,
    );
}
