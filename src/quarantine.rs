//! Quarantine: ending a room that can never be proven drained.
//!
//! # Implementation details
//!
//! A room that can never be proven drained (a failed transfer whose peer's transport
//! cannot be torn down) is ended by [`RoomTable::quarantine`]. The decision is one CAS of
//! the room word that sets its quarantine bit and closes the room (`room_word.rs`); it is
//! refused, and changes nothing, once the room's release is decided. Then it gives up on
//! every pending writer and failed transfer of the room, exactly as a fence would. The
//! release that follows (at once, or when the last local transfer ends) reads the bit in
//! the value of the RMW that decides it: the room index returns to service but never the
//! pages (pool pages stay out of the pool for good; gate-mode releases say
//! [`Reason::Quarantined`](crate::Reason::Quarantined): the engine must never free those
//! pages). Before issue 18 the mark was a separate store read by the releaser after its
//! deciding RMW, so a quarantine refused in the release gap still kept the drained pages
//! (test-only mutation `kvfence_quarantine_mark_first`). Time still never frees anything.

use crate::error::Error;
use crate::release::Released;
use crate::room_word::{Closed, Hold, Refusal};
#[cfg(any(kvfence_quarantine_mark_first, kvfence_mutants))]
use crate::state::mark;
use crate::state::RoomTable;
#[cfg(any(kvfence_quarantine_mark_first, kvfence_mutants))]
use crate::sync::Ordering;
use crate::RoomHandle;

impl RoomTable {
    /// Ends a room that can never be proven drained (its rank's transport cannot be torn
    /// down): gives up on its pending writers and failed transfers. The room index returns
    /// to service once local transfers still in flight end; its pages never do (see
    /// [`Reason::Quarantined`](crate::Reason::Quarantined)). Counted in [`stats`](Self::stats).
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
        #[cfg(any(kvfence_quarantine_mark_first, kvfence_mutants))]
        if mutant!(kvfence_quarantine_mark_first) {
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
                self.stamp_closed(index);
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
        if let Some(r) = self.clear_pending_writers(index, gen, self.config.release_queue) {
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
