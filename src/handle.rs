//! Generation-tagged, table-keyed room handles and their 16-byte wire form.
//!
//! # Implementation details
//!
//! ```text
//!  127                          64 63               32 31                0
//! +-------------------------------+-------------------+-------------------+
//! |   check = mix(key ^ low 64)   |    room index     |    generation     |
//! +-------------------------------+-------------------+-------------------+
//! ```
//!
//! A handle names one *lifecycle* of one room: the index says which room, the generation
//! which lifecycle. The check ties both to the [`RoomTable`](crate::RoomTable) that made the
//! handle: every table draws a random, non-zero 64-bit key at construction, and
//! `check = mix(key ^ (index << 32 | generation))`, where `mix` is the 64-bit finaliser of
//! MurmurHash3 (`fmix64`: two multiplications and three xor-shifts). Every call that takes a
//! handle recomputes the check first and refuses a mismatch with
//! [`Error::InvalidHandle`](crate::Error::InvalidHandle).
//!
//! **What the check catches, and how surely.** `mix` is a bijection of `u64`, so for one
//! key distinct `(index, generation)` pairs have distinct checks:
//! * a handle whose index or generation bits were corrupted (any number of bits, as long
//!   as the check half is intact) is refused *always*: it now names a pair whose check is
//!   a different value;
//! * a handle made by another table (another process: a decode and a prefill process each
//!   make tables) is refused *always* unless the two random keys are equal (`2^-64`);
//! * the all-zero wire value is refused always (`mix(0) = 0`, and the key is never 0, so
//!   the check of `(0, 0)` is never 0);
//! * a value with corrupted check bits, or an arbitrary value, is accepted only if its 64
//!   check bits happen to equal the right one: `2^-64` for a random value.
//!
//! This is integrity against accidents (zero-filled fields, bit flips, misrouted messages,
//! handles of a restarted process), not authentication: `mix` is not a cryptographic MAC,
//! and a party that reads handles off the wire can recover the key. Handles travel between
//! the processes of one serving cluster; authenticating them is the transport's job.
//!
//! **ABA bound (generations are 32-bit).** A stale handle (an earlier lifecycle of the same
//! room, with a valid check) is refused because its generation differs from the room's. It
//! is accepted again, as the live lifecycle's, if the room went through exactly 2^32
//! lifecycles (or a multiple) while the stale handle was kept: the generation wraps. How
//! fast one room's generation moves depends on how full the table is: claims rotate
//! through the free room indices (see `bitmap.rs`), so with most rooms free one room
//! advances about once per `rooms` opens of the table; in a nearly full table the few free
//! indices take every open, and one room can advance once per open.
//!
//! Measured (issue 42, item 6): the fastest one room can advance is one thread cycling a
//! 1-room table, open + finish back to back: 107.5 ns per lifecycle in gate mode
//! (`open_gate` + `finish`), 206 ns in pool mode (`open` of 1 page + `finish`), on the
//! project's 2-core box (Intel Xeon, 2 vCPUs) at load average 8-9 from other work (best of
//! five 0.4 s timed loops). So **2^32 lifecycles of one room take at least 7.7 minutes**
//! (gate; 14.7 minutes in pool mode): a handle kept that long by a table cycling one room
//! flat out can be accepted again. With rotation over a 1024-room table the same rate
//! wraps a room after 1024 times as long (about 5.5 days); at a realistic serving rate
//! (10^3 opens/s) even the worst case is 2^32 / 10^3 s, about 50 days.
//!
//! A [`TransferToken`](crate::TransferToken) has the same form and the same bound per
//! token slot: each `end` advances its slot's 32-bit generation. Cycling one slot
//! (`begin` + `end` on a 1-slot table, same box, measured while this box also ran two of
//! the project's test suites, load 6-9) took 110.6 ns, so **2^32 cycles of one token slot
//! take about 8 minutes** (less on an idle core). A stale token is one already ended:
//! ending it again after exactly 2^32 `begin`/`end` cycles of its slot would end the live
//! transfer there.
//!
//! kvfence relies on no handle or token outliving that bound: a transfer intent, ACK or
//! token is used within a transfer's lifetime (seconds), and a stale one is expected only
//! from a late or duplicate message of that time scale. An integrator that stores handles
//! for longer (minutes, under a table cycled at full speed) must drop them instead.

/// The largest room table (room indices must fit the handle's index field; the bound
/// comes from the room bitmap and page indices, not from the 32-bit field).
pub const MAX_ROOMS: usize = 1 << 24;

/// Names one lifecycle of one room of one table. `Copy`, 16 bytes; send it to the other
/// side as [`to_wire`](Self::to_wire) (a `u128`) or [`to_bytes`](Self::to_bytes).
///
/// ```
/// use kvfence::{RoomTable, Config, Error};
/// let table = RoomTable::new(Config::pool(4, 16))?;
/// let room = table.open(&[0, 1], 2)?;
/// let wire: u128 = room.handle.to_wire();           // goes into the transfer request
/// let back = kvfence::RoomHandle::from_wire(wire);  // comes back in the ACK
/// assert_eq!(back, room.handle);
/// // A corrupted or zero-filled field is refused, never mistaken for another room:
/// let flipped = kvfence::RoomHandle::from_wire(wire ^ (1 << 40));
/// assert_eq!(table.quiesce(flipped, 0), Err(Error::InvalidHandle));
/// assert_eq!(table.quiesce(kvfence::RoomHandle::from_wire(0), 0), Err(Error::InvalidHandle));
/// # Ok::<(), kvfence::Error>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RoomHandle {
    /// `index << 32 | generation`.
    low: u64,
    /// `mix(key ^ low)` for the key of the table that made the handle.
    check: u64,
}

/// The table-side key: random, non-zero, one per table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HandleKey(u64);

impl HandleKey {
    /// A fresh random key (constant under loom and shuttle, where executions must be
    /// deterministic).
    pub(crate) fn random() -> HandleKey {
        if cfg!(loom) || cfg!(shuttle) {
            return HandleKey(0x6b76_6665_6e63_6521);
        }
        use std::hash::{BuildHasher, Hash, Hasher};
        // std's `RandomState` is seeded from the operating system's random source once per
        // thread and advanced on every `new()`; hashing a process-wide counter, the clock
        // and the process id on top makes two tables' keys independent even across a fork.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .hash(&mut hasher);
        std::process::id().hash(&mut hasher);
        // (Miri's isolation has no wall clock; its RandomState is seeded all the same.)
        if !cfg!(miri) {
            std::time::SystemTime::now().hash(&mut hasher);
        }
        HandleKey(hasher.finish() | 1)
    }

    /// An independent key for another kind of integer handle (transfer tokens), so that a
    /// room handle is never accepted as a token or the other way round.
    pub(crate) fn derive(self, salt: u64) -> HandleKey {
        HandleKey(mix(self.0 ^ mix(salt)) | 1)
    }

    /// The handle of lifecycle `gen` of room `index` under this key.
    #[inline]
    pub(crate) fn handle(self, index: usize, gen: u32) -> RoomHandle {
        let low = (index as u64) << 32 | u64::from(gen);
        RoomHandle {
            low,
            check: mix(self.0 ^ low),
        }
    }

    /// Whether this key made `handle` (see the module docs for what that proves).
    #[inline]
    pub(crate) fn made(self, handle: RoomHandle) -> bool {
        mix(self.0 ^ handle.low) == handle.check
    }
}

/// MurmurHash3's 64-bit finaliser: a bijection of `u64` with full avalanche.
#[inline(always)]
const fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

impl RoomHandle {
    /// `index << 32 | generation` (the part the key does not cover).
    pub(crate) const fn low(self) -> u64 {
        self.low
    }

    /// The room's index in its table.
    pub const fn index(self) -> usize {
        (self.low >> 32) as usize
    }

    /// The lifecycle this handle belongs to.
    pub const fn generation(self) -> u32 {
        self.low as u32
    }

    /// The wire form: 16 bytes to carry in transfer requests and ACK messages (a Python
    /// `int`, two `u64` fields, or [`to_bytes`](Self::to_bytes)).
    pub const fn to_wire(self) -> u128 {
        (self.check as u128) << 64 | self.low as u128
    }

    /// Decodes a wire form. Every `u128` decodes; whether it names a live room of the table
    /// it is used with is checked by that table on use (a forged, corrupted, zero or
    /// foreign value gets an error, never a panic and never another room).
    pub const fn from_wire(wire: u128) -> RoomHandle {
        RoomHandle {
            low: wire as u64,
            check: (wire >> 64) as u64,
        }
    }

    /// The wire form as 16 little-endian bytes.
    pub const fn to_bytes(self) -> [u8; 16] {
        self.to_wire().to_le_bytes()
    }

    /// Decodes [`to_bytes`](Self::to_bytes) (every 16-byte value decodes; see
    /// [`from_wire`](Self::from_wire)).
    pub const fn from_bytes(bytes: [u8; 16]) -> RoomHandle {
        RoomHandle::from_wire(u128::from_le_bytes(bytes))
    }
}

impl core::fmt::Debug for RoomHandle {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "RoomHandle({}@{}#{:04x})",
            self.index(),
            self.generation(),
            self.check >> 48
        )
    }
}

impl core::fmt::Display for RoomHandle {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "room {} generation {}", self.index(), self.generation())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn mix_is_a_bijection_on_samples_and_fixes_zero() {
        assert_eq!(mix(0), 0);
        let mut seen = std::collections::HashSet::new();
        for i in 0..if cfg!(miri) { 2_000u64 } else { 100_000 } {
            assert!(seen.insert(mix(i.wrapping_mul(0x9e37_79b9_7f4a_7c15))));
        }
    }

    #[test]
    fn keys_differ_and_are_never_zero() {
        let keys: std::collections::HashSet<_> = (0..1000).map(|_| HandleKey::random().0).collect();
        assert_eq!(keys.len(), 1000);
        assert!(!keys.contains(&0));
    }

    #[test]
    fn wire_and_bytes_round_trip() {
        let key = HandleKey::random();
        let h = key.handle(12345, 0xdead_beef);
        assert_eq!((h.index(), h.generation()), (12345, 0xdead_beef));
        assert_eq!(RoomHandle::from_wire(h.to_wire()), h);
        assert_eq!(RoomHandle::from_bytes(h.to_bytes()), h);
        assert!(key.made(h));
        assert!(!key.made(RoomHandle::from_wire(0)));
        assert!(!HandleKey::random().made(h));
    }
}
