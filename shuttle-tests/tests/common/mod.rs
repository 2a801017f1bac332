//! Shared harness of the shuttle tests: the runner (random and PCT schedulers, iteration
//! count, the summary line), table constructors and the page-contents model.
//!
//! Included by every test file with `mod common;`; not every test uses every item.
#![allow(dead_code)]

use kvfence::{Config, Reason, Released, RoomHandle, RoomTable};
use shuttle::scheduler::{PctScheduler, RandomScheduler, Scheduler};
use shuttle::sync::atomic::{AtomicU64, Ordering};
use shuttle::sync::{Arc, Mutex};
use std::sync::atomic::{AtomicUsize, Ordering as StdOrdering};
use std::time::Instant;

/// A scheduler to run a test under.
#[derive(Clone, Copy, Debug)]
pub enum Sched {
    /// `shuttle::check_random`: a uniformly random runnable thread at every step.
    Random,
    /// `shuttle::check_pct` with this depth (bug depth: `depth - 1` priority change points).
    Pct(usize),
}

impl core::fmt::Display for Sched {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Sched::Random => f.write_str("random"),
            Sched::Pct(d) => write!(f, "pct({d})"),
        }
    }
}

/// `KVFENCE_SHUTTLE_SCALE` (default 1) multiplies every iteration count.
pub fn scale() -> usize {
    std::env::var("KVFENCE_SHUTTLE_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

/// The seed of one scheduler run: fixed by default (derived from the test name and the
/// scheduler, so a run is reproducible and CI deterministic); `KVFENCE_SHUTTLE_SEED=<u64>`
/// mixes in another value, `KVFENCE_SHUTTLE_SEED=random` draws fresh seeds (exploration).
/// shuttle's own `SHUTTLE_RANDOM_SEED`, if set, overrides both.
fn seed(name: &str, sched: Sched) -> u64 {
    let salt = match std::env::var("KVFENCE_SHUTTLE_SEED").ok().as_deref() {
        None | Some("") => 0,
        Some("random") => {
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        }
        Some(s) => s.parse().expect("KVFENCE_SHUTTLE_SEED: a u64 or `random`"),
    };
    // FNV-1a of the name and the scheduler: stable across Rust versions.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in format!("{name}/{sched}").bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    h ^ salt
}

/// Prints the failure line if a scheduler run unwinds (shuttle found a failing schedule).
struct OnFailure<'a> {
    name: &'a str,
    sched: Sched,
    seed: u64,
    runs: &'a AtomicUsize,
    start: Instant,
}

impl Drop for OnFailure<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            println!(
                "shuttle-fail {}: scheduler={} seed={} failed at iteration={} time={:.2}s",
                self.name,
                self.sched,
                self.seed,
                self.runs.load(StdOrdering::Relaxed),
                self.start.elapsed().as_secs_f64()
            );
        }
    }
}

/// Runs `f` under one scheduler for `iterations` schedules (times `KVFENCE_SHUTTLE_SCALE`)
/// and prints `shuttle-test <name>: scheduler=<s> iterations=<n> time=<t>s seed=<seed>`.
///
/// This is `shuttle::check_random(f, n)` / `shuttle::check_pct(f, n, depth)` with an
/// explicit seed and shuttle's warning about non-`SeqCst` orderings silenced (the library
/// uses weaker orderings on purpose; shuttle runs every atomic as `SeqCst`, see the README).
/// A failing schedule panics (shuttle prints it for `shuttle::replay`), after the line
/// `shuttle-fail <name>: scheduler=<s> seed=<seed> failed at iteration=<k> time=<t>s`.
pub fn run_with<F>(name: &str, sched: Sched, iterations: usize, f: F) -> usize
where
    F: Fn() + Send + Sync + 'static,
{
    let iterations = iterations * scale();
    let seed = seed(name, sched);
    let runs = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let start = Instant::now();
    let guard = OnFailure {
        name,
        sched,
        seed,
        runs: &runs,
        start,
    };
    let mut config = shuttle::Config::new();
    config.silence_warnings = true;
    let body = move || {
        counter.fetch_add(1, StdOrdering::Relaxed);
        f();
    };
    let n = match sched {
        Sched::Random => run_on(
            RandomScheduler::new_from_seed(seed, iterations),
            config,
            body,
        ),
        Sched::Pct(depth) => run_on(
            PctScheduler::new_from_seed(seed, depth, iterations),
            config,
            body,
        ),
    };
    drop(guard);
    assert!(n > 0, "shuttle ran no iteration");
    println!(
        "shuttle-test {name}: scheduler={sched} iterations={n} time={:.2}s seed={seed}",
        start.elapsed().as_secs_f64()
    );
    n
}

fn run_on<S, F>(scheduler: S, config: shuttle::Config, f: F) -> usize
where
    S: Scheduler + 'static,
    F: Fn() + Send + Sync + 'static,
{
    shuttle::Runner::new(scheduler, config).run(f)
}

/// The suite's rule: every test runs under the random scheduler for `random` iterations,
/// then under PCT of depth `depth` for `pct` iterations. `KVFENCE_SHUTTLE_ONLY=random` or
/// `=pct` runs only that one (to measure each scheduler on a mutation);
/// `KVFENCE_SHUTTLE_REPLAY=<schedule>` replays a failing schedule instead.
pub fn check<F>(name: &str, random: usize, pct: usize, depth: usize, f: F)
where
    F: Fn() + Send + Sync + 'static,
{
    // Replay one failing schedule (the string shuttle printed after "failing schedule:").
    // Executions are deterministic (constant handle key and thread seeds), so it replays
    // to the same failure; run one test with `--exact` when setting it.
    if let Ok(schedule) = std::env::var("KVFENCE_SHUTTLE_REPLAY") {
        println!("shuttle-test {name}: replaying the given schedule");
        let mut config = shuttle::Config::new();
        config.silence_warnings = true;
        let replay = shuttle::scheduler::ReplayScheduler::new_from_encoded(schedule.trim());
        run_on(replay, config, f);
        return;
    }
    let only = std::env::var("KVFENCE_SHUTTLE_ONLY").unwrap_or_default();
    let f = std::sync::Arc::new(f);
    let g = f.clone();
    if only != "pct" {
        run_with(name, Sched::Random, random, move || f());
    }
    if only != "random" {
        run_with(name, Sched::Pct(depth), pct, move || g());
    }
}

/// A call's span: the tickets taken right before and right after it (one global order,
/// [`Window::timed`]).
pub type Span = (u64, u64);

/// How many span slots a model may record per execution ([`Window::timed`]).
const SLOTS: usize = 4;

/// The racy windows of one model (issue 42, item 3): the real-thread tests of
/// `tests/scanner_races.rs` only *report* how often their threads hit a race's window (a
/// timing of the box); the assertion that the window is reachable lives here, in the
/// shuttle model of the same race, where it is deterministic (fixed seeds).
/// [`check_windows`] runs the model like [`check`] and fails a scheduler run in which a
/// window was never hit.
///
/// Everything here is a `std` atomic, not a shuttle one: it is no scheduling point, so
/// counting changes neither the schedules explored nor the iteration at which a mutation
/// is caught.
#[derive(Clone)]
pub struct Window {
    ticket: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Per execution: each slot's span, `[start, end]` (reset before every execution).
    spans: std::sync::Arc<[[std::sync::atomic::AtomicU64; 2]; SLOTS]>,
    /// Per window: how many times it was hit, over every execution so far.
    hits: std::sync::Arc<Vec<AtomicUsize>>,
}

impl Window {
    fn new(windows: usize) -> Self {
        Self {
            ticket: std::sync::Arc::new(std::sync::atomic::AtomicU64::new(1)),
            spans: std::sync::Arc::new(Default::default()),
            hits: std::sync::Arc::new((0..windows).map(|_| AtomicUsize::new(0)).collect()),
        }
    }

    fn reset(&self) {
        for slot in self.spans.iter() {
            for end in slot {
                end.store(0, StdOrdering::SeqCst);
            }
        }
    }

    fn ticket(&self) -> u64 {
        self.ticket.fetch_add(1, StdOrdering::SeqCst)
    }

    /// Runs `f`, recording its span in `slot` (a call that did not run this execution has
    /// no span: it overlaps nothing).
    pub fn timed<R>(&self, slot: usize, f: impl FnOnce() -> R) -> R {
        let start = self.ticket();
        let r = f();
        let end = self.ticket();
        self.spans[slot][0].store(start, StdOrdering::SeqCst);
        self.spans[slot][1].store(end, StdOrdering::SeqCst);
        r
    }

    /// The span recorded in `slot` this execution, if any.
    pub fn span(&self, slot: usize) -> Option<Span> {
        let s = &self.spans[slot];
        let span = (
            s[0].load(StdOrdering::SeqCst),
            s[1].load(StdOrdering::SeqCst),
        );
        (span.1 != 0).then_some(span)
    }

    /// Whether the calls recorded in slots `a` and `b` overlapped: each began before the
    /// other ended, so shuttle switched threads inside one of them and the other ran
    /// there.
    pub fn overlap(&self, a: usize, b: usize) -> bool {
        match (self.span(a), self.span(b)) {
            (Some(a), Some(b)) => a.0 < b.1 && b.0 < a.1,
            _ => false,
        }
    }

    /// Counts one hit of window `window` if `hit`.
    pub fn hit(&self, window: usize, hit: bool) {
        if hit {
            self.hits[window].fetch_add(1, StdOrdering::Relaxed);
        }
    }

    fn hits(&self) -> Vec<usize> {
        self.hits
            .iter()
            .map(|h| h.load(StdOrdering::Relaxed))
            .collect()
    }
}

/// [`check`], and each of `windows` (named, indexed as in [`Window::hit`]) must be hit at
/// least once under each scheduler: prints
/// `shuttle-window <name>: scheduler=<s> <window>=<hits> ... iterations=<n>` and fails if
/// a window was never hit (the model no longer reaches the race it is for). Deterministic:
/// the seeds are fixed (see [`check`]).
pub fn check_windows<F>(name: &str, random: usize, pct: usize, depth: usize, windows: &[&str], f: F)
where
    F: Fn(&Window) + Send + Sync + 'static,
{
    let w = Window::new(windows.len());
    let body = {
        let w = w.clone();
        std::sync::Arc::new(move || {
            w.reset();
            f(&w)
        })
    };
    if std::env::var("KVFENCE_SHUTTLE_REPLAY").is_ok() {
        let body = body.clone();
        check(name, random, pct, depth, move || body());
        return;
    }
    let only = std::env::var("KVFENCE_SHUTTLE_ONLY").unwrap_or_default();
    let mut scheds = Vec::new();
    if only != "pct" {
        scheds.push((Sched::Random, random));
    }
    if only != "random" {
        scheds.push((Sched::Pct(depth), pct));
    }
    for (sched, iterations) in scheds {
        let before = w.hits();
        let body = body.clone();
        let n = run_with(name, sched, iterations, move || body());
        let hits: Vec<usize> = w.hits().iter().zip(&before).map(|(a, b)| a - b).collect();
        let counts: Vec<String> = windows
            .iter()
            .zip(&hits)
            .map(|(window, k)| format!("{window}={k}"))
            .collect();
        println!(
            "shuttle-window {name}: scheduler={sched} {} iterations={n}",
            counts.join(" ")
        );
        for (window, k) in windows.iter().zip(&hits) {
            assert!(
                *k > 0,
                "{name}: scheduler={sched}: the window `{window}` was never hit in {n} \
                 executions: the model no longer reaches the race it is for"
            );
        }
    }
}

/// Keeps tables small: few token slots and fenced-rank slots.
fn small(config: Config) -> Config {
    config.max_fenced(2).max_tokens(2)
}

/// A pool-mode table (kvfence owns pages `0..pages`) of `rooms` rooms.
pub fn pool(rooms: usize, pages: usize) -> Arc<RoomTable> {
    Arc::new(RoomTable::new(small(Config::pool(rooms, pages))).expect("valid config"))
}

/// A gate-mode table (the engine owns the pages); `queue`: every release is queued.
pub fn gate(rooms: usize, queue: bool) -> Arc<RoomTable> {
    Arc::new(RoomTable::new(small(Config::gate(rooms).release_queue(queue))).expect("valid config"))
}

/// A lifecycle's id in the page model: never 0 (0 = free / never written).
pub fn life(h: RoomHandle) -> u64 {
    1 << 63 | (h.to_wire() as u64)
}

/// Page contents, as shuttle atomics (every access is a scheduling point):
/// * `owner[p]`: the lifecycle the page was last handed to (by `open`, or by the engine's
///   allocator in gate mode);
/// * `data[p]`: the lifecycle whose data the page holds (its last writer).
///
/// A writer of lifecycle `L` may write a page only while `owner[p] == L`: a stale writer
/// (a transfer, a remote rank or a late failed transfer of an earlier lifecycle) writing a
/// page that was released and handed to a new lifecycle fails [`Pages::write`]; if the
/// hand-over happens between the check and the write, the new owner's [`Pages::expect`]
/// finds the stale data.
pub struct Pages {
    owner: Vec<AtomicU64>,
    data: Vec<AtomicU64>,
}

impl Pages {
    pub fn new(pages: usize) -> Arc<Pages> {
        Arc::new(Pages {
            owner: (0..pages).map(|_| AtomicU64::new(0)).collect(),
            data: (0..pages).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// `pages` were just handed to lifecycle `l`.
    pub fn own(&self, pages: &[u32], l: u64) {
        for &p in pages {
            self.owner[p as usize].store(l, Ordering::SeqCst);
        }
    }

    /// A writer of lifecycle `l` writes every page of `pages`.
    pub fn write(&self, pages: &[u32], l: u64, who: &str) {
        for &p in pages {
            let owner = self.owner[p as usize].load(Ordering::SeqCst);
            assert_eq!(
                owner, l,
                "{who} of lifecycle {l:#x} wrote page {p}, which now belongs to lifecycle \
                 {owner:#x}: a page was reused while a writer of its old lifecycle could still \
                 write it"
            );
            self.data[p as usize].store(l, Ordering::SeqCst);
        }
    }

    /// The owner `l` reads its pages back: each must hold `l`'s data.
    pub fn expect(&self, pages: &[u32], l: u64) {
        for &p in pages {
            let got = self.data[p as usize].load(Ordering::SeqCst);
            assert_eq!(
                got, l,
                "page {p} belongs to lifecycle {l:#x} but holds {got:#x}'s data (a stale \
                 write landed in a reused page)"
            );
        }
    }
}

/// Every release seen by the test, from return values and drains.
pub type Log = Arc<Mutex<Vec<Released>>>;

pub fn log() -> Log {
    Arc::new(Mutex::new(Vec::new()))
}

/// Pool mode: the thread that got `released` (one of `watched`'s) reuses its pages at once
/// for a new lifecycle B with no writers: B owns them, writes them, reads them back, and
/// finishes (B's own release is logged too). `released` is logged first.
pub fn reuse(table: &RoomTable, pages: &Pages, released: Released, log: &Log) {
    assert_ne!(
        released.reason,
        Reason::Quarantined,
        "nothing is quarantined here"
    );
    let n = released.pages.len();
    log.lock().unwrap().push(released);
    let b = match table.open(&[], n) {
        Ok(b) => b,
        // Another thread reused them first (its B holds them): fine.
        Err(kvfence::Error::PoolExhausted { .. } | kvfence::Error::RoomTableFull) => return,
        Err(e) => panic!("reuse: open: {e}"),
    };
    let l = life(b.handle);
    pages.own(&b.pages, l);
    pages.write(&b.pages, l, "the new owner");
    pages.expect(&b.pages, l);
    // Nothing of B's holds it, but a stale `begin_transfer` may have its transient unit in
    // B's word (a reused room index): then that call's take-back releases B, into the
    // queue (issue 42), and the test's final drain logs it.
    if let Some(r) = table.finish(b.handle).unwrap() {
        log.lock().unwrap().push(r);
    }
}

/// Asserts `log` holds exactly one release of lifecycle `h`; returns it.
pub fn exactly_one(log: &Log, h: RoomHandle) -> Released {
    let log = log.lock().unwrap();
    let of_it: Vec<_> = log.iter().filter(|r| r.handle == h).collect();
    assert_eq!(
        of_it.len(),
        1,
        "lifecycle {h:?} must be released and delivered exactly once, got {:?}",
        *log
    );
    of_it[0].clone()
}

/// Asserts the table is at rest: every room free, every pool page back, nothing queued.
pub fn assert_at_rest(table: &RoomTable, rooms: usize, pages: Option<usize>) {
    let s = table.stats();
    assert_eq!(
        (s.rooms.free, s.rooms.owned, s.rooms.held, s.rooms.queued),
        (rooms, 0, 0, 0),
        "rooms not conserved: {s:?}"
    );
    assert_eq!(
        (s.pages.free, s.pages.owned, s.pages.held, s.pages.queued),
        (pages.unwrap_or(0), 0, 0, 0),
        "pages not conserved: {s:?}"
    );
    assert_eq!(table.queued_releases(), 0, "a release left in the queue");
}
