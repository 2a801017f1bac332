//! Fencing: giving up on a writer rank whose transport is torn down, and re-admitting it.
//!
//! # Implementation details
//!
//! `fence_rank(r)` sets `r`'s bit in the fenced set and then scans every room, quiescing
//! `r` where it is still pending. Two races matter, and each has its own rule.
//!
//! **Fence vs. open (store-buffer).** `fence_rank` sets the bit, issues `fence(SeqCst)` and
//! reads the room words; `open` publishes its room word, issues `fence(SeqCst)` and reads
//! the fenced set. By the fences' total order at least one side sees the other: the scan
//! finds the room and quiesces `r` in it, or `open` sees the bit. `open` then rolls the room
//! back and refuses with [`Error::RankFenced`] (it never hands out a room that was opened
//! while one of its writers was fenced: the caller could route that room's writes to the
//! rank's next incarnation once it is re-admitted). Both may happen; the rollback tolerates
//! the scan's quiesce (a duplicate), the scan tolerates the rollback (a stale room), and
//! whichever of them performs the rolled-back room's release does not report it (no handle
//! was issued for it: see `RoomTable::release`).
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
//! The contract this gives (also on [`RoomTable::fence_rank`]): a room returned by `open`
//! waits on each of its writer ranks until that rank quiesces it, or until a `fence_rank`
//! of the rank that *begins after the room's `open` returned* (or overlaps it) reaches it;
//! a fence never touches a room whose `open` began after the rank's `readmit_rank`
//! returned.
//!
//! The test-only mutation `kvfence_unserialized_readmit` restores the old behaviour
//! (readmit without the lock): `tests/scanner_races.rs` and the shuttle models must catch
//! it.

use crate::error::Error;
use crate::room_word::Phase;
use crate::sync::{fence, Ordering};
use crate::table::lock;
use crate::writers::RankSet;
use crate::{Quiesced, Released, RoomTable};

/// What [`RoomTable::fence_rank`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fenced {
    /// Live rooms in which the rank was still pending and is now quiesced.
    pub quiesced: usize,
    /// Rooms that this fence released (they waited on nothing else).
    pub released: Vec<Released>,
}

impl RoomTable {
    /// The fenced ranks, as a set.
    pub(crate) fn fenced_set(&self) -> RankSet {
        RankSet::from_words(core::array::from_fn(|i| {
            self.fenced[i].load(Ordering::Relaxed)
        }))
    }

    /// The lowest rank of `writers` that is fenced.
    pub(crate) fn first_fenced(&self, writers: &RankSet) -> Option<u32> {
        writers.intersection(&self.fenced_set()).iter().next()
    }

    /// Declares that `rank` can no longer write anywhere: the integrator has torn down its
    /// transport (QP reset, memory-region invalidation). Quiesces the rank in every live
    /// room, reports what that released, and refuses new rooms naming the rank until
    /// [`readmit_rank`](Self::readmit_rank).
    ///
    /// Only call this once no write from the rank can land any more: the table cannot check
    /// it, and it is the only way besides the rank's own ACK to stop waiting on it.
    /// Allocates (the list of releases) and scans the whole table under a lock shared only
    /// with `readmit_rank`; it is not a hot-path call.
    ///
    /// # Contract with `open` and `readmit_rank`
    /// * Every room whose `open` returned before this call began has `rank` quiesced when
    ///   it returns. An `open` that overlaps it either is refused with
    ///   [`Error::RankFenced`] or returns a room in which `rank` is quiesced.
    /// * A room whose `open` began after `readmit_rank(rank)` returned is never touched by
    ///   an earlier fence: route its writes to the rank's new transport safely. Never route
    ///   a room opened before the fence to the rank's next incarnation: open a new room.
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
        let _serial = lock(&self.fence_lock);
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
    /// fenced. Waits for a `fence_rank` scan in progress to finish first, so that no room
    /// opened after this returns can be reached by an earlier fence (see
    /// [`fence_rank`](Self::fence_rank)).
    ///
    /// # Errors
    /// [`Error::RankOutOfRange`].
    pub fn readmit_rank(&self, rank: u32) -> Result<bool, Error> {
        self.check_rank(rank)?;
        let _serial = if cfg!(kvfence_unserialized_readmit) {
            // MUTATION (test-only): the pre-fix readmit, racing a running fence scan.
            None
        } else {
            Some(lock(&self.fence_lock))
        };
        let r = rank as usize;
        let bit = 1u64 << (r % 64);
        Ok(self.fenced[r / 64].fetch_and(!bit, Ordering::SeqCst) & bit != 0)
    }
}
