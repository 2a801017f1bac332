//! Real-thread stress tests of every scanner racing a lifecycle: `fence_rank` (vs
//! `readmit_rank` + `open`, vs `open`, and vs a transfer to the fenced peer ending as
//! failed), `wait_released`, `wait_idle`, `stats`, the release queue's drainers vs the
//! threads pushing releases into it, the fenced set's lock-free membership read vs
//! readmits and fences of other ranks, and `quarantine` vs the last transfer's completion
//! (issue 18, items 1 and 2).
//!
//! Why these exist beside the loom models: loom keeps one "last access" per atomic, so a
//! scanner's load that races a load-then-store of the same word (open's load of the room
//! word, then its publish) can go unexplored. These tests run the races on real threads,
//! many times, and *count how often the racy window was actually hit*: two calls whose
//! executions overlapped in time (each call is bracketed by tickets from one `SeqCst`
//! counter). Each test prints its count (`cargo test --test scanner_races -- --nocapture`)
//! but never fails for a window not hit: whether the threads overlapped is a timing of the
//! box (under load 9-13 one run in 24 raced nothing), not a bug (issue 42, item 3). A test
//! fails only when a race went wrong. That each window is *reachable* is asserted by a
//! deterministic check instead: the shuttle model of the same race counts the executions
//! that hit the window and fails if none did, under fixed seeds (`shuttle-tests/`,
//! its `shuttle-window` line):
//!
//! | test here | shuttle model (window asserted there) |
//! |---|---|
//! | `fence_then_readmit_...` | `fence_vs_readmit_then_open` (fence_readmit.rs) |
//! | `fence_vs_open_...` | `fence_vs_open` (scanners.rs) |
//! | `wait_released_vs_release_...` | `wait_released_vs_release` (scanners.rs) |
//! | `wait_idle_vs_releases_...` | `wait_idle_vs_releases` (scanners.rs) |
//! | `stats_vs_lifecycles_...` | `stats_vs_lifecycles` (scanners.rs) |
//! | `queue_drainers_vs_pushes_...` | `release_queue_two_drainers` (release_queue.rs) |
//! | `fence_vs_failed_transfer_...` | `failed_transfer_vs_fence` (failed_transfer.rs) |
//! | `failed_transfer_to_a_rank_that_stayed_fenced_...` | `fail_vs_readmit_and_fence_of_other_ranks` (fenced_set.rs) |
//! | `quarantine_vs_last_completion_...` | `quarantine_vs_last_completion` (quarantine.rs; both outcomes asserted there too) |
//! | `finish_drained_vs_fence_...` | `finish_drained_vs_fence` (scanners.rs) |
//!
//! The mutations of `scripts/mutations.sh` are still caught here: a mutated build fails
//! with the race's own assertion message, never with a "window not hit" one.
//!
//! They were first written against the API before issue 10 (with `Config::new` and
//! `RankSet`), and that version failed on the library before issue 9's fixes (see the
//! README); this is the same file ported to the current API.
//! The tests run one at a time (a file-wide lock: side by side, their threads would share
//! the cores and rarely overlap), start each race from a spinning barrier (a sleeping one
//! wakes its thread microseconds late), and keep racing past their iteration counts, up
//! to 30 s, while their window was never hit.
//! `KVFENCE_STRESS_SCALE` (default 1) multiplies the iteration counts and time bounds.

// Real threads by the thousand: far too slow under Miri's interpreter. These races run under
// ThreadSanitizer instead (scripts/tsan.sh).
#![cfg(not(miri))]

use kvfence::{Config, Error, Phase, Quiesced, Reason, RoomHandle, RoomTable};
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

fn scale() -> usize {
    std::env::var("KVFENCE_STRESS_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

/// Serialises this file's tests. Each race needs its threads on cores at the same time;
/// run side by side (libtest's default), ten races of two to four threads share a 2-core
/// box and a race's threads rarely overlap (a CI box hit `fence_vs_open`'s window in 0 of
/// 3000 runs that way, where a serial run hits it in over 90%).
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    // A test that failed poisons the lock; the others still run (and report their own).
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How long a race keeps going past its iteration count while its window was never hit.
const EXTEND: Duration = Duration::from_secs(30);

/// A race's iteration budget: its `min` iterations, then more while the window was never
/// hit, until [`EXTEND`] has passed since the start (on a loaded box the threads may not
/// run in parallel for a while). The count printed and checked is the iterations run.
struct Runs {
    min: usize,
    began: Instant,
}

impl Runs {
    fn new(min: usize) -> Self {
        Self {
            min,
            began: Instant::now(),
        }
    }

    /// Whether iteration `run` (counted from 0) happens, `hits` windows hit so far.
    fn more(&self, run: usize, hits: usize) -> bool {
        run < self.min || (hits == 0 && self.began.elapsed() < EXTEND * scale() as u32)
    }
}

/// A one-use barrier whose waiters spin (yielding after 100 us) instead of sleeping.
/// `std::sync::Barrier` puts the early arrivals to sleep, and waking one takes a futex
/// round trip, microseconds: longer than the short calls raced here, so the thread woken
/// last often started its call after the other's had ended. Spinning waiters on their own
/// cores all leave within a cache-line transfer of the last arrival.
struct SpinBarrier {
    parties: usize,
    arrived: AtomicUsize,
}

impl SpinBarrier {
    fn new(parties: usize) -> Self {
        Self {
            parties,
            arrived: AtomicUsize::new(0),
        }
    }

    fn wait(&self) {
        self.arrived.fetch_add(1, Ordering::AcqRel);
        // Spin, not yield, for the first 100 us: a thread just spawned starts on its
        // parent's core, and a yield would hand it that core where spinning lets an idle
        // core take it over.
        let waiting = Instant::now();
        while self.arrived.load(Ordering::Acquire) < self.parties {
            if waiting.elapsed() > Duration::from_micros(100) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

/// The long side of a race, on a thread of its own kept for the whole test, and the short
/// side landed at every point of it, run after run. [`Partner::start`] asks the partner
/// thread for one long call, waits until it has begun, then spins for run `k`'s share,
/// `(k % 17) / 16`, of the long call's typical length (measured beforehand with
/// [`typical`]): over 17 runs the short call (made by the caller right after) starts with
/// the long one, all through it, and just past its end; [`Partner::finish`] takes the long
/// call's result and tickets.
///
/// Why a kept thread: a thread spawned per run starts on its parent's core and the two
/// calls then often run one after the other, not side by side (and a barrier alone
/// starts both at once, so a short call ends before the long one's first step, or not,
/// depending on the box: a CI box hit `fence_vs_open`'s window in 0 of 3000 runs).
struct Partner<'a, R> {
    go: mpsc::Sender<()>,
    done: mpsc::Receiver<(R, (u64, u64))>,
    began: &'a AtomicUsize,
    asked: Cell<usize>,
    long: Duration,
}

impl<R> Partner<'_, R> {
    fn start(&self, run: usize) {
        self.asked.set(self.asked.get() + 1);
        self.go.send(()).expect("the partner thread panicked");
        // Spin, not sleep, for the first 100 us: the partner wakes on its own core.
        let waiting = Instant::now();
        while self.began.load(Ordering::Acquire) < self.asked.get() {
            if waiting.elapsed() > Duration::from_micros(100) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        let until = Instant::now() + self.long * (run % 17) as u32 / 16;
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    }

    fn finish(&self) -> (R, (u64, u64)) {
        self.done.recv().expect("the partner thread panicked")
    }
}

/// Runs `body` with a [`Partner`] thread making `long_call` (typically `long` long) on
/// request. The thread ends with `body` (also when `body` panics: its sender is dropped).
fn with_partner<R: Send, T>(
    long: Duration,
    long_call: impl Fn() -> R + Sync,
    body: impl FnOnce(&Partner<'_, R>) -> T,
) -> T {
    let began = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let (go, go_rx) = mpsc::channel::<()>();
        let (done_tx, done) = mpsc::channel();
        let (began, long_call) = (&began, &long_call);
        s.spawn(move || {
            for () in go_rx {
                began.fetch_add(1, Ordering::Release);
                if done_tx.send(timed(long_call)).is_err() {
                    break;
                }
            }
        });
        body(&Partner {
            go,
            done,
            began,
            asked: Cell::new(0),
            long,
        })
    })
}

/// The median of nine timed calls of `f`.
fn typical(mut f: impl FnMut()) -> Duration {
    let mut times: Vec<Duration> = (0..9)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed()
        })
        .collect();
    times.sort_unstable();
    times[4]
}

/// One global order of call starts and ends.
static TICKET: AtomicU64 = AtomicU64::new(0);

fn ticket() -> u64 {
    TICKET.fetch_add(1, Ordering::SeqCst)
}

/// Runs `f`, returning its result and its `[start, end]` tickets.
fn timed<R>(f: impl FnOnce() -> R) -> (R, (u64, u64)) {
    let start = ticket();
    let r = f();
    (r, (start, ticket()))
}

/// Runs `f`, returning its result and the monotonic clock's readings around it. For races
/// of calls a few nanoseconds long, where the tickets' shared counter would itself
/// serialise the two threads right before their calls (`Instant` is a vDSO clock read:
/// no shared cache line; the monotonic clock is consistent across cores).
fn clocked<R>(f: impl FnOnce() -> R) -> (R, (Instant, Instant)) {
    let start = Instant::now();
    let r = f();
    (r, (start, Instant::now()))
}

fn overlap(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

/// Prints how often the racy window was hit. Never fails: a window not hit is a timing
/// (the threads did not overlap on this box, this time), not a bug; the window's
/// reachability is asserted by the race's shuttle model (see the module docs).
fn report(test: &str, hits: usize, runs: usize) {
    println!("scanner-race {test}: racy window hit in {hits} of {runs} iterations");
    if hits == 0 {
        println!(
            "scanner-race {test}: NOTE the racy window was never hit in {runs} iterations \
             (at least {:?} of racing; {} CPUs available): this run raced nothing (not a \
             failure: the shuttle model asserts the window is reachable)",
            EXTEND * scale() as u32,
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
    }
}

/// Finding 1 of issue 9: a room opened after `readmit_rank(r)` returned, while an earlier
/// `fence_rank(r)` scan was still running, must not be reached by that scan (its writes come
/// from r's new transport: only r's own ACK may release it).
///
/// The table is full but for its last room index, so the room opened after the readmit is
/// the last one the scan visits. Fails on the pre-fix library (and under
/// `--cfg kvfence_unserialized_readmit`) with "released at once".
#[test]
fn fence_then_readmit_never_strips_a_room_opened_after_the_readmit() {
    let _serial = serial();
    const ROOMS: usize = 1 << 16;
    let t = RoomTable::new(Config::pool(ROOMS, ROOMS + 8)).unwrap();
    // Every room but the last is owned (writer: rank 1, never fenced).
    let mut held = Vec::new();
    for _ in 0..ROOMS {
        held.push(t.open(&[], 1).unwrap().handle);
    }
    let last = *held.iter().max_by_key(|h| h.index()).unwrap();
    assert_eq!(last.index(), ROOMS - 1);
    let _ = t.abort(last).unwrap();
    let budget = Runs::new(20 * scale());
    let mut hits = 0;
    let mut runs = 0;
    while budget.more(runs, hits) {
        let run = runs;
        runs += 1;
        let fence_done = AtomicBool::new(false);
        let start = SpinBarrier::new(2);
        let (room, readmit_during_scan) = std::thread::scope(|s| {
            s.spawn(|| {
                start.wait();
                let _ = t.fence_rank(0).unwrap();
                fence_done.store(true, Ordering::SeqCst);
            });
            start.wait();
            // Re-admit as soon as the fence has set its bit (the scan is then running).
            let during = loop {
                let before = fence_done.load(Ordering::SeqCst);
                if t.readmit_rank(0).unwrap() {
                    break !before;
                }
                std::hint::spin_loop();
            };
            // A new request, for rank 0's new transport: the only free index is the last.
            // Only an open refused because a later fence won a race could fail: none here.
            let room = t
                .open(&[0], 1)
                .unwrap_or_else(|e| panic!("run {run}: open after readmit: {e}"));
            (room, during)
        });
        hits += usize::from(readmit_during_scan);
        assert_eq!(room.handle.index(), ROOMS - 1);
        let aborted = t.abort(room.handle).unwrap();
        assert!(
            aborted.released.is_none() && aborted.fanout.contains(0),
            "run {run}: the room opened after readmit_rank was released at once (fan-out \
             {:?}): the earlier fence's scan quiesced rank 0 in it although its new \
             transport never acknowledged",
            aborted.fanout
        );
        assert!(matches!(
            t.quiesce(room.handle, 0),
            Ok(Quiesced::Released(_))
        ));
    }
    report("fence_then_readmit", hits, runs);
}

/// `fence_rank` racing `open` of a room naming the rank (the store-buffer pair): the open is
/// refused, or the room it returns does not wait on the fenced rank. Never a room left
/// waiting on a rank that can no longer answer.
#[test]
fn fence_vs_open_never_leaves_a_room_waiting_on_a_fenced_rank() {
    let _serial = serial();
    let t = RoomTable::new(Config::pool(4096, 4200)).unwrap();
    // Owned rooms so the scan takes a while around the new one.
    let _background: Vec<_> = (0..4000).map(|_| t.open(&[1], 1).unwrap()).collect();
    let fence = typical(|| {
        let _ = t.fence_rank(0).unwrap();
        assert!(t.readmit_rank(0).unwrap());
    });
    let budget = Runs::new(3000 * scale());
    let mut hits = 0;
    let mut runs = 0;
    with_partner(
        fence,
        || t.fence_rank(0).unwrap(),
        |partner| {
            while budget.more(runs, hits) {
                let run = runs;
                runs += 1;
                partner.start(run);
                let (opened, o) = timed(|| t.open(&[0], 1));
                let (fenced, f) = partner.finish();
                hits += usize::from(overlap(o, f));
                assert!(fenced.released.is_empty());
                match opened {
                    Ok(room) => {
                        let aborted = t.abort(room.handle).unwrap();
                        assert!(
                            aborted.fanout.is_empty() && aborted.released.is_some(),
                            "run {run}: a room opened during a fence waits on the fenced rank"
                        );
                    }
                    Err(Error::RankFenced { rank: 0 }) => {}
                    Err(e) => panic!("run {run}: open: {e}"),
                }
                assert!(t.readmit_rank(0).unwrap());
            }
        },
    );
    assert_eq!(t.queued_releases(), 0, "a rolled-back open was reported");
    report("fence_vs_open", hits, runs);
}

/// `wait_released` racing the ACK that releases the room: it always returns (no lost
/// wake-up), and only once the pages are back in the pool.
#[test]
fn wait_released_vs_release_never_loses_a_wake_up() {
    let _serial = serial();
    const PAGES: usize = 16;
    let t = RoomTable::new(Config::pool(4, PAGES)).unwrap();
    let budget = Runs::new(3000 * scale());
    let mut hits = 0;
    let mut runs = 0;
    while budget.more(runs, hits) {
        let run = runs;
        runs += 1;
        let room = t.open(&[0], PAGES).unwrap();
        let _ = t.abort(room.handle).unwrap();
        let start = SpinBarrier::new(2);
        let (w, a) = std::thread::scope(|s| {
            let acker = s.spawn(|| {
                start.wait();
                let (r, span) = timed(|| t.quiesce(room.handle, 0));
                assert!(matches!(r, Ok(Quiesced::Released(_))));
                span
            });
            let waiter = s.spawn(|| {
                start.wait();
                let ((), span) = timed(|| t.wait_released(room.handle).unwrap());
                // The whole pool is free again: `open` of every page succeeds at once.
                let next = t.open(&[], PAGES).unwrap_or_else(|e| {
                    panic!("run {run}: pages not back after wait_released: {e}")
                });
                let _ = t.abort(next.handle).unwrap();
                span
            });
            (waiter.join().unwrap(), acker.join().unwrap())
        });
        hits += usize::from(overlap(w, a));
    }
    report("wait_released_vs_release", hits, runs);
}

/// `wait_idle` racing several releases on several rooms: it returns only when every page is
/// back, and never sleeps through the last release.
#[test]
fn wait_idle_vs_releases_never_returns_early_or_hangs() {
    let _serial = serial();
    const ROOMS: usize = 8;
    let t = RoomTable::new(Config::pool(ROOMS, ROOMS * 4)).unwrap();
    let budget = Runs::new(1000 * scale());
    let mut hits = 0;
    let mut runs = 0;
    while budget.more(runs, hits) {
        let run = runs;
        runs += 1;
        let rooms: Vec<RoomHandle> = (0..ROOMS)
            .map(|_| t.open(&[0, 1], 4).unwrap().handle)
            .collect();
        for &h in &rooms {
            let _ = t.abort(h).unwrap();
        }
        let start = SpinBarrier::new(3);
        let ((), w, acks) = std::thread::scope(|s| {
            let ackers: Vec<_> = [0u32, 1]
                .into_iter()
                .map(|rank| {
                    let (t, rooms, start) = (&t, &rooms, &start);
                    s.spawn(move || {
                        start.wait();
                        timed(|| {
                            for &h in rooms {
                                let _ = t.quiesce(h, rank).unwrap();
                            }
                        })
                        .1
                    })
                })
                .collect();
            start.wait();
            let ((), w) = timed(|| t.wait_idle());
            let s = t.stats();
            assert_eq!(
                (s.pages.free, s.rooms.free),
                (ROOMS * 4, ROOMS),
                "run {run}: wait_idle returned before every page was back"
            );
            let acks: Vec<_> = ackers.into_iter().map(|a| a.join().unwrap()).collect();
            ((), w, acks)
        });
        hits += usize::from(acks.iter().any(|&a| overlap(w, a)));
    }
    report("wait_idle_vs_releases", hits, runs);
}

/// `stats` racing lifecycles on the same rooms: each closing room it reports is consistent
/// with one lifecycle (its page count is that lifecycle's), and a fresh close is never shown
/// as long overdue (`closing_for` at most the time since that lifecycle's `abort` began).
#[test]
fn stats_vs_lifecycles_reports_each_room_consistently() {
    let _serial = serial();
    const ROOMS: usize = 4;
    const THREADS: usize = 2;
    let t = RoomTable::new(Config::pool(ROOMS, 64)).unwrap();
    // handle -> (pages, when its abort began); filled before the room can be closing.
    let lifecycles: Mutex<HashMap<RoomHandle, (usize, Option<Instant>)>> =
        Mutex::new(HashMap::new());
    // Bumped by the workers after every open, abort and release.
    let events = AtomicU64::new(0);
    let per_thread = 20_000 * scale();
    let mut snapshots = 0;
    let mut hits = 0;
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|id| {
                let (t, lifecycles, events) = (&t, &lifecycles, &events);
                s.spawn(move || {
                    for i in 0..per_thread {
                        // A page count that differs between consecutive lifecycles.
                        let pages = 1 + (i * THREADS + id) % 7;
                        let room = match t.open(&[0], pages) {
                            Ok(room) => room,
                            Err(Error::RoomTableFull | Error::PoolExhausted { .. }) => continue,
                            Err(e) => panic!("{e}"),
                        };
                        let h = room.handle;
                        events.fetch_add(1, Ordering::SeqCst);
                        lifecycles.lock().unwrap().insert(h, (pages, None));
                        std::thread::yield_now();
                        lifecycles.lock().unwrap().get_mut(&h).unwrap().1 = Some(Instant::now());
                        let _ = t.abort(h).unwrap();
                        events.fetch_add(1, Ordering::SeqCst);
                        std::thread::yield_now();
                        assert!(matches!(t.quiesce(h, 0), Ok(Quiesced::Released(_))));
                        events.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        while !workers.iter().all(|w| w.is_finished()) {
            let before = events.load(Ordering::SeqCst);
            let stats = t.stats();
            let now = Instant::now();
            let changed = events.load(Ordering::SeqCst) != before;
            snapshots += 1;
            let known = lifecycles.lock().unwrap();
            for room in &stats.closing {
                assert!(matches!(room.phase, Phase::Aborting));
                let (pages, aborted_at) = known[&room.handle];
                assert_eq!(
                    room.pages, pages,
                    "stats mixed lifecycles: {:?} reported {} pages, its lifecycle has {pages}",
                    room.handle, room.pages
                );
                let aborted_at = aborted_at.expect("closing room was aborted");
                let bound = now.saturating_duration_since(aborted_at) + Duration::from_millis(2);
                assert!(
                    room.closing_for <= bound,
                    "{:?} shown closing for {:?}, but its abort began {:?} before the snapshot",
                    room.handle,
                    room.closing_for,
                    now.saturating_duration_since(aborted_at)
                );
            }
            // The window: a snapshot that ran while rooms changed lifecycle under it.
            hits += usize::from(changed);
        }
    });
    report("stats_vs_lifecycles", hits, snapshots);
}

/// The release queue's drainers (scanners of its bitmap) racing the threads that push
/// releases into it: every release is delivered exactly once, none is lost.
#[test]
fn queue_drainers_vs_pushes_deliver_each_release_exactly_once() {
    let _serial = serial();
    const ROOMS: usize = 64;
    let t = RoomTable::new(Config::gate(ROOMS).release_queue(true)).unwrap();
    let budget = Runs::new(500 * scale());
    let mut hits = 0;
    let mut runs = 0;
    while budget.more(runs, hits) {
        let run = runs;
        runs += 1;
        let rooms: Vec<RoomHandle> = (0..ROOMS as u64)
            // No pages: under `kvfence_racy_queue_pop` a release delivered twice hands one
            // page Vec to two owners, and a heap-backed one crashed the test (a double free,
            // `malloc_consolidate(): invalid chunk size`) before the assertion below could
            // name the bug. The tokens alone show a loss or a duplicate.
            .map(|token| t.open_gate(&[0, 1], token, vec![]).unwrap())
            .collect();
        for &h in &rooms {
            let _ = t.abort(h).unwrap();
            let _ = t.quiesce(h, 0).unwrap();
        }
        let start = SpinBarrier::new(4);
        let done = AtomicBool::new(false);
        let (pushes, drained) = std::thread::scope(|s| {
            let pushers: Vec<_> = [0usize, 1]
                .into_iter()
                .map(|half| {
                    let (t, rooms, start) = (&t, &rooms, &start);
                    s.spawn(move || {
                        start.wait();
                        timed(|| {
                            for h in rooms.iter().skip(half).step_by(2) {
                                assert_eq!(t.quiesce(*h, 1).unwrap(), Quiesced::Queued);
                            }
                        })
                        .1
                    })
                })
                .collect();
            // One drainer pops (`pop_released`), the other drains (`drain_released`: one
            // pass, a swap per word): both ways of taking a queue bit race each other and
            // the pushes. (`kvfence_racy_queue_pop` breaks only the pop: since issue 18's
            // one-pass drain, two `drain_released` drainers no longer caught it.)
            let drainers: Vec<_> = (0..2)
                .map(|d| {
                    let (t, start, done) = (&t, &start, &done);
                    s.spawn(move || {
                        start.wait();
                        let mut got = Vec::new();
                        let ((), span) = timed(|| loop {
                            let finished = done.load(Ordering::SeqCst);
                            if d == 0 {
                                while let Some(r) = t.pop_released() {
                                    got.push(r);
                                }
                            } else {
                                t.drain_released(&mut got);
                            }
                            if finished {
                                break;
                            }
                        });
                        (got, span)
                    })
                })
                .collect();
            let pushes: Vec<_> = pushers.into_iter().map(|p| p.join().unwrap()).collect();
            done.store(true, Ordering::SeqCst);
            let drained: Vec<_> = drainers.into_iter().map(|d| d.join().unwrap()).collect();
            (pushes, drained)
        });
        hits += usize::from(
            drained
                .iter()
                .any(|(_, d)| pushes.iter().any(|&p| overlap(*d, p)) && !drained[0].0.is_empty()),
        );
        let mut tokens: Vec<u64> = drained
            .iter()
            .flat_map(|(got, _)| got.iter().map(|r| r.token))
            .collect();
        tokens.sort_unstable();
        assert_eq!(
            tokens,
            (0..ROOMS as u64).collect::<Vec<_>>(),
            "run {run}: a release was lost or delivered twice"
        );
        assert_eq!(t.stats().rooms.free, ROOMS);
    }
    report("queue_drainers_vs_pushes", hits, runs);
}

/// `fence_rank(peer)` (which sweeps the failed-transfer registry) racing a transfer to that
/// peer ending as failed: the failure is never registered after the sweep that should have
/// ended it, so the room is always released once its writers ACKed.
#[test]
fn fence_vs_failed_transfer_never_strands_a_room() {
    let _serial = serial();
    let t = RoomTable::new(Config::gate(4096)).unwrap();
    // Owned rooms so the fence's scan takes a while before it sweeps the registry.
    let _background: Vec<_> = (0..4000)
        .map(|i| t.open_gate(&[1], i, vec![]).unwrap())
        .collect();
    let fence = typical(|| {
        let _ = t.fence_rank(0).unwrap();
        assert!(t.readmit_rank(0).unwrap());
    });
    let budget = Runs::new(2000 * scale());
    let mut hits = 0;
    let mut runs = 0;
    with_partner(
        fence,
        || t.fence_rank(0).unwrap(),
        |partner| {
            while budget.more(runs, hits) {
                let run = runs;
                runs += 1;
                let h = t.open_gate(&[], 7, vec![1, 2]).unwrap();
                let transfer = t.begin_transfer_to(h, 0).unwrap();
                let _ = t.abort(h).unwrap();
                partner.start(run);
                let (failed, fa) = timed(|| transfer.fail());
                let (fenced, fe) = partner.finish();
                hits += usize::from(overlap(fa, fe));
                let released = usize::from(failed.is_some()) + fenced.released.len();
                assert_eq!(
                released, 1,
                "run {run}: the room of a failed transfer to a fenced peer was released {released} times"
            );
                assert!(t.readmit_rank(0).unwrap());
            }
        },
    );
    report("fence_vs_failed_transfer", hits, runs);
}

/// Issue 18, item 1: the fenced set's membership read (`fail()` of a transfer whose peer
/// is fenced reads it without the lock) racing `readmit_rank` + `fence_rank` of *other*
/// ranks must always find a rank that stayed fenced for the whole read. A miss registers
/// the failure instead of dropping its hold, after that rank's fence already swept the
/// registry: the room stays held until the rank is fenced again.
///
/// 200 ranks are fenced (`max_fenced(200)`). The cycler thread, at iteration `i`, re-admits
/// rank `i % 200` and fences it again, publishing `i` once that fence returned. The main
/// thread reads the latest published iteration `e`, takes `B = e % 200` (the rank fenced
/// last: under the pre-fix set it sits in the last entry, the one the next readmit moves),
/// fails a transfer to `B` on an aborted room that nothing else holds, and accepts the
/// sample only if the cycler had not yet begun iteration `e + 200` (the readmit of `B`)
/// when `fail()` returned: an epoch counter proves `B` stayed fenced the whole time. Each
/// such failure must drop its hold at once: `fail()` returns the release. The window: the
/// `fail()` overlapped a readmit (its readmits-begun count moved past the readmits-ended
/// count read before the call). Fails under `--cfg kvfence_moving_fenced_set` with
/// "registered instead of dropping its hold".
#[test]
fn failed_transfer_to_a_rank_that_stayed_fenced_drops_its_hold_at_once() {
    let _serial = serial();
    const RANKS: u64 = 200;
    let t = RoomTable::new(Config::gate(64).max_fenced(RANKS as usize)).unwrap();
    for r in 0..RANKS as u32 {
        let _ = t.fence_rank(r).unwrap();
    }
    // Iteration numbers: `began` = the last readmit begun, `ended` = the last one ended,
    // `fenced_at` = the last iteration whose fence returned. Iteration `i` handles rank
    // `i % RANKS`; the initial fences count as iterations 0..RANKS.
    let began = AtomicU64::new(RANKS - 1);
    let ended = AtomicU64::new(RANKS - 1);
    let fenced_at = AtomicU64::new(RANKS - 1);
    let stop = AtomicBool::new(false);
    // Time-bound: 6 s (an idle core pair runs some 500,000 fails a second).
    let runs = 50_000_000 * scale();
    let deadline = Instant::now() + Duration::from_secs(6 * scale() as u64);
    let (mut proven, mut hits, mut done) = (0usize, 0usize, 0usize);
    let mut missed: Option<String> = None;
    std::thread::scope(|s| {
        let cycler = s.spawn(|| {
            let mut i = RANKS;
            while !stop.load(Ordering::Relaxed) {
                let rank = (i % RANKS) as u32;
                began.store(i, Ordering::SeqCst);
                assert!(t.readmit_rank(rank).unwrap());
                ended.store(i, Ordering::SeqCst);
                let _ = t.fence_rank(rank).unwrap();
                fenced_at.store(i, Ordering::SeqCst);
                i += 1;
            }
            i - RANKS
        });
        for run in 0..runs {
            if run % 1024 == 0 && Instant::now() > deadline {
                break;
            }
            done += 1;
            let e = fenced_at.load(Ordering::SeqCst);
            let b = (e % RANKS) as u32;
            let h = t.open_gate(&[], run as u64, vec![]).unwrap();
            let transfer = t.begin_transfer_to(h, b).unwrap();
            assert!(t.abort(h).unwrap().released.is_none());
            let ended_before = ended.load(Ordering::SeqCst);
            let released = transfer.fail();
            let began_after = began.load(Ordering::SeqCst);
            if began_after >= e + RANKS {
                // B may have been re-admitted meanwhile: not a proof. Tidy up.
                // (Or B's next fence already ended it: then the quarantine is stale.)
                if released.is_none() {
                    let _ = t.quarantine(h);
                }
                continue;
            }
            proven += 1;
            hits += usize::from(began_after > ended_before);
            match released {
                Some(r) => assert_eq!((r.handle, r.reason), (h, Reason::Aborted)),
                None => {
                    let status = t.room_status(h);
                    missed = Some(format!(
                        "run {run}: fail() of a transfer to rank {b}, fenced the whole time \
                         (fenced at iteration {e}, readmits begun by the end: {began_after}), \
                         was registered instead of dropping its hold: the room stays held \
                         ({status:?})"
                    ));
                    break;
                }
            }
        }
        stop.store(true, Ordering::SeqCst);
        let cycles = cycler.join().unwrap();
        println!(
            "scanner-race fenced_set_read: {done} fails, {proven} to a rank proven fenced \
             throughout, {cycles} readmit+fence cycles"
        );
    });
    if let Some(m) = missed {
        panic!("{m}");
    }
    assert_eq!(t.stats().rooms.free, 64, "a room was left held");
    report("fenced_set_read_vs_readmit_and_fence", hits, proven);
}

/// Issue 18, item 2: `quarantine` of a draining room racing the completion of its last
/// transfer. Exactly one of them decides the release: either the quarantine closed the
/// room first (it returns `Ok`, and the completion's release says `Quarantined`) or the
/// completion released it first (the quarantine is refused with `StaleHandle` and the
/// release says `Finished`). Never "refused, yet quarantined": the pages of a room that
/// drained on its own would be lost for good while the call that did it said it did
/// nothing.
///
/// Rooms are prepared in batches (`finish`ed, each held by one transfer); one thread
/// completes the transfers in order, another quarantines the same rooms in order, in
/// lockstep (each waits for the other to reach the same room), one side first spinning a
/// varying few pauses (0-7) so that the two calls' relative timing sweeps the window. The
/// window: the two calls overlapped in time (monotonic clock readings around each call,
/// not tickets: see `clocked`). Runs 400 batches or 9 s (up to 30 s while the window was
/// never hit). Fails under
/// `--cfg kvfence_quarantine_mark_first` with "refused (StaleHandle), yet".
#[test]
fn quarantine_vs_last_completion_is_decided_by_one_step() {
    let _serial = serial();
    const BATCH: usize = 1000;
    let t = RoomTable::new(Config::gate(BATCH)).unwrap();
    let batches = 400 * scale();
    // 9 s, or up to 30 s while the window was never hit: on a loaded box the two threads
    // may not run in parallel for a while (each handshake then costs a time slice).
    let began = Instant::now();
    let (soft, hard) = (9 * scale() as u64, 30 * scale() as u64);
    let (mut runs, mut hits, mut quarantined, mut refused) = (0usize, 0usize, 0usize, 0usize);
    let mut wrong: Option<String> = None;
    'batches: for batch in 0..batches {
        let elapsed = began.elapsed().as_secs();
        if elapsed >= hard || (elapsed >= soft && hits > 0) {
            break;
        }
        let mut handles = Vec::with_capacity(BATCH);
        let mut guards = Vec::with_capacity(BATCH);
        for k in 0..BATCH {
            let h = t.open_gate(&[], k as u64, vec![k as u32]).unwrap();
            guards.push(t.begin_transfer(h).unwrap());
            assert!(t.finish(h).unwrap().is_none(), "held by its transfer");
            handles.push(h);
        }
        // Lockstep: each side publishes the index of the room it is about to race.
        let at_c = AtomicU64::new(0);
        let at_q = AtomicU64::new(0);
        let wait_for = |other: &AtomicU64, k: u64| {
            let mut spins = 0u32;
            while other.load(Ordering::Acquire) < k {
                spins += 1;
                if spins % 64 == 0 {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        };
        // The delay (in `spin_loop` pauses) one side waits before its call: 0..8 on the
        // completer, then 1..8 on the quarantiner, varying with the room and the batch.
        let delay = |k: usize, mine: usize| {
            let j = (k * 5 + batch) % 16;
            let n = if j / 8 == mine { j % 8 } else { 0 };
            for _ in 0..n {
                std::hint::spin_loop();
            }
        };
        let (completed, quarantines) = std::thread::scope(|s| {
            let completer = s.spawn(|| {
                let mut out = Vec::with_capacity(BATCH);
                for (k, guard) in guards.into_iter().enumerate() {
                    at_c.store(k as u64 + 1, Ordering::Release);
                    wait_for(&at_q, k as u64 + 1);
                    delay(k, 0);
                    out.push(clocked(|| guard.complete()));
                }
                out
            });
            let quarantiner = s.spawn(|| {
                let mut out = Vec::with_capacity(BATCH);
                for (k, &h) in handles.iter().enumerate() {
                    at_q.store(k as u64 + 1, Ordering::Release);
                    wait_for(&at_c, k as u64 + 1);
                    delay(k, 1);
                    out.push(clocked(|| t.quarantine(h)));
                }
                out
            });
            (completer.join().unwrap(), quarantiner.join().unwrap())
        });
        for (k, ((released, c), (q, qs))) in completed.into_iter().zip(quarantines).enumerate() {
            runs += 1;
            hits += usize::from(c.0 < qs.1 && qs.0 < c.1);
            let r = released.expect("the transfer held the room: its completion releases it");
            assert_eq!(r.handle, handles[k]);
            match (&q, r.reason) {
                (Ok(None), Reason::Quarantined) => quarantined += 1,
                (Err(Error::StaleHandle), Reason::Finished) => refused += 1,
                (Err(Error::StaleHandle), Reason::Quarantined) => {
                    wrong = Some(format!(
                        "batch {batch} room {k}: quarantine was refused (StaleHandle), yet \
                         the release says Quarantined: the pages of a room that drained on \
                         its own are lost for good"
                    ));
                    break 'batches;
                }
                (q, reason) => {
                    wrong = Some(format!(
                        "batch {batch} room {k}: quarantine returned {q:?}, the release says \
                         {reason:?}"
                    ));
                    break 'batches;
                }
            }
        }
    }
    println!(
        "scanner-race quarantine_vs_completion: {runs} races, quarantine won {quarantined}, \
         completion won {refused}"
    );
    if let Some(m) = wrong {
        panic!("{m}");
    }
    // Which side won is a timing too: printed above, not asserted (the shuttle model
    // asserts that both outcomes are reachable).
    report("quarantine_vs_last_completion", hits, runs);
}

/// `finish_drained` (the scheduler: a successful transfer) racing `fence_rank` of one of
/// the room's writers (the heartbeat thread): both clear writer bits of the same room, and
/// exactly one release comes out, delivered once: returned by `finish_drained`, or queued
/// by the fence (a gate table with a release queue, as SGLang's). Fails under
/// `--cfg kvfence_finish_drained_skips_writers` with "released 0 times".
#[test]
fn finish_drained_vs_fence_releases_each_room_exactly_once() {
    let _serial = serial();
    const ROOMS: usize = 512;
    let t = RoomTable::new(Config::gate(ROOMS).release_queue(true)).unwrap();
    let budget = Runs::new(400 * scale());
    let (mut hits, mut by_fence) = (0usize, 0usize);
    let mut runs = 0;
    while budget.more(runs, hits) {
        let run = runs;
        runs += 1;
        let handles: Vec<RoomHandle> = (0..ROOMS)
            .map(|k| t.open_gate(&[0, 1], k as u64, vec![]).unwrap())
            .collect();
        let start = SpinBarrier::new(2);
        // The scheduler finishes the rooms from the last index down while the fence scans
        // up: they meet somewhere in the table.
        let ((direct, f), (fenced, g)) = std::thread::scope(|s| {
            let fencer = s.spawn(|| {
                start.wait();
                clocked(|| t.fence_rank(1).unwrap())
            });
            start.wait();
            let finished = clocked(|| {
                handles
                    .iter()
                    .rev()
                    .map(|&h| t.finish_drained(h).unwrap())
                    .collect::<Vec<_>>()
            });
            (finished, fencer.join().unwrap())
        });
        hits += usize::from(f.0 < g.1 && g.0 < f.1);
        let mut count: HashMap<RoomHandle, usize> = HashMap::new();
        for r in direct.into_iter().flatten() {
            assert_eq!(r.reason, Reason::Finished);
            *count.entry(r.handle).or_default() += 1;
        }
        let mut queued = Vec::new();
        t.drain_released(&mut queued);
        assert_eq!(queued.len(), fenced.queued, "run {run}: the fence's count");
        by_fence += queued.len();
        for r in queued {
            *count.entry(r.handle).or_default() += 1;
        }
        for h in &handles {
            let n = count.get(h).copied().unwrap_or(0);
            assert!(n == 1, "run {run}: room {h:?} released {n} times");
        }
        assert!(t.readmit_rank(1).unwrap());
    }
    println!("scanner-race finish_drained_vs_fence: the fence released {by_fence} rooms");
    report("finish_drained_vs_fence", hits, runs);
}
