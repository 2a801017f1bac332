//! Shared pieces of the kvfence benchmarks: the criterion configuration, a scoped-thread
//! harness that times only the work (not thread spawning), the workloads, and the
//! peer-style baseline tracker (`Mutex<HashMap>` of room state + `Mutex<Vec<u32>>` free
//! page list) that kvfence is compared against.
//!
//! Every bench file includes this module with `mod common;` and uses only part of it.
#![allow(dead_code)]

use criterion::Criterion;
use kvfence::{Config, Quiesced, RankSet, RoomHandle, RoomTable};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Rooms in every benchmark table: far more than 16 threads ever hold at once.
pub const ROOMS: usize = 4096;
/// Pages in every benchmark pool: room for a 4096-page batch and 16 threads x 16 pages.
pub const PAGES: usize = 1 << 17;
/// Writer ranks the tables accept.
pub const RANKS: usize = 64;
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

/// The kvfence table every benchmark uses.
pub fn table() -> RoomTable {
    RoomTable::new(Config::new(ROOMS, PAGES, RANKS)).expect("benchmark table config is valid")
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

/// The physical limit of a transfer hold: one `fetch_add` and one `fetch_sub` on a word.
#[inline(always)]
pub fn bare_pair(word: &AtomicU64) {
    let word = std::hint::black_box(word);
    word.fetch_add(1, Ordering::AcqRel);
    word.fetch_sub(1, Ordering::AcqRel);
}

/// One kvfence scaling lifecycle: open 16 pages for 8 writer ranks, 2 local transfers,
/// abort, 8 ACKs; the last ACK releases. Panics if the protocol misbehaves (a benchmark
/// must not silently measure a broken path).
#[inline]
pub fn kvfence_lifecycle(table: &RoomTable, writers: &RankSet) {
    let room = table.open(LIFE_PAGES, writers).expect("open");
    for _ in 0..LIFE_TRANSFERS {
        let guard = table.begin_transfer(room.handle).expect("begin_transfer");
        assert!(guard.complete().is_none());
    }
    let aborted = table.abort(room.handle).expect("abort");
    assert!(aborted.released.is_none());
    let mut released = 0;
    for rank in 0..LIFE_RANKS {
        if let Quiesced::Released(r) = table.quiesce(room.handle, rank).expect("quiesce") {
            released += r.pages;
        }
    }
    assert_eq!(released, LIFE_PAGES);
}

/// The same lifecycle on the baseline tracker; `id` must be unique among live rooms.
#[inline]
pub fn baseline_lifecycle(tracker: &Baseline, id: u64, writers: &[u32]) {
    let pages = tracker.open(id, LIFE_PAGES, writers).expect("open");
    std::hint::black_box(&pages);
    for _ in 0..LIFE_TRANSFERS {
        tracker.begin_transfer(id).expect("begin_transfer");
        assert!(tracker.complete(id).expect("complete").is_none());
    }
    let aborted = tracker.abort(id).expect("abort");
    assert!(aborted.released.is_none());
    let mut released = 0;
    for rank in 0..LIFE_RANKS {
        if let BQuiesced::Released(n) = tracker.quiesce(id, rank).expect("quiesce") {
            released += n;
        }
    }
    assert_eq!(released, LIFE_PAGES);
}

/// Opens a room that nothing writes and returns its handle (for the hold benchmarks).
pub fn open_idle_room(table: &RoomTable) -> RoomHandle {
    table.open(1, &RankSet::new()).expect("open").handle
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

/// What a baseline `quiesce` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BQuiesced {
    Recorded,
    Duplicate,
    /// Released; the number of pages returned to the free list.
    Released(usize),
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

/// The peer-style tracker: one `Mutex<HashMap>` of room state keyed by the request's room
/// id (each room keeps the set of ranks that ACKed), and one `Mutex<Vec<u32>>` free page
/// list. Every call takes the map lock; claims and releases take the list lock. It is
/// correct (same release rule as kvfence: closing, no transfer in flight, every writer
/// ACKed); the comparison is about cost and scaling, not safety.
#[derive(Debug)]
pub struct Baseline {
    rooms: Mutex<HashMap<u64, BRoom>>,
    free_pages: Mutex<Vec<u32>>,
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
                writers: writers.iter().copied().collect(),
                acked: HashSet::new(),
                inflight: 0,
                phase: BPhase::Owned,
            },
        );
        Ok(pages)
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
        Ok(self.maybe_release(rooms, id))
    }

    /// Records that `rank` is done with room `id` (its ACK).
    pub fn quiesce(&self, id: u64, rank: u32) -> Result<BQuiesced, BError> {
        let mut rooms = lock(&self.rooms);
        let room = rooms.get_mut(&id).ok_or(BError::UnknownRoom)?;
        if !room.writers.contains(&rank) {
            return Err(BError::NotInRoom);
        }
        if !room.acked.insert(rank) {
            return Ok(BQuiesced::Duplicate);
        }
        Ok(match self.maybe_release(rooms, id) {
            Some(n) => BQuiesced::Released(n),
            None => BQuiesced::Recorded,
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
            released: self.maybe_release(rooms, id),
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
        Ok(self.maybe_release(rooms, id))
    }

    /// Releases room `id` if it has drained: removes it under the map lock, then returns its
    /// pages under the list lock.
    fn maybe_release(
        &self,
        mut rooms: MutexGuard<'_, HashMap<u64, BRoom>>,
        id: u64,
    ) -> Option<usize> {
        if !rooms.get(&id).is_some_and(BRoom::drained) {
            return None;
        }
        let room = rooms.remove(&id).expect("checked above");
        drop(rooms);
        self.free_pages(&room.pages);
        Some(room.pages.len())
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
