//! Writer ranks: a room's inline writer list, its generation-tagged pending masks, and the
//! [`Fanout`] that `abort` returns.
//!
//! # Implementation details
//!
//! Rank ids are any `u32` but `u32::MAX` (an engine numbers `(prefill instance, rank)`
//! pairs as it likes). A room has at most [`MAX_WRITERS`] writers, stored inline in its
//! slot: the list of ids (`AtomicU32`s) and two mask words of 32 *positions* each:
//!
//! ```text
//!  63                              32 31                              0
//! +----------------------------------+--------------------------------+
//! |            generation            |     pending (positions)        |
//! +----------------------------------+--------------------------------+
//! ```
//!
//! Bit `p` of word `p / 32` is set while the writer at position `p` of the list may still
//! write. `quiesce(rank)` finds the rank's position in the list and clears its bit by CAS,
//! only if the word's generation is the handle's: a late or duplicate ACK of an earlier
//! lifecycle compares against a word the next opener restamped, and fails. While a word has
//! a pending bit it owns one hold on the room word; the CAS that empties it drops the hold.
//! So per-room work (quiesce, fan-out, a fence's check) is proportional to the room's own
//! writer count, whatever the rank ids are.
//!
//! **Who writes what.** The opener, while it owns the room index and before it publishes the
//! room word: the ids, the count (tagged with the generation) and the mask words. Then only
//! `quiesce`/`fence_rank`/`quarantine` CASes clearing bits of the same generation. The ids
//! are atomics, not plain memory, because readers holding only a handle (a late ACK) may read
//! them while the next opener rewrites them; such a reader always re-validates the
//! generation afterwards (the mask CAS, or a reload of the room word), so a mixed read can
//! only make it report a stale handle, never change another lifecycle.

use crate::error::Error;
use crate::pack::Field;
use crate::sync::{AtomicU32, AtomicU64, Ordering};
use arrayvec::ArrayVec;

/// The most writer ranks one room can wait on (its fan-in).
pub const MAX_WRITERS: usize = 64;

/// Positions per mask word.
const PER_WORD: usize = 32;
const WORDS: usize = MAX_WRITERS / PER_WORD;

const PENDING: Field = Field::after(None, 32);
const GEN: Field = Field::after(Some(PENDING), 32);

/// Writer ranks a closing room still waits on (what [`abort`](crate::RoomTable::abort)
/// returns: tell each to drain and ACK). Inline, at most [`MAX_WRITERS`], no heap.
///
/// ```
/// use kvfence::{Config, RoomTable};
/// let table = RoomTable::new(Config::pool(8, 64))?;
/// let room = table.open(&[7, 1_000_042], 2)?;
/// let aborted = table.abort(room.handle)?;
/// assert_eq!(&aborted.fanout[..], &[7, 1_000_042]);
/// assert!(aborted.fanout.contains(7));
/// # Ok::<(), kvfence::Error>(())
/// ```
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Fanout(ArrayVec<u32, MAX_WRITERS>);

impl Fanout {
    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }

    /// Whether `rank` is in the fan-out.
    pub fn contains(&self, rank: u32) -> bool {
        self.0.contains(&rank)
    }

    #[inline] // inlined into kvfence-ffi (see lib.rs)
    pub(crate) fn push(&mut self, rank: u32) {
        self.0.push(rank);
    }
}

impl core::ops::Deref for Fanout {
    type Target = [u32];
    fn deref(&self) -> &[u32] {
        &self.0
    }
}

impl core::fmt::Debug for Fanout {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.0.iter()).finish()
    }
}

/// Checks a writer list: at most [`MAX_WRITERS`], no duplicates, no `u32::MAX`.
#[inline] // a local copy per crate, not a call through the GOT (see lib.rs)
pub(crate) fn check_writers(writers: &[u32]) -> Result<(), Error> {
    if writers.len() > MAX_WRITERS {
        return Err(Error::TooManyWriters {
            writers: writers.len(),
            max: MAX_WRITERS,
        });
    }
    // Ranks below 64 (every tensor-parallel group in practice) are checked against a bit
    // set; only larger ones are compared with the ranks before them.
    let mut small = 0u64;
    for (i, &rank) in writers.iter().enumerate() {
        let duplicate = if rank < 64 {
            let seen = small & (1 << rank) != 0;
            small |= 1 << rank;
            seen
        } else if rank == u32::MAX {
            return Err(Error::InvalidRank { rank });
        } else {
            writers[..i].contains(&rank)
        };
        if duplicate {
            return Err(Error::DuplicateWriter { rank });
        }
    }
    Ok(())
}

/// A mask word's decoded value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mask(u64);

impl Mask {
    pub(crate) const fn new(gen: u32, pending: u32) -> Mask {
        Mask(GEN.set(PENDING.set(0, pending as u64), gen as u64))
    }
    pub(crate) const fn gen(self) -> u32 {
        GEN.get(self.0) as u32
    }
    pub(crate) const fn pending(self) -> u32 {
        PENDING.get(self.0) as u32
    }
}

/// What clearing one position did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cleared {
    /// The bit was cleared; other positions of the word are still pending.
    Bit,
    /// The bit was cleared and the word is now empty: the caller owns the word's hold on
    /// the room word and must drop it.
    LastOfWord,
    /// The bit was already clear (a duplicate ACK): nothing changed.
    Duplicate,
}

/// The mask word belongs to another lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MaskStale;

/// One room's writers (see the module docs).
///
/// `repr(C)`, ids last: a room of n writers touches the count, the masks and the first n
/// ids, which then share the slot's first cache lines (see `Slot`).
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Writers {
    /// `generation << 32 | writer count`.
    count: AtomicU64,
    masks: [AtomicU64; WORDS],
    ids: [AtomicU32; MAX_WRITERS],
}

impl Writers {
    /// Bytes from the start of the list through its first `n` ids (the layout test of
    /// `SLOT_HOT_BYTES`).
    #[cfg(test)]
    pub(crate) fn bytes_through(&self, n: usize) -> usize {
        self.ids[..n].as_ptr_range().end as usize - self as *const Writers as usize
    }

    pub(crate) fn new() -> Writers {
        Writers {
            ids: core::array::from_fn(|_| AtomicU32::new(u32::MAX)),
            count: AtomicU64::new(0),
            masks: core::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Stamps the list for lifecycle `gen` (only the opener, before it publishes); returns
    /// the number of holds the mask words own.
    #[inline] // inlined into kvfence-ffi (see lib.rs)
    pub(crate) fn stamp(&self, gen: u32, writers: &[u32]) -> u32 {
        // The count (with the new generation) first, then the ids with `Release`: a reader
        // that sees any new id (`Acquire`) then sees the new count, and knows the list is
        // no longer the lifecycle it asked about (see `position`).
        self.count.store(
            u64::from(gen) << 32 | writers.len() as u64,
            Ordering::Relaxed,
        );
        for (slot, &rank) in self.ids.iter().zip(writers) {
            slot.store(rank, Ordering::Release);
        }
        let mut holds = 0;
        for (w, mask) in self.masks.iter().enumerate() {
            let n = writers.len().saturating_sub(w * PER_WORD).min(PER_WORD);
            let bits = if n == PER_WORD {
                u32::MAX
            } else {
                (1u32 << n) - 1
            };
            mask.store(Mask::new(gen, bits).0, Ordering::Relaxed);
            holds += u32::from(bits != 0);
        }
        holds
    }

    /// The position of `rank` in lifecycle `gen`'s list: `Ok(None)` if it is not in that
    /// list, `Err(MaskStale)` if the list is (or became, while it was read) another
    /// lifecycle's. A reader holding only a handle races the next opener's rewrite here:
    /// the opener stores the count before the ids, and the ids with `Release`, so a read
    /// that saw any id of the next lifecycle sees its count on the second load below
    /// (found by the loom model `m4_late_ack_error_kind`: without this order a late ACK
    /// could be answered `RankNotInRoom` instead of `StaleHandle`).
    #[inline] // inlined into kvfence-ffi (see lib.rs)
    pub(crate) fn position(&self, gen: u32, rank: u32) -> Result<Option<usize>, MaskStale> {
        let before = self.count.load(Ordering::Acquire);
        if (before >> 32) as u32 != gen {
            return Err(MaskStale);
        }
        let n = (before as u32 as usize).min(MAX_WRITERS);
        let found = self.ids[..n]
            .iter()
            .position(|id| id.load(Ordering::Acquire) == rank);
        if self.count.load(Ordering::Relaxed) != before {
            return Err(MaskStale);
        }
        Ok(found)
    }

    /// Clears position `pos` for lifecycle `gen`.
    pub(crate) fn clear(&self, gen: u32, pos: usize) -> Result<Cleared, MaskStale> {
        let word = &self.masks[pos / PER_WORD];
        let bit = 1u32 << (pos % PER_WORD);
        let mut cur = Mask(word.load(Ordering::Acquire));
        loop {
            if cur.gen() != gen {
                return Err(MaskStale);
            }
            if cur.pending() & bit == 0 {
                return Ok(Cleared::Duplicate);
            }
            let next = Mask::new(gen, cur.pending() & !bit);
            match word.compare_exchange_weak(cur.0, next.0, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) if next.pending() == 0 => return Ok(Cleared::LastOfWord),
                Ok(_) => return Ok(Cleared::Bit),
                Err(actual) => cur = Mask(actual),
            }
        }
    }

    /// Positions of lifecycle `gen` still pending, as `(position)` in order.
    pub(crate) fn pending_positions(&self, gen: u32) -> impl Iterator<Item = usize> + '_ {
        self.masks.iter().enumerate().flat_map(move |(w, word)| {
            let mask = Mask(word.load(Ordering::Acquire));
            let mut bits = if mask.gen() == gen { mask.pending() } else { 0 };
            core::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let b = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    w * PER_WORD + b
                })
            })
        })
    }

    /// The ranks of lifecycle `gen` still pending (the caller re-validates the generation).
    pub(crate) fn pending(&self, gen: u32) -> Fanout {
        let mut out = Fanout::default();
        self.pending_into(gen, &mut out);
        out
    }

    /// Appends the ranks of lifecycle `gen` still pending to `out`, which must be empty
    /// (the caller re-validates the generation).
    #[inline] // inlined into kvfence-ffi (see lib.rs)
    pub(crate) fn pending_into(&self, gen: u32, out: &mut Fanout) {
        for pos in self.pending_positions(gen) {
            out.push(self.ids[pos].load(Ordering::Relaxed));
        }
    }

    /// Mask words of lifecycle `gen` that still own a hold.
    #[cfg(test)]
    pub(crate) fn pending_words(&self, gen: u32) -> u32 {
        self.masks
            .iter()
            .map(|w| Mask(w.load(Ordering::Acquire)))
            .filter(|m| m.gen() == gen && m.pending() != 0)
            .count() as u32
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn stamp_counts_holds_per_nonempty_word() {
        let w = Writers::new();
        assert_eq!(w.stamp(1, &[]), 0);
        assert_eq!(w.stamp(2, &[5]), 1);
        let many: Vec<u32> = (100..164).collect();
        assert_eq!(w.stamp(3, &many), 2);
        assert_eq!(w.position(3, 163), Ok(Some(63)));
        assert_eq!(w.position(3, 99), Ok(None));
        assert_eq!(
            w.position(2, 163),
            Err(MaskStale),
            "another lifecycle's list"
        );
        assert_eq!(&w.pending(3)[..], &many[..]);
    }

    #[test]
    fn clear_checks_generation_and_reports_the_last_bit() {
        let w = Writers::new();
        let _ = w.stamp(5, &[10, 20, 30]);
        assert_eq!(w.clear(4, 0), Err(MaskStale));
        assert_eq!(w.clear(5, 0), Ok(Cleared::Bit));
        assert_eq!(w.clear(5, 0), Ok(Cleared::Duplicate));
        assert_eq!(w.clear(5, 2), Ok(Cleared::Bit));
        assert_eq!(&w.pending(5)[..], &[20]);
        assert_eq!(w.clear(5, 1), Ok(Cleared::LastOfWord));
        assert_eq!(w.pending_words(5), 0);
    }

    #[test]
    fn writer_lists_are_checked() {
        assert!(check_writers(&[1, 2, 3]).is_ok());
        assert!(check_writers(&[0, 63, 64, 1000, u32::MAX - 1]).is_ok());
        assert_eq!(
            check_writers(&[1, 2, 1]),
            Err(Error::DuplicateWriter { rank: 1 })
        );
        // Both sides of the small-rank bit set: below 64, at 64 and above.
        for dup in [0, 63, 64, 65, 1 << 20, u32::MAX - 1] {
            assert_eq!(
                check_writers(&[5, dup, 70, 2, dup]),
                Err(Error::DuplicateWriter { rank: dup }),
                "{dup}"
            );
        }
        assert_eq!(
            check_writers(&[u32::MAX]),
            Err(Error::InvalidRank { rank: u32::MAX })
        );
        let many: Vec<u32> = (0..65).collect();
        assert_eq!(
            check_writers(&many),
            Err(Error::TooManyWriters {
                writers: 65,
                max: 64
            })
        );
    }
}
