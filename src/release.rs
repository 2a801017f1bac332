//! The release: deciding it, delivering it exactly once, the release queue's drain
//! (quarantine is in `quarantine.rs`).
//!
//! # Implementation details
//!
//! **Deciding.** Exactly one RMW on the room word observes a closing room reaching zero
//! holds and moves it to `FREE` with the next generation: the CAS of `RoomWord::close`, or
//! the release CAS that follows a `fetch_sub` taking a closing room to no hold (of
//! `RoomWord::drop_hold`, or of the take-back of a refused `begin_transfer`'s transient
//! unit: see `room_word.rs`). Whichever call makes the last change (an abort with nothing
//! in flight, the last transfer's end, the last ACK, a fence, a quarantine, a refused begin
//! whose unit the last drop saw) wins, and calls [`RoomTable::release`]. The winner happens-after every writer of the lifecycle (every
//! change of the room word in between is an RMW, which continues the release sequence).
//!
//! **Delivering.** A release is *delivered* when its [`Released`] value (handle, token,
//! page ids, reason) is handed to someone, and only then are the pool pages freed, the room
//! index returned and waiters woken ([`RoomTable::deliver`]). Either
//! * directly: the winning call returns it (`abort`, `finish`, `quiesce`, a transfer's
//!   end, `fence_rank`, `quarantine`); or
//! * through the release queue: with [`Config::release_queue`](crate::Config) every release,
//!   and in any mode a release that no caller can return (a transfer guard dropped while
//!   unwinding on a quarantined room, a `grow` whose hold was the last, a refused transfer
//!   begin whose transient unit was the last), is *queued*: the
//!   winner stores its reason in the slot and sets the room's bit in a [`PendingSet`];
//!   [`RoomTable::drain_released`] delivers it on the owner's thread.
//!
//! The queue is a bitmap over room indices plus a count: bounded by construction (a room
//! has at most one release pending, and its index is not reused before that release is
//! drained), lock-free (a `fetch_or` to push; to take, a `fetch_and` clearing the bits
//! taken: the bit arbitrates between concurrent drainers) and allocation-free.
//! [`RoomTable::drain_released`] makes **one pass** over the bitmap words and takes the bits
//! of a word it wants with one `fetch_and`, so a drain of `k` releases out of `rooms` costs
//! `rooms / 64` loads plus one RMW per non-empty word, wherever the `k` rooms are (before
//! issue 18 it popped one at a time, each pop restarting at word 0: `k` scans). A bounded
//! drain clears only the bits it takes (never a whole word put back later: issue 42), so
//! a queued release's bit stays set until the drainer that delivers it clears it. It stops
//! early once it has taken as many releases as the count said were pending when it
//! began. A drain with nothing pending is one load of the count.
//!
//! **Queued means visible.** A release that goes to the queue stores its tag, sets its bit
//! and only then wakes waiters; a waiter counts it as queued only once it sees the bit
//! (`wait.rs`), so "wait, then drain" always finds it (issue 40: the C ABI pushed releases
//! that the core had already delivered into a queue of its own, after the wake-up; callers
//! with no use for a release now have the core queue it: [`RoomTable::end_queued`],
//! [`RoomTable::fence_rank_max`]).
//! [`RoomTable::pop_released`] takes one release, scanning from word 0.
//!
//! **The steps that may decide** live here too: dropping a hold of any kind
//! (`drop_hold`), clearing a writer's position (`clear_position`, which drops its mask
//! word's hold when it empties) and clearing every pending writer
//! (`clear_pending_writers`: a rollback or a quarantine gives them up, `finish_drained`
//! quiesces them). Quarantine itself is in `quarantine.rs`.

use crate::counters::Event;
use crate::error::Error;
pub use crate::room_word::Reason;
use crate::room_word::{Hold, Refusal, Refused, Step};
use crate::state::{mark, queued_of, tagged, RoomTable, Slot, QUEUED};
use crate::sync::Ordering;
use crate::writers::Cleared;
use crate::RoomHandle;

/// A room's release: its lifecycle is over and nothing can write its pages any more
/// (unless [`Reason::Quarantined`]). Delivered exactly once.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Released {
    /// The lifecycle that ended (its handle is stale from now on).
    pub handle: RoomHandle,
    /// The token the room was opened with (gate mode; 0 in pool mode).
    pub token: u64,
    /// The room's page ids. Pool mode: already back in the pool (or, if quarantined, out
    /// of it for good). Gate mode: the engine's, to free now (never, if quarantined). This
    /// is the list the room was opened and grown with, moved out: no allocation.
    pub pages: Vec<u32>,
    /// Why it was released.
    pub reason: Reason,
}

/// What [`RoomTable::quiesce`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use = "a release must be acted on"]
pub enum Quiesced {
    /// The rank is marked done; the room still waits on others (or is still live).
    Recorded,
    /// The rank had already quiesced in this lifecycle: nothing changed.
    Duplicate,
    /// This was the last thing the closing room waited on: it is released.
    Released(Released),
    /// This released the room, and the release went to the release queue (the table was
    /// made with [`Config::release_queue`](crate::Config::release_queue)).
    Queued,
}

impl RoomTable {
    /// Takes a transfer hold on an owned room of generation `gen` (`slot` is room
    /// `index`'s). A refusal whose transient unit's take-back performed a release (see
    /// `RoomWord::begin_transfer`) queues that release: the caller has none to return.
    #[inline] // inlined into kvfence-ffi (see lib.rs)
    pub(crate) fn hold(&self, index: usize, slot: &Slot, gen: u32) -> Result<(), Error> {
        match slot.word.begin_transfer(gen) {
            Ok(()) => Ok(()),
            Err(refused) => Err(self.refused(index, refused)),
        }
    }

    /// The error of a refused transfer hold, after queueing the release its take-back
    /// performed, if any.
    #[cold]
    fn refused(&self, index: usize, refused: Refused) -> Error {
        if let Some((gen, reason)) = refused.released {
            let _ = self.release_to(index, gen, reason, true);
        }
        match refused.refusal {
            Refusal::Stale => self.stale(),
            Refusal::Phase(phase) => Error::RoomClosed { phase },
            Refusal::HoldsFull => Error::TooManyTransfers,
        }
    }

    /// Drops a hold of `kind` the caller owns; returns the release if it was the last.
    #[inline]
    pub(crate) fn drop_hold(&self, index: usize, gen: u32, kind: Hold) -> Option<Released> {
        self.drop_hold_to(index, gen, kind, self.config.release_queue)
    }

    /// [`drop_hold`](Self::drop_hold), delivering a release it performs as `queue` says
    /// (not as the table is configured).
    #[inline]
    pub(crate) fn drop_hold_to(
        &self,
        index: usize,
        gen: u32,
        kind: Hold,
        queue: bool,
    ) -> Option<Released> {
        match self.slots[index].0.word.drop_hold(gen, kind) {
            Ok(Step::Released(reason)) => self.release_to(index, gen, reason, queue),
            Ok(Step::Held) => None,
            // Unreachable for a real hold: a held room cannot be released under it. (Only
            // the test-only `kvfence_naive_release` mutation gets here.)
            Err(_) => None,
        }
    }

    /// Clears writer position `pos` of lifecycle `gen` of room `index`; drops the mask
    /// word's hold if it empties.
    #[inline(always)] // into quiesce, as into kvfence_quiesce (see lib.rs)
    pub(crate) fn clear_position(
        &self,
        index: usize,
        gen: u32,
        pos: usize,
    ) -> Result<Quiesced, Error> {
        self.clear_position_to(index, gen, pos, self.config.release_queue)
    }

    /// [`clear_position`](Self::clear_position), delivering a release it performs as
    /// `queue` says (not as the table is configured).
    #[inline(always)]
    pub(crate) fn clear_position_to(
        &self,
        index: usize,
        gen: u32,
        pos: usize,
        queue: bool,
    ) -> Result<Quiesced, Error> {
        match self.slots[index].0.writers.clear(gen, pos) {
            Err(_) => Err(Error::StaleHandle),
            Ok(Cleared::Duplicate) => Ok(Quiesced::Duplicate),
            Ok(Cleared::Bit) => Ok(Quiesced::Recorded),
            Ok(Cleared::LastOfWord) => match self.slots[index].0.word.drop_hold(gen, Hold::Writers)
            {
                Ok(Step::Released(reason)) => {
                    Ok(match self.release_to(index, gen, reason, queue) {
                        Some(released) => Quiesced::Released(released),
                        None if self.is_rolled_back(index, gen) => Quiesced::Recorded,
                        None => Quiesced::Queued,
                    })
                }
                // The word's hold was ours; with the mutation above it may not be.
                Ok(Step::Held) | Err(_) => Ok(Quiesced::Recorded),
            },
        }
    }

    fn is_rolled_back(&self, index: usize, gen: u32) -> bool {
        self.slots[index].0.rolled_back.load(Ordering::Relaxed) == mark(gen)
    }

    /// Clears every writer still pending in lifecycle `gen` of room `index`: a rollback or
    /// a quarantine gives them up, `finish_drained` quiesces them (each reported its last
    /// write complete). A release one of those clears performs is delivered as `queue`
    /// says (`false`: returned, for a caller that acts on it) and returned if not queued.
    pub(crate) fn clear_pending_writers(
        &self,
        index: usize,
        gen: u32,
        queue: bool,
    ) -> Option<Released> {
        let slot = &self.slots[index].0;
        // Read without a lock: a clear of another lifecycle's list is refused (`Err`), so a
        // list that moved on meanwhile is left alone.
        let positions: arrayvec::ArrayVec<usize, { crate::MAX_WRITERS }> =
            slot.writers.pending_positions(gen).collect();
        let mut out = None;
        for pos in positions {
            if let Ok(Cleared::LastOfWord) = slot.writers.clear(gen, pos) {
                // The word's hold was ours (only a test-only mutation makes it otherwise).
                if let Ok(Step::Released(reason)) = slot.word.drop_hold(gen, Hold::Writers) {
                    out = self.release_to(index, gen, reason, queue);
                }
            }
        }
        out
    }

    /// The caller won the RMW that moved room `index` from lifecycle `gen` to `FREE`, for
    /// `reason` (read from the value that RMW observed). Delivers the release now (`Some`),
    /// or queues it (`None`), as the table is configured; a rolled-back `open` is returned
    /// to service silently (`None`).
    pub(crate) fn release(&self, index: usize, gen: u32, reason: Reason) -> Option<Released> {
        self.release_to(index, gen, reason, self.config.release_queue)
    }

    /// [`release`](Self::release), forcing the queue when `queue` (no caller to return to).
    pub(crate) fn release_to(
        &self,
        index: usize,
        gen: u32,
        reason: Reason,
        queue: bool,
    ) -> Option<Released> {
        let slot = &self.slots[index].0;
        // A release that depends on a rollback's own RMWs sees its mark (stored before
        // those RMWs; every release RMW is later in the room word's order).
        if slot.rolled_back.load(Ordering::Relaxed) == mark(gen) {
            let _ = self.deliver(index, gen, Reason::Aborted, false);
            return None;
        }
        // MUTATION (test-only): the pre-fix quarantine, whose mark was a separate store
        // read here, after the deciding RMW: a refused quarantine could still keep pages.
        #[cfg(any(kvfence_quarantine_mark_first, kvfence_mutants))]
        let reason = if mutant!(kvfence_quarantine_mark_first)
            && slot.quarantine_mark.load(Ordering::Relaxed) == mark(gen)
        {
            Reason::Quarantined
        } else {
            reason
        };
        let reason = match reason {
            // MUTATION (test-only): a quarantined room's pages treated as drained.
            Reason::Quarantined if mutant!(kvfence_quarantine_frees_pages) => Reason::Aborted,
            reason => reason,
        };
        if queue {
            slot.queued
                .store(tagged(gen, QUEUED | reason.code()), Ordering::Release);
            self.queue.push(index);
            // The release is decided and queued: a waiter for it may go on (and drain).
            slot.parking.notify();
            return None;
        }
        Some(self.deliver(index, gen, reason, true))
    }

    /// Hands the release of lifecycle `gen` of room `index` over: takes the page list,
    /// returns pool pages (unless quarantined), frees the room index, wakes waiters.
    fn deliver(&self, index: usize, gen: u32, reason: Reason, count: bool) -> Released {
        let slot = &self.slots[index].0;
        let pages = slot.pages.with_mut(|list| {
            // SAFETY: the release of lifecycle `gen` was decided (by an RMW that
            // happens-after every writer and grower of the list) and is delivered once:
            // directly by the winner, or by the one drainer whose RMW took the room's queue
            // bit (the `fetch_and` of a pop or a drain, `Acquire`: it happens-after the
            // winner's `fetch_or`). The index is
            // still claimed, so no opener touches the list until we free it below.
            core::mem::take(unsafe { &mut *list })
        });
        let token = slot.token.load(Ordering::Relaxed);
        if reason == Reason::Quarantined {
            self.counters
                .add(Event::QuarantinedPages, pages.len() as u64);
            self.counters.bump(Event::QuarantinedRoom);
        } else if let Some(pool) = &self.pages_free {
            pool.free_all(&pages);
        }
        self.rooms_free.free_one(index);
        // Announce "lifecycle `gen` is completely released". Once the index is free a new
        // lifecycle can open and be released before this store; never move backwards.
        let below = gen.wrapping_add(1);
        let _ = slot
            .released_below
            .fetch_update(Ordering::Release, Ordering::Relaxed, |cur| {
                ((below.wrapping_sub(cur) as i32) > 0).then_some(below)
            });
        // Counted before the waiters are woken: one that reads `stats()` right after its
        // wait returns sees the release that woke it (found by the shuttle suite).
        if count {
            self.counters.bump(Event::Release);
        }
        slot.parking.notify();
        Released {
            handle: self.handle(index, gen),
            token,
            pages,
            reason,
        }
    }

    /// Drops a hold whose caller cannot return a release: a release it performs is queued.
    pub(crate) fn drop_hold_to_queue(&self, index: usize, gen: u32, kind: Hold) {
        if let Ok(Step::Released(reason)) = self.slots[index].0.word.drop_hold(gen, kind) {
            let _ = self.release_to(index, gen, reason, true);
        }
    }

    /// The generation and reason code queued in room `index`, whose queue bit we took.
    #[inline] // inlined into kvfence-ffi (see lib.rs)
    fn queued_release(&self, index: usize) -> (u32, u32) {
        // The bit was set after the tag was stored (`push` is `Release`, our take of the
        // bit `Acquire`): the tag names a lifecycle.
        queued_of(self.slots[index].0.queued.load(Ordering::Relaxed)).unwrap_or((0, 0))
    }

    /// Takes one release from the release queue and delivers it (pool pages go back, the
    /// room index returns to service). `None` if the queue is empty.
    ///
    /// ```
    /// use kvfence::{Config, Quiesced, RoomTable};
    /// let table = RoomTable::new(Config::gate(8).release_queue(true))?;
    /// let h = table.open_gate(&[3], 7, vec![1, 2])?;
    /// let _ = table.abort(h)?;
    /// assert_eq!(table.quiesce(h, 3)?, Quiesced::Queued);   // decided on the ACK thread...
    /// let r = table.pop_released().expect("queued");     // ...acted on by the owner
    /// assert_eq!((r.token, r.pages), (7, vec![1, 2]));
    /// assert!(table.pop_released().is_none());
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn pop_released(&self) -> Option<Released> {
        let index = self.queue.pop()?;
        let (gen, code) = self.queued_release(index);
        Some(self.deliver(index, gen, Reason::from_code(code), true))
    }

    /// Delivers every queued release into `out` (appended; no allocation if `out` has the
    /// capacity) and returns how many. Call it from the owner thread each loop; any thread
    /// may call it, and each release is delivered to exactly one caller.
    ///
    /// ```
    /// use kvfence::{Config, RoomTable};
    /// let table = RoomTable::new(Config::gate(8).release_queue(true))?;
    /// let mut released = Vec::with_capacity(8);
    /// for slot in 0..3 {
    ///     let h = table.open_gate(&[], slot, vec![slot as u32])?;
    ///     assert!(table.finish(h)?.is_none());            // queued, not returned
    /// }
    /// assert_eq!(table.drain_released(&mut released), 3);
    /// let mut tokens: Vec<u64> = released.iter().map(|r| r.token).collect();
    /// tokens.sort();
    /// assert_eq!(tokens, [0, 1, 2]);
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn drain_released(&self, out: &mut Vec<Released>) -> usize {
        self.drain_released_max(out, usize::MAX)
    }

    /// [`drain_released`](Self::drain_released), delivering at most `max` releases (the
    /// rest stay queued for the next call): for callers with a fixed-size buffer (the C
    /// ABI). Still one pass over the bitmap.
    pub fn drain_released_max(&self, out: &mut Vec<Released>, max: usize) -> usize {
        self.queue.drain(max, |index| {
            let (gen, code) = self.queued_release(index);
            out.push(self.deliver(index, gen, Reason::from_code(code), true));
        })
    }

    /// [`drain_released_max`](Self::drain_released_max), handing each release to `f`
    /// instead of appending it to a `Vec`: for a caller that stores releases in its own
    /// memory (the C ABI writes them straight into the caller's array). Returns how many
    /// `f` received. Still one pass over the bitmap; `f` runs on the calling thread.
    ///
    /// No release is lost if `f` panics: the one it was given is its own (dropped by the
    /// unwind, like any value a panicking function owns), and the rest of this drain's
    /// releases go back to the queue, untouched, before the panic resumes.
    ///
    /// ```
    /// use kvfence::{Config, RoomTable};
    /// let table = RoomTable::new(Config::gate(8).release_queue(true))?;
    /// for slot in 0..3 {
    ///     let h = table.open_gate(&[], slot, vec![slot as u32])?;
    ///     assert!(table.finish(h)?.is_none()); // queued
    /// }
    /// let mut tokens = [0u64; 2];
    /// let mut n = 0;
    /// assert_eq!(table.drain_released_with(2, |r| { tokens[n] = r.token; n += 1 }), 2);
    /// assert_eq!(table.queued_releases(), 1); // the limit left one queued
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn drain_released_with(&self, max: usize, mut f: impl FnMut(Released)) -> usize {
        let mut panicked = None;
        let mut delivered = 0;
        self.queue.drain(max, |index| {
            if panicked.is_some() {
                // `f` panicked on an earlier release of this drain: this one is not
                // delivered (its room stays queued, its pages held) and goes back.
                self.queue.push(index);
                return;
            }
            let (gen, code) = self.queued_release(index);
            let r = self.deliver(index, gen, Reason::from_code(code), true);
            delivered += 1;
            // Free on the path that does not unwind (a landing pad only).
            if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(r))) {
                panicked = Some(p);
            }
        });
        if let Some(p) = panicked {
            std::panic::resume_unwind(p);
        }
        delivered
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::{Config, Error, Phase};

    /// Issue 42: a refused transfer hold whose transient unit was the room's last hold
    /// performs the release on take-back; `begin_transfer` has nobody to return it to, so
    /// it is queued (in pool mode without the queue too), exactly once.
    #[test]
    fn a_refused_hold_that_releases_queues_the_release() {
        let table = RoomTable::new(Config::pool(4, 16)).unwrap();
        let room = table.open(&[], 3).unwrap();
        let guard = table.begin_transfer(room.handle).unwrap();
        assert!(table.abort(room.handle).unwrap().released.is_none());
        let index = room.handle.index();
        let slot = &table.slots[index].0;
        // A concurrent refused begin: its unit is in when the last transfer completes.
        slot.word.add_transient_unit();
        assert!(guard.complete().is_none());
        assert_eq!(table.queued_releases(), 0);
        let refused = Refused {
            refusal: Refusal::Phase(Phase::Aborting),
            released: slot.word.back_out(),
        };
        assert_eq!(
            table.refused(index, refused),
            Error::RoomClosed {
                phase: Phase::Aborting
            }
        );
        let mut out = Vec::new();
        assert_eq!(table.drain_released(&mut out), 1);
        assert_eq!(out[0].handle, room.handle);
        assert_eq!(
            (out[0].reason, &out[0].pages),
            (Reason::Aborted, &room.pages)
        );
        assert_eq!(table.stats().pages.free, 16);
        assert!(matches!(
            table.begin_transfer(room.handle),
            Err(Error::StaleHandle)
        ));
        assert_eq!(table.drain_released(&mut out), 0);
    }
}
