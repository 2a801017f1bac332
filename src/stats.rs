//! Statistics: striped event counters, the [`Stats`] snapshot and per-room [`RoomStatus`].
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
//!
//! A room is read consistently (one per-room snapshot, seqlock-style): the room word is
//! loaded, then the room's other fields (page count and failed-transfer count, each tagged
//! with its generation; the closing time; the writer masks), then, after an `Acquire`
//! fence, the room word again; the snapshot is taken only if the word did not change at
//! all, else the room is read again. Phase, transfers and quarantine come from that one
//! word value, so `transfers` counts exactly the transfers holding the room at that instant
//! (it is its own field of the word: no difference of two counts read at different
//! moments, which reported transfers that never existed before issue 18), and the writers
//! still pending are those of the same instant (a writer's ACK clears its mask bit first;
//! while the word is unchanged that ACK is recorded and nothing else moved).

use crate::counters::Event;
use crate::error::Error;
use crate::handle::RoomHandle;
use crate::room_word::Phase;
use crate::state::{queued_of, untag, RoomTable};
use crate::sync::{fence, Ordering};
use crate::writers::Fanout;
use std::time::Duration;

/// How many rooms (or pages) are free, owned (live), held (closing, waiting to drain) and
/// released but not yet drained from the release queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Free (for pages: in the pool; always 0 in gate mode).
    pub free: usize,
    /// In an `Owned` room.
    pub owned: usize,
    /// In an `Aborting` or `Draining` room: not reusable until it drains.
    pub held: usize,
    /// Released, waiting in the release queue.
    pub queued: usize,
}

impl Usage {
    /// `free + owned + held + queued`: for rooms, and for pool pages not quarantined, the
    /// capacity whenever no open or release is mid-way.
    pub fn total(&self) -> usize {
        self.free + self.owned + self.held + self.queued
    }
}

/// One room's status (see [`RoomTable::room_status`]); also each closing room of
/// [`Stats::closing`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoomStatus {
    /// The room's lifecycle.
    pub handle: RoomHandle,
    /// `Owned`, `Aborting` or `Draining`.
    pub phase: Phase,
    /// Writer ranks that have not quiesced (ACKed) yet.
    pub waiting_on: Fanout,
    /// Transfers holding the room: in flight, and failed ones (whose outcome is unknown).
    pub transfers: u32,
    /// Of `transfers`, the failed ones (released by fencing their peer, or quarantine).
    pub failed: u32,
    /// Pages it holds.
    pub pages: usize,
    /// Time since `abort`, `finish` or `quarantine` closed it: how overdue its drain is
    /// (zero while owned, and for a room closed so recently that its time is not stored
    /// yet). Counted in 64-bit milliseconds: it does not wrap. Time never releases it.
    pub closing_for: Duration,
    /// Quarantined: its release will say
    /// [`Reason::Quarantined`](crate::Reason::Quarantined).
    pub quarantined: bool,
}

/// The name [`Stats::closing`] used before per-room status existed.
pub type ClosingRoom = RoomStatus;

/// A snapshot of a [`RoomTable`].
///
/// Taken without stopping anyone: each room is read consistently, but a snapshot taken while
/// other threads open and release rooms mixes moments. At quiescence
/// `rooms.total() == rooms` and, in pool mode, `pages.total() + quarantined_pages == pages`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Room occupancy.
    pub rooms: Usage,
    /// Page occupancy (gate mode: the engine's page ids the rooms hold; `free` is 0).
    pub pages: Usage,
    /// Every closing room, with the ranks and transfers it waits on.
    pub closing: Vec<RoomStatus>,
    /// Ranks fenced and not re-admitted, sorted.
    pub fenced: Vec<u32>,
    /// Releases delivered since construction (quarantines included).
    pub releases: u64,
    /// Calls refused because their handle was stale (late ACKs, queued intents, reuse).
    pub stale_refused: u64,
    /// `quiesce` calls for a rank that had already quiesced (duplicate ACKs).
    pub duplicate_acks: u64,
    /// Transfers ended as failed since construction.
    pub failed_transfers: u64,
    /// Rooms released as quarantined since construction.
    pub quarantined_rooms: u64,
    /// Pages of quarantined rooms: never to be reused (pool mode: out of the pool).
    pub quarantined_pages: u64,
}

/// How often a room that changed under the reader is re-read. A room that changes on every
/// one of them is reported from the last read (each field then comes from a state that
/// existed, not all from one), or, between lifecycles, left out of `stats` (counted in no
/// category) and reported stale by `room_status`.
const STATS_RETRIES: usize = 64;

impl RoomTable {
    /// A snapshot of occupancy, closing rooms and event counts (see [`Stats`]).
    /// Allocates the list of closing rooms; it is not a hot-path call.
    ///
    /// ```
    /// use kvfence::{Config, RoomTable};
    /// let table = RoomTable::new(Config::pool(8, 64))?;
    /// let room = table.open(&[0, 1, 2], 5)?;
    /// let _ = table.abort(room.handle)?;
    /// let _ = table.quiesce(room.handle, 1)?;
    /// let stats = table.stats();
    /// assert_eq!(stats.pages.held, 5);
    /// assert_eq!(stats.pages.total(), 64);
    /// assert_eq!(&stats.closing[0].waiting_on[..], &[0, 2]);
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn stats(&self) -> Stats {
        // Never `Err`: an infallible snapshot's lists grow (or abort) as any `Vec` does.
        self.collect_stats(false).unwrap_or_default()
    }

    /// [`stats`](Self::stats), but memory running out for its lists is
    /// [`Error::OutOfMemory`] instead of an abort of the process (for the C ABI's
    /// `kvfence_get_stats`).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`].
    pub fn try_stats(&self) -> Result<Stats, Error> {
        self.collect_stats(true)
    }

    /// The snapshot; `fallible`: its lists grow with `try_reserve`.
    fn collect_stats(&self, fallible: bool) -> Result<Stats, Error> {
        let mut stats = Stats {
            fenced: self.fenced.try_list(fallible)?,
            releases: self.counters.sum(Event::Release),
            stale_refused: self.counters.sum(Event::Stale),
            duplicate_acks: self.counters.sum(Event::Duplicate),
            failed_transfers: self.counters.sum(Event::FailedTransfer),
            quarantined_rooms: self.counters.sum(Event::QuarantinedRoom),
            quarantined_pages: self.counters.sum(Event::QuarantinedPages),
            ..Stats::default()
        };
        let now_ms = self.now_ms();
        for index in 0..self.slots.len() {
            match self.snapshot(index, None, now_ms) {
                Snapshot::Live(room) if room.phase == Phase::Owned => {
                    stats.rooms.owned += 1;
                    stats.pages.owned += room.pages;
                }
                Snapshot::Live(room) => {
                    stats.rooms.held += 1;
                    stats.pages.held += room.pages;
                    if fallible && stats.closing.try_reserve(1).is_err() {
                        return Err(Error::OutOfMemory {
                            bytes: (stats.closing.len() + 1)
                                .saturating_mul(core::mem::size_of::<RoomStatus>()),
                        });
                    }
                    stats.closing.push(room);
                }
                Snapshot::Queued(pages) => {
                    stats.rooms.queued += 1;
                    stats.pages.queued += pages;
                }
                Snapshot::Free => {}
            }
        }
        stats.rooms.free = self.rooms_free.count_free();
        stats.pages.free = self.pages_free.as_ref().map_or(0, |p| p.count_free());
        Ok(stats)
    }

    /// The status of one live room, without a scan.
    ///
    /// # Errors
    /// [`Error::StaleHandle`] once the lifecycle is released (or if it never began),
    /// [`Error::InvalidHandle`], [`Error::UnknownRoom`].
    ///
    /// ```
    /// use kvfence::{Config, Phase, RoomTable};
    /// let table = RoomTable::new(Config::gate(8))?;
    /// let h = table.open_gate(&[4, 9], 1, vec![1, 2, 3])?;
    /// let t = table.begin_transfer_to(h, 4)?;
    /// let _ = table.abort(h)?;
    /// let s = table.room_status(h)?;
    /// assert_eq!((s.phase, &s.waiting_on[..], s.transfers, s.pages), (Phase::Aborting, &[4, 9][..], 1, 3));
    /// # let _ = t.complete();
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn room_status(&self, handle: RoomHandle) -> Result<RoomStatus, Error> {
        self.slot(handle)?;
        match self.snapshot(handle.index(), Some(handle.generation()), self.now_ms()) {
            Snapshot::Live(room) => Ok(room),
            _ => Err(self.stale()),
        }
    }

    /// One room, read consistently; `want`: only that lifecycle.
    fn snapshot(&self, index: usize, want: Option<u32>, now_ms: u64) -> Snapshot {
        let slot = &self.slots[index].0;
        let mut last = None;
        for _ in 0..STATS_RETRIES {
            let state = slot.word.load(Ordering::Acquire);
            let gen = state.gen();
            if state.phase() == Phase::Free {
                if want.is_some() {
                    return Snapshot::Free;
                }
                // Released but not yet delivered: its release waits in the queue.
                let Some((qgen, _)) = queued_of(slot.queued.load(Ordering::Relaxed)) else {
                    return Snapshot::Free;
                };
                let (sgen, pages) = untag(slot.sized.load(Ordering::Relaxed));
                let queued = qgen.wrapping_add(1) == gen
                    && slot.released_below.load(Ordering::Acquire) != gen
                    && self.rooms_free_bit_taken(index);
                return if queued && sgen == qgen {
                    Snapshot::Queued(pages as usize)
                } else {
                    Snapshot::Free
                };
            }
            if want.is_some_and(|w| w != gen) {
                return Snapshot::Free;
            }
            let (sized_gen, pages) = untag(slot.sized.load(Ordering::Relaxed));
            let closed = slot.closed_ms.load(Ordering::Relaxed);
            let (failed_gen, failed) = untag(slot.failed.load(Ordering::Relaxed));
            let waiting_on = slot.writers.pending(gen);
            // The reads above belong to `state` only if the word did not change meanwhile
            // (a new lifecycle restamps them before it publishes, with `Release` stores:
            // if we read one, this fence makes the word's move visible to the load below).
            fence(Ordering::Acquire);
            let again = slot.word.load(Ordering::Acquire);
            if again.gen() != gen || again.phase() == Phase::Free || sized_gen != gen {
                continue;
            }
            let closing_for = if again.phase().is_closing() && closed != 0 {
                // Closed after `now_ms` was read: just now.
                Duration::from_millis(now_ms.saturating_sub(closed - 1))
            } else {
                Duration::ZERO
            };
            let room = RoomStatus {
                handle: self.handle(index, gen),
                phase: again.phase(),
                waiting_on,
                transfers: again.transfers(),
                failed: if failed_gen == gen { failed } else { 0 },
                pages: pages as usize,
                closing_for,
                quarantined: again.quarantined(),
            };
            if again == state {
                return Snapshot::Live(room);
            }
            last = Some(room);
        }
        match last {
            Some(room) => Snapshot::Live(room),
            None => Snapshot::Free,
        }
    }

    fn rooms_free_bit_taken(&self, index: usize) -> bool {
        !self.rooms_free.is_free(index)
    }

    /// Releases waiting in the release queue right now.
    pub fn queued_releases(&self) -> usize {
        self.queue.len()
    }
}

// `Live` is much larger than the others, but a `Snapshot` only lives on the stack of a
// `stats`/`room_status` call: boxing it would allocate per room for nothing.
#[allow(clippy::large_enum_variant)]
enum Snapshot {
    Free,
    Live(RoomStatus),
    Queued(usize),
}
