//! Writer ranks: the public [`RankSet`] and the per-room, generation-tagged mask words.
//!
//! # Implementation details
//!
//! A room's writer set is split into mask words of 16 ranks each:
//!
//! ```text
//!  63                              32 31            16 15             0
//! +----------------------------------+----------------+----------------+
//! |            generation            |    original    |    pending     |
//! +----------------------------------+----------------+----------------+
//! ```
//!
//! * `original` is the word's part of the set the room was opened with (never changes
//!   during a lifecycle): it tells "not in this room's set" (an error) apart from "already
//!   quiesced" (a duplicate, harmless).
//! * `pending` is the ranks that may still write. `quiesce` clears one bit by CAS, and only
//!   if the word's generation equals the handle's: a late or duplicate ACK from an earlier
//!   lifecycle compares against a word the opener has since restamped, and fails.
//! * While `pending != 0` the word owns one hold on the room word. The thread whose CAS
//!   empties `pending` drops that hold, which may release the room. So the room word's
//!   `holds == 0` means "no transfer in flight *and* every writer quiesced", read in one load.
//!
//! 16 ranks per word, not 32, so that `original` and `pending` share the word with a full
//! 32-bit generation and are read and changed in one CAS; a room with [`MAX_RANKS`] ranks
//! has 16 words and so at most 16 holds from writers.
//!
//! Who writes a mask word: the opener (plain `Relaxed` stores before the `Release` that
//! publishes the room word, while it owns the room index), then only `quiesce` CASes
//! that clear `pending` bits of the same generation.

use crate::error::Error;
use crate::pack::Field;
use crate::sync::{AtomicU64, Ordering};

/// The most writer ranks a table supports (rank ids `0..MAX_RANKS`).
pub const MAX_RANKS: usize = 256;

/// Ranks per mask word.
pub(crate) const RANKS_PER_WORD: usize = 16;

const PENDING: Field = Field::after(None, 16);
const ORIGINAL: Field = Field::after(Some(PENDING), 16);
const GEN: Field = Field::after(Some(ORIGINAL), 32);

/// A set of writer ranks (`0..MAX_RANKS`), as a fixed 256-bit set: `Copy`, 32 bytes, no
/// heap. It is both what [`open`](crate::RoomTable::open) takes and the fan-out that
/// [`abort`](crate::RoomTable::abort) returns.
///
/// ```
/// use kvfence::RankSet;
/// let mut set = RankSet::first(4)?;        // ranks 0, 1, 2, 3
/// set.insert(200)?;
/// assert!(set.contains(200) && set.len() == 5);
/// assert!(set.insert(256).is_err());        // out of range: an error, not a panic
/// assert_eq!(set.iter().collect::<Vec<_>>(), [0, 1, 2, 3, 200]);
/// # Ok::<(), kvfence::Error>(())
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct RankSet {
    bits: [u64; MAX_RANKS / 64],
}

impl RankSet {
    /// The empty set.
    pub const fn new() -> RankSet {
        RankSet {
            bits: [0; MAX_RANKS / 64],
        }
    }

    /// Ranks `0..n`.
    ///
    /// # Errors
    /// [`Error::RankOutOfRange`] if `n > MAX_RANKS`.
    pub fn first(n: usize) -> Result<RankSet, Error> {
        let mut set = RankSet::new();
        for rank in 0..n {
            set.insert(u32::try_from(rank).unwrap_or(u32::MAX))?;
        }
        Ok(set)
    }

    /// The set of the given ranks.
    ///
    /// # Errors
    /// [`Error::RankOutOfRange`] for the first rank `>= MAX_RANKS`.
    pub fn from_ranks(ranks: impl IntoIterator<Item = u32>) -> Result<RankSet, Error> {
        let mut set = RankSet::new();
        for rank in ranks {
            set.insert(rank)?;
        }
        Ok(set)
    }

    /// Adds `rank`; returns whether it was new.
    ///
    /// # Errors
    /// [`Error::RankOutOfRange`] if `rank >= MAX_RANKS`.
    pub fn insert(&mut self, rank: u32) -> Result<bool, Error> {
        let (word, bit) = locate(rank)?;
        let new = self.bits[word] & bit == 0;
        self.bits[word] |= bit;
        Ok(new)
    }

    /// Removes `rank`; returns whether it was present (out-of-range ranks never are).
    pub fn remove(&mut self, rank: u32) -> bool {
        match locate(rank) {
            Ok((word, bit)) => {
                let had = self.bits[word] & bit != 0;
                self.bits[word] &= !bit;
                had
            }
            Err(_) => false,
        }
    }

    /// Whether `rank` is in the set.
    pub fn contains(&self, rank: u32) -> bool {
        locate(rank).is_ok_and(|(word, bit)| self.bits[word] & bit != 0)
    }

    /// Number of ranks in the set.
    pub fn len(&self) -> usize {
        self.bits.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|&w| w == 0)
    }

    /// The highest rank in the set.
    pub fn max(&self) -> Option<u32> {
        self.iter().last()
    }

    /// Ranks in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.bits.iter().enumerate().flat_map(|(i, &word)| {
            let mut w = word;
            core::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let bit = w.trailing_zeros();
                w &= w - 1;
                Some(i as u32 * 64 + bit)
            })
        })
    }

    /// The set whose 64-rank words are `words` (rank `64*i + b` is bit `b` of `words[i]`).
    pub(crate) const fn from_words(words: [u64; MAX_RANKS / 64]) -> RankSet {
        RankSet { bits: words }
    }

    /// The 16-rank chunk `index` (ranks `16*index .. 16*index+16`), as stored in a mask word.
    pub(crate) fn chunk(&self, index: usize) -> u16 {
        let bit = index * RANKS_PER_WORD;
        (self.bits[bit / 64] >> (bit % 64)) as u16
    }

    /// ORs a mask word's 16-rank chunk `index` into the set.
    pub(crate) fn add_chunk(&mut self, index: usize, chunk: u16) {
        let bit = index * RANKS_PER_WORD;
        self.bits[bit / 64] |= (chunk as u64) << (bit % 64);
    }

    /// The ranks in both sets.
    pub fn intersection(&self, other: &RankSet) -> RankSet {
        let mut out = *self;
        for (a, b) in out.bits.iter_mut().zip(other.bits) {
            *a &= b;
        }
        out
    }
}

impl core::fmt::Debug for RankSet {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

fn locate(rank: u32) -> Result<(usize, u64), Error> {
    let r = rank as usize;
    if r >= MAX_RANKS {
        return Err(Error::RankOutOfRange {
            rank,
            max: MAX_RANKS as u32,
        });
    }
    Ok((r / 64, 1u64 << (r % 64)))
}

/// A mask word's decoded value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mask(u64);

impl Mask {
    pub(crate) const fn new(gen: u32, ranks: u16) -> Mask {
        Mask(GEN.set(
            ORIGINAL.set(PENDING.set(0, ranks as u64), ranks as u64),
            gen as u64,
        ))
    }
    pub(crate) const fn gen(self) -> u32 {
        GEN.get(self.0) as u32
    }
    pub(crate) const fn pending(self) -> u16 {
        PENDING.get(self.0) as u16
    }
    pub(crate) const fn original(self) -> u16 {
        ORIGINAL.get(self.0) as u16
    }
}

/// What one `quiesce` did to its mask word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cleared {
    /// The bit was cleared; other ranks of the word are still pending.
    Bit,
    /// The bit was cleared and the word is now empty: the caller owns the word's hold on
    /// the room word and must drop it.
    LastOfWord,
    /// The bit was already clear (a duplicate ACK): nothing changed.
    Duplicate,
}

/// Why a mask word refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MaskRefusal {
    /// The word belongs to another lifecycle.
    Stale,
    /// The rank is not in the room's original writer set.
    NotInRoom,
}

/// One generation-tagged mask word.
#[derive(Debug)]
pub(crate) struct MaskWord(AtomicU64);

impl MaskWord {
    pub(crate) fn new() -> MaskWord {
        MaskWord(AtomicU64::new(Mask::new(0, 0).0))
    }

    pub(crate) fn load(&self, order: Ordering) -> Mask {
        Mask(self.0.load(order))
    }

    /// Stamps the word for a new lifecycle. Only the opener, before publishing.
    pub(crate) fn stamp(&self, gen: u32, ranks: u16) {
        self.0.store(Mask::new(gen, ranks).0, Ordering::Relaxed);
    }

    /// Clears `bit` (a one-bit `u16`) for lifecycle `gen`.
    pub(crate) fn clear(&self, gen: u32, bit: u16) -> Result<Cleared, MaskRefusal> {
        let mut cur = self.load(Ordering::Acquire);
        loop {
            if cur.gen() != gen {
                return Err(MaskRefusal::Stale);
            }
            if cur.original() & bit == 0 {
                return Err(MaskRefusal::NotInRoom);
            }
            if cur.pending() & bit == 0 {
                return Ok(Cleared::Duplicate);
            }
            let next = Mask(PENDING.set(cur.0, (cur.pending() & !bit) as u64));
            match self
                .0
                .compare_exchange_weak(cur.0, next.0, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) if next.pending() == 0 => return Ok(Cleared::LastOfWord),
                Ok(_) => return Ok(Cleared::Bit),
                Err(actual) => cur = Mask(actual),
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn chunks_round_trip() {
        let set = RankSet::from_ranks([0, 15, 16, 63, 64, 255]).unwrap();
        let mut back = RankSet::new();
        for i in 0..MAX_RANKS / RANKS_PER_WORD {
            back.add_chunk(i, set.chunk(i));
        }
        assert_eq!(back, set);
        assert_eq!(set.chunk(0), 0x8001);
        assert_eq!(set.chunk(15), 0x8000);
    }

    #[test]
    fn mask_word_checks_generation_and_membership() {
        let w = MaskWord::new();
        w.stamp(5, 0b101);
        assert_eq!(w.clear(4, 0b1), Err(MaskRefusal::Stale));
        assert_eq!(w.clear(5, 0b10), Err(MaskRefusal::NotInRoom));
        assert_eq!(w.clear(5, 0b1), Ok(Cleared::Bit));
        assert_eq!(w.clear(5, 0b1), Ok(Cleared::Duplicate));
        assert_eq!(w.clear(5, 0b100), Ok(Cleared::LastOfWord));
        assert_eq!(w.load(Ordering::Relaxed).original(), 0b101);
    }
}
