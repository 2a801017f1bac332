//! Shared pieces of the kvfence benchmarks: the criterion configuration, a scoped-thread
//! harness that times only the work (not thread spawning), the [`Tracker`] interface that
//! kvfence's `RoomTable` and the baseline both implement, the workloads (each written once,
//! generic over `Tracker`, used by both `hot_path.rs` and `baseline.rs`), and the peer-style
//! baseline tracker (`Mutex<HashMap>` of room state + `Mutex<Vec<u32>>` free page list) that
//! kvfence is compared against.
//!
//! Every bench file includes this module with `mod common;` and uses only part of it.
#![allow(dead_code)]

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion};
use kvfence::{Config, Fanout, Quiesced, Released, RoomHandle, RoomTable, TransferGuard};
use std::collections::{HashMap, HashSet};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Rooms in every benchmark table: far more than 16 threads ever hold at once.
pub const ROOMS: usize = 4096;
/// Pages in every benchmark pool: room for a 4096-page batch and 16 threads x 16 pages.
pub const PAGES: usize = 1 << 17;
/// Writer ranks per room at most (the library's `MAX_WRITERS`).
pub const RANKS: usize = kvfence::MAX_WRITERS;
/// Thread counts of the multi-threaded benchmarks.
pub const THREADS: [usize; 5] = [1, 2, 4, 8, 16];
/// Page counts of the open -> finish -> release benchmark.
pub const OPEN_PAGES: [usize; 3] = [1, 16, 256];
/// Batch sizes of the page claim/free benchmark.
pub const BATCHES: [usize; 4] = [1, 16, 256, 4096];

/// The lifecycle of the scaling benchmark: pages per room, writer ranks, local transfers.
pub const LIFE_PAGES: usize = 16;
pub const LIFE_RANKS: u32 = 8;
pub const LIFE_TRANSFERS: usize = 2;

/// Short defaults so the whole suite fits in a few minutes on 2 cores; command-line
/// arguments (`--warm-up-time`, `--measurement-time`, `--sample-size`) override them.
pub fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args()
}

/// The kvfence table every pool-mode benchmark uses (kvfence owns pages `0..PAGES`).
pub fn table() -> RoomTable {
    RoomTable::new(Config::pool(ROOMS, PAGES)).expect("benchmark table config is valid")
}

/// The kvfence table of the gate-mode benchmarks: the engine owns the pages, releases go to
/// the release queue and are drained by the engine.
pub fn gate_table() -> RoomTable {
    RoomTable::new(Config::gate(ROOMS).release_queue(true))
        .expect("benchmark table config is valid")
}

/// Runs `iters` units of work split over `threads` scoped threads and returns the wall time
/// from the first thread's start to the last thread's end. Threads are spawned before the
/// clock starts and meet at a barrier, so spawn cost is not measured. `work(thread, n)` runs
/// `n` units on thread number `thread`.
pub fn run_threads(threads: usize, iters: u64, work: impl Fn(usize, u64) + Sync) -> Duration {
    let barrier = Barrier::new(threads);
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let n = iters / threads as u64 + u64::from((t as u64) < iters % threads as u64);
                let (barrier, work) = (&barrier, &work);
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    work(t, n);
                    (start, Instant::now())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("benchmark thread panicked"))
            .collect()
    });
    let first = spans
        .iter()
        .map(|s| s.0)
        .min()
        .expect("at least one thread");
    let last = spans
        .iter()
        .map(|s| s.1)
        .max()
        .expect("at least one thread");
    last - first
}

/// Benchmark `<name>/<threads>` of group `g`: each criterion iteration is one unit of
/// work on any of `threads` threads; `work(thread, n)` runs `n` units (see [`run_threads`]).
pub fn bench_threads(
    g: &mut Group<'_>,
    name: &str,
    threads: usize,
    work: impl Fn(usize, u64) + Sync,
) {
    g.bench_with_input(BenchmarkId::new(name, threads), &threads, |b, &t| {
        b.iter_custom(|iters| run_threads(t, iters, &work))
    });
}

/// The physical limit of a transfer hold: one `fetch_add` and one `fetch_sub` on a word.
#[inline(always)]
pub fn bare_pair(word: &AtomicU64) {
    let word = std::hint::black_box(word);
    word.fetch_add(1, Ordering::AcqRel);
    word.fetch_sub(1, Ordering::AcqRel);
}

// ---------------------------------------------------------------------------------------
// The two trackers behind one interface, so each workload is written once.
// ---------------------------------------------------------------------------------------

/// What a `quiesce` (one rank's ACK) did, for either tracker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ack {
    Recorded,
    Duplicate,
    /// Released; the number of pages returned to the pool.
    Released(usize),
    /// Released into the release queue (gate mode): the engine drains it.
    Queued,
}

/// The calls the workloads make, implemented by kvfence's [`RoomTable`] and by the
/// [`Baseline`]. Workloads are generic over it (never `dyn`) and the methods the timed
/// loops call are `#[inline]`, so each bench compiles to the direct calls it would make by
/// hand (kvfence's `begin_transfer` + `complete` stay inlined into the measured loop).
pub trait Tracker: Sync {
    /// What names a live room (kvfence: its handle; baseline: the caller's room id).
    type Room: Copy + Send + Sync + std::fmt::Debug;
    /// The writer ranks of a room, as `open` takes them.
    type Writers: Sync;
    /// Per-thread state `open` draws room ids from (kvfence: none).
    type Ids;
    /// A local transfer in flight.
    type Transfer<'a>
    where
        Self: 'a;
    /// What `complete` returns when it releases the room.
    type Release;
    /// The ranks `abort` says must still ACK.
    type Fanout;
    /// A release delivered by [`drain`](Tracker::drain) (gate mode).
    type Drained;
    type Error: std::fmt::Debug + PartialEq;

    /// A gate-mode tracker: the engine owns the pages, releases are queued for it.
    fn gate() -> Self
    where
        Self: Sized;

    /// Ranks `0..ranks`.
    fn writers(ranks: u32) -> Self::Writers;
    /// Id state for thread number `thread` (ids of different threads never collide).
    fn ids(thread: usize) -> Self::Ids;
    /// Opens a room of `pages` pages written by `writers`; returns it and its page list.
    fn open(
        &self,
        ids: &mut Self::Ids,
        pages: usize,
        writers: &Self::Writers,
    ) -> Result<(Self::Room, Vec<u32>), Self::Error>;
    fn begin(&self, room: Self::Room) -> Result<Self::Transfer<'_>, Self::Error>;
    /// Ends a transfer; `Some` if that released the room.
    fn complete(&self, transfer: Self::Transfer<'_>) -> Option<Self::Release>;
    fn quiesce(&self, room: Self::Room, rank: u32) -> Result<Ack, Self::Error>;
    /// Aborts; returns the ranks still to ACK and the pages released at once, if any.
    fn abort(&self, room: Self::Room) -> Result<(Self::Fanout, Option<usize>), Self::Error>;
    fn fanout(fanout: &Self::Fanout) -> impl Iterator<Item = u32> + '_;
    /// Finishes; returns the pages released at once, if any.
    fn finish(&self, room: Self::Room) -> Result<Option<usize>, Self::Error>;
    /// Gate mode: opens a room over the engine's `pages` (request slot `token`).
    fn open_gate(
        &self,
        ids: &mut Self::Ids,
        token: u64,
        pages: Vec<u32>,
        writers: &Self::Writers,
    ) -> Result<Self::Room, Self::Error>;
    /// Gate mode: delivers every queued release into `out`; returns how many.
    fn drain(&self, out: &mut Vec<Self::Drained>) -> usize;
    /// A delivered release's request slot and the engine pages to free.
    fn drained(d: Self::Drained) -> (u64, Vec<u32>);
}

impl Tracker for RoomTable {
    type Room = RoomHandle;
    type Writers = Vec<u32>;
    type Ids = ();
    type Transfer<'a> = TransferGuard<'a>;
    type Release = Released;
    type Fanout = Fanout;
    type Drained = Released;
    type Error = kvfence::Error;

    fn gate() -> RoomTable {
        gate_table()
    }
    fn writers(ranks: u32) -> Vec<u32> {
        (0..ranks).collect()
    }
    fn ids(_thread: usize) -> Self::Ids {}
    #[inline]
    fn open(
        &self,
        _ids: &mut (),
        pages: usize,
        writers: &Vec<u32>,
    ) -> Result<(RoomHandle, Vec<u32>), kvfence::Error> {
        RoomTable::open(self, writers, pages).map(|o| (o.handle, o.pages))
    }
    #[inline(always)]
    fn begin(&self, room: RoomHandle) -> Result<TransferGuard<'_>, kvfence::Error> {
        self.begin_transfer(room)
    }
    #[inline(always)]
    fn complete(&self, transfer: TransferGuard<'_>) -> Option<Released> {
        transfer.complete()
    }
    #[inline]
    fn quiesce(&self, room: RoomHandle, rank: u32) -> Result<Ack, kvfence::Error> {
        RoomTable::quiesce(self, room, rank).map(|q| match q {
            Quiesced::Recorded => Ack::Recorded,
            Quiesced::Duplicate => Ack::Duplicate,
            Quiesced::Released(r) => Ack::Released(r.pages.len()),
            Quiesced::Queued => Ack::Queued,
        })
    }
    #[inline]
    fn abort(&self, room: RoomHandle) -> Result<(Fanout, Option<usize>), kvfence::Error> {
        RoomTable::abort(self, room).map(|a| (a.fanout, a.released.map(|r| r.pages.len())))
    }
    #[inline]
    fn fanout(fanout: &Fanout) -> impl Iterator<Item = u32> + '_ {
        fanout.iter().copied()
    }
    #[inline]
    fn finish(&self, room: RoomHandle) -> Result<Option<usize>, kvfence::Error> {
        RoomTable::finish(self, room).map(|r| r.map(|r| r.pages.len()))
    }
    #[inline]
    fn open_gate(
        &self,
        _ids: &mut (),
        token: u64,
        pages: Vec<u32>,
        writers: &Vec<u32>,
    ) -> Result<RoomHandle, kvfence::Error> {
        RoomTable::open_gate(self, writers, token, pages)
    }
    #[inline]
    fn drain(&self, out: &mut Vec<Released>) -> usize {
        self.drain_released(out)
    }
    #[inline]
    fn drained(d: Released) -> (u64, Vec<u32>) {
        (d.token, d.pages)
    }
}

impl Tracker for Baseline {
    type Room = u64;
    type Writers = Vec<u32>;
    /// The last id handed out; thread `t` starts at `t << 40`.
    type Ids = u64;
    type Transfer<'a> = u64;
    type Release = usize;
    type Fanout = usize;
    type Drained = (u64, Vec<u32>);
    type Error = BError;

    fn gate() -> Baseline {
        Baseline::new(0)
    }
    fn writers(ranks: u32) -> Vec<u32> {
        (0..ranks).collect()
    }
    fn ids(thread: usize) -> u64 {
        (thread as u64) << 40
    }
    #[inline]
    fn open(
        &self,
        ids: &mut u64,
        pages: usize,
        writers: &Vec<u32>,
    ) -> Result<(u64, Vec<u32>), BError> {
        *ids += 1;
        Baseline::open(self, *ids, pages, writers).map(|p| (*ids, p))
    }
    #[inline(always)]
    fn begin(&self, room: u64) -> Result<u64, BError> {
        self.begin_transfer(room).map(|()| room)
    }
    #[inline(always)]
    fn complete(&self, transfer: u64) -> Option<usize> {
        Baseline::complete(self, transfer).expect("complete")
    }
    #[inline]
    fn quiesce(&self, room: u64, rank: u32) -> Result<Ack, BError> {
        Baseline::quiesce(self, room, rank)
    }
    #[inline]
    fn abort(&self, room: u64) -> Result<(usize, Option<usize>), BError> {
        Baseline::abort(self, room).map(|a| (a.fanout, a.released))
    }
    #[inline]
    fn fanout(fanout: &usize) -> impl Iterator<Item = u32> + '_ {
        0..*fanout as u32
    }
    #[inline]
    fn finish(&self, room: u64) -> Result<Option<usize>, BError> {
        Baseline::finish(self, room)
    }
    #[inline]
    fn open_gate(
        &self,
        ids: &mut u64,
        token: u64,
        pages: Vec<u32>,
        writers: &Vec<u32>,
    ) -> Result<u64, BError> {
        *ids += 1;
        Baseline::open_gate(self, *ids, token, pages, writers).map(|()| *ids)
    }
    #[inline]
    fn drain(&self, out: &mut Vec<(u64, Vec<u32>)>) -> usize {
        Baseline::drain_released(self, out)
    }
    #[inline]
    fn drained(d: (u64, Vec<u32>)) -> (u64, Vec<u32>) {
        d
    }
}

// ---------------------------------------------------------------------------------------
// The workloads, each written once for both trackers.
// ---------------------------------------------------------------------------------------

/// A criterion benchmark group (wall-clock measurement).
pub type Group<'a> = BenchmarkGroup<'a, WallTime>;

/// Ranks per room in the quiesce benchmark.
pub const Q_RANKS: u32 = 64;
/// Rooms opened per untimed setup round.
pub const BATCH_ROOMS: u64 = 256;

/// One local transfer: begin, then complete; `Some` if completing released the room.
#[inline(always)]
pub fn transfer<T: Tracker>(t: &T, room: T::Room) -> Option<T::Release> {
    let guard = t.begin(room).expect("begin_transfer");
    t.complete(guard)
}

/// Opens a room that nothing writes and returns it (for the hold benchmarks).
pub fn open_idle_room<T: Tracker>(t: &T) -> T::Room {
    t.open(&mut T::ids(0), 1, &T::writers(0)).expect("open").0
}

/// Opens `n` rooms of `pages` pages for `ranks` writer ranks (untimed setup).
pub fn open_rooms<T: Tracker>(
    t: &T,
    ids: &mut T::Ids,
    n: u64,
    pages: usize,
    ranks: u32,
) -> Vec<T::Room> {
    let writers = T::writers(ranks);
    (0..n)
        .map(|_| t.open(ids, pages, &writers).expect("open").0)
        .collect()
}

/// `begin_complete/<name>`: begin + complete a transfer on an uncontended live room. The
/// routine returns whether a release came out (`is_none`), as a caller branches on it:
/// black-boxing the whole `Option<Released>` (48 bytes) stored it to the stack twice per
/// iteration (our closure's `black_box`, then criterion's), which the bare pairs, returning
/// nothing, do not pay (issue 42: 5.1 against 4.6 ns on the same box, same minutes).
pub fn begin_complete<T: Tracker>(g: &mut Group<'_>, name: &str, t: &T) {
    let room = open_idle_room(t);
    g.bench_function(name, |b| b.iter(|| transfer(t, black_box(room)).is_none()));
}

/// Times `iters` operations done in rounds with untimed setup and cleanup (criterion's
/// `iter_custom`): `setup(left)` prepares a batch for `n <= left` operations and returns it
/// with `n`; `timed(&batch, n)` runs them and is the only part timed; `cleanup(batch, n)`.
#[inline]
pub fn rounds<B>(
    iters: u64,
    mut setup: impl FnMut(u64) -> (B, u64),
    mut timed: impl FnMut(&B, u64),
    mut cleanup: impl FnMut(B, u64),
) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let (batch, n) = setup(left);
        let start = Instant::now();
        timed(&batch, n);
        total += start.elapsed();
        left -= n;
        cleanup(batch, n);
    }
    total
}

/// `quiesce/<name>`: one writer rank's ACK on a live room of 64 ranks (rooms are opened,
/// and drained and finished, outside the timed region).
pub fn quiesce<T: Tracker>(g: &mut Group<'_>, name: &str, t: &T) {
    let mut ids = T::ids(0);
    let q = Q_RANKS as u64;
    g.bench_function(name, |b| {
        b.iter_custom(|iters| {
            rounds(
                iters,
                |left| {
                    let rooms =
                        open_rooms(t, &mut ids, left.div_ceil(q).min(BATCH_ROOMS), 1, Q_RANKS);
                    let n = left.min(rooms.len() as u64 * q);
                    (rooms, n)
                },
                |rooms, n| {
                    for i in 0..n {
                        let room = rooms[(i / q) as usize];
                        let out = t.quiesce(black_box(room), (i % q) as u32);
                        assert_eq!(out, Ok(Ack::Recorded));
                    }
                },
                // The rest of the ACKs, then finish releases each room.
                |rooms, n| {
                    for i in n..rooms.len() as u64 * q {
                        let room = rooms[(i / q) as usize];
                        let _ = t.quiesce(room, (i % q) as u32).expect("quiesce");
                    }
                    for room in rooms {
                        assert!(t.finish(room).expect("finish").is_some());
                    }
                },
            )
        })
    });
}

/// `abort_ack_release/<name>`: abort a room of 16 pages and 8 writer ranks, then the 8
/// ACKs, the last of which releases it (rooms are opened outside the timed region).
pub fn abort_ack_release<T: Tracker>(g: &mut Group<'_>, name: &str, t: &T) {
    let mut ids = T::ids(0);
    g.bench_function(name, |b| {
        b.iter_custom(|iters| {
            rounds(
                iters,
                |left| {
                    let rooms = open_rooms(t, &mut ids, left.min(BATCH_ROOMS), 16, 8);
                    let n = rooms.len() as u64;
                    (rooms, n)
                },
                |rooms, _| {
                    for &room in rooms {
                        let (fanout, _) = t.abort(black_box(room)).expect("abort");
                        let mut released = false;
                        for rank in T::fanout(&fanout) {
                            released |=
                                matches!(t.quiesce(room, rank).expect("quiesce"), Ack::Released(_));
                        }
                        assert!(released);
                    }
                },
                |_, _| {},
            )
        })
    });
}

/// `open_finish_release/<name>/<pages>`: open a room of 1, 16 or 256 pages with no writer
/// ranks, finish it (which releases it at once). Includes the returned page list.
pub fn open_finish_release<T: Tracker>(g: &mut Group<'_>, name: &str, t: &T) {
    let mut ids = T::ids(0);
    let nobody = T::writers(0);
    for pages in OPEN_PAGES {
        g.bench_with_input(BenchmarkId::new(name, pages), &pages, |b, &pages| {
            b.iter(|| {
                let (room, got) = t.open(&mut ids, black_box(pages), &nobody).expect("open");
                assert_eq!(t.finish(room).expect("finish"), Some(pages));
                got
            })
        });
    }
}

/// A workload: adds benchmark `name` on a tracker to a group.
pub type Workload<T> = fn(&mut Group<'_>, &str, &T);

/// The single-thread workloads of `hot_path.rs` and `baseline.rs` for tracker `name`, in
/// their groups `begin_complete`, `quiesce`, `abort_ack_release`, `open_finish_release`,
/// each on a fresh (pool-mode) tracker from `new`, and `gate_lifecycle` on a fresh
/// gate-mode tracker ([`Tracker::gate`]). `extra` first adds other benchmarks to the
/// `begin_complete` group (the bare atomic pairs of `hot_path.rs`).
pub fn single_thread<T: Tracker>(
    c: &mut Criterion,
    name: &str,
    new: impl Fn() -> T,
    extra: impl FnOnce(&mut Group<'_>),
) {
    let mut g = c.benchmark_group("begin_complete");
    extra(&mut g);
    begin_complete(&mut g, name, &new());
    g.finish();
    let workloads: [(&str, Workload<T>); 3] = [
        ("quiesce", quiesce::<T>),
        ("abort_ack_release", abort_ack_release::<T>),
        ("open_finish_release", open_finish_release::<T>),
    ];
    for (group, workload) in workloads {
        let mut g = c.benchmark_group(group);
        workload(&mut g, name, &new());
        g.finish();
    }
    let mut g = c.benchmark_group("gate_lifecycle");
    gate_lifecycle_single(&mut g, name, &T::gate());
    g.finish();
}

/// One scaling lifecycle: open 16 pages for 8 writer ranks, 2 local transfers, abort,
/// 8 ACKs; the last ACK releases. Panics if the protocol misbehaves (a benchmark must not
/// silently measure a broken path).
#[inline]
pub fn lifecycle<T: Tracker>(t: &T, ids: &mut T::Ids, writers: &T::Writers) {
    let (room, pages) = t.open(ids, LIFE_PAGES, writers).expect("open");
    black_box(&pages);
    for _ in 0..LIFE_TRANSFERS {
        assert!(transfer(t, room).is_none());
    }
    let (_, released) = t.abort(room).expect("abort");
    assert!(released.is_none());
    let mut released = 0;
    for rank in 0..LIFE_RANKS {
        if let Ack::Released(n) = t.quiesce(room, rank).expect("quiesce") {
            released += n;
        }
    }
    assert_eq!(released, LIFE_PAGES);
}

/// `<group>/<name>/<T>` for T in [`THREADS`]: T threads each running whole lifecycles,
/// thread `i` on tracker `tracker_of(i)`. One iteration is one lifecycle on any thread.
pub fn scaling<'t, T: Tracker + 't>(
    g: &mut Group<'_>,
    name: &str,
    tracker_of: impl Fn(usize) -> &'t T + Sync,
) {
    let writers = T::writers(LIFE_RANKS);
    for threads in THREADS {
        bench_threads(g, name, threads, |thread, n| {
            let tracker = tracker_of(thread);
            let mut ids = T::ids(thread);
            for _ in 0..n {
                lifecycle(tracker, &mut ids, &writers);
            }
        });
    }
}

/// Most recycled page lists an [`Engine`] keeps (another thread may drain its releases).
const ENGINE_LISTS: usize = 8;

/// One thread's engine for the gate-mode lifecycle: it owns the pages (page lists recycled
/// from drained releases, so a lifecycle allocates nothing), names requests by token, and
/// drains the tracker's release queue into a reused buffer.
pub struct Engine<T: Tracker> {
    thread: usize,
    ids: T::Ids,
    next_token: u64,
    lists: Vec<Vec<u32>>,
    drained: Vec<T::Drained>,
    /// Lifecycles opened and releases drained by this engine (on a shared tracker one
    /// engine may drain another's release).
    pub opened: u64,
    pub freed: u64,
}

impl<T: Tracker> Engine<T> {
    pub fn new(thread: usize) -> Engine<T> {
        Engine {
            thread,
            ids: T::ids(thread),
            next_token: (thread as u64) << 40,
            lists: Vec::with_capacity(ENGINE_LISTS),
            drained: Vec::with_capacity(ROOMS),
            opened: 0,
            freed: 0,
        }
    }

    /// The engine's allocator: 16 page ids (a recycled list if it has one).
    fn alloc(&mut self) -> Vec<u32> {
        let base = (self.thread * LIFE_PAGES) as u32;
        self.lists
            .pop()
            .unwrap_or_else(|| (base..base + LIFE_PAGES as u32).collect())
    }

    /// The scheduler loop: drains the release queue, then frees the pages.
    fn drain(&mut self, t: &T) {
        t.drain(&mut self.drained);
        for d in self.drained.drain(..) {
            let (_token, pages) = T::drained(d);
            assert_eq!(pages.len(), LIFE_PAGES, "a release with the wrong pages");
            self.freed += 1;
            if self.lists.len() < ENGINE_LISTS {
                self.lists.push(pages);
            }
        }
    }
}

/// One gate-mode lifecycle: open with 16 engine pages and 8 writer ranks, 2 local
/// transfers, abort, 8 ACKs (the last queues the release), drain the release queue and
/// free the pages. Panics if the protocol misbehaves.
#[inline]
pub fn gate_lifecycle<T: Tracker>(t: &T, e: &mut Engine<T>, writers: &T::Writers) {
    let pages = e.alloc();
    e.next_token += 1;
    let room = t
        .open_gate(&mut e.ids, e.next_token, pages, writers)
        .expect("open_gate");
    e.opened += 1;
    for _ in 0..LIFE_TRANSFERS {
        assert!(transfer(t, room).is_none());
    }
    let (_, released) = t.abort(room).expect("abort");
    assert!(released.is_none());
    let mut queued = 0;
    for rank in 0..LIFE_RANKS {
        match t.quiesce(room, rank).expect("quiesce") {
            Ack::Recorded => {}
            Ack::Queued => queued += 1,
            other => panic!("gate lifecycle: ACK gave {other:?}"),
        }
    }
    assert_eq!(queued, 1, "the last ACK queues the release");
    e.drain(t);
}

/// `gate_lifecycle/<name>`: one gate-mode lifecycle ([`gate_lifecycle`]), single thread,
/// on a gate-mode tracker (every release is drained by the same thread).
pub fn gate_lifecycle_single<T: Tracker>(g: &mut Group<'_>, name: &str, t: &T) {
    let writers = T::writers(LIFE_RANKS);
    let mut e = Engine::<T>::new(0);
    g.bench_function(name, |b| b.iter(|| gate_lifecycle(t, &mut e, &writers)));
    assert_eq!(e.opened, e.freed, "{name}: a release was not drained");
}

/// `<group>/<name>/<T>` for T in [`THREADS`]: T threads each running whole gate-mode
/// lifecycles ([`gate_lifecycle`]), thread `i` on tracker `tracker_of(i)` with an engine of
/// its own. One iteration is one lifecycle on any thread. Checks that every release opened
/// was drained by some engine.
pub fn scaling_gate<'t, T: Tracker + 't>(
    g: &mut Group<'_>,
    name: &str,
    tracker_of: impl Fn(usize) -> &'t T + Sync,
) {
    let writers = T::writers(LIFE_RANKS);
    let (opened, freed) = (AtomicU64::new(0), AtomicU64::new(0));
    for threads in THREADS {
        bench_threads(g, name, threads, |thread, n| {
            let tracker = tracker_of(thread);
            let mut e = Engine::<T>::new(thread);
            for _ in 0..n {
                gate_lifecycle(tracker, &mut e, &writers);
            }
            opened.fetch_add(e.opened, Ordering::Relaxed);
            freed.fetch_add(e.freed, Ordering::Relaxed);
        });
    }
    assert_eq!(
        opened.load(Ordering::Relaxed),
        freed.load(Ordering::Relaxed),
        "{name}: a release was not drained"
    );
}

// ---------------------------------------------------------------------------------------
// The baseline: the same protocol written the way peers write it.
// ---------------------------------------------------------------------------------------

/// Phase of a baseline room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BPhase {
    Owned,
    Aborting,
    Draining,
}

/// Why a baseline call was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BError {
    UnknownRoom,
    DuplicateRoom,
    Closed,
    NotInRoom,
    PoolExhausted,
}

/// What a baseline `abort` returns: how many ranks must still be told, and the release
/// (pages returned) if nothing held the room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BAborted {
    pub fanout: usize,
    pub released: Option<usize>,
}

#[derive(Debug)]
struct BRoom {
    pages: Vec<u32>,
    /// Gate mode: the engine's request slot; the release goes to the release queue.
    engine: Option<u64>,
    writers: HashSet<u32>,
    acked: HashSet<u32>,
    inflight: u32,
    phase: BPhase,
}

impl BRoom {
    fn drained(&self) -> bool {
        self.phase != BPhase::Owned && self.inflight == 0 && self.acked.len() == self.writers.len()
    }
}

/// How a baseline room was released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BRel {
    /// Its pages went back on the free list.
    Freed(usize),
    /// Engine pages (gate mode): the release went to the release queue.
    Queued,
}

/// The peer-style tracker: one `Mutex<HashMap>` of room state keyed by the request's room
/// id (each room keeps the set of ranks that ACKed), and one `Mutex<Vec<u32>>` free page
/// list. Every call takes the map lock; claims and releases take the list lock. It is
/// correct (same release rule as kvfence: closing, no transfer in flight, every writer
/// ACKed); the comparison is about cost and scaling, not safety.
///
/// Gate mode (`open_gate`): the room just records the engine's pages; its release is
/// pushed, with them, on a `Mutex<Vec<_>>` release queue that the engine drains.
#[derive(Debug)]
pub struct Baseline {
    rooms: Mutex<HashMap<u64, BRoom>>,
    free_pages: Mutex<Vec<u32>>,
    released: Mutex<Vec<(u64, Vec<u32>)>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Baseline {
    /// A tracker with `pages` free pages.
    pub fn new(pages: usize) -> Baseline {
        Baseline {
            rooms: Mutex::new(HashMap::new()),
            free_pages: Mutex::new((0..pages as u32).rev().collect()),
            released: Mutex::new(Vec::with_capacity(ROOMS)),
        }
    }

    /// Claims `n` pages for room `id`, written by `writers`; returns the pages.
    pub fn open(&self, id: u64, n: usize, writers: &[u32]) -> Result<Vec<u32>, BError> {
        let pages = self.claim_pages(n)?;
        let mut rooms = lock(&self.rooms);
        if rooms.contains_key(&id) {
            drop(rooms);
            self.free_pages(&pages);
            return Err(BError::DuplicateRoom);
        }
        rooms.insert(
            id,
            BRoom {
                pages: pages.clone(),
                engine: None,
                writers: writers.iter().copied().collect(),
                acked: HashSet::new(),
                inflight: 0,
                phase: BPhase::Owned,
            },
        );
        Ok(pages)
    }

    /// Gate mode: opens room `id` over the engine's `pages` for request slot `token`.
    pub fn open_gate(
        &self,
        id: u64,
        token: u64,
        pages: Vec<u32>,
        writers: &[u32],
    ) -> Result<(), BError> {
        let mut rooms = lock(&self.rooms);
        if rooms.contains_key(&id) {
            return Err(BError::DuplicateRoom);
        }
        rooms.insert(
            id,
            BRoom {
                pages,
                engine: Some(token),
                writers: writers.iter().copied().collect(),
                acked: HashSet::new(),
                inflight: 0,
                phase: BPhase::Owned,
            },
        );
        Ok(())
    }

    /// Gate mode: moves every queued release into `out`; returns how many.
    pub fn drain_released(&self, out: &mut Vec<(u64, Vec<u32>)>) -> usize {
        let mut q = lock(&self.released);
        let n = q.len();
        out.append(&mut q);
        n
    }

    /// Starts a local transfer on room `id`.
    pub fn begin_transfer(&self, id: u64) -> Result<(), BError> {
        let mut rooms = lock(&self.rooms);
        let room = rooms.get_mut(&id).ok_or(BError::UnknownRoom)?;
        if room.phase != BPhase::Owned {
            return Err(BError::Closed);
        }
        room.inflight += 1;
        Ok(())
    }

    /// Ends a local transfer; returns the release (pages returned) if it was the last hold.
    pub fn complete(&self, id: u64) -> Result<Option<usize>, BError> {
        let mut rooms = lock(&self.rooms);
        let room = rooms.get_mut(&id).ok_or(BError::UnknownRoom)?;
        room.inflight -= 1;
        Ok(freed(self.maybe_release(rooms, id)))
    }

    /// Records that `rank` is done with room `id` (its ACK).
    pub fn quiesce(&self, id: u64, rank: u32) -> Result<Ack, BError> {
        let mut rooms = lock(&self.rooms);
        let room = rooms.get_mut(&id).ok_or(BError::UnknownRoom)?;
        if !room.writers.contains(&rank) {
            return Err(BError::NotInRoom);
        }
        if !room.acked.insert(rank) {
            return Ok(Ack::Duplicate);
        }
        Ok(match self.maybe_release(rooms, id) {
            Some(BRel::Freed(n)) => Ack::Released(n),
            Some(BRel::Queued) => Ack::Queued,
            None => Ack::Recorded,
        })
    }

    /// Aborts room `id`.
    pub fn abort(&self, id: u64) -> Result<BAborted, BError> {
        let mut rooms = lock(&self.rooms);
        let room = rooms.get_mut(&id).ok_or(BError::UnknownRoom)?;
        if room.phase != BPhase::Owned {
            return Err(BError::Closed);
        }
        room.phase = BPhase::Aborting;
        let fanout = room.writers.len() - room.acked.len();
        Ok(BAborted {
            fanout,
            released: freed(self.maybe_release(rooms, id)),
        })
    }

    /// Finishes room `id` normally.
    pub fn finish(&self, id: u64) -> Result<Option<usize>, BError> {
        let mut rooms = lock(&self.rooms);
        let room = rooms.get_mut(&id).ok_or(BError::UnknownRoom)?;
        if room.phase != BPhase::Owned {
            return Err(BError::Closed);
        }
        room.phase = BPhase::Draining;
        Ok(freed(self.maybe_release(rooms, id)))
    }

    /// Releases room `id` if it has drained: removes it under the map lock, then returns its
    /// pages under the list lock (or, engine pages, queues the release under the queue's).
    fn maybe_release(
        &self,
        mut rooms: MutexGuard<'_, HashMap<u64, BRoom>>,
        id: u64,
    ) -> Option<BRel> {
        if !rooms.get(&id).is_some_and(BRoom::drained) {
            return None;
        }
        let room = rooms.remove(&id).expect("checked above");
        drop(rooms);
        if let Some(token) = room.engine {
            lock(&self.released).push((token, room.pages));
            return Some(BRel::Queued);
        }
        self.free_pages(&room.pages);
        Some(BRel::Freed(room.pages.len()))
    }

    /// Takes `n` pages off the free list (the peers' `free_slots[:n]`).
    pub fn claim_pages(&self, n: usize) -> Result<Vec<u32>, BError> {
        let mut list = lock(&self.free_pages);
        if list.len() < n {
            return Err(BError::PoolExhausted);
        }
        let at = list.len() - n;
        Ok(list.split_off(at))
    }

    /// Puts pages back on the free list.
    pub fn free_pages(&self, pages: &[u32]) {
        lock(&self.free_pages).extend_from_slice(pages);
    }

    /// Free pages and live rooms (for the benchmarks' sanity checks).
    pub fn usage(&self) -> (usize, usize) {
        (lock(&self.free_pages).len(), lock(&self.rooms).len())
    }
}

/// The pages a release returned to the free list (a queued release returned none yet).
fn freed(rel: Option<BRel>) -> Option<usize> {
    match rel {
        Some(BRel::Freed(n)) => Some(n),
        Some(BRel::Queued) | None => None,
    }
}
