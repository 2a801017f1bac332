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
//! drained), lock-free (a `fetch_or` to push, a `fetch_and` to pop: the bit arbitrates
//! between concurrent drainers) and allocation-free. Popping scans the bitmap words, so a
//! drain costs `rooms / 64` loads when something is pending and one load when nothing is.
//!
//! **Quarantine.** A room that can never be proven drained (a failed transfer whose peer's
//! transport cannot be torn down) is ended by [`RoomTable::quarantine`]: it gives up on
//! every pending writer and failed transfer of the room, exactly as a fence would, after
//! marking the lifecycle quarantined. The release that follows (at once, or when the last
//! local transfer ends) returns the room index to service but never the pages: pool pages
//! stay out of the pool for good and gate-mode releases say [`Reason::Quarantined`] (the
//! engine must never free those pages). Time still never frees anything.

use crate::error::Error;
use crate::room_word::{Phase, Refusal, Step};
use crate::stats::Event;
use crate::sync::{AtomicU64, AtomicUsize, Ordering};
use crate::table::{mark, reason_of, tagged, try_boxed, untag};
use crate::{RoomHandle, RoomTable};

/// Why a room was released.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Finished normally (`finish`), and everything in flight drained.
    Finished,
    /// Aborted, and every writer acknowledged (or was fenced) and every transfer ended.
    Aborted,
    /// Quarantined: the room index is back, but the pages must **never** be freed or
    /// reused (a write to them may still land). Pool mode keeps them out of the pool.
    Quarantined,
}

impl Reason {
    const fn code(self) -> u32 {
        match self {
            Reason::Finished => 0,
            Reason::Aborted => 1,
            Reason::Quarantined => 2,
        }
    }
    const fn from_code(code: u32) -> Reason {
        match code {
            0 => Reason::Finished,
            1 => Reason::Aborted,
            _ => Reason::Quarantined,
        }
    }
}

impl core::fmt::Display for Reason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Reason::Finished => "finished",
            Reason::Aborted => "aborted",
            Reason::Quarantined => "quarantined",
        })
    }
}

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

    pub(crate) fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }
}

impl RoomTable {
    /// The caller won the RMW that moved room `index` from lifecycle `gen` (closed to
    /// `phase`) to `FREE`. Delivers the release now (`Some`), or queues it (`None`), as the
    /// table is configured; a rolled-back `open` is returned to service silently (`None`).
    pub(crate) fn release(&self, index: usize, gen: u32, phase: Phase) -> Option<Released> {
        self.release_to(index, gen, phase, self.config.release_queue)
    }

    /// [`release`](Self::release), forcing the queue when `queue` (no caller to return to).
    pub(crate) fn release_to(
        &self,
        index: usize,
        gen: u32,
        phase: Phase,
        queue: bool,
    ) -> Option<Released> {
        let slot = &self.slots[index].0;
        // A release that depends on a rollback's or a quarantine's own RMWs sees its mark
        // (stored before those RMWs; every release RMW is later in the room word's order).
        // A quarantine that lands after the deciding RMW (in the gap before FREE is stored)
        // may or may not be seen: if seen, the pages are kept out for good although they
        // drained (safe, a leak the stats count); the quarantine itself reports a stale
        // handle either way.
        if slot.rolled_back.load(Ordering::Relaxed) == mark(gen) {
            let _ = self.deliver(index, gen, Reason::Aborted, false);
            return None;
        }
        let quarantined = slot.quarantined.load(Ordering::Relaxed) == mark(gen)
            // MUTATION (test-only): a quarantined room's pages treated as drained.
            && !cfg!(kvfence_quarantine_frees_pages);
        let reason = reason_of(phase, quarantined);
        if queue {
            slot.queued
                .store(tagged(gen, reason.code()), Ordering::Relaxed);
            self.queue.push(index);
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
    pub(crate) fn drop_hold_to_queue(&self, index: usize, gen: u32) {
        if let Ok(Step::Released(phase)) = self.slots[index].0.word.drop_hold(gen) {
            let _ = self.release_to(index, gen, phase, true);
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
        let mut n = 0;
        while let Some(released) = self.pop_released() {
            out.push(released);
            n += 1;
        }
        n
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
        let state = slot.word.load(Ordering::Acquire);
        if state.gen() != gen || state.phase() == Phase::Free {
            return Err(self.stale());
        }
        // Mark this lifecycle, unless a newer one is marked already (this call ran late:
        // the room was released and reopened since the check above, and the stale close
        // below will refuse): a late store must never erase a newer lifecycle's mark.
        let _ = slot
            .quarantined
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |cur| {
                let newer = cur != 0 && (((cur as u32).wrapping_sub(gen)) as i32) > 0;
                (!newer).then_some(mark(gen))
            });
        let mut out = None;
        match slot.word.close(gen, Phase::Aborting) {
            Ok(Step::Released(phase)) => return Ok(self.release(index, gen, phase)),
            Ok(Step::Held) | Err(Refusal::Phase(_)) => {}
            Err(Refusal::Stale) => return Err(self.stale()),
            Err(Refusal::HoldsFull) => unreachable!("close never adds a hold"),
        }
        // Give up on every writer still pending...
        if let Some(r) = self.give_up_writers(index, gen) {
            out = Some(r);
        }
        // ...and on every failed transfer of the room.
        for failed in self.take_failed(|f| f.index == index as u32 && f.gen == gen) {
            if let Some(r) = self.drop_hold(failed.index as usize, failed.gen) {
                out = Some(r);
            }
        }
        Ok(out)
    }
}
