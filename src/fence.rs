//! Fencing: giving up on a writer rank whose transport is torn down, and re-admitting it.
//!
//! # Implementation details
//!
//! `fence_rank(r)` adds `r` to the fenced set, then scans every room, quiescing `r` where it
//! is still pending, and ends every failed transfer whose peer is `r` (see `transfer.rs`).
//! Two races matter, and each has its own rule.
//!
//! **The fenced set** is an array of `max_fenced` entries (`AtomicU32`s, `u32::MAX` for an
//! empty one), a high-water mark (entries ever used, only grows) and a count, written only
//! under `fence_lock`. An entry never moves: `fence_rank` stores the rank into the first
//! empty entry (raising the mark if it is past it) and then raises the count;
//! `readmit_rank` empties the rank's entry and then lowers the count. So membership reads
//! without the lock are linearizable: a reader loads the count (0: nothing is fenced, done),
//! then the mark, then the entries below it one by one; a rank that stays fenced for the
//! whole read sits in one entry that no writer touches meanwhile (inserts only fill empty
//! entries, removals only empty their own rank's), below a mark the reader saw, so the
//! reader finds it; a rank it reports was in its entry at the moment of that load. (Before
//! issue 18, readmit moved the last entry into the removed one's place and the next fence
//! appended into the last place: a reader between the two missed a rank that stayed
//! fenced, and a failed transfer to it was registered after the fence's sweep, holding its
//! room forever. The test-only mutation `kvfence_moving_fenced_set` restores that.) `open`
//! reads the set twice (before claiming and after publishing); with no rank fenced that is
//! one load of the count.
//!
//! **Fence vs. open (store-buffer).** `fence_rank` adds the rank, issues `fence(SeqCst)`
//! and reads the room words; `open` publishes its room word, issues `fence(SeqCst)` and
//! reads the fenced set. By the fences' total order at least one side sees the other: the
//! scan finds the room and quiesces `r` in it, or `open` sees the rank. `open` then checks
//! two things before it hands the room out: no writer is fenced now, and every writer is
//! still pending (nobody else has the handle, so a writer already quiesced was quiesced by a
//! fence that came and was re-admitted while `open` ran). If either fails it rolls the room
//! back and refuses with [`Error::RankFenced`]: a room is never handed out that a fence
//! touched before `open` returned, because the caller would route its writes to the rank's
//! *current* transport, which may be the next incarnation. Both sides may act; the rollback
//! tolerates the scan's quiesce (a duplicate), the scan tolerates the rollback (a stale
//! room), and whichever performs the rolled-back room's release does not report it (no
//! handle was issued for it: see `RoomTable::release`).
//!
//! **Fence vs. readmit.** Without more, `readmit_rank(r)` clearing the bit while a scan
//! for `r` is still running lets a room opened *after* the readmit (which waits on `r`'s
//! new transport) be reached by the old scan, which quiesces `r` there: an abort would then
//! release its pages although the new incarnation never acknowledged. So the scan and the
//! readmit are serialised by `fence_lock`: `readmit_rank` returns only once no scan for the
//! fenced incarnation is running, so no room opened after it can be touched by an earlier
//! fence. Both calls are cold (a transport failure, a process restart); the lock is held for
//! one scan of the table. `open` and every hot-path call never take it.
//!
//! The contract this gives (also on [`RoomTable::fence_rank`]): when `open` returns a room,
//! every writer rank is pending in it and no fence has touched it; from then on it waits on
//! each writer until that rank quiesces it or a later `fence_rank` of the rank reaches it.
//! The caller's side of the contract (on [`RoomTable::fence_rank`]): readmit a rank before
//! its new transport carries anything, and send a room only over an admitted rank's
//! transport, the incarnation current when `open` returned. The SPIN model in
//! `verify/spin/` checks these rules exhaustively on small instances; its variants show
//! each one broken (and both pre-fix races).
//!
//! The test-only mutation `kvfence_unserialized_readmit` restores the old behaviour
//! (readmit without the lock): `tests/scanner_races.rs` must catch it (`scripts/mutations.sh`);
//! loom cannot (see loom-tests/README.md).

use crate::error::Error;
use crate::release::{Quiesced, Released};
use crate::room_word::{Hold, Phase, Step};
use crate::state::{lock, RoomTable};
use crate::sync::{fence, Ordering};

/// What [`RoomTable::fence_rank`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fenced {
    /// Live rooms in which the rank was still pending and is now quiesced.
    pub quiesced: usize,
    /// Failed transfers to the rank that were holding their rooms and are now ended.
    pub failed_ended: usize,
    /// Rooms that this fence released (they waited on nothing else), when releases are
    /// returned directly.
    pub released: Vec<Released>,
    /// Rooms that this fence released into the release queue (a table made with
    /// [`Config::release_queue`](crate::Config::release_queue)).
    pub queued: usize,
}

impl Fenced {
    /// Whether the next release this fence performs goes to the release queue: the table
    /// queues every release, `max` are returned already, or the list cannot grow (out of
    /// memory: queued rather than aborting).
    fn queue_next(&mut self, queue_mode: bool, max: usize) -> bool {
        queue_mode || self.released.len() >= max || self.released.try_reserve(1).is_err()
    }
}

impl RoomTable {
    /// Declares that `rank` can no longer write anywhere: the integrator has torn down its
    /// transport (QP reset, memory-region invalidation, the peer process is gone). Quiesces
    /// the rank in every live room, ends every failed transfer to it, reports what that
    /// released, and refuses new rooms naming the rank until
    /// [`readmit_rank`](Self::readmit_rank).
    ///
    /// Only call this once no write from the rank can land any more: the table cannot check
    /// it, and it is the only way besides the rank's own ACK to stop waiting on it.
    /// Allocates (the list of releases) and scans the whole table under a lock shared only
    /// with `readmit_rank`; it is not a hot-path call.
    ///
    /// # Contract with `open` and `readmit_rank`
    /// The table guarantees: every room whose `open` returned before this call began has
    /// `rank` quiesced when it returns; a room that `open` returns was touched by no fence
    /// before it returned (an overlapping `open` that sees the fence, or whose room it
    /// already quiesced, rolls back and refuses [`Error::RankFenced`]); a fence never
    /// touches a room whose `open` began after `readmit_rank(rank)` returned.
    ///
    /// The integrator must (each rule is broken by a variant of the SPIN model in
    /// `verify/spin/`, which then finds a page reused under a live writer):
    /// 1. stop sending to the rank, tear down its transport, then fence it;
    /// 2. call [`readmit_rank`](Self::readmit_rank) *before* a new incarnation's transport
    ///    carries anything (requests or transfers);
    /// 3. send a room's requests and post its transfers only over an admitted rank's
    ///    transport (not between the start of `fence_rank` and the return of
    ///    `readmit_rank`), and only over the incarnation current when the room's `open`
    ///    returned: never route a room opened before a fence to the next incarnation.
    ///
    /// # Errors
    /// [`Error::InvalidRank`], [`Error::TooManyFenced`].
    ///
    /// ```
    /// use kvfence::{Config, Error, RoomTable};
    /// let table = RoomTable::new(Config::pool(8, 64))?;
    /// let room = table.open(&[0], 2)?;
    /// let _ = table.abort(room.handle)?;                      // rank 0 never answers...
    /// let fenced = table.fence_rank(0)?;                      // ...its QP was reset
    /// assert_eq!(fenced.released.len(), 1);
    /// assert_eq!(table.open(&[0], 1), Err(Error::RankFenced { rank: 0 }));
    /// assert!(table.readmit_rank(0)?);
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn fence_rank(&self, rank: u32) -> Result<Fenced, Error> {
        self.fence_rank_max(rank, usize::MAX)
    }

    /// [`fence_rank`](Self::fence_rank), returning at most `max` releases in
    /// [`Fenced::released`]: the others go to the release queue (counted in
    /// [`Fenced::queued`]), queued before their waiters are woken, so "wait, then drain"
    /// finds them. For a caller with a fixed-size buffer (the C ABI). A release that the
    /// list cannot take because memory ran out is queued too: a fence never aborts for
    /// its result list.
    ///
    /// # Errors
    /// As [`fence_rank`](Self::fence_rank).
    ///
    /// ```
    /// use kvfence::{Config, RoomTable};
    /// let table = RoomTable::new(Config::gate(8))?;
    /// for slot in 0..3 {
    ///     let h = table.open_gate(&[5], slot, vec![])?;
    ///     let _ = table.abort(h)?;
    /// }
    /// let fenced = table.fence_rank_max(5, 1)?;
    /// assert_eq!((fenced.released.len(), fenced.queued), (1, 2));
    /// assert_eq!(table.queued_releases(), 2);
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn fence_rank_max(&self, rank: u32, max: usize) -> Result<Fenced, Error> {
        if rank == u32::MAX {
            return Err(Error::InvalidRank { rank });
        }
        let _serial = lock(&self.fence_lock);
        self.fenced.insert(rank)?;
        fence(Ordering::SeqCst);
        let mut out = Fenced::default();
        for index in 0..self.slots.len() {
            let slot = &self.slots[index].0;
            let state = slot.word.load(Ordering::Acquire);
            if state.phase() == Phase::Free {
                continue;
            }
            // A position read from a list the next opener is rewriting is harmless: the
            // clear checks the generation, and a released lifecycle has nothing pending.
            let Ok(Some(pos)) = slot.writers.position(state.gen(), rank) else {
                continue;
            };
            let queue = out.queue_next(self.config.release_queue, max);
            match self.clear_position_to(index, state.gen(), pos, queue) {
                Ok(Quiesced::Recorded) => out.quiesced += 1,
                Ok(Quiesced::Queued) => {
                    out.quiesced += 1;
                    out.queued += 1;
                }
                Ok(Quiesced::Released(released)) => {
                    out.quiesced += 1;
                    out.released.push(released);
                }
                // Already quiesced, or released meanwhile.
                Ok(Quiesced::Duplicate) | Err(_) => {}
            }
        }
        for failed in self.take_failed(|f| f.peer == Some(rank)) {
            out.failed_ended += failed.count as usize;
            let word = &self.slots[failed.index as usize].0.word;
            for _ in 0..failed.count {
                if let Ok(Step::Released(reason)) = word.drop_hold(failed.gen, Hold::Transfer) {
                    let queue = out.queue_next(self.config.release_queue, max);
                    match self.release_to(failed.index as usize, failed.gen, reason, queue) {
                        Some(released) => out.released.push(released),
                        // A failed transfer's room was handed out: never rolled back.
                        None => out.queued += 1,
                    }
                }
            }
        }
        Ok(out)
    }

    /// Re-admits a fenced rank (it has a new transport connection), or forgets a fenced rank
    /// id that will never be used again. Returns whether it was fenced. Waits for a
    /// `fence_rank` scan in progress to finish first, so that no room opened after this
    /// returns can be reached by an earlier fence (see [`fence_rank`](Self::fence_rank)).
    ///
    /// # Errors
    /// [`Error::InvalidRank`].
    pub fn readmit_rank(&self, rank: u32) -> Result<bool, Error> {
        if rank == u32::MAX {
            return Err(Error::InvalidRank { rank });
        }
        let _serial = if mutant!(kvfence_unserialized_readmit) {
            // MUTATION (test-only): the pre-fix readmit, racing a running fence scan.
            None
        } else {
            Some(lock(&self.fence_lock))
        };
        Ok(self.fenced.remove(rank))
    }
}
