//! The release: deciding it, delivering it exactly once, the release queue, quarantine.
//!
//! # Implementation details
//!
//! **Deciding.** Exactly one RMW on the room word observes a closing room reaching zero
//! holds: the CAS of `RoomWord::close` (which also moves it to `FREE` with the next
//! generation), or the `fetch_sub` of `RoomWord::drop_hold` (whose caller then stores that
//! state). Whichever call makes the last change (an abort with nothing in flight, the last
//! transfer's end, the last ACK, a fence, a quarantine) wins, and calls
//! [`RoomTable::release`]. The winner happens-after every writer of the lifecycle (every
//! change of the room word in between is an RMW, which continues the release sequence).
//!
//! **Delivering.** A release is *delivered* when its [`Released`] value (handle, token,
//! page ids, reason) is handed to someone, and only then are the pool pages freed, the room
//! index returned and waiters woken ([`RoomTable::deliver`]). Either
//! * directly: the winning call returns it (`abort`, `finish`, `quiesce`, a transfer's
//!   end, `fence_rank`, `quarantine`); or
//! * through the release queue: with [`Config::release_queue`](crate::Config) every release,
//!   and in any mode a release that no caller can return (a transfer guard dropped while
//!   unwinding on a quarantined room, a `grow` whose hold was the last), is *queued*: the
//!   winner stores its reason in the slot and sets the room's bit in a [`PendingSet`];
//!   [`RoomTable::drain_released`] delivers it on the owner's thread.
//!
//! The queue is a bitmap over room indices plus a count: bounded by construction (a room
//! has at most one release pending, and its index is not reused before that release is
//! drained), lock-free (a `fetch_or` to push; to take, a `fetch_and` clearing the bits
//! taken: the bit arbitrates between concurrent drainers) and allocation-free.
//! [`RoomTable::drain_released`] makes **one pass** over the bitmap words and takes every
//! bit of a word with one `swap(0)`, so a drain of `k` releases out of `rooms` costs
//! `rooms / 64` loads plus one RMW per non-empty word, wherever the `k` rooms are (before
//! issue 18 it popped one at a time, each pop restarting at word 0: `k` scans). It stops
//! early once it has taken as many releases as the count said were pending when it
//! began. A drain with nothing pending is one load of the count.
//! [`RoomTable::pop_released`] takes one release, scanning from word 0.
//!
//! **Quarantine.** A room that can never be proven drained (a failed transfer whose peer's
//! transport cannot be torn down) is ended by [`RoomTable::quarantine`]: it gives up on
//! every pending writer and failed transfer of the room, exactly as a fence would, after
//! marking the lifecycle quarantined. The release that follows (at once, or when the last
//! local transfer ends) returns the room index to service but never the pages: pool pages
//! stay out of the pool for good and gate-mode releases say [`Reason::Quarantined`] (the
//! engine must never free those pages). Time still never frees anything.

use crate::error::Error;
pub use crate::room_word::Reason;
use crate::room_word::{Closed, Hold, Refusal, Step};
use crate::stats::Event;
use crate::sync::{AtomicU64, AtomicUsize, Ordering};
use crate::table::{mark, tagged, try_boxed, untag};
use crate::{RoomHandle, RoomTable};

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

/// Rooms whose release waits in the release queue (see the module docs).
#[derive(Debug)]
pub(crate) struct PendingSet {
    words: Box<[AtomicU64]>,
    count: AtomicUsize,
}

impl PendingSet {
    pub(crate) fn new(rooms: usize) -> Result<PendingSet, Error> {
        Ok(PendingSet {
            words: try_boxed(rooms.div_ceil(64), |_| AtomicU64::new(0))?,
            count: AtomicUsize::new(0),
        })
    }

    fn push(&self, index: usize) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let old = self.words[index / 64].fetch_or(1 << (index % 64), Ordering::Release);
        debug_assert_eq!(old & 1 << (index % 64), 0, "room {index} queued twice");
    }

    /// Takes one pending room index, if any.
    fn pop(&self) -> Option<usize> {
        if self.count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        for (w, word) in self.words.iter().enumerate() {
            let mut bits = word.load(Ordering::Relaxed);
            while bits != 0 {
                let bit = 1u64 << bits.trailing_zeros();
                if cfg!(kvfence_racy_queue_pop) {
                    // MUTATION (test-only): take the bit with a load and a store instead of
                    // one RMW: two drainers can both deliver the same release.
                    word.store(bits & !bit, Ordering::Release);
                    self.count.fetch_sub(1, Ordering::Relaxed);
                    return Some(w * 64 + bit.trailing_zeros() as usize);
                }
                if word.fetch_and(!bit, Ordering::Acquire) & bit != 0 {
                    self.count.fetch_sub(1, Ordering::Relaxed);
                    return Some(w * 64 + bit.trailing_zeros() as usize);
                }
                bits = word.load(Ordering::Relaxed);
            }
        }
        None
    }

    /// Takes up to `max` pending room indices, in one pass over the words, handing each
    /// to `f`. Bits of a word taken beyond `max` are put back (their rooms' indices are not
    /// reused before their releases are delivered, so nobody else can set them meanwhile).
    fn drain(&self, max: usize, mut f: impl FnMut(usize)) -> usize {
        let pending = self.count.load(Ordering::Relaxed);
        if pending == 0 || max == 0 {
            return 0;
        }
        let mut taken = 0;
        for (w, word) in self.words.iter().enumerate() {
            if word.load(Ordering::Relaxed) == 0 {
                continue;
            }
            // Every bit of the word at once: one RMW, and each bit taken by one drainer.
            let mut bits = word.swap(0, Ordering::Acquire);
            let mut keep = bits;
            let mut n = 0;
            while keep != 0 && taken + n < max {
                keep &= keep - 1;
                n += 1;
            }
            if keep != 0 {
                word.fetch_or(keep, Ordering::Release);
                bits &= !keep;
            }
            self.count.fetch_sub(n, Ordering::Relaxed);
            while bits != 0 {
                f(w * 64 + bits.trailing_zeros() as usize);
                bits &= bits - 1;
            }
            taken += n;
            // Everything pending when we began is taken (later pushes may wait for the
            // next drain), or the caller's limit is reached.
            if taken >= pending || taken == max {
                break;
            }
        }
        taken
    }

    pub(crate) fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }
}

impl RoomTable {
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
        #[cfg(kvfence_quarantine_mark_first)]
        let reason = if slot.quarantine_mark.load(Ordering::Relaxed) == mark(gen) {
            Reason::Quarantined
        } else {
            reason
        };
        let reason = match reason {
            // MUTATION (test-only): a quarantined room's pages treated as drained.
            Reason::Quarantined if cfg!(kvfence_quarantine_frees_pages) => Reason::Aborted,
            reason => reason,
        };
        if queue {
            slot.queued
                .store(tagged(gen, reason.code()), Ordering::Release);
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
            // directly by the winner, or by the one drainer whose `fetch_and` took the
            // room's queue bit (which happens-after the winner's `fetch_or`). The index is
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
        let (gen, code) = untag(self.slots[index].0.queued.load(Ordering::Relaxed));
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
        if cfg!(kvfence_drain_rescans) {
            // MUTATION (test-only, for the benchmark's before/after): the pre-issue-18
            // drain, one `pop_released` (a scan from word 0) per release.
            let mut n = 0;
            while let Some(released) = self.pop_released() {
                out.push(released);
                n += 1;
            }
            return n;
        }
        self.drain_released_max(out, usize::MAX)
    }

    /// [`drain_released`](Self::drain_released), delivering at most `max` releases (the
    /// rest stay queued for the next call): for callers with a fixed-size buffer (the C
    /// ABI). Still one pass over the bitmap.
    pub fn drain_released_max(&self, out: &mut Vec<Released>, max: usize) -> usize {
        self.queue.drain(max, |index| {
            let (gen, code) = untag(self.slots[index].0.queued.load(Ordering::Relaxed));
            out.push(self.deliver(index, gen, Reason::from_code(code), true));
        })
    }

    /// Ends a room that can never be proven drained (its rank's transport cannot be torn
    /// down): gives up on its pending writers and failed transfers. The room index returns
    /// to service once local transfers still in flight end; its pages never do (see
    /// [`Reason::Quarantined`]). Counted in [`stats`](Self::stats).
    ///
    /// Returns the release if this call performed it (direct delivery).
    ///
    /// # Errors
    /// [`Error::StaleHandle`] (already released), [`Error::InvalidHandle`],
    /// [`Error::UnknownRoom`].
    ///
    /// ```
    /// use kvfence::{Config, Reason, RoomTable};
    /// let table = RoomTable::new(Config::gate(8))?;
    /// let h = table.open_gate(&[5], 1, vec![40, 41])?;
    /// let t = table.begin_transfer_to(h, 5)?;
    /// assert!(t.fail().is_none());            // outcome unknown: the room stays held
    /// let _ = table.abort(h)?;
    /// let _ = table.quiesce(h, 5)?;           // even after the ACK...
    /// let r = table.quarantine(h)?.expect("released by the quarantine");
    /// assert_eq!(r.reason, Reason::Quarantined);   // ...never free pages 40, 41
    /// assert_eq!(table.stats().quarantined_pages, 2);
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn quarantine(&self, handle: RoomHandle) -> Result<Option<Released>, Error> {
        let slot = self.slot(handle)?;
        let (index, gen) = (handle.index(), handle.generation());
        #[cfg(kvfence_quarantine_mark_first)]
        {
            // MUTATION (test-only): mark first, close after (see `release_to`).
            let state = slot.word.load(Ordering::Acquire);
            if state.gen() == gen && state.phase() != crate::Phase::Free {
                slot.quarantine_mark.store(mark(gen), Ordering::Relaxed);
            }
        }
        // The decision: one CAS sets the quarantine bit and closes the room, or refuses
        // (the release is decided already) and changes nothing.
        let stamp = match slot.word.quarantine(gen) {
            Ok(Closed::Released(reason)) => return Ok(self.release(index, gen, reason)),
            Ok(Closed::Stamp) => {
                // Quarantining a live room closes it: its closing time counts from now.
                self.stamp_closed(index, gen);
                true
            }
            Ok(Closed::Held) => false,
            Err(Refusal::Stale) => return Err(self.stale()),
            Err(Refusal::Phase(_) | Refusal::HoldsFull) => {
                unreachable!("quarantine closes any live room and adds no transfer")
            }
        };
        let mut out = None;
        // Give up on every writer still pending...
        if let Some(r) = self.give_up_writers(index, gen) {
            out = Some(r);
        }
        // ...and on every failed transfer of the room...
        for failed in self.take_failed(|f| f.index == index as u32 && f.gen == gen) {
            for _ in 0..failed.count {
                if let Some(r) = self.drop_hold(index, gen, Hold::Transfer) {
                    out = Some(r);
                }
            }
        }
        // ...and last our stamp hold, which kept the room from being released meanwhile.
        if stamp {
            if let Some(r) = self.drop_hold(index, gen, Hold::Stamp) {
                out = Some(r);
            }
        }
        Ok(out)
    }
}
