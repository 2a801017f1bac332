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
//! **Fencing.** See `fence.rs`: `fence_rank` and `readmit_rank` are serialised by a
//! mutex (cold paths), and `open` re-checks the fenced set after publishing its room,
//! rolling the room back if a writer was fenced meanwhile.
//!
//! **Waiting.** See `wait.rs`: each room has its own waiter count, lock and condition
//! variable, so a release wakes only the threads waiting on that room, and a release of a
//! room nobody waits on touches no shared line.

use crate::bitmap::{Bitmap, Kind};
use crate::error::Error;
use crate::handle::{HandleKey, RoomHandle, MAX_ROOMS};
use crate::room_word::{Phase, Refusal, RoomWord, Step};
use crate::stats::{Counters, Event};
use crate::sync::{fence, AtomicU32, AtomicU64, Mutex, MutexGuard, Ordering, Padded, UnsafeCell};
use crate::wait::Parking;
use crate::writers::{Cleared, MaskRefusal, MaskWord, RankSet, MAX_RANKS, RANKS_PER_WORD};
use crate::TransferGuard;
use std::time::Instant;

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

/// Packs a generation with a 32-bit value (`gen << 32 | value`): slot fields that must be
/// read together with the lifecycle they belong to.
const fn tagged(gen: u32, value: u32) -> u64 {
    (gen as u64) << 32 | value as u64
}

/// The `rolled_back` mark of lifecycle `gen` (never 0, the initial value).
const fn rolled(gen: u32) -> u64 {
    1 << 32 | gen as u64
}

/// `closed_at` value meaning "this lifecycle has not closed (yet)".
pub(crate) const NOT_CLOSED: u32 = u32::MAX;

/// One room's slot. Padded so that rooms used by different threads never share a line.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) word: RoomWord,
    /// Pages of the current lifecycle. Written only by the claimer of the room index before
    /// `publish`; read by guards (which hold the room) and by the releaser.
    pages: UnsafeCell<Vec<u32>>,
    /// `tagged(generation, page count)` of the latest lifecycle, stored by its opener before
    /// `publish`: `stats` uses the count only when the tag matches the room word it read.
    pub(crate) sized: AtomicU64,
    /// `tagged(generation, milliseconds since the table's epoch)` at `abort`/`finish`,
    /// `tagged(generation, NOT_CLOSED)` from `open` until then. The closer only replaces
    /// the exact value its own lifecycle's opener stored, so a late closer of an earlier
    /// lifecycle can never overwrite a newer one's time.
    pub(crate) closed_at: AtomicU64,
    /// Every lifecycle of a generation below this one has *finished* its release (pages
    /// and room index back). Advanced only forward, by the releaser, after it freed the
    /// room index; `wait_released` and `wait_idle` wait on it, not on the room word, whose
    /// release CAS comes before the pages are back.
    pub(crate) released_below: AtomicU32,
    /// `rolled(gen)` if lifecycle `gen` was rolled back by its own `open` (see
    /// `RoomTable::release`).
    pub(crate) rolled_back: AtomicU64,
    /// Threads waiting for this room's releases (see `wait.rs`).
    pub(crate) parking: Parking,
}

// SAFETY: `Slot` is shared between threads; its only non-`Sync` field is the page-list cell,
// and every access to it follows the hand-off described in the module docs: exclusive
// writes by the room index's claimer before the `Release` publish, shared reads only by a
// holder of the room (guard) or by the single winner of the release CAS, each of which
// happens-after that publish, and no write until the index is claimed again, which
// happens-after the releaser is done.
unsafe impl Sync for Slot {}

/// Builds a boxed slice of `n` values without aborting the process when memory runs out.
pub(crate) fn try_boxed<T>(n: usize, mut f: impl FnMut(usize) -> T) -> Result<Box<[T]>, Error> {
    let mut v = Vec::new();
    if v.try_reserve_exact(n).is_err() {
        return Err(Error::OutOfMemory {
            bytes: n.saturating_mul(core::mem::size_of::<T>()),
        });
    }
    v.extend((0..n).map(&mut f));
    Ok(v.into_boxed_slice())
}

/// The lock-free room table: the whole kvfence core.
///
/// See the [crate docs](crate) for the protocol and an example.
#[derive(Debug)]
pub struct RoomTable {
    pub(crate) slots: Box<[Padded<Slot>]>,
    /// Mask words: room `i` uses `masks[i * stride ..][.. words]`.
    masks: Box<[MaskWord]>,
    mask_stride: usize,
    pub(crate) mask_words: usize,
    pub(crate) rooms_free: Bitmap,
    pub(crate) pages_free: Bitmap,
    ranks: u32,
    key: HandleKey,
    pub(crate) fenced: [AtomicU64; MAX_RANKS / 64],
    /// Serialises `fence_rank` scans with `readmit_rank` (see `fence.rs`).
    pub(crate) fence_lock: Mutex<()>,
    pub(crate) counters: Counters,
    orphans: Mutex<Vec<Released>>,
    pub(crate) epoch: Instant,
}

impl RoomTable {
    /// A table with every room and page free and no rank fenced.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if a size is zero or above its limit;
    /// [`Error::OutOfMemory`] if the table's memory cannot be allocated (the process does
    /// not abort).
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
            slots: try_boxed(config.rooms, |_| {
                Padded(Slot {
                    word: RoomWord::new(),
                    pages: UnsafeCell::new(Vec::new()),
                    sized: AtomicU64::new(0),
                    closed_at: AtomicU64::new(tagged(0, NOT_CLOSED)),
                    released_below: AtomicU32::new(0),
                    rolled_back: AtomicU64::new(0),
                    parking: Parking::new(),
                })
            })?,
            masks: try_boxed(config.rooms * mask_stride, |_| MaskWord::new())?,
            mask_stride,
            mask_words,
            rooms_free: Bitmap::try_full(config.rooms, Kind::Rooms)?,
            pages_free: Bitmap::try_full(config.pages, Kind::Pages)?,
            ranks: config.ranks as u32,
            key: HandleKey::random(),
            fenced: core::array::from_fn(|_| AtomicU64::new(0)),
            fence_lock: Mutex::new(()),
            counters: Counters::new(),
            orphans: Mutex::new(Vec::new()),
            epoch: Instant::now(),
        })
    }

    /// The sizes this table was made with.
    pub fn config(&self) -> Config {
        Config::new(self.slots.len(), self.pages_free.len(), self.ranks as usize)
    }

    pub(crate) fn mask(&self, index: usize, word: usize) -> &MaskWord {
        &self.masks[index * self.mask_stride + word]
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

    pub(crate) fn check_rank(&self, rank: u32) -> Result<(), Error> {
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

    /// Milliseconds since the table's epoch, wrapping, never [`NOT_CLOSED`].
    pub(crate) fn now_ms(&self) -> u32 {
        (self.epoch.elapsed().as_millis() % u128::from(NOT_CLOSED)) as u32
    }

    /// Claims a room and `pages` pages, all or nothing, for a request written by `writers`.
    ///
    /// The room starts `Owned`, waiting on every rank of `writers` (each must `quiesce`
    /// before the room can be released, even after an abort). `writers` may be empty (the
    /// prefill side of a push transfer protects its source pages with transfer guards only).
    ///
    /// # Errors
    /// [`Error::NoPages`], [`Error::TooManyPages`], [`Error::RankOutOfRange`],
    /// [`Error::RankFenced`] (also when a writer is fenced while `open` runs: see
    /// [`fence_rank`](Self::fence_rank)), [`Error::RoomTableFull`],
    /// [`Error::PoolExhausted`]. On error nothing was claimed.
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
        if let Some(rank) = self.first_fenced(writers) {
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
        let gen = slot.word.load(Ordering::Relaxed).gen();
        slot.sized
            .store(tagged(gen, pages as u32), Ordering::Relaxed);
        slot.closed_at
            .store(tagged(gen, NOT_CLOSED), Ordering::Relaxed);
        let mut holds = 0;
        for word in 0..self.mask_words {
            let chunk = writers.chunk(word);
            self.mask(index, word).stamp(gen, chunk);
            holds += u32::from(chunk != 0);
        }
        slot.word.publish(gen, holds);

        // A `fence_rank` racing with us may have set its bit after our check above and
        // scanned the room words before our publish. Store-buffer pairing (see `fence.rs`):
        // after this fence we see its bit, or its scan sees our room. If we see it, the
        // room must not be handed out (the caller would route writes to the rank's next
        // incarnation after a readmit): roll it back and refuse.
        fence(Ordering::SeqCst);
        if let Some(rank) = self.first_fenced(writers) {
            self.roll_back(index, gen, writers);
            return Err(Error::RankFenced { rank });
        }
        Ok(Opened {
            handle: self.handle(index, gen),
            pages: list,
        })
    }

    /// Undoes an `open` whose handle was never handed out: every writer is quiesced and the
    /// room closed, which releases it at once (nothing else can hold a room nobody knows,
    /// short of a forged handle; if one did, its holder releases later through the orphan
    /// list, as for any dropped guard).
    fn roll_back(&self, index: usize, gen: u32, writers: &RankSet) {
        // Whoever performs the release (we, or a racing fence scan) must not report it.
        self.slots[index]
            .0
            .rolled_back
            .store(rolled(gen), Ordering::Relaxed);
        for rank in writers.iter() {
            // Owned room: clearing writers cannot release it.
            let _ = self.quiesce_in(index, gen, rank);
        }
        if let Ok(Step::Released(phase)) = self.slots[index].0.word.close(gen, Phase::Aborting) {
            let _ = self.release_quietly(index, gen, phase);
        }
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
    /// [`Error::InvalidHandle`], [`Error::UnknownRoom`], [`Error::TooManyTransfers`].
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
            Ok(Step::Released(phase)) => self.release(handle.index(), handle.generation(), phase),
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
    /// [`Error::RankNotInRoom`], [`Error::InvalidHandle`], [`Error::UnknownRoom`].
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
    pub(crate) fn quiesce_in(&self, index: usize, gen: u32, rank: u32) -> Result<Quiesced, Error> {
        let word = self.mask(index, rank as usize / RANKS_PER_WORD);
        let bit = 1u16 << (rank as usize % RANKS_PER_WORD);
        match word.clear(gen, bit) {
            Err(MaskRefusal::Stale) => Err(Error::StaleHandle),
            Err(MaskRefusal::NotInRoom) => Err(Error::RankNotInRoom { rank }),
            Ok(Cleared::Duplicate) => Ok(Quiesced::Duplicate),
            Ok(Cleared::Bit) => Ok(Quiesced::Recorded),
            Ok(Cleared::LastOfWord) => match self.slots[index].0.word.drop_hold(gen) {
                Ok(Step::Released(phase)) => Ok(match self.release(index, gen, phase) {
                    Some(released) => Quiesced::Released(released),
                    // A rolled-back `open`: nobody knows this lifecycle.
                    None => Quiesced::Recorded,
                }),
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
    /// released), [`Error::InvalidHandle`], [`Error::UnknownRoom`].
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
            Ok(Step::Released(phase)) => Ok(self.release(handle.index(), gen, phase)),
            Ok(Step::Held) => {
                // Only this lifecycle's "not closed" value is replaced: a closer that runs
                // late, after the room was released and reopened, finds the newer opener's
                // value and changes nothing.
                let _ = slot.closed_at.compare_exchange(
                    tagged(gen, NOT_CLOSED),
                    tagged(gen, self.now_ms()),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                Ok(None)
            }
            Err(Refusal::Stale) => Err(self.stale()),
            Err(Refusal::Phase(Phase::Aborting)) => Err(Error::AlreadyAborted),
            Err(Refusal::Phase(_)) => Err(Error::AlreadyFinished),
            Err(Refusal::HoldsFull) => unreachable!("close never adds a hold"),
        }
    }

    /// The phase of the handle's lifecycle: `Free` once it has been released (or if it
    /// never began).
    ///
    /// # Errors
    /// [`Error::InvalidHandle`], [`Error::UnknownRoom`].
    pub fn phase(&self, handle: RoomHandle) -> Result<Phase, Error> {
        let state = self.slot(handle)?.word.load(Ordering::Acquire);
        Ok(if state.gen() == handle.generation() {
            state.phase()
        } else {
            Phase::Free
        })
    }

    /// The release: the caller won the CAS that moved room `index` from lifecycle `gen` to
    /// `FREE`. Returns the pages, then the index, then wakes this room's waiters.
    ///
    /// `None` if the lifecycle was rolled back by its `open` (no handle was issued, so there
    /// is nobody to report it to: the pages are back all the same). The rollback marked the
    /// slot before its close CAS, and every release of the lifecycle is an RMW after that
    /// CAS in the room word's order, so the mark is visible here.
    pub(crate) fn release(&self, index: usize, gen: u32, phase: Phase) -> Option<Released> {
        let unissued = self.slots[index].0.rolled_back.load(Ordering::Relaxed) == rolled(gen);
        let released = self.release_quietly(index, gen, phase);
        if unissued {
            return None;
        }
        self.counters.bump(Event::Release);
        Some(released)
    }

    /// [`release`](Self::release) without counting it (an `open` rolled back).
    fn release_quietly(&self, index: usize, gen: u32, phase: Phase) -> Released {
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
        slot.parking.notify();
        Released {
            handle: self.handle(index, gen),
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
}

/// Locks a mutex whose data a panic cannot leave inconsistent (a `push`, a `take`, or no
/// data at all), so poisoning is ignored.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
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

    #[test]
    fn slot_fits_its_padding() {
        assert!(
            core::mem::size_of::<Slot>() <= 128,
            "{}",
            core::mem::size_of::<Slot>()
        );
    }
}
