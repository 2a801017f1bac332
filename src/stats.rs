//! Statistics: striped event counters and the [`Stats`] snapshot.
//!
//! # Implementation details
//!
//! Counters that the hot path bumps (releases, refused stale calls, duplicate ACKs) are
//! striped: each thread adds to the stripe picked by its
//! [`thread_seed`](crate::sync::thread_seed), each stripe on its own 128-byte line, and a
//! read sums the stripes. A single global counter bumped on every release would put one
//! cache line on every lifecycle of every thread and serialise them (DESIGN section 4:
//! measured 16 threads slower than 1). Occupancy (free / owned / held) is not counted at
//! all: [`RoomTable::stats`](crate::RoomTable::stats) derives it from the room words and
//! the bitmaps, so nothing on the lifecycle path maintains it.

use crate::room_word::Phase;
use crate::sync::{AtomicU64, Ordering, Padded};
use crate::{RankSet, RoomHandle};
use std::time::Duration;

#[cfg(not(loom))]
const STRIPES: usize = 32;
#[cfg(loom)]
const STRIPES: usize = 2;

/// Which counter to bump.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Event {
    Release = 0,
    Stale = 1,
    Duplicate = 2,
    Orphan = 3,
}
const EVENTS: usize = 4;

/// Per-thread striped event counters.
#[derive(Debug)]
pub(crate) struct Counters {
    stripes: Box<[Padded<[AtomicU64; EVENTS]>]>,
}

impl Counters {
    pub(crate) fn new() -> Counters {
        Counters {
            stripes: (0..STRIPES)
                .map(|_| Padded(core::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }

    #[inline]
    pub(crate) fn bump(&self, event: Event) {
        let stripe = &self.stripes[crate::sync::thread_seed() % STRIPES];
        stripe.0[event as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn sum(&self, event: Event) -> u64 {
        self.stripes
            .iter()
            .map(|s| s.0[event as usize].load(Ordering::Relaxed))
            .sum()
    }
}

/// How many of something are free, owned (live) and held (closing, waiting to drain).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// In the free list.
    pub free: usize,
    /// In an `Owned` room.
    pub owned: usize,
    /// In an `Aborting` or `Draining` room: not reusable until it drains.
    pub held: usize,
}

impl Usage {
    /// `free + owned + held`: equals the capacity whenever no open or release is mid-way.
    pub fn total(&self) -> usize {
        self.free + self.owned + self.held
    }
}

/// One closing room and what it still waits on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClosingRoom {
    /// The room.
    pub handle: RoomHandle,
    /// `Aborting` or `Draining`.
    pub phase: Phase,
    /// Writer ranks that have not quiesced (ACKed) yet.
    pub waiting_on: RankSet,
    /// Local transfers still in flight.
    pub transfers: u32,
    /// Pages it holds.
    pub pages: usize,
    /// Time since `abort`/`finish`: how overdue its drain is. Time never releases it.
    pub closing_for: Duration,
}

/// A snapshot of a [`RoomTable`](crate::RoomTable).
///
/// Taken without stopping anyone: each room is read consistently, but a snapshot taken while
/// other threads open and release rooms mixes moments. At quiescence
/// `rooms.total() == rooms capacity` and `pages.total() == pages capacity` exactly.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Room occupancy.
    pub rooms: Usage,
    /// Page occupancy.
    pub pages: Usage,
    /// Every closing room, with the ranks and transfers it waits on.
    pub closing: Vec<ClosingRoom>,
    /// Ranks fenced and not re-admitted.
    pub fenced: RankSet,
    /// Releases performed since construction.
    pub releases: u64,
    /// Calls refused because their handle was stale (late ACKs, queued intents, reuse).
    pub stale_refused: u64,
    /// `quiesce` calls for a rank that had already quiesced (duplicate ACKs).
    pub duplicate_acks: u64,
    /// Releases performed by a dropped [`TransferGuard`](crate::TransferGuard), delivered
    /// through [`RoomTable::take_orphaned`](crate::RoomTable::take_orphaned).
    pub orphaned_releases: u64,
}
