//! Statistics: striped event counters and the [`Stats`] snapshot.
//!
//! # Implementation details
//!
//! Counters that the hot path bumps (releases, refused stale calls, duplicate ACKs) are
//! striped: each thread adds to the stripe picked by its
//! [`thread_seed`](crate::sync::thread_seed), each stripe on its own 128-byte line, and a
//! read sums the stripes. A single global counter bumped on every release would put one
//! cache line on every lifecycle of every thread and serialise them (`docs/DESIGN.md`
//! section 4; measured: 16 threads slower than 1). Occupancy (free / owned / held) is not
//! counted at all: [`RoomTable::stats`](crate::RoomTable::stats) derives it from the room
//! words and the bitmaps, so nothing on the lifecycle path maintains it.

use crate::room_word::Phase;
use crate::sync::{AtomicU64, Ordering, Padded};
use crate::table::NOT_CLOSED;
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

/// How often `stats` re-reads a room that changed lifecycle under it before it gives up on
/// that room for this snapshot (it is then between lifecycles: counted as free).
const STATS_RETRIES: usize = 8;

impl crate::RoomTable {
    /// A snapshot of occupancy, closing rooms and event counts (see [`Stats`]).
    /// Allocates the list of closing rooms; it is not a hot-path call.
    ///
    /// Each room is read consistently: its phase, page count, pending ranks and closing
    /// time all belong to one lifecycle (the page count and closing time are tagged with
    /// their generation; a room caught between lifecycles is re-read). A room closed so
    /// recently that its closing time is not stored yet shows `closing_for` zero.
    ///
    /// ```
    /// use kvfence::{Config, RankSet, RoomTable};
    /// let table = RoomTable::new(Config::new(8, 64, 4))?;
    /// let room = table.open(5, &RankSet::first(3)?)?;
    /// let _ = table.abort(room.handle)?;
    /// let _ = table.quiesce(room.handle, 1)?;
    /// let stats = table.stats();
    /// assert_eq!(stats.pages.held, 5);
    /// assert_eq!(stats.pages.total(), 64);
    /// assert_eq!(stats.closing[0].waiting_on, RankSet::from_ranks([0, 2])?);
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn stats(&self) -> Stats {
        let mut stats = Stats {
            fenced: self.fenced_set(),
            releases: self.counters.sum(Event::Release),
            stale_refused: self.counters.sum(Event::Stale),
            duplicate_acks: self.counters.sum(Event::Duplicate),
            orphaned_releases: self.counters.sum(Event::Orphan),
            ..Stats::default()
        };
        let now_ms = self.now_ms();
        for index in 0..self.slots.len() {
            if let Some(room) = self.room_snapshot(index, now_ms) {
                match room.phase {
                    Phase::Owned => {
                        stats.rooms.owned += 1;
                        stats.pages.owned += room.pages;
                    }
                    _ => {
                        stats.rooms.held += 1;
                        stats.pages.held += room.pages;
                        stats.closing.push(room);
                    }
                }
            }
        }
        stats.rooms.free = self.rooms_free.count_free();
        stats.pages.free = self.pages_free.count_free();
        stats
    }

    /// One room, read consistently (`None` if it is free or kept changing).
    fn room_snapshot(&self, index: usize, now_ms: u32) -> Option<ClosingRoom> {
        let slot = &self.slots[index].0;
        for _ in 0..STATS_RETRIES {
            let state = slot.word.load(Ordering::Acquire);
            if state.phase() == Phase::Free {
                return None;
            }
            let (sized_gen, pages) = split(slot.sized.load(Ordering::Relaxed));
            let (closed_gen, closed_ms) = split(slot.closed_at.load(Ordering::Relaxed));
            let mut waiting_on = RankSet::new();
            let mut words = 0;
            for word in 0..self.mask_words {
                let mask = self.mask(index, word).load(Ordering::Acquire);
                if mask.gen() == state.gen() && mask.pending() != 0 {
                    waiting_on.add_chunk(word, mask.pending());
                    words += 1;
                }
            }
            // The reads above belong to `state`'s lifecycle only if the word did not move
            // on meanwhile (a new lifecycle restamps the size before it publishes).
            let again = slot.word.load(Ordering::Acquire);
            if again != state || sized_gen != state.gen() {
                continue;
            }
            let closing_for = if state.phase().is_closing()
                && closed_gen == state.gen()
                && closed_ms != NOT_CLOSED
            {
                // Closed after `now_ms` was read (a negative difference): just now.
                let ms = now_ms.wrapping_sub(closed_ms);
                Duration::from_millis(if (ms as i32) < 0 { 0 } else { u64::from(ms) })
            } else {
                Duration::ZERO
            };
            return Some(ClosingRoom {
                handle: self.handle(index, state.gen()),
                phase: state.phase(),
                waiting_on,
                transfers: state.holds().saturating_sub(words),
                pages: pages as usize,
                closing_for,
            });
        }
        None
    }
}

fn split(word: u64) -> (u32, u32) {
    ((word >> 32) as u32, word as u32)
}
