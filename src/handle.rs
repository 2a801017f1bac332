//! Generation-tagged room handles and their `u64` wire form.
//!
//! # Implementation details
//!
//! ```text
//!  63                              32 31      24 23                      0
//! +----------------------------------+----------+------------------------+
//! |            generation            |  table   |       room index       |
//! +----------------------------------+----------+------------------------+
//! ```
//!
//! A handle names one *lifecycle* of one room: the index says which room, the generation
//! which lifecycle, and the table tag which [`RoomTable`](crate::RoomTable) made it (a
//! handle from another table is refused with [`Error::ForeignHandle`](crate::Error),
//! except with probability 1/256 when two tables' 8-bit tags collide).
//!
//! **ABA bound.** A stale handle could only be mistaken for a live one if its room went
//! through exactly 2^32 lifecycles (or a multiple) while the stale message was in flight.
//! Claims rotate through the whole room table (see `bitmap.rs`), so one room's generation
//! advances about once per `rooms` opens of the table: at one million opens per second on
//! a 1024-room table a room wraps after 2^32 * 1024 / 10^6 s, about 50 days. A transfer
//! intent or ACK delayed that long is far beyond any transport's lifetime.

use crate::pack::Field;

const INDEX: Field = Field::after(None, 24);
const TAG: Field = Field::after(Some(INDEX), 8);
const GEN: Field = Field::after(Some(TAG), 32);

/// The largest room table (room indices must fit the handle's 24-bit index field).
pub const MAX_ROOMS: usize = 1 << 24;

/// Names one lifecycle of one room. `Copy`; send it to the other side as [`to_wire`](Self::to_wire).
///
/// ```
/// use kvfence::{RankSet, RoomTable, Config};
/// let table = RoomTable::new(Config::new(4, 16, 2))?;
/// let room = table.open(2, &RankSet::first(2)?)?;
/// let wire: u64 = room.handle.to_wire();           // goes into the transfer request
/// let back = kvfence::RoomHandle::from_wire(wire);  // comes back in the ACK
/// assert_eq!(back, room.handle);
/// # Ok::<(), kvfence::Error>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RoomHandle(u64);

impl RoomHandle {
    pub(crate) fn new(index: usize, tag: u8, gen: u32) -> RoomHandle {
        RoomHandle(GEN.set(TAG.set(INDEX.set(0, index as u64), tag as u64), gen as u64))
    }

    /// The room's index in its table.
    pub fn index(self) -> usize {
        INDEX.get(self.0) as usize
    }

    /// The lifecycle this handle belongs to.
    pub fn generation(self) -> u32 {
        GEN.get(self.0) as u32
    }

    pub(crate) fn tag(self) -> u8 {
        TAG.get(self.0) as u8
    }

    /// The wire form: 8 bytes to carry in transfer requests and ACK messages.
    pub const fn to_wire(self) -> u64 {
        self.0
    }

    /// Decodes a wire form. Every `u64` decodes; whether it names a live room is checked by
    /// the table on use (a forged or corrupted value gets an error, never a panic).
    pub const fn from_wire(wire: u64) -> RoomHandle {
        RoomHandle(wire)
    }
}

impl core::fmt::Debug for RoomHandle {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "RoomHandle({}@{}#{})",
            self.index(),
            self.generation(),
            self.tag()
        )
    }
}

impl core::fmt::Display for RoomHandle {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "room {} generation {}", self.index(), self.generation())
    }
}
