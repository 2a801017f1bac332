//! The table's state, below every concern: [`RoomTable`]'s fields, the per-room [`Slot`],
//! and the helpers every module uses (generation tags, marks, fallible boxing, the lock
//! helper, the clock). Nothing here decides anything; the modules above it do, in one
//! direction (see `lib.rs`, "Modules").
//!
//! # Implementation details
//!
//! State lives in a few places, each with one rule for who may write it:
//!
//! | state | written by | when |
//! |---|---|---|
//! | room bitmap bit | claimer (`open`), then the releaser (or the queue's drainer) | claim: CAS 1->0; release: `fetch_or` after the pages are handed back |
//! | page list (`UnsafeCell<Vec<u32>>`) | the claimer of the room index; `grow` under the room's grow lock *and* its grow hold; the releaser | see below |
//! | writer list and mask words | the opener (stamp), then CASes of the same generation | `writers.rs` |
//! | room word | the opener (`publish`), then CAS / `fetch_sub` by everyone | `room_word.rs` |
//! | token, size, failed count, marks | the opener before `publish`; then tagged updates | each is tagged with its generation |
//! | closing time | the opener (0), then the closer of the owned room under its stamp hold | `room_word.rs`, `Slot::closed_ms` |
//!
//! **The page list.** Written by the opener before its `Release` publish; appended to by
//! `grow`, which holds the room's grow hold (so it cannot be released meanwhile) and its
//! grow lock (so two growers never append at once); read and taken only by the releaser,
//! which won the RMW that took a closing room to no hold and so happens-after every writer
//! (every intermediate change of the room word is an RMW, which continues the release
//! sequence). Nobody else ever reads it: transfer guards do not expose it (the caller has
//! the page ids from `open`, `grow` or, in gate mode, its own allocator).

use crate::bitmap::{Bitmap, Kind};
use crate::config::Config;
use crate::counters::{Counters, Event};
use crate::error::{try_boxed, Error};
use crate::fenced::FencedRanks;
use crate::handle::{HandleKey, RoomHandle};
use crate::park::Parking;
use crate::queue::PendingSet;
use crate::room_word::RoomWord;
pub(crate) use crate::sync::lock;
use crate::sync::{AtomicU32, AtomicU64, Mutex, Ordering, Padded, UnsafeCell};
use crate::writers::Writers;
use std::time::Instant;

/// Packs a generation with a 32-bit value (`gen << 32 | value`): slot fields that must be
/// read together with the lifecycle they belong to.
pub(crate) const fn tagged(gen: u32, value: u32) -> u64 {
    (gen as u64) << 32 | value as u64
}

/// Splits a [`tagged`] value.
pub(crate) const fn untag(word: u64) -> (u32, u32) {
    ((word >> 32) as u32, word as u32)
}

/// The flag of a [`Slot::queued`] value that says it names a lifecycle: the initial 0
/// must not read as "generation 0 was queued" (found by the loom and shuttle wait models
/// once waits accepted a queued release, issue 18 item 9).
pub(crate) const QUEUED: u32 = 1 << 31;

/// A [`Slot::queued`] value: the generation and reason code of the release it queued, or
/// `None` for the initial value.
pub(crate) const fn queued_of(word: u64) -> Option<(u32, u32)> {
    let (gen, value) = untag(word);
    if value & QUEUED != 0 {
        Some((gen, value & !QUEUED))
    } else {
        None
    }
}

/// A mark for lifecycle `gen` (never 0, the initial value).
pub(crate) const fn mark(gen: u32) -> u64 {
    1 << 32 | gen as u64
}

/// One room's slot. Padded so that rooms used by different threads never share a line.
///
/// `repr(C)`, in this order: a lifecycle touches the fields up to the first few writer ids
/// (about 170 bytes, three cache lines), so they come first; the rest of the 64 writer ids
/// (rarely used) come last. In the default layout they spread over five lines of the
/// 400-byte slot, and a table large enough that slots go cold between lifecycles paid for
/// the extra misses (measured with the Python lifecycle benchmark, `python/bench`).
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Slot {
    pub(crate) word: RoomWord,
    /// The engine's token for the current lifecycle (gate mode; 0 in pool mode unless set).
    pub(crate) token: AtomicU64,
    /// `tagged(generation, page count)`, stored by the opener before `publish` and by
    /// `grow`: `stats` uses the count only when the tag matches the room word it read.
    pub(crate) sized: AtomicU64,
    /// When the lifecycle closed (`abort`, `finish`, `quarantine` of a live room):
    /// milliseconds since the table's epoch, plus one; 0 from `open` until then. 64 bits of
    /// milliseconds: it never wraps. Written with `Release` by the opener (0) and by the
    /// closer of the `OWNED` room while it holds the stamp hold (see `room_word.rs`), so a
    /// value can only be stored while its own lifecycle is live; `stats` validates it
    /// against the room word, seqlock-style.
    pub(crate) closed_ms: AtomicU64,
    /// `tagged(generation, failed transfers holding the room)`.
    pub(crate) failed: AtomicU64,
    /// `mark(gen)` if lifecycle `gen` was rolled back by its own `open`.
    pub(crate) rolled_back: AtomicU64,
    /// MUTATION (test-only): the pre-fix quarantine mark, stored apart from the room word.
    #[cfg(any(kvfence_quarantine_mark_first, kvfence_mutants))]
    pub(crate) quarantine_mark: AtomicU64,
    /// `tagged(gen, QUEUED | reason)` of the release last put in the release queue (0:
    /// none yet; see [`queued_of`]).
    pub(crate) queued: AtomicU64,
    /// Every lifecycle of a generation below this one has *finished* its release (pages
    /// and room index handed back). Advanced only forward, by whoever delivers a release;
    /// `wait_released` and `wait_idle` wait on it.
    pub(crate) released_below: AtomicU32,
    /// Serialises `grow` (and `pages_of`) of one room.
    pub(crate) grow_lock: Mutex<()>,
    /// Page ids of the current lifecycle (see the module docs for who touches it).
    pub(crate) pages: UnsafeCell<Vec<u32>>,
    /// Threads waiting for this room's releases (see `wait.rs`).
    pub(crate) parking: Parking,
    /// Last: its hot part (count, masks, first ids) starts it, see [`Writers`].
    pub(crate) writers: Writers,
}

/// The bytes at the start of a [`Slot`] that a lifecycle touches: the fields before
/// `writers`, then the writers' count, masks and first ids (checked by a unit test).
pub(crate) const SLOT_HOT_BYTES: usize = 192;

// SAFETY: `Slot` is shared between threads; its only non-`Sync` field is the page-list cell,
// and every access to it follows the hand-off described in the module docs: writes by the
// room index's claimer before the `Release` publish, appends by `grow` under the grow lock
// while it holds a hold (so no release can run), and the releaser's exclusive take after it
// won the releasing RMW, which happens-after all of those; no access until the index is
// claimed again, which happens-after the release freed it.
unsafe impl Sync for Slot {}

/// Failed transfers of one room lifecycle to one peer, still holding the room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FailedTransfer {
    pub(crate) index: u32,
    pub(crate) gen: u32,
    pub(crate) peer: Option<u32>,
    /// How many (each holds one transfer hold).
    pub(crate) count: u32,
}

/// A token slot's state: in use.
pub(crate) const ACTIVE: u32 = 1;

/// One token-form transfer slot.
#[derive(Debug)]
pub(crate) struct TokenSlot {
    /// `tagged(generation, ACTIVE or 0)`.
    pub(crate) state: AtomicU64,
    /// `tagged(room index, room generation)`.
    pub(crate) room: AtomicU64,
    /// `1 << 32 | peer`, or 0 for no peer.
    pub(crate) peer: AtomicU64,
}

impl TokenSlot {
    pub(crate) fn new() -> TokenSlot {
        TokenSlot {
            state: AtomicU64::new(0),
            room: AtomicU64::new(0),
            peer: AtomicU64::new(0),
        }
    }
}

/// The lock-free room table: the whole kvfence core.
///
/// See the [crate docs](crate) for the protocol and examples of both modes.
#[derive(Debug)]
pub struct RoomTable {
    pub(crate) config: Config,
    pub(crate) slots: Box<[Padded<Slot>]>,
    pub(crate) rooms_free: Bitmap,
    /// `None` in gate mode.
    pub(crate) pages_free: Option<Bitmap>,
    pub(crate) key: HandleKey,
    pub(crate) fenced: FencedRanks,
    /// Serialises `fence_rank` scans with `readmit_rank` (see `fence.rs`).
    pub(crate) fence_lock: Mutex<()>,
    /// Failed transfers still holding their rooms (see `transfer.rs`): cold path.
    pub(crate) failed: Mutex<Vec<FailedTransfer>>,
    /// Token-form transfers (see `transfer.rs`).
    pub(crate) tokens: Box<[TokenSlot]>,
    pub(crate) tokens_free: Bitmap,
    pub(crate) token_key: HandleKey,
    /// Rooms whose release waits in the release queue.
    pub(crate) queue: PendingSet,
    pub(crate) counters: Counters,
    pub(crate) epoch: Instant,
}

impl RoomTable {
    /// A table with every room (and page) free and no rank fenced.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if a setting is out of range; [`Error::OutOfMemory`] if the
    /// table's memory cannot be allocated (the process does not abort).
    ///
    /// ```
    /// use kvfence::{Config, Error, RoomTable};
    /// assert!(RoomTable::new(Config::gate(4096)).is_ok());
    /// assert!(RoomTable::new(Config::pool(1024, 65536)).is_ok());
    /// assert!(matches!(RoomTable::new(Config::gate(0)), Err(Error::InvalidConfig { .. })));
    /// ```
    pub fn new(config: Config) -> Result<RoomTable, Error> {
        config.check()?;
        let key = HandleKey::random();
        let mut failed = Vec::new();
        // Failing a transfer registers it here; reserve so that it does not allocate
        // until more transfers are failed at once than there are rooms.
        if failed.try_reserve(config.rooms).is_err() {
            return Err(Error::OutOfMemory {
                bytes: config.rooms * core::mem::size_of::<FailedTransfer>(),
            });
        }
        Ok(RoomTable {
            config,
            slots: try_boxed(config.rooms, |_| {
                Padded(Slot {
                    word: RoomWord::new(),
                    writers: Writers::new(),
                    pages: UnsafeCell::new(Vec::new()),
                    grow_lock: Mutex::new(()),
                    token: AtomicU64::new(0),
                    sized: AtomicU64::new(0),
                    closed_ms: AtomicU64::new(0),
                    failed: AtomicU64::new(0),
                    released_below: AtomicU32::new(0),
                    rolled_back: AtomicU64::new(0),
                    #[cfg(any(kvfence_quarantine_mark_first, kvfence_mutants))]
                    quarantine_mark: AtomicU64::new(0),
                    queued: AtomicU64::new(0),
                    parking: Parking::new(),
                })
            })?,
            rooms_free: Bitmap::try_full(config.rooms, Kind::Rooms)?,
            pages_free: match config.pages {
                Some(pages) => Some(Bitmap::try_full(pages, Kind::Pages)?),
                None => None,
            },
            key,
            fenced: FencedRanks::new(config.max_fenced)?,
            fence_lock: Mutex::new(()),
            failed: Mutex::new(failed),
            tokens: try_boxed(config.max_tokens, |_| TokenSlot::new())?,
            tokens_free: Bitmap::try_full(config.max_tokens, Kind::Tokens)?,
            token_key: key.derive(0x746f_6b65_6e73),
            queue: PendingSet::new(config.rooms)?,
            counters: Counters::new(),
            epoch: Instant::now(),
        })
    }

    /// The settings this table was made with.
    pub fn config(&self) -> Config {
        self.config
    }

    /// Whether this is a gate-mode table (the engine owns the pages).
    pub fn is_gate(&self) -> bool {
        self.pages_free.is_none()
    }

    /// The handle of lifecycle `gen` of room `index` of this table.
    pub(crate) fn handle(&self, index: usize, gen: u32) -> RoomHandle {
        self.key.handle(index, gen)
    }

    /// Checks that this table made `handle` (see `handle.rs`) and returns its slot.
    #[inline]
    pub(crate) fn slot(&self, handle: RoomHandle) -> Result<&Slot, Error> {
        if !self.key.made(handle) {
            return Err(Error::InvalidHandle);
        }
        match self.slots.get(handle.index()) {
            Some(slot) => Ok(&slot.0),
            None => Err(Error::UnknownRoom {
                index: handle.index(),
                rooms: self.slots.len(),
            }),
        }
    }

    /// Counts stale refusals on their way out.
    #[inline] // inlined into kvfence-ffi (see lib.rs)
    pub(crate) fn stale(&self) -> Error {
        self.counters.bump(Event::Stale);
        Error::StaleHandle
    }

    /// Milliseconds since the table's epoch: 64 bits, so it cannot wrap (584 million
    /// years). Runs on every close that leaves a room held, so no 128-bit division
    /// (`as_millis()` is one).
    pub(crate) fn now_ms(&self) -> u64 {
        let elapsed = self.epoch.elapsed();
        elapsed
            .as_secs()
            .saturating_mul(1000)
            .saturating_add(u64::from(elapsed.subsec_millis()))
    }

    /// Stores lifecycle `gen`'s closing time. Only the holder of the room's stamp hold
    /// calls this (see `room_word.rs`): the room cannot be released meanwhile, so the store
    /// lands in its own lifecycle.
    pub(crate) fn stamp_closed(&self, index: usize) {
        self.slots[index]
            .0
            .closed_ms
            .store(self.now_ms().saturating_add(1), Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn slot_fits_its_padding() {
        // Four lines: the writer list is inline (64 ids).
        assert!(
            core::mem::size_of::<Padded<Slot>>() <= 512,
            "{}",
            core::mem::size_of::<Slot>()
        );
    }

    /// What `open` prefetches for the next room covers what a lifecycle of up to 8 writers
    /// touches: every field before the writer list, and the list's count, masks and first
    /// 8 ids (`repr(C)` keeps that order).
    #[test]
    fn slot_hot_bytes_cover_a_lifecycle() {
        let table = RoomTable::new(Config::gate(1)).unwrap();
        let slot = &table.slots[0].0;
        let writers = &slot.writers as *const Writers as usize - slot as *const Slot as usize;
        let hot = writers + slot.writers.bytes_through(8);
        assert!(hot <= SLOT_HOT_BYTES, "hot part is {hot} bytes");
        assert!(SLOT_HOT_BYTES <= core::mem::size_of::<Slot>());
    }
}
