//! [`RoomTable`]: rooms, their pages, their writers, and the release that ties them.
//!
//! # Implementation details
//!
//! State lives in four places, each with one rule for who may write it:
//!
//! | state | written by | when |
//! |---|---|---|
//! | room bitmap bit | claimer (`open`), then releaser | claim: CAS 1->0; release: `fetch_or` after the pages are back |
//! | page list (`UnsafeCell`) | the claimer of the room index | between the claim and the `publish` of the room word |
//! | mask words | the opener (stamp), then `quiesce` (CAS) | stamp before `publish`; CAS only for the same generation |
//! | room word | the opener (`publish`), then CAS by everyone | see `room_word.rs` |
//!
//! **The release.** Exactly one RMW on the room word observes a closing room reaching zero
//! holds (the CAS of `RoomWord::close`, which also moves it to `FREE` with the next
//! generation, or the `fetch_sub` of `RoomWord::drop_hold`, whose caller then stores that
//! state), so whichever call makes the last change (abort with nothing in flight, the last
//! `complete`, the last `quiesce`, a `fence_rank`) is the one that releases, and it says so
//! in its return value. The winner then, and only then, reads the page list, returns the
//! pages to the pool and finally frees the room index. The page list hand-off is race free:
//! the opener's writes happen-before its `Release` publish; the releaser's `Acquire` CAS
//! comes later in the word's modification order (every intermediate write is an RMW, which
//! continues the release sequence); and the next opener's `Acquire` claim of the room index
//! happens-after the releaser's `Release` free of it.
//!
//! **Releases no caller can return.** A [`TransferGuard`] dropped without
//! [`complete`](TransferGuard::complete) can perform a release inside `Drop`. That event is
//! pushed to an orphan list ([`RoomTable::take_orphaned`]) under a mutex: it is the cold,
//! abnormal path (usually unwinding), never the lifecycle hot path.
//!
//! **Fencing vs. opening.** `fence_rank` sets the rank's fenced bit and then scans the room
//! words; `open` publishes its room word and then reads the fenced bits. With a
//! `fence(SeqCst)` between the write and the read on both sides (the store-buffer pattern)
//! at least one of them sees the other: either the scan finds the room and quiesces the
//! rank, or `open` sees the bit and quiesces the rank itself. So a room is never left
//! waiting on a rank that can no longer answer. `open` also refuses up front a room that
//! names a rank already fenced, so a fence never strips protection from a later room.
//!
//! **Waiting.** A release is complete only when the pages and the room index are back, which
//! is after the release CAS; so waits do not look at the room word's generation but at the
//! slot's `released_below`, which the releaser advances (monotonically) as its last step.
//! Sleepers register in `waiters`, read `seq`, check their condition and
//! futex-wait on `seq`. A release, after its CAS, issues `fence(SeqCst)` and bumps `seq` and
//! wakes only if `waiters != 0`: no shared write on the release path when nobody waits. The
//! two fences make the registration and the release a store-buffer pair, so either the
//! releaser sees the waiter (and wakes it) or the waiter sees the release (and does not
//! sleep); a bump that lands between the waiter's read of `seq` and its sleep makes the
//! futex compare fail.

use crate::bitmap::{Bitmap, Kind};
use crate::error::Error;
use crate::handle::{RoomHandle, MAX_ROOMS};
use crate::room_word::{Phase, Refusal, RoomWord, Step};
use crate::stats::{ClosingRoom, Counters, Event, Stats};
use crate::sync::{
    fence, futex_wait, futex_wake_all, AtomicU32, AtomicU64, Mutex, MutexGuard, Ordering, Padded,
    UnsafeCell,
};
use crate::writers::{Cleared, MaskRefusal, MaskWord, RankSet, MAX_RANKS, RANKS_PER_WORD};
use crate::TransferGuard;
use std::time::{Duration, Instant};

/// The sizes of a [`RoomTable`], fixed at construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Rooms (concurrent requests), `1..=2^24`.
    pub rooms: usize,
    /// Pages in the pool, `1..=2^31`.
    pub pages: usize,
    /// Writer ranks, `1..=256`: rank ids are `0..ranks`.
    pub ranks: usize,
}

impl Config {
    /// A config of `rooms` rooms, `pages` pages and `ranks` writer ranks.
    pub const fn new(rooms: usize, pages: usize, ranks: usize) -> Config {
        Config {
            rooms,
            pages,
            ranks,
        }
    }

    fn check(&self) -> Result<(), Error> {
        let bad = |reason| Err(Error::InvalidConfig { reason });
        if self.rooms == 0 || self.rooms > MAX_ROOMS {
            return bad("rooms must be in 1..=16777216 (2^24)");
        }
        if self.pages == 0 || self.pages > 1 << 31 {
            return bad("pages must be in 1..=2147483648 (2^31)");
        }
        if self.ranks == 0 || self.ranks > MAX_RANKS {
            return bad("ranks must be in 1..=256");
        }
        Ok(())
    }
}

/// A room's release: its pages are back in the pool and its index may be reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Released {
    /// The lifecycle that ended (its handle is stale from now on).
    pub handle: RoomHandle,
    /// Pages returned to the pool.
    pub pages: usize,
    /// How the room was closed: `Aborting` (the prefill side now sends its ABORT_ACK) or
    /// `Draining`.
    pub phase: Phase,
}

/// What [`RoomTable::open`] returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Opened {
    /// The new lifecycle's handle.
    pub handle: RoomHandle,
    /// The pages the room owns (indices into the caller's page arena).
    pub pages: Vec<u32>,
}

/// What [`RoomTable::abort`] returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "the fan-out must be told about the abort, and a release must be acted on"]
pub struct Aborted {
    /// Writer ranks still to be told; each answers with `quiesce` (its ABORT_ACK) once it
    /// has drained.
    pub fanout: RankSet,
    /// `Some` if nothing held the room and `abort` released it at once.
    pub released: Option<Released>,
}

/// What [`RoomTable::quiesce`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a release must be acted on"]
pub enum Quiesced {
    /// The rank is marked done; the room still waits on others (or is still live).
    Recorded,
    /// The rank had already quiesced in this lifecycle: nothing changed.
    Duplicate,
    /// This was the last thing the closing room waited on: it is released.
    Released(Released),
}

/// What [`RoomTable::fence_rank`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fenced {
    /// Live rooms in which the rank was still pending and is now quiesced.
    pub quiesced: usize,
    /// Rooms that this fence released (they waited on nothing else).
    pub released: Vec<Released>,
}

/// One room's slot. Padded so that rooms used by different threads never share a line.
#[derive(Debug)]
struct Slot {
    word: RoomWord,
    /// Pages of the current lifecycle. Written only by the claimer of the room index before
    /// `publish`; read by guards (which hold the room) and by the releaser.
    pages: UnsafeCell<Vec<u32>>,
    /// `pages.len()`, readable without the cell for `stats`.
    npages: AtomicU32,
    /// Nanoseconds since the table's epoch at `abort`/`finish`, for `stats`.
    closed_at: AtomicU64,
    /// Every lifecycle of a generation below this one has *finished* its release (pages
    /// and room index back). Advanced only forward, by the releaser, after it freed the
    /// room index; `wait_released` and `wait_idle` wait on it, not on the room word, whose
    /// release CAS comes before the pages are back.
    released_below: AtomicU32,
}

// SAFETY: `Slot` is shared between threads; its only non-`Sync` field is the page-list cell,
// and every access to it follows the hand-off described in the module docs: exclusive
// writes by the room index's claimer before the `Release` publish, shared reads only by a
// holder of the room (guard) or by the single winner of the release CAS, each of which
// happens-after that publish, and no write until the index is claimed again, which
// happens-after the releaser is done.
unsafe impl Sync for Slot {}

/// The lock-free room table: the whole kvfence core.
///
/// See the [crate docs](crate) for the protocol and an example.
#[derive(Debug)]
pub struct RoomTable {
    slots: Box<[Padded<Slot>]>,
    /// Mask words: room `i` uses `masks[i * stride ..][.. words]`.
    masks: Box<[MaskWord]>,
    mask_stride: usize,
    mask_words: usize,
    rooms_free: Bitmap,
    pages_free: Bitmap,
    ranks: u32,
    tag: u8,
    fenced: [AtomicU64; MAX_RANKS / 64],
    counters: Counters,
    waiters: Padded<AtomicU32>,
    seq: Padded<AtomicU32>,
    orphans: Mutex<Vec<Released>>,
    epoch: Instant,
}

impl RoomTable {
    /// A table with every room and page free and no rank fenced.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if a size is zero or above its limit.
    ///
    /// ```
    /// use kvfence::{Config, Error, RoomTable};
    /// assert!(RoomTable::new(Config::new(1024, 65536, 64)).is_ok());
    /// assert!(matches!(RoomTable::new(Config::new(0, 1, 1)), Err(Error::InvalidConfig { .. })));
    /// ```
    pub fn new(config: Config) -> Result<RoomTable, Error> {
        config.check()?;
        let mask_words = config.ranks.div_ceil(RANKS_PER_WORD);
        // 16 words = 128 bytes: one room's mask words never share a line pair with another's.
        let mask_stride = if cfg!(loom) {
            mask_words
        } else {
            mask_words.next_multiple_of(16)
        };
        Ok(RoomTable {
            slots: (0..config.rooms)
                .map(|_| {
                    Padded(Slot {
                        word: RoomWord::new(),
                        pages: UnsafeCell::new(Vec::new()),
                        npages: AtomicU32::new(0),
                        closed_at: AtomicU64::new(0),
                        released_below: AtomicU32::new(0),
                    })
                })
                .collect(),
            masks: (0..config.rooms * mask_stride)
                .map(|_| MaskWord::new())
                .collect(),
            mask_stride,
            mask_words,
            rooms_free: Bitmap::full(config.rooms, Kind::Rooms),
            pages_free: Bitmap::full(config.pages, Kind::Pages),
            ranks: config.ranks as u32,
            tag: crate::sync::next_table_tag(),
            fenced: core::array::from_fn(|_| AtomicU64::new(0)),
            counters: Counters::new(),
            waiters: Padded(AtomicU32::new(0)),
            seq: Padded(AtomicU32::new(0)),
            orphans: Mutex::new(Vec::new()),
            epoch: Instant::now(),
        })
    }

    /// The sizes this table was made with.
    pub fn config(&self) -> Config {
        Config::new(self.slots.len(), self.pages_free.len(), self.ranks as usize)
    }

    fn mask(&self, index: usize, word: usize) -> &MaskWord {
        &self.masks[index * self.mask_stride + word]
    }

    fn slot(&self, handle: RoomHandle) -> Result<&Slot, Error> {
        if handle.tag() != self.tag {
            return Err(Error::ForeignHandle);
        }
        match self.slots.get(handle.index()) {
            Some(slot) => Ok(&slot.0),
            None => Err(Error::UnknownRoom {
                index: handle.index(),
                rooms: self.slots.len(),
            }),
        }
    }

    fn check_rank(&self, rank: u32) -> Result<(), Error> {
        if rank >= self.ranks {
            return Err(Error::RankOutOfRange {
                rank,
                max: self.ranks,
            });
        }
        Ok(())
    }

    /// Counts stale refusals on their way out.
    fn stale(&self) -> Error {
        self.counters.bump(Event::Stale);
        Error::StaleHandle
    }

    fn fenced_set(&self) -> RankSet {
        RankSet::from_words(core::array::from_fn(|i| {
            self.fenced[i].load(Ordering::Relaxed)
        }))
    }

    /// Claims a room and `pages` pages, all or nothing, for a request written by `writers`.
    ///
    /// The room starts `Owned`, waiting on every rank of `writers` (each must `quiesce`
    /// before the room can be released, even after an abort). `writers` may be empty (the
    /// prefill side of a push transfer protects its source pages with transfer guards only).
    ///
    /// # Errors
    /// [`Error::NoPages`], [`Error::TooManyPages`], [`Error::RankOutOfRange`],
    /// [`Error::RankFenced`], [`Error::RoomTableFull`], [`Error::PoolExhausted`]. On error
    /// nothing was claimed.
    ///
    /// ```
    /// use kvfence::{Config, RankSet, RoomTable};
    /// let table = RoomTable::new(Config::new(8, 64, 4))?;
    /// let room = table.open(3, &RankSet::first(2)?)?;   // 3 pages, prefill ranks 0 and 1
    /// assert_eq!(room.pages.len(), 3);
    /// assert_eq!(table.stats().pages.owned, 3);
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn open(&self, pages: usize, writers: &RankSet) -> Result<Opened, Error> {
        if pages == 0 {
            return Err(Error::NoPages);
        }
        if pages > self.pages_free.len() {
            return Err(Error::TooManyPages {
                requested: pages,
                capacity: self.pages_free.len(),
            });
        }
        if let Some(max) = writers.max() {
            self.check_rank(max)?;
        }
        if let Some(rank) = writers.intersection(&self.fenced_set()).iter().next() {
            return Err(Error::RankFenced { rank });
        }
        let index = self.rooms_free.claim_one().ok_or(Error::RoomTableFull)?;
        let slot = &self.slots[index].0;
        let list = slot.pages.with_mut(|list| {
            // SAFETY: we claimed `index` in the room bitmap, so no other opener touches this
            // slot, and the room word is FREE, so no guard or releaser reads the list (the
            // previous releaser finished with it before freeing the index, which our
            // Acquire claim synchronised with).
            let list = unsafe { &mut *list };
            list.clear();
            self.pages_free
                .claim_many(pages, list)
                .then(|| list.clone())
        });
        let Some(list) = list else {
            self.rooms_free.free_one(index);
            return Err(Error::PoolExhausted { requested: pages });
        };
        slot.npages.store(pages as u32, Ordering::Relaxed);
        let gen = slot.word.load(Ordering::Relaxed).gen();
        let mut holds = 0;
        for word in 0..self.mask_words {
            let chunk = writers.chunk(word);
            self.mask(index, word).stamp(gen, chunk);
            holds += u32::from(chunk != 0);
        }
        slot.word.publish(gen, holds);
        let handle = RoomHandle::new(index, self.tag, gen);

        // A `fence_rank` racing with us may have set its bit after our check above and
        // scanned the room words before our publish. Then it is our job to quiesce it.
        fence(Ordering::SeqCst);
        for rank in writers.intersection(&self.fenced_set()).iter() {
            // The room is OWNED, so this cannot normally release; it can if a forged handle
            // already closed it, in which case the event must not be lost.
            if let Ok(Quiesced::Released(r)) = self.quiesce_in(index, gen, rank) {
                self.orphan(r);
            }
        }
        Ok(Opened {
            handle,
            pages: list,
        })
    }

    /// Starts a local transfer on the room's pages: the room cannot be released until the
    /// returned guard is completed or dropped.
    ///
    /// This is the check a queued transfer intent makes right before it touches the pages:
    /// after an abort (or once the room is reused) it is refused, so a stale intent can
    /// never write.
    ///
    /// # Errors
    /// [`Error::RoomClosed`] (aborting or draining), [`Error::StaleHandle`],
    /// [`Error::ForeignHandle`], [`Error::UnknownRoom`], [`Error::TooManyTransfers`].
    ///
    /// ```
    /// use kvfence::{Config, Error, RankSet, RoomTable};
    /// let table = RoomTable::new(Config::new(8, 64, 4))?;
    /// let room = table.open(2, &RankSet::new())?;
    /// let transfer = table.begin_transfer(room.handle)?;
    /// assert_eq!(transfer.pages(), &room.pages[..]);
    /// let aborted = table.abort(room.handle)?;
    /// assert!(aborted.released.is_none());                       // still in flight
    /// assert!(matches!(table.begin_transfer(room.handle), Err(Error::RoomClosed { .. })));
    /// let released = transfer.complete().expect("last hold releases");
    /// assert_eq!(released.pages, 2);
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    #[inline]
    pub fn begin_transfer(&self, handle: RoomHandle) -> Result<TransferGuard<'_>, Error> {
        let slot = self.slot(handle)?;
        match slot.word.begin(handle.generation()) {
            Ok(()) => Ok(TransferGuard::new(self, handle)),
            Err(Refusal::Stale) => Err(self.stale()),
            Err(Refusal::Phase(phase)) => Err(Error::RoomClosed { phase }),
            Err(Refusal::HoldsFull) => Err(Error::TooManyTransfers),
        }
    }

    /// Ends a hold taken by `begin_transfer`. Called by the guard exactly once.
    #[inline]
    pub(crate) fn end_transfer(&self, handle: RoomHandle) -> Option<Released> {
        let slot = &self.slots[handle.index()].0;
        match slot.word.drop_hold(handle.generation()) {
            Ok(Step::Released(phase)) => {
                Some(self.release(handle.index(), handle.generation(), phase))
            }
            Ok(Step::Held) => None,
            // Unreachable for a real hold: a held room cannot be released under it. (Only
            // the test-only `kvfence_naive_release` mutation gets here.)
            Err(_) => None,
        }
    }

    /// Gives a guard's page list to `f`.
    pub(crate) fn with_pages<R>(&self, handle: RoomHandle, f: impl FnOnce(&[u32]) -> R) -> R {
        self.slots[handle.index()].0.pages.with(|list| {
            // SAFETY: called only through a live `TransferGuard`, which holds the room: it
            // cannot be released, so its index cannot be re-claimed and nobody writes the
            // list; the opener's writes happen-before the guard's Acquire `begin` CAS.
            f(unsafe { &*list })
        })
    }

    /// Marks writer `rank` done with this room: it will write no more (its transfers
    /// completed, or it drained and acknowledged the abort). Idempotent.
    ///
    /// If the room is closing and this was the last thing it waited on, the room is released
    /// by this call and [`Quiesced::Released`] says so.
    ///
    /// # Errors
    /// [`Error::StaleHandle`] for an ACK of an earlier lifecycle (the room was released and
    /// maybe reused: nothing is touched), [`Error::RankOutOfRange`],
    /// [`Error::RankNotInRoom`], [`Error::ForeignHandle`], [`Error::UnknownRoom`].
    ///
    /// ```
    /// use kvfence::{Config, Quiesced, RankSet, RoomTable};
    /// let table = RoomTable::new(Config::new(8, 64, 4))?;
    /// let room = table.open(4, &RankSet::first(2)?)?;
    /// let aborted = table.abort(room.handle)?;
    /// assert_eq!(aborted.fanout, RankSet::first(2)?);       // tell ranks 0 and 1
    /// assert_eq!(table.quiesce(room.handle, 1)?, Quiesced::Recorded);
    /// assert_eq!(table.quiesce(room.handle, 1)?, Quiesced::Duplicate);
    /// assert!(matches!(table.quiesce(room.handle, 0)?, Quiesced::Released(_)));
    /// assert!(table.quiesce(room.handle, 0).is_err());       // late ACK: stale, harmless
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn quiesce(&self, handle: RoomHandle, rank: u32) -> Result<Quiesced, Error> {
        let slot = self.slot(handle)?;
        self.check_rank(rank)?;
        let state = slot.word.load(Ordering::Acquire);
        let gen = if cfg!(kvfence_skip_ack_gen_check) {
            // MUTATION (test-only): trust the ACK whatever lifecycle it names.
            state.gen()
        } else {
            if state.gen() != handle.generation() || state.phase() == Phase::Free {
                return Err(self.stale());
            }
            handle.generation()
        };
        let out = self.quiesce_in(handle.index(), gen, rank);
        match out {
            Err(Error::StaleHandle) => Err(self.stale()),
            Ok(Quiesced::Duplicate) => {
                self.counters.bump(Event::Duplicate);
                out
            }
            _ => out,
        }
    }

    /// Clears `rank` in lifecycle `gen` of room `index`; drops the word's hold if it empties.
    fn quiesce_in(&self, index: usize, gen: u32, rank: u32) -> Result<Quiesced, Error> {
        let word = self.mask(index, rank as usize / RANKS_PER_WORD);
        let bit = 1u16 << (rank as usize % RANKS_PER_WORD);
        match word.clear(gen, bit) {
            Err(MaskRefusal::Stale) => Err(Error::StaleHandle),
            Err(MaskRefusal::NotInRoom) => Err(Error::RankNotInRoom { rank }),
            Ok(Cleared::Duplicate) => Ok(Quiesced::Duplicate),
            Ok(Cleared::Bit) => Ok(Quiesced::Recorded),
            Ok(Cleared::LastOfWord) => match self.slots[index].0.word.drop_hold(gen) {
                Ok(Step::Released(phase)) => {
                    Ok(Quiesced::Released(self.release(index, gen, phase)))
                }
                // The word's hold was ours; with the mutation above it may not be.
                Ok(Step::Held) | Err(_) => Ok(Quiesced::Recorded),
            },
        }
    }

    /// Aborts the request: from now on no transfer can begin on the room, and it is released
    /// once every writer rank has acknowledged (`quiesce`) and every local transfer has
    /// completed. Never blocks.
    ///
    /// Returns the fan-out (writer ranks still to be told) and, if nothing held the room,
    /// the release this call performed.
    ///
    /// # Errors
    /// [`Error::AlreadyAborted`], [`Error::AlreadyFinished`], [`Error::StaleHandle`] (already
    /// released), [`Error::ForeignHandle`], [`Error::UnknownRoom`].
    ///
    /// ```
    /// use kvfence::{Config, RankSet, RoomTable};
    /// let table = RoomTable::new(Config::new(8, 64, 4))?;
    /// let room = table.open(4, &RankSet::new())?;    // nothing can be writing it
    /// let aborted = table.abort(room.handle)?;
    /// assert_eq!(aborted.released.map(|r| r.pages), Some(4));   // released at once
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn abort(&self, handle: RoomHandle) -> Result<Aborted, Error> {
        let released = self.close(handle, Phase::Aborting)?;
        let mut fanout = RankSet::new();
        if released.is_none() {
            for word in 0..self.mask_words {
                let mask = self.mask(handle.index(), word).load(Ordering::Acquire);
                if mask.gen() == handle.generation() {
                    fanout.add_chunk(word, mask.pending());
                }
            }
        }
        Ok(Aborted { fanout, released })
    }

    /// Finishes the request normally: no transfer can begin any more, and the room is
    /// released once what is still in flight (transfers, writer ranks not yet done) drains.
    ///
    /// # Errors
    /// As [`abort`](Self::abort).
    ///
    /// ```
    /// use kvfence::{Config, RankSet, RoomTable};
    /// let table = RoomTable::new(Config::new(8, 64, 4))?;
    /// let room = table.open(1, &RankSet::first(1)?)?;
    /// let _ = table.quiesce(room.handle, 0)?;                  // rank 0 sent everything
    /// assert!(table.finish(room.handle)?.is_some());          // released by finish
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn finish(&self, handle: RoomHandle) -> Result<Option<Released>, Error> {
        self.close(handle, Phase::Draining)
    }

    fn close(&self, handle: RoomHandle, to: Phase) -> Result<Option<Released>, Error> {
        let slot = self.slot(handle)?;
        let gen = handle.generation();
        match slot.word.close(gen, to) {
            Ok(Step::Released(phase)) => Ok(Some(self.release(handle.index(), gen, phase))),
            Ok(Step::Held) => {
                let now = self.epoch.elapsed().as_nanos() as u64;
                slot.closed_at.store(now, Ordering::Relaxed);
                Ok(None)
            }
            Err(Refusal::Stale) => Err(self.stale()),
            Err(Refusal::Phase(Phase::Aborting)) => Err(Error::AlreadyAborted),
            Err(Refusal::Phase(_)) => Err(Error::AlreadyFinished),
            Err(Refusal::HoldsFull) => unreachable!("close never adds a hold"),
        }
    }

    /// Declares that `rank` can no longer write anywhere: the integrator has torn down its
    /// transport (QP reset, memory-region invalidation). Quiesces the rank in every live
    /// room, reports what that released, and refuses new rooms naming the rank until
    /// [`readmit_rank`](Self::readmit_rank).
    ///
    /// Only call this once no write from the rank can land any more: the table cannot check
    /// it, and it is the only way besides the rank's own ACK to stop waiting on it.
    /// Allocates (the list of releases); it is not a hot-path call.
    ///
    /// # Errors
    /// [`Error::RankOutOfRange`].
    ///
    /// ```
    /// use kvfence::{Config, Error, RankSet, RoomTable};
    /// let table = RoomTable::new(Config::new(8, 64, 4))?;
    /// let room = table.open(2, &RankSet::first(1)?)?;
    /// let _ = table.abort(room.handle)?;                      // rank 0 never answers...
    /// let fenced = table.fence_rank(0)?;                      // ...its QP was reset
    /// assert_eq!(fenced.released.len(), 1);
    /// assert_eq!(table.open(1, &RankSet::first(1)?), Err(Error::RankFenced { rank: 0 }));
    /// assert!(table.readmit_rank(0)?);
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn fence_rank(&self, rank: u32) -> Result<Fenced, Error> {
        self.check_rank(rank)?;
        let r = rank as usize;
        self.fenced[r / 64].fetch_or(1u64 << (r % 64), Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let mut out = Fenced::default();
        for index in 0..self.slots.len() {
            let state = self.slots[index].0.word.load(Ordering::Acquire);
            if state.phase() == Phase::Free {
                continue;
            }
            match self.quiesce_in(index, state.gen(), rank) {
                Ok(Quiesced::Recorded) => out.quiesced += 1,
                Ok(Quiesced::Released(released)) => {
                    out.quiesced += 1;
                    out.released.push(released);
                }
                // Not a writer of this room, already quiesced, or released meanwhile.
                Ok(Quiesced::Duplicate) | Err(_) => {}
            }
        }
        Ok(out)
    }

    /// Re-admits a fenced rank (it has a new transport connection). Returns whether it was
    /// fenced.
    ///
    /// # Errors
    /// [`Error::RankOutOfRange`].
    pub fn readmit_rank(&self, rank: u32) -> Result<bool, Error> {
        self.check_rank(rank)?;
        let r = rank as usize;
        let bit = 1u64 << (r % 64);
        Ok(self.fenced[r / 64].fetch_and(!bit, Ordering::SeqCst) & bit != 0)
    }

    /// The phase of the handle's lifecycle: `Free` once it has been released (or if it
    /// never began).
    ///
    /// # Errors
    /// [`Error::ForeignHandle`], [`Error::UnknownRoom`].
    pub fn phase(&self, handle: RoomHandle) -> Result<Phase, Error> {
        let state = self.slot(handle)?.word.load(Ordering::Acquire);
        Ok(if state.gen() == handle.generation() {
            state.phase()
        } else {
            Phase::Free
        })
    }

    /// The release: the caller won the CAS that moved room `index` from lifecycle `gen` to
    /// `FREE`. Returns the pages, then the index, then wakes sleepers.
    fn release(&self, index: usize, gen: u32, phase: Phase) -> Released {
        let slot = &self.slots[index].0;
        let pages = slot.pages.with(|list| {
            // SAFETY: we won the release CAS (Acquire), so every guard of this lifecycle is
            // gone and the opener's writes are visible; the index is still claimed, so no
            // new opener writes the list until we free it below.
            let list = unsafe { &*list };
            self.pages_free.free_all(list);
            list.len()
        });
        self.rooms_free.free_one(index);
        // Announce "lifecycle `gen` is completely released". Once the index is free a new
        // lifecycle can open and be released before this store; never move backwards.
        let below = gen.wrapping_add(1);
        let _ = slot
            .released_below
            .fetch_update(Ordering::Release, Ordering::Relaxed, |cur| {
                ((below.wrapping_sub(cur) as i32) > 0).then_some(below)
            });
        self.counters.bump(Event::Release);
        self.wake();
        Released {
            handle: RoomHandle::new(index, self.tag, gen),
            pages,
            phase,
        }
    }

    /// Records a release that no call could return (a guard dropped without `complete`).
    pub(crate) fn orphan(&self, released: Released) {
        self.counters.bump(Event::Orphan);
        lock(&self.orphans).push(released);
    }

    /// Takes the releases performed where no value could be returned: by a
    /// [`TransferGuard`] dropped without [`complete`](TransferGuard::complete). Every
    /// release is reported exactly once: by the call that performed it, or here.
    ///
    /// ```
    /// use kvfence::{Config, RankSet, RoomTable};
    /// let table = RoomTable::new(Config::new(8, 64, 4))?;
    /// let room = table.open(1, &RankSet::new())?;
    /// let transfer = table.begin_transfer(room.handle)?;
    /// let _ = table.abort(room.handle)?;
    /// drop(transfer);                                 // e.g. unwinding: no return value
    /// assert_eq!(table.take_orphaned()[0].handle, room.handle);
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn take_orphaned(&self) -> Vec<Released> {
        core::mem::take(&mut *lock(&self.orphans))
    }

    fn wake(&self) {
        fence(Ordering::SeqCst);
        if self.waiters.load(Ordering::Relaxed) != 0 {
            self.seq.fetch_add(1, Ordering::Release);
            futex_wake_all(&self.seq);
        }
    }

    fn wait_until(&self, done: impl Fn() -> bool) {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        loop {
            let seq = self.seq.load(Ordering::Acquire);
            if done() {
                break;
            }
            futex_wait(&self.seq, seq);
        }
        self.waiters.fetch_sub(1, Ordering::Relaxed);
    }

    /// Blocks until the handle's lifecycle is released and its pages and room index are
    /// back in the pool (returns at once if they already are), so an `open` right after
    /// it can use them. Sleeps on a futex; no polling.
    ///
    /// # Errors
    /// [`Error::ForeignHandle`], [`Error::UnknownRoom`].
    ///
    /// ```
    /// use kvfence::{Config, RankSet, RoomTable};
    /// let table = RoomTable::new(Config::new(8, 64, 4))?;
    /// let room = table.open(1, &RankSet::first(1)?)?;
    /// let _ = table.abort(room.handle)?;
    /// std::thread::scope(|s| {
    ///     s.spawn(|| table.quiesce(room.handle, 0));          // the ACK arrives
    ///     table.wait_released(room.handle)                     // and wakes us
    /// })?;
    /// assert_eq!(table.stats().pages.free, 64);     // back in the pool, not just "released"
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn wait_released(&self, handle: RoomHandle) -> Result<(), Error> {
        let slot = self.slot(handle)?;
        let gen = handle.generation();
        self.wait_until(|| {
            let released_below = slot.released_below.load(Ordering::Acquire);
            let state = slot.word.load(Ordering::Acquire);
            // Generations compare modulo 2^32 (see `handle.rs` for the ABA bound): `behind`
            // is how many lifecycles the room has moved past the handle's.
            match state.gen().wrapping_sub(gen) as i32 {
                // The handle's lifecycle: live, or (FREE) it never began.
                0 => state.phase() == Phase::Free,
                // Over: wait until its release has handed the pages and index back.
                behind if behind > 0 => (released_below.wrapping_sub(gen) as i32) > 0,
                // Ahead of the room (forged): it never began, nothing to wait for.
                _ => true,
            }
        });
        Ok(())
    }

    /// Blocks until no room is owned or closing and every release has returned its pages
    /// (shutdown drain: abort or finish every room, then wait here for the writers and
    /// transfers to drain). A room whose `open` is mid-way does not count.
    ///
    /// ```
    /// use kvfence::{Config, RankSet, RoomTable};
    /// let table = RoomTable::new(Config::new(8, 64, 4))?;
    /// let room = table.open(1, &RankSet::new())?;
    /// let _ = table.finish(room.handle)?;
    /// table.wait_idle();
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn wait_idle(&self) {
        self.wait_until(|| {
            self.slots.iter().all(|slot| {
                let released_below = slot.released_below.load(Ordering::Acquire);
                let state = slot.word.load(Ordering::Acquire);
                // FREE, and no release of it still returning pages.
                state.phase() == Phase::Free && state.gen() == released_below
            })
        });
    }

    /// A snapshot of occupancy, closing rooms and event counts (see [`Stats`]).
    /// Allocates the list of closing rooms; it is not a hot-path call.
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
        let now = self.epoch.elapsed();
        for (index, slot) in self.slots.iter().enumerate() {
            let state = slot.word.load(Ordering::Acquire);
            let pages = slot.npages.load(Ordering::Relaxed) as usize;
            match state.phase() {
                Phase::Free => {}
                Phase::Owned => {
                    stats.rooms.owned += 1;
                    stats.pages.owned += pages;
                }
                phase => {
                    stats.rooms.held += 1;
                    stats.pages.held += pages;
                    let mut waiting_on = RankSet::new();
                    let mut words = 0;
                    for word in 0..self.mask_words {
                        let mask = self.mask(index, word).load(Ordering::Acquire);
                        if mask.gen() == state.gen() && mask.pending() != 0 {
                            waiting_on.add_chunk(word, mask.pending());
                            words += 1;
                        }
                    }
                    let closed_at = Duration::from_nanos(slot.closed_at.load(Ordering::Relaxed));
                    stats.closing.push(ClosingRoom {
                        handle: RoomHandle::new(index, self.tag, state.gen()),
                        phase,
                        waiting_on,
                        transfers: state.holds().saturating_sub(words),
                        pages,
                        closing_for: now.saturating_sub(closed_at),
                    });
                }
            }
        }
        stats.rooms.free = self.rooms_free.count_free();
        stats.pages.free = self.pages_free.count_free();
        stats
    }
}

/// Locks the orphan list; a panic while it was held cannot leave it inconsistent (a `push`
/// or a `take`), so poisoning is ignored.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn mask_words_of_neighbouring_rooms_do_not_share_a_line() {
        let table = RoomTable::new(Config::new(4, 4, 8)).unwrap();
        let a = table.mask(0, 0) as *const MaskWord as usize;
        let b = table.mask(1, 0) as *const MaskWord as usize;
        assert!(b - a >= 128);
    }
}
