//! [`TransferGuard`]: one local transfer in flight on a room's pages.

use crate::{Released, RoomHandle, RoomTable};
use core::mem::ManuallyDrop;

/// One local transfer in flight: while it lives the room holds its pages, whatever happens
/// to the request (abort, finish).
///
/// End it with [`complete`](Self::complete), which returns the release if it was the last
/// thing the closing room waited on. Dropping it without `complete` (early return,
/// unwinding) also ends the transfer; a release it performs then is delivered through
/// [`RoomTable::take_orphaned`], so no release event is ever lost.
///
/// ```
/// use kvfence::{Config, RankSet, RoomTable};
/// let table = RoomTable::new(Config::new(8, 64, 4))?;
/// let room = table.open(2, &RankSet::new())?;
/// let transfer = table.begin_transfer(room.handle)?;
/// for &page in transfer.pages() {
///     // ... post the RDMA write / copy for `page` ...
///     # let _ = page;
/// }
/// assert!(transfer.complete().is_none());   // room still owned: no release
/// # Ok::<(), kvfence::Error>(())
/// ```
#[derive(Debug)]
#[must_use = "dropping the guard ends the transfer at once"]
pub struct TransferGuard<'t> {
    table: &'t RoomTable,
    handle: RoomHandle,
}

impl<'t> TransferGuard<'t> {
    pub(crate) fn new(table: &'t RoomTable, handle: RoomHandle) -> Self {
        TransferGuard { table, handle }
    }

    /// The room this transfer holds.
    pub fn handle(&self) -> RoomHandle {
        self.handle
    }

    /// The room's pages. Safe to read for as long as the guard lives: the room cannot be
    /// released, so its page list cannot change.
    #[cfg(not(loom))]
    pub fn pages(&self) -> &[u32] {
        self.table.with_pages(self.handle, |pages| {
            // SAFETY (lifetime extension): the list lives in the table (`'t`) and is not
            // written while this guard holds the room (see `RoomTable::with_pages`), so the
            // slice stays valid and unchanged for as long as `&self` is borrowed.
            unsafe { core::slice::from_raw_parts(pages.as_ptr(), pages.len()) }
        })
    }

    /// Gives the room's pages to `f` (the form loom can check: the access stays inside `f`).
    pub fn with_pages<R>(&self, f: impl FnOnce(&[u32]) -> R) -> R {
        self.table.with_pages(self.handle, f)
    }

    /// Ends the transfer. Returns the release if this was the last hold of a closing room
    /// (the prefill side sends its ABORT_ACK on that event).
    #[must_use = "a release must be acted on"]
    pub fn complete(self) -> Option<Released> {
        let this = ManuallyDrop::new(self);
        this.table.end_transfer(this.handle)
    }
}

impl Drop for TransferGuard<'_> {
    fn drop(&mut self) {
        if let Some(released) = self.table.end_transfer(self.handle) {
            self.table.orphan(released);
        }
    }
}
