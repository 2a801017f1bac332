//! Transfers on a room's pages: borrowed and owned guards, integer tokens, and outcomes.
//!
//! # Implementation details
//!
//! Every form takes one *hold* on the room word at its start (refused unless the room is
//! `OWNED` and of the handle's generation) and gives it up exactly once at its end. Taking
//! it is one `fetch_add`, checked on the value it returns; a refused call takes its unit
//! back at once, and if the room's last real hold was dropped meanwhile, that take-back is
//! the room's release, which goes to the release queue (`room_word.rs`, issue 42):
//!
//! | form | for | ends by |
//! |---|---|---|
//! | [`TransferGuard<'t>`] | Rust code on one stack frame | `complete()` / `fail()` / drop |
//! | [`OwnedTransferGuard`] | tasks, callbacks, other threads (holds an `Arc` of the table) | the same |
//! | [`TransferToken`] | FFI and Python: an integer | [`RoomTable::end`]`(token, outcome)` |
//!
//! **Outcomes.** [`Outcome::Completed`] drops the hold (the last drop of a closing room
//! releases it). [`Outcome::Failed`] does *not*: a transfer engine that reports an error
//! (Mooncake's `-1`, a timeout) may still have slices of the write posted, so a failed
//! transfer never counts as drained. Its hold is registered under the transfer's peer rank
//! and stays until that rank is fenced ([`RoomTable::fence_rank`]: its transport is torn
//! down, nothing of it can land) or the room is quarantined. A guard dropped without an
//! outcome (an early return, unwinding) is failed, not completed. The registry is a
//! `Mutex<Vec<_>>`: failures are the cold path, and fence and quarantine must find every
//! entry of a rank or a room exactly once. A failure whose peer is fenced already, or whose
//! room is quarantined already, drops its hold at once (both are checked under the same
//! lock that fence and quarantine sweep under, so no entry is registered after the sweep
//! that should have found it; the fenced set's membership read is linearizable, see
//! `fence.rs`).
//!
//! **Allocation.** One entry per (room lifecycle, peer) with a count: a room's failed
//! transfers to one peer, however many, share one entry. The table reserves one entry per
//! room, so failing a transfer allocates nothing as long as no room has failed transfers to
//! more than one peer at a time (the usual case: a room's transfers go to its request's
//! peer). Beyond that the registry grows, amortized, on this cold path; fencing and
//! quarantine allocate the list of entries they take.
//!
//! **Tokens.** A token names a slot of a fixed table of `max_tokens` transfer slots
//! (claimed from a bitmap like rooms), and carries the slot's generation and a keyed check
//! (the same scheme as room handles, with a key derived from the table's). `end` moves the
//! slot from "active, generation g" to "free, generation g + 1" by one CAS before it touches
//! the room: a second `end` of the same token, or a forged one, fails that CAS (or the
//! check) and is refused with [`Error::InvalidToken`]; it can never decrement twice.

use crate::error::Error;
use crate::handle::RoomHandle;
use crate::release::Released;
use crate::room_word::Hold;
use crate::state::{lock, tagged, untag, FailedTransfer, RoomTable, ACTIVE};
use crate::sync::Ordering;
use std::sync::Arc;

/// How a transfer ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Every byte landed (the transfer engine said so): the hold is dropped.
    Completed,
    /// The transfer engine reported an error or a timeout: bytes may still land. The room
    /// stays held until the transfer's peer rank is fenced, or the room is quarantined.
    /// If the peer is fenced already, the hold is dropped at once: that assumes the bytes
    /// went over the torn-down transport, so never post a transfer over a rank's new
    /// transport before [`RoomTable::readmit_rank`] returned.
    Failed,
}

/// Refuses `u32::MAX` as a peer: it is not a rank id (see `writers.rs`), so no fence could
/// ever end a failed transfer to it.
fn check_peer(peer: Option<u32>) -> Result<(), Error> {
    match peer {
        Some(rank) if rank == u32::MAX => Err(Error::InvalidRank { rank }),
        _ => Ok(()),
    }
}

impl RoomTable {
    /// Starts a transfer on the room's pages, with no known peer rank (a failure can then
    /// only be cleared by [`quarantine`](Self::quarantine)): the room cannot be released
    /// until the guard completes.
    ///
    /// This is the check a queued transfer intent makes right before it touches the pages:
    /// after an abort (or once the room is reused) it is refused, so a stale intent can
    /// never write. A refused call can end up performing a closing room's release (when
    /// the room's last hold was dropped while the call ran): that release goes to the
    /// release queue ([`drain_released`](Self::drain_released)).
    ///
    /// # Errors
    /// [`Error::RoomClosed`] (aborting or draining), [`Error::StaleHandle`],
    /// [`Error::InvalidHandle`], [`Error::UnknownRoom`], [`Error::TooManyTransfers`].
    ///
    /// ```
    /// use kvfence::{Config, Error, RoomTable};
    /// let table = RoomTable::new(Config::pool(8, 64))?;
    /// let room = table.open(&[], 2)?;
    /// let transfer = table.begin_transfer(room.handle)?;
    /// // ... post the writes for room.pages ...
    /// let aborted = table.abort(room.handle)?;
    /// assert!(aborted.released.is_none());                       // still in flight
    /// assert!(matches!(table.begin_transfer(room.handle), Err(Error::RoomClosed { .. })));
    /// let released = transfer.complete().expect("last hold releases");
    /// assert_eq!(released.pages, room.pages);
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    #[inline]
    pub fn begin_transfer(&self, handle: RoomHandle) -> Result<TransferGuard<'_>, Error> {
        self.begin_hold(handle)?;
        Ok(TransferGuard {
            table: self,
            handle,
            peer: None,
        })
    }

    /// [`begin_transfer`](Self::begin_transfer) with the transfer's peer rank (the rank
    /// whose transport carries it): if it fails, fencing `peer` ends it.
    ///
    /// # Errors
    /// As [`begin_transfer`](Self::begin_transfer), and [`Error::InvalidRank`] for
    /// `u32::MAX` (not a rank id).
    #[inline]
    pub fn begin_transfer_to(
        &self,
        handle: RoomHandle,
        peer: u32,
    ) -> Result<TransferGuard<'_>, Error> {
        check_peer(Some(peer))?;
        self.begin_hold(handle)?;
        Ok(TransferGuard {
            table: self,
            handle,
            peer: Some(peer),
        })
    }

    /// [`begin_transfer`](Self::begin_transfer) for a guard that owns a reference to the
    /// table (`'static`: move it into a task, a callback, another thread).
    ///
    /// # Errors
    /// As [`begin_transfer_to`](Self::begin_transfer_to).
    ///
    /// ```
    /// use kvfence::{Config, RoomTable};
    /// use std::sync::Arc;
    /// let table = Arc::new(RoomTable::new(Config::gate(8))?);
    /// let h = table.open_gate(&[], 1, vec![3])?;
    /// let transfer = RoomTable::begin_transfer_owned(&table, h, Some(0))?;
    /// std::thread::spawn(move || transfer.complete()).join().unwrap();
    /// assert!(table.finish(h)?.is_some());
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn begin_transfer_owned(
        this: &Arc<RoomTable>,
        handle: RoomHandle,
        peer: Option<u32>,
    ) -> Result<OwnedTransferGuard, Error> {
        check_peer(peer)?;
        this.begin_hold(handle)?;
        Ok(OwnedTransferGuard {
            table: Arc::clone(this),
            handle,
            peer,
            ended: false,
        })
    }

    #[inline]
    fn begin_hold(&self, handle: RoomHandle) -> Result<(), Error> {
        let slot = self.slot(handle)?;
        self.hold(handle.index(), slot, handle.generation())
    }

    /// Ends a transfer's hold with `outcome` on the room lifecycle `room`: `index << 32 |
    /// generation`, a handle's low word (`RoomHandle::low`), as a token slot stores it
    /// (`end` passes it on without computing the handle's key). `queue`: no caller to return
    /// a release to.
    #[inline] // a local copy per crate, not a call through the GOT (see lib.rs)
    pub(crate) fn end_hold(
        &self,
        room: u64,
        peer: Option<u32>,
        outcome: Outcome,
        queue: bool,
    ) -> Option<Released> {
        let (index, gen) = untag(room);
        let index = index as usize;
        match outcome {
            Outcome::Completed if queue => {
                self.drop_hold_to_queue(index, gen, Hold::Transfer);
                None
            }
            Outcome::Completed => self.drop_hold(index, gen, Hold::Transfer),
            // MUTATION (test-only): a failed transfer counted as drained.
            Outcome::Failed if mutant!(kvfence_failed_counts_as_drained) => {
                self.end_hold(room, peer, Outcome::Completed, queue)
            }
            Outcome::Failed => {
                let mut failed = lock(&self.failed);
                let slot = &self.slots[index].0;
                // Our hold keeps the word in our lifecycle: its quarantine bit is ours.
                let quarantined = slot.word.load(Ordering::Acquire).quarantined();
                let fenced = peer.is_some_and(|p| self.fenced.contains(p));
                if quarantined || fenced {
                    // Nothing of it can land any more (or nobody will ever reuse the pages).
                    drop(failed);
                    return if queue {
                        self.drop_hold_to_queue(index, gen, Hold::Transfer);
                        None
                    } else {
                        self.drop_hold(index, gen, Hold::Transfer)
                    };
                }
                let (tag, count) = untag(slot.failed.load(Ordering::Relaxed));
                let count = if tag == gen { count + 1 } else { 1 };
                // The room's entry for this peer, if it has failures already (only then is
                // the registry searched).
                let entry = if count > 1 {
                    failed
                        .iter_mut()
                        .rev()
                        .find(|f| f.index == index as u32 && f.gen == gen && f.peer == peer)
                } else {
                    None
                };
                match entry {
                    Some(entry) => entry.count += 1,
                    None => failed.push(FailedTransfer {
                        index: index as u32,
                        gen,
                        peer,
                        count: 1,
                    }),
                }
                slot.failed.store(tagged(gen, count), Ordering::Relaxed);
                self.counters.bump(crate::counters::Event::FailedTransfer);
                None
            }
        }
    }

    /// Removes and returns the failed transfers matching `which` (fence and quarantine).
    pub(crate) fn take_failed(
        &self,
        which: impl Fn(&FailedTransfer) -> bool,
    ) -> Vec<FailedTransfer> {
        let mut failed = lock(&self.failed);
        let mut taken = Vec::new();
        failed.retain(|f| {
            if which(f) {
                taken.push(*f);
                false
            } else {
                true
            }
        });
        for f in &taken {
            let slot = &self.slots[f.index as usize].0;
            let (tag, count) = untag(slot.failed.load(Ordering::Relaxed));
            if tag == f.gen {
                slot.failed.store(
                    tagged(f.gen, count.saturating_sub(f.count)),
                    Ordering::Relaxed,
                );
            }
        }
        taken
    }

    /// Token form (FFI, Python): starts a transfer and returns an integer token for it.
    /// `peer`: the rank whose transport carries it (see [`Outcome::Failed`]).
    ///
    /// # Errors
    /// As [`begin_transfer_to`](Self::begin_transfer_to), and [`Error::TooManyTokens`].
    ///
    /// ```
    /// use kvfence::{Config, Error, Outcome, RoomTable, TransferToken};
    /// let table = RoomTable::new(Config::gate(8))?;
    /// let h = table.open_gate(&[], 9, vec![1])?;
    /// let token = table.begin(h, Some(2))?;
    /// let wire: u128 = token.to_wire();                  // cross the FFI / Python boundary
    /// let back = TransferToken::from_wire(wire);
    /// assert!(table.end(back, Outcome::Completed)?.is_none());
    /// assert_eq!(table.end(back, Outcome::Completed), Err(Error::InvalidToken)); // twice
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn begin(&self, handle: RoomHandle, peer: Option<u32>) -> Result<TransferToken, Error> {
        self.__begin_inline(handle, peer)
    }

    /// [`begin`](Self::begin), always inlined into its caller. For kvfence-ffi only
    /// (`kvfence_begin`: one call level from C, as a Rust caller of `begin` has); not part
    /// of the API, no stability promise. Rust code calls `begin`.
    #[doc(hidden)]
    #[inline(always)]
    pub fn __begin_inline(
        &self,
        handle: RoomHandle,
        peer: Option<u32>,
    ) -> Result<TransferToken, Error> {
        check_peer(peer)?;
        let slot = self.slot(handle)?;
        let t = self.tokens_free.claim_one().ok_or(Error::TooManyTokens)?;
        if let Err(e) = self.hold(handle.index(), slot, handle.generation()) {
            self.tokens_free.free_one(t);
            return Err(e);
        }
        let token = &self.tokens[t];
        let (gen, _) = untag(token.state.load(Ordering::Relaxed));
        token.room.store(
            tagged(handle.index() as u32, handle.generation()),
            Ordering::Relaxed,
        );
        token.peer.store(
            peer.map_or(0, |p| 1 << 32 | u64::from(p)),
            Ordering::Relaxed,
        );
        token.state.store(tagged(gen, ACTIVE), Ordering::Release);
        let h = self.token_key.handle(t, gen);
        Ok(TransferToken(h))
    }

    /// Token form: ends the transfer `token` with `outcome`; returns the release if this was
    /// the last hold of a closing room.
    ///
    /// # Errors
    /// [`Error::InvalidToken`]: a token this table did not issue, or one already ended.
    pub fn end(&self, token: TransferToken, outcome: Outcome) -> Result<Option<Released>, Error> {
        self.__end_inline(token, outcome)
    }

    /// [`end`](Self::end), always inlined into its caller. For kvfence-ffi only
    /// (`kvfence_end`: one call level from C, as a Rust caller of `end` has); not part
    /// of the API, no stability promise. Rust code calls `end`.
    #[doc(hidden)]
    #[inline(always)]
    pub fn __end_inline(
        &self,
        token: TransferToken,
        outcome: Outcome,
    ) -> Result<Option<Released>, Error> {
        self.end_token(token, outcome, false)
    }

    /// Token form: [`end`](Self::end), but a release it performs goes to the release queue
    /// (delivered by [`drain_released`](Self::drain_released)) instead of being returned:
    /// for a caller that cannot act on a release (a destructor, a callback). The release is
    /// queued before waiters are woken, so a thread that
    /// [`wait_released`](Self::wait_released)s and then drains finds it.
    ///
    /// # Errors
    /// [`Error::InvalidToken`], as [`end`](Self::end).
    ///
    /// ```
    /// use kvfence::{Config, Outcome, RoomTable};
    /// let table = RoomTable::new(Config::gate(8))?;           // direct delivery
    /// let h = table.open_gate(&[], 9, vec![1])?;
    /// let token = table.begin(h, None)?;
    /// let _ = table.abort(h)?;
    /// table.end_queued(token, Outcome::Completed)?;            // the release is queued
    /// table.wait_released(h)?;
    /// assert_eq!(table.pop_released().map(|r| r.token), Some(9));
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn end_queued(&self, token: TransferToken, outcome: Outcome) -> Result<(), Error> {
        self.end_token(token, outcome, true).map(|_| ())
    }

    /// Ends transfer `token`; `queue`: a release goes to the release queue.
    #[inline(always)]
    fn end_token(
        &self,
        token: TransferToken,
        outcome: Outcome,
        queue: bool,
    ) -> Result<Option<Released>, Error> {
        let t = token.0;
        if !self.token_key.made(t) {
            return Err(Error::InvalidToken);
        }
        let Some(slot) = self.tokens.get(t.index()) else {
            return Err(Error::InvalidToken);
        };
        let gen = t.generation();
        // Exactly one `end` wins this CAS; the slot's fields are ours until we free it.
        if slot
            .state
            .compare_exchange(
                tagged(gen, ACTIVE),
                tagged(gen.wrapping_add(1), 0),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return Err(Error::InvalidToken);
        }
        let room = slot.room.load(Ordering::Relaxed);
        let peer = slot.peer.load(Ordering::Relaxed);
        let peer = (peer >> 32 != 0).then_some(peer as u32);
        self.tokens_free.free_one(t.index());
        Ok(self.end_hold(room, peer, outcome, queue))
    }
}

/// A token-form transfer: an integer for FFI and Python ([`to_wire`](Self::to_wire)).
/// End it with [`RoomTable::end`], exactly once.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TransferToken(RoomHandle);

impl TransferToken {
    /// The token as an integer (16 bytes).
    pub const fn to_wire(self) -> u128 {
        self.0.to_wire()
    }

    /// Decodes [`to_wire`](Self::to_wire); every value decodes, the table checks it on use.
    pub const fn from_wire(wire: u128) -> TransferToken {
        TransferToken(RoomHandle::from_wire(wire))
    }
}

impl core::fmt::Debug for TransferToken {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "TransferToken({:#x})", self.to_wire())
    }
}

/// One transfer in flight, borrowing the table: while it lives the room holds its pages,
/// whatever happens to the request (abort, finish).
///
/// End it with [`complete`](Self::complete) (every byte landed) or [`fail`](Self::fail)
/// (the transfer engine reported an error: bytes may still land). Dropping it without
/// either (an early return, unwinding) counts as a failure: the room stays held until the
/// transfer's peer is fenced or the room is quarantined.
///
/// ```
/// use kvfence::{Config, RoomTable};
/// let table = RoomTable::new(Config::pool(8, 64))?;
/// let room = table.open(&[], 2)?;
/// let transfer = table.begin_transfer_to(room.handle, 3)?;
/// // ... post the RDMA write / copy for room.pages, wait for its status ...
/// assert!(transfer.complete().is_none());   // room still owned: no release
/// # Ok::<(), kvfence::Error>(())
/// ```
#[derive(Debug)]
#[must_use = "dropping the guard fails the transfer: the room stays held"]
pub struct TransferGuard<'t> {
    table: &'t RoomTable,
    handle: RoomHandle,
    peer: Option<u32>,
}

impl TransferGuard<'_> {
    /// The room this transfer holds.
    pub fn handle(&self) -> RoomHandle {
        self.handle
    }

    /// Ends the transfer as completed. Returns the release if this was the last hold of a
    /// closing room (queued instead with [`Config::release_queue`](crate::Config)).
    #[must_use = "a release must be acted on"]
    #[inline] // the hot path's other half (`begin_transfer` is inline too)
    pub fn complete(self) -> Option<Released> {
        let this = core::mem::ManuallyDrop::new(self);
        this.table
            .end_hold(this.handle.low(), this.peer, Outcome::Completed, false)
    }

    /// Ends the transfer as failed (see [`Outcome::Failed`]). Returns a release only if the
    /// peer was fenced or the room quarantined already and this was its last hold.
    #[must_use = "a release must be acted on"]
    pub fn fail(self) -> Option<Released> {
        let this = core::mem::ManuallyDrop::new(self);
        this.table
            .end_hold(this.handle.low(), this.peer, Outcome::Failed, false)
    }
}

impl Drop for TransferGuard<'_> {
    fn drop(&mut self) {
        // No outcome: failed. A release (peer fenced or room quarantined already) has no
        // caller to go to: queued.
        let _ = self
            .table
            .end_hold(self.handle.low(), self.peer, Outcome::Failed, true);
    }
}

/// A transfer in flight that owns a reference to its table (see
/// [`RoomTable::begin_transfer_owned`]); otherwise as [`TransferGuard`].
#[derive(Debug)]
#[must_use = "dropping the guard fails the transfer: the room stays held"]
pub struct OwnedTransferGuard {
    table: Arc<RoomTable>,
    handle: RoomHandle,
    peer: Option<u32>,
    ended: bool,
}

impl OwnedTransferGuard {
    /// The room this transfer holds.
    pub fn handle(&self) -> RoomHandle {
        self.handle
    }

    /// The table.
    pub fn table(&self) -> &Arc<RoomTable> {
        &self.table
    }

    /// Ends the transfer with `outcome` (see [`TransferGuard::complete`] and
    /// [`TransferGuard::fail`]).
    #[must_use = "a release must be acted on"]
    pub fn end(mut self, outcome: Outcome) -> Option<Released> {
        self.ended = true;
        self.table
            .end_hold(self.handle.low(), self.peer, outcome, false)
    }

    /// Ends the transfer as completed.
    #[must_use = "a release must be acted on"]
    pub fn complete(self) -> Option<Released> {
        self.end(Outcome::Completed)
    }

    /// Ends the transfer as failed.
    #[must_use = "a release must be acted on"]
    pub fn fail(self) -> Option<Released> {
        self.end(Outcome::Failed)
    }
}

impl Drop for OwnedTransferGuard {
    fn drop(&mut self) {
        if !self.ended {
            let _ = self
                .table
                .end_hold(self.handle.low(), self.peer, Outcome::Failed, true);
        }
    }
}
