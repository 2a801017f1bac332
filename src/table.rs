//! The lifecycle API of [`RoomTable`]: open (both modes), grow, `quiesce`, abort, finish,
//! phase. It composes the modules below it and nothing imports from it but `lib.rs`.
//!
//! # Implementation details
//!
//! `open` claims a room index, fills the page list, stamps the writer list and publishes
//! the room word, then re-checks the fenced set (the store-buffer pair with `fence_rank`:
//! `fence.rs`) and rolls the room back if a fence touched it. Closing (`abort`, `finish`)
//! is one CAS of the room word (`room_word.rs`); a close that leaves the room held takes
//! the stamp hold, stores the closing time and drops it. `quiesce` clears the rank's mask
//! bit (`writers.rs`); the steps that may decide a release are in `release.rs`. Who writes
//! which piece of a room's state is in `state.rs`. `finish_drained` is the same close CAS
//! followed by the clears `quiesce` would make for every pending writer, each a mask RMW
//! that a racing `fence_rank` may win instead (ours then finds the bit clear: a duplicate),
//! with the release returned to the caller instead of queued; a release someone else
//! decides meanwhile goes where the table is configured to put it.

use crate::counters::Event;
use crate::error::Error;
use crate::handle::RoomHandle;
use crate::release::{Quiesced, Released};
use crate::room_word::{Closed, Hold, Phase, Refusal};
use crate::state::{lock, mark, tagged, RoomTable, SLOT_HOT_BYTES};
use crate::sync::{fence, Ordering};
use crate::writers::{check_writers, Fanout};

/// What [`RoomTable::open`] returns (pool mode).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Opened {
    /// The new lifecycle's handle.
    pub handle: RoomHandle,
    /// The pages the room owns (ids `0..pages` of the pool).
    pub pages: Vec<u32>,
}

/// What [`RoomTable::abort`] returns.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use = "the fan-out must be told about the abort, and a release must be acted on"]
pub struct Aborted {
    /// Writer ranks still to be told; each answers with `quiesce` (its ABORT_ACK) once it
    /// has drained.
    pub fanout: Fanout,
    /// `Some` if nothing held the room and `abort` released it at once (direct delivery).
    pub released: Option<Released>,
}

impl RoomTable {
    /// Pool mode: claims a room and `pages` pages, all or nothing, for a request written by
    /// `writers` (any rank ids but `u32::MAX`, at most [`MAX_WRITERS`](crate::MAX_WRITERS),
    /// no repeats).
    ///
    /// The room starts `Owned`, waiting on every rank of `writers` (each must `quiesce`
    /// before the room can be released, even after an abort). `writers` may be empty (the
    /// prefill side of a push transfer protects its source pages with transfers only);
    /// `pages` may be 0 (add them later with [`grow`](Self::grow)).
    ///
    /// # Errors
    /// [`Error::WrongMode`] on a gate-mode table, [`Error::TooManyPages`],
    /// [`Error::TooManyWriters`], [`Error::DuplicateWriter`], [`Error::InvalidRank`],
    /// [`Error::RankFenced`] (also when a writer is fenced while `open` runs: see
    /// [`fence_rank`](Self::fence_rank)), [`Error::RoomTableFull`],
    /// [`Error::PoolExhausted`]. On error nothing was claimed.
    ///
    /// ```
    /// use kvfence::{Config, RoomTable};
    /// let table = RoomTable::new(Config::pool(8, 64))?;
    /// let room = table.open(&[0, 1], 3)?;   // 3 pages, prefill ranks 0 and 1
    /// assert_eq!(room.pages.len(), 3);
    /// assert_eq!(table.stats().pages.owned, 3);
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn open(&self, writers: &[u32], pages: usize) -> Result<Opened, Error> {
        let Some(pool) = &self.pages_free else {
            return Err(Error::WrongMode { table: "gate" });
        };
        if pages > pool.len() {
            return Err(Error::TooManyPages {
                requested: pages,
                capacity: pool.len(),
            });
        }
        let mut handed = Vec::new();
        let handle = self.open_room(writers, 0, |list| {
            list.clear();
            // Fallible: memory running out is `OutOfMemory`, never an abort of the host.
            try_reserve(list, pages)?;
            try_reserve(&mut handed, pages)?;
            if !pool.claim_many(pages, list) {
                return Err(Error::PoolExhausted { requested: pages });
            }
            handed.extend_from_slice(list);
            Ok(())
        })?;
        Ok(Opened {
            handle,
            pages: handed,
        })
    }

    /// Gate mode: opens a room for the engine's request `token` (its request slot, an id,
    /// anything) whose pages the engine owns (`pages`: its page ids, any count, or empty),
    /// written by `writers`. kvfence allocates no page: the release hands back `token` and
    /// `pages`, exactly once, and the engine frees them with its own allocator.
    ///
    /// # Errors
    /// [`Error::WrongMode`] on a pool-mode table, and as [`open`](Self::open) (but never
    /// `PoolExhausted`). On error the table holds nothing of the request (the engine still
    /// owns its pages and frees them itself).
    ///
    /// ```
    /// use kvfence::{Config, Quiesced, Reason, RoomTable};
    /// let table = RoomTable::new(Config::gate(1024))?;
    /// let h = table.open_gate(&[0, 1], 42, vec![7, 8, 9])?;   // request slot 42
    /// let _ = table.abort(h)?;
    /// let _ = table.quiesce(h, 0)?;
    /// let Quiesced::Released(r) = table.quiesce(h, 1)? else { unreachable!() };
    /// assert_eq!((r.token, r.pages, r.reason), (42, vec![7, 8, 9], Reason::Aborted));
    /// // ... now the engine frees pages 7, 8, 9 and request slot 42.
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn open_gate(
        &self,
        writers: &[u32],
        token: u64,
        pages: Vec<u32>,
    ) -> Result<RoomHandle, Error> {
        self.__open_gate_inline(writers, token, pages)
    }

    /// [`open_gate`](Self::open_gate), always inlined into its caller. For kvfence-ffi
    /// only (`kvfence_open_gate`: one call level from C, as a Rust caller of `open_gate`
    /// has); not part of the API, no stability promise. Rust code calls `open_gate`.
    #[doc(hidden)]
    #[inline(always)]
    pub fn __open_gate_inline(
        &self,
        writers: &[u32],
        token: u64,
        pages: Vec<u32>,
    ) -> Result<RoomHandle, Error> {
        if self.pages_free.is_some() {
            return Err(Error::WrongMode { table: "pool" });
        }
        if pages.len() > crate::config::MAX_PAGES {
            return Err(Error::TooManyPagesInRoom);
        }
        let mut pages = Some(pages);
        self.open_room(writers, token, |list| {
            *list = pages.take().unwrap_or_default();
            Ok(())
        })
    }

    /// The one `open`: claim an index, fill the page list with `fill`, stamp, publish, and
    /// re-check the fenced ranks (store-buffer pair with `fence_rank`, see `fence.rs`).
    #[inline] // inlined into kvfence-ffi (see lib.rs)
    fn open_room(
        &self,
        writers: &[u32],
        token: u64,
        fill: impl FnOnce(&mut Vec<u32>) -> Result<(), Error>,
    ) -> Result<RoomHandle, Error> {
        check_writers(writers)?;
        if let Some(rank) = self.fenced.first_of(writers) {
            return Err(Error::RankFenced { rank });
        }
        let index = self.rooms_free.claim_one().ok_or(Error::RoomTableFull)?;
        // The next `open` most likely claims the next index (the bitmap's claim hint moves
        // past this one): bring the hot part of that slot in now, so that its cache misses
        // overlap with whatever the caller does until then instead of stalling that `open`.
        // (Large tables: slots go cold between two lifecycles of one room.)
        let next = if index + 1 < self.slots.len() {
            index + 1
        } else {
            0
        };
        crate::sync::prefetch(&self.slots[next], SLOT_HOT_BYTES);
        let slot = &self.slots[index].0;
        let filled = slot.pages.with_mut(|list| {
            // SAFETY: we claimed `index` in the room bitmap, so no other opener touches this
            // slot, and the room word is FREE, so no grower or releaser touches the list
            // (the previous releaser finished with it before freeing the index, which our
            // Acquire claim synchronised with).
            let list = unsafe { &mut *list };
            fill(list).map(|()| list.len())
        });
        let npages = match filled {
            Ok(n) => n,
            Err(e) => {
                self.rooms_free.free_one(index);
                return Err(e);
            }
        };
        let gen = slot.word.load(Ordering::Relaxed).gen();
        slot.token.store(token, Ordering::Relaxed);
        slot.sized
            .store(tagged(gen, npages as u32), Ordering::Relaxed);
        slot.closed_ms.store(0, Ordering::Release);
        slot.failed.store(tagged(gen, 0), Ordering::Relaxed);
        let holds = slot.writers.stamp(gen, writers);
        slot.word.publish(gen, holds);
        // With no writer no fence can concern the room: neither re-check below can find
        // anything (no rank to be fenced, no position to lose), so the fence that orders
        // them after the publish is skipped (issue 42: a pool-mode `open` of pages only).
        if writers.is_empty() {
            return Ok(self.handle(index, gen));
        }

        // A `fence_rank` racing with us may have fenced a writer after our check above and
        // scanned the room words before our publish. After this fence we see its rank, or
        // its scan sees our room. If we see it, the room must not be handed out (the caller
        // could route its writes to the rank's next incarnation after a readmit): roll it
        // back and refuse.
        fence(Ordering::SeqCst);
        if let Some(rank) = self.fenced.first_of(writers) {
            self.roll_back(index, gen);
            return Err(Error::RankFenced { rank });
        }
        // A fence may also have come *and gone* while we ran: its scan saw our published
        // room and quiesced the rank in it, then `readmit_rank` removed the rank before our
        // check above. Nobody else has our handle, so a writer that is no longer pending was
        // quiesced by such a fence: the room must not be handed out either (its writes would
        // go to the rank's new incarnation while the room no longer waits on it).
        if slot.writers.pending_positions(gen).count() != writers.len() {
            let pending: arrayvec::ArrayVec<usize, { crate::MAX_WRITERS }> =
                slot.writers.pending_positions(gen).collect();
            let rank = (0..writers.len())
                .find(|p| !pending.contains(p))
                .map_or(writers[0], |p| writers[p]);
            self.roll_back(index, gen);
            return Err(Error::RankFenced { rank });
        }
        Ok(self.handle(index, gen))
    }

    /// Undoes an `open` whose handle was never handed out: every writer is given up and the
    /// room closed, which releases it at once (nothing else can hold a room nobody knows,
    /// short of a forged handle; if one did, its holder releases later). Whoever performs
    /// the release does not report it (see `release.rs`).
    fn roll_back(&self, index: usize, gen: u32) {
        let slot = &self.slots[index].0;
        slot.rolled_back.store(mark(gen), Ordering::Relaxed);
        let _ = self.clear_pending_writers(index, gen, self.config.release_queue);
        match slot.word.close(gen, Phase::Aborting) {
            Ok(Closed::Released(reason)) => {
                let _ = self.release(index, gen, reason);
            }
            Ok(Closed::Stamp) => {
                let _ = self.drop_hold(index, gen, Hold::Stamp);
            }
            // A forged handle's holder releases it later.
            Ok(Closed::Held) | Err(_) => {}
        }
    }

    /// Adds pool pages to an owned room (prefill-side source pages grow chunk by chunk).
    /// Returns the new pages.
    ///
    /// # Errors
    /// [`Error::WrongMode`] (gate mode: [`grow_gate`](Self::grow_gate)),
    /// [`Error::RoomClosed`] once the room is closing, [`Error::StaleHandle`],
    /// [`Error::TooManyPages`] (more than the whole pool, as [`open`](Self::open): refused
    /// before anything is claimed), [`Error::PoolExhausted`], [`Error::InvalidHandle`]. If
    /// the room was closed while it grew and this call's hold was its last, the release goes
    /// to the release queue.
    ///
    /// ```
    /// use kvfence::{Config, RoomTable};
    /// let table = RoomTable::new(Config::pool(8, 64))?;
    /// let room = table.open(&[], 2)?;
    /// let more = table.grow(room.handle, 3)?;
    /// assert_eq!(more.len(), 3);
    /// let _ = table.finish(room.handle)?;
    /// assert!(table.grow(room.handle, 1).is_err());       // refused once closing
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn grow(&self, handle: RoomHandle, pages: usize) -> Result<Vec<u32>, Error> {
        let Some(pool) = &self.pages_free else {
            return Err(Error::WrongMode { table: "gate" });
        };
        let mut added = Vec::new();
        self.grow_room(handle, |list| {
            // As `open`: a request larger than the pool is refused before anything is
            // claimed (`claim_many` would take every free page before finding it cannot).
            if pages > pool.len() {
                return Err(Error::TooManyPages {
                    requested: pages,
                    capacity: pool.len(),
                });
            }
            let before = list.len();
            try_reserve(list, pages)?;
            try_reserve(&mut added, pages)?;
            if !pool.claim_many(pages, list) {
                return Err(Error::PoolExhausted { requested: pages });
            }
            added.extend_from_slice(&list[before..]);
            Ok(())
        })?;
        Ok(added)
    }

    /// Gate mode: adds the engine's page ids to an owned room.
    ///
    /// # Errors
    /// As [`grow`](Self::grow), [`Error::WrongMode`] on a pool-mode table.
    ///
    /// ```
    /// use kvfence::{Config, RoomTable};
    /// let table = RoomTable::new(Config::gate(8))?;
    /// let h = table.open_gate(&[], 1, vec![10])?;
    /// table.grow_gate(h, &[11, 12])?;
    /// assert_eq!(table.pages_of(h)?, vec![10, 11, 12]);
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn grow_gate(&self, handle: RoomHandle, pages: &[u32]) -> Result<(), Error> {
        if self.pages_free.is_some() {
            return Err(Error::WrongMode { table: "pool" });
        }
        self.grow_room(handle, |list| {
            if list.len() + pages.len() > crate::config::MAX_PAGES {
                return Err(Error::TooManyPagesInRoom);
            }
            try_reserve(list, pages.len())?;
            list.extend_from_slice(pages);
            Ok(())
        })
    }

    /// Runs `f` on the page list of an owned room, holding the room (a hold, so it cannot be
    /// released meanwhile) and its grow lock.
    fn grow_room(
        &self,
        handle: RoomHandle,
        f: impl FnOnce(&mut Vec<u32>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let slot = self.slot(handle)?;
        let gen = handle.generation();
        // The lock first: one grower at a time holds the room's single grow hold.
        let _lock = lock(&slot.grow_lock);
        match slot.word.begin_grow(gen) {
            Ok(()) => {}
            Err(Refusal::Stale) => return Err(self.stale()),
            Err(Refusal::Phase(phase)) => return Err(Error::RoomClosed { phase }),
            Err(Refusal::HoldsFull) => unreachable!("the grow hold is taken under the grow lock"),
        }
        let out = {
            let out = slot.pages.with_mut(|list| {
                // SAFETY: we hold the room (no release can take the list) and its grow lock
                // (no other grower or reader touches it); see the module docs.
                let list = unsafe { &mut *list };
                f(list).map(|()| list.len())
            });
            if let Ok(n) = out {
                slot.sized.store(tagged(gen, n as u32), Ordering::Relaxed);
            }
            out
        };
        // The room may have been closed meanwhile: our hold may be its last. A release has
        // no caller to return to here: it goes to the release queue.
        self.drop_hold_to_queue(handle.index(), gen, Hold::Grow);
        out.map(|_| ())
    }

    /// The page ids of a live (owned) room.
    ///
    /// # Errors
    /// [`Error::RoomClosed`] once the room is closing (its pages are then the release's),
    /// [`Error::StaleHandle`], [`Error::InvalidHandle`]. Like `grow`, it holds the room
    /// (its grow hold) while it copies: a release it ends up performing (the room
    /// was closed meanwhile) goes to the release queue.
    pub fn pages_of(&self, handle: RoomHandle) -> Result<Vec<u32>, Error> {
        let mut copy = Vec::new();
        self.grow_room(handle, |list| {
            try_reserve(&mut copy, list.len())?;
            copy.extend_from_slice(list);
            Ok(())
        })?;
        Ok(copy)
    }

    /// Marks writer `rank` done with this room: it will write no more (its transfers
    /// completed, or it drained and acknowledged the abort). Idempotent.
    ///
    /// If the room is closing and this was the last thing it waited on, the room is released
    /// by this call: [`Quiesced::Released`] carries the release (or [`Quiesced::Queued`]
    /// says it went to the release queue).
    ///
    /// # Errors
    /// [`Error::StaleHandle`] for an ACK of an earlier lifecycle (the room was released and
    /// maybe reused: nothing is touched), [`Error::RankNotInRoom`],
    /// [`Error::InvalidHandle`], [`Error::UnknownRoom`].
    ///
    /// ```
    /// use kvfence::{Config, Quiesced, RoomTable};
    /// let table = RoomTable::new(Config::pool(8, 64))?;
    /// let room = table.open(&[0, 1], 4)?;
    /// let aborted = table.abort(room.handle)?;
    /// assert_eq!(&aborted.fanout[..], &[0, 1]);             // tell ranks 0 and 1
    /// assert_eq!(table.quiesce(room.handle, 1)?, Quiesced::Recorded);
    /// assert_eq!(table.quiesce(room.handle, 1)?, Quiesced::Duplicate);
    /// assert!(matches!(table.quiesce(room.handle, 0)?, Quiesced::Released(_)));
    /// assert!(table.quiesce(room.handle, 0).is_err());       // late ACK: stale, harmless
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn quiesce(&self, handle: RoomHandle, rank: u32) -> Result<Quiesced, Error> {
        self.__quiesce_inline(handle, rank)
    }

    /// [`quiesce`](Self::quiesce), always inlined into its caller. For kvfence-ffi only
    /// (`kvfence_quiesce`: one call level from C, as a Rust caller of `quiesce` has); not
    /// part of the API, no stability promise. Rust code calls `quiesce`.
    #[doc(hidden)]
    #[inline(always)]
    pub fn __quiesce_inline(&self, handle: RoomHandle, rank: u32) -> Result<Quiesced, Error> {
        let slot = self.slot(handle)?;
        let state = slot.word.load(Ordering::Acquire);
        let gen = if mutant!(kvfence_skip_ack_gen_check) {
            // MUTATION (test-only): trust the ACK whatever lifecycle it names.
            state.gen()
        } else {
            if state.gen() != handle.generation() || state.phase() == Phase::Free {
                return Err(self.stale());
            }
            handle.generation()
        };
        let index = handle.index();
        let pos = match slot.writers.position(gen, rank) {
            Ok(Some(pos)) => pos,
            // The list belongs to another lifecycle now: the room moved on.
            Err(_) => return Err(self.stale()),
            Ok(None) => return Err(Error::RankNotInRoom { rank }),
        };
        match self.clear_position(index, gen, pos) {
            Err(Error::StaleHandle) => Err(self.stale()),
            Ok(Quiesced::Duplicate) => {
                self.counters.bump(Event::Duplicate);
                Ok(Quiesced::Duplicate)
            }
            out => out,
        }
    }

    /// Aborts the request: from now on no transfer can begin on the room, and it is released
    /// once every writer rank has acknowledged (`quiesce`) and every transfer has ended.
    /// Never blocks. A room that was finishing (draining) is aborted too: the client left
    /// while the last chunks arrived.
    ///
    /// Returns the fan-out (writer ranks still to be told) and, if nothing held the room,
    /// the release this call performed.
    ///
    /// # Errors
    /// [`Error::AlreadyAborted`], [`Error::StaleHandle`] (already released),
    /// [`Error::InvalidHandle`], [`Error::UnknownRoom`].
    ///
    /// ```
    /// use kvfence::{Config, RoomTable};
    /// let table = RoomTable::new(Config::pool(8, 64))?;
    /// let room = table.open(&[], 4)?;                // nothing can be writing it
    /// let aborted = table.abort(room.handle)?;
    /// assert_eq!(aborted.released.map(|r| r.pages.len()), Some(4));   // released at once
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn abort(&self, handle: RoomHandle) -> Result<Aborted, Error> {
        self.__abort_inline(handle)
    }

    /// [`abort`](Self::abort), always inlined into its caller. For kvfence-ffi only
    /// (`kvfence_abort`: one call level from C, as a Rust caller of `abort` has); not part
    /// of the API, no stability promise. Rust code calls `abort`.
    #[doc(hidden)]
    #[inline(always)]
    pub fn __abort_inline(&self, handle: RoomHandle) -> Result<Aborted, Error> {
        let released = self.close(handle, Phase::Aborting)?;
        // Filled in place: the fan-out is 260 bytes, not worth copying around.
        let mut aborted = Aborted {
            fanout: Fanout::default(),
            released,
        };
        if aborted.released.is_none() {
            let slot = &self.slots[handle.index()].0;
            let gen = handle.generation();
            slot.writers.pending_into(gen, &mut aborted.fanout);
            // The ids were read without a lock: valid only if the room is still this
            // lifecycle (else it was released meanwhile and nobody needs telling).
            if slot.word.load(Ordering::Acquire).gen() != gen {
                aborted.fanout.clear();
            }
        }
        Ok(aborted)
    }

    /// Finishes the request normally: no transfer can begin any more, and the room is
    /// released once what is still in flight (transfers, writer ranks not yet done) drains.
    ///
    /// # Errors
    /// As [`abort`](Self::abort), and [`Error::AlreadyFinished`].
    ///
    /// ```
    /// use kvfence::{Config, RoomTable};
    /// let table = RoomTable::new(Config::pool(8, 64))?;
    /// let room = table.open(&[0], 1)?;
    /// let _ = table.quiesce(room.handle, 0)?;                  // rank 0 sent everything
    /// assert!(table.finish(room.handle)?.is_some());          // released by finish
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn finish(&self, handle: RoomHandle) -> Result<Option<Released>, Error> {
        self.close(handle, Phase::Draining)
    }

    /// The normal end of a request whose every writer rank reported its last write
    /// complete (a successful transfer): [`finish`](Self::finish), then
    /// [`quiesce`](Self::quiesce) of every writer still pending, in one call. A release
    /// this call performs is **returned, even with
    /// [`Config::release_queue`](crate::Config::release_queue)**: the caller is the one to
    /// act on it, and a scheduler need not drain its own successes. If a transfer still
    /// holds the room, the room is released when it ends, as the table is configured.
    ///
    /// Only for rooms whose writers all reported success: on any other room it is a false
    /// ACK of each of them.
    ///
    /// # Errors
    /// As [`finish`](Self::finish) (nothing is quiesced then).
    ///
    /// ```
    /// use kvfence::{Config, RoomTable};
    /// let table = RoomTable::new(Config::gate(8).release_queue(true))?;
    /// let h = table.open_gate(&[0, 1], 7, vec![])?;
    /// let released = table.finish_drained(h)?.expect("released at once");
    /// assert_eq!((released.token, table.queued_releases()), (7, 0));   // not queued
    /// assert!(table.finish_drained(h).is_err());                        // stale now
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn finish_drained(&self, handle: RoomHandle) -> Result<Option<Released>, Error> {
        let out = self.close_to(handle, Phase::Draining, false)?;
        if out.is_some() {
            return Ok(out);
        }
        // MUTATION (test-only): finish without quiescing the writers (the room waits for
        // ACKs that a successful transfer never sends).
        if mutant!(kvfence_finish_drained_skips_writers) {
            return Ok(None);
        }
        Ok(self.clear_pending_writers(handle.index(), handle.generation(), false))
    }

    #[inline] // a local copy per crate, not a call through the GOT (see lib.rs)
    fn close(&self, handle: RoomHandle, to: Phase) -> Result<Option<Released>, Error> {
        self.close_to(handle, to, self.config.release_queue)
    }

    /// [`close`](Self::close), delivering a release it performs as `queue` says.
    #[inline]
    fn close_to(
        &self,
        handle: RoomHandle,
        to: Phase,
        queue: bool,
    ) -> Result<Option<Released>, Error> {
        let slot = self.slot(handle)?;
        let gen = handle.generation();
        let index = handle.index();
        match slot.word.close(gen, to) {
            Ok(Closed::Released(reason)) => Ok(self.release_to(index, gen, reason, queue)),
            Ok(Closed::Stamp) => {
                // We hold the stamp hold: the room cannot be released (and reopened) before
                // we drop it, so the time lands in this lifecycle. The drop may release it.
                self.stamp_closed(index);
                Ok(self.drop_hold_to(index, gen, Hold::Stamp, queue))
            }
            // An abort of a draining room keeps the time it began closing.
            Ok(Closed::Held) => Ok(None),
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
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::Config;

    /// `open` prefetches the slot after its own for the next `open`: on one thread, the
    /// next `open` claims it, transfers in between or not (tokens keep their own claim
    /// hint; with a shared one, each transfer moved the room hint on).
    #[test]
    fn next_open_claims_the_prefetched_room() {
        let table = RoomTable::new(Config::gate(256)).unwrap();
        let mut last = table.open_gate(&[1, 2], 0, vec![7]).unwrap();
        for _ in 0..300 {
            for _ in 0..2 {
                let token = table.begin(last, Some(1)).unwrap();
                assert!(table
                    .end(token, crate::Outcome::Completed)
                    .unwrap()
                    .is_none());
            }
            let h = table.open_gate(&[1, 2], 0, vec![7]).unwrap();
            assert_eq!(h.index(), (last.index() + 1) % 256);
            let _ = table.finish(last).unwrap();
            for rank in [1, 2] {
                let _ = table.quiesce(last, rank).unwrap();
            }
            last = h;
        }
    }
}

/// Makes room for `n` more ids in `v`, or [`Error::OutOfMemory`] (no abort of the host: the
/// C ABI promises that memory running out is a status).
fn try_reserve(v: &mut Vec<u32>, n: usize) -> Result<(), Error> {
    v.try_reserve(n).map_err(|_| Error::OutOfMemory {
        bytes: n.saturating_mul(core::mem::size_of::<u32>()),
    })
}
