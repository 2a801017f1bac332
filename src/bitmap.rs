//! Atomic free-bitmaps: the room table's free list and the page pool.
//!
//! # Implementation details
//!
//! One bit per index, `1` = free. Claiming is a CAS that clears bits of one word, freeing a
//! `fetch_or` that sets them, so a whole batch of pages that share a word moves in one
//! atomic operation either way.
//!
//! There is no shared cursor. Each thread starts its scan at its own hint (seeded from
//! [`thread_seed`](crate::sync::thread_seed), then advanced past what it last claimed), so
//! threads claiming at the same time work in different words, and consecutive lifecycles
//! of one thread walk through the table instead of hammering its lowest free index (which
//! also spreads generation reuse over all rooms, see `handle.rs`).
//!
//! A batch claim is all-or-nothing: it scans the whole bitmap once, and if it could not
//! gather `n` bits it puts back what it took. Under contention this can refuse a claim
//! that a moment later would fit (two claimers each holding part of the last free pages);
//! it never over-claims and never loses a bit.
//!
//! Orderings: a claim's successful CAS is `Acquire` and a free is `Release`, so whatever
//! the previous owner did before freeing (the releaser's reads of a room's page list) is
//! visible to the next claimer.

use crate::error::Error;
use crate::sync::{thread_local, AtomicU64, Ordering};
use std::cell::Cell;

// Not a `const` initializer: loom's `thread_local!` does not accept that form.
#[allow(clippy::missing_const_for_thread_local)]
mod hints {
    use super::{thread_local, Cell};
    thread_local! {
    /// Per-thread scan starts, as bit positions (taken modulo each bitmap's length): one
    /// for room tables and one for page pools, so the two scans do not drag each other.
    pub(super) static ROOM_HINT: Cell<usize> = Cell::new(usize::MAX);
    pub(super) static PAGE_HINT: Cell<usize> = Cell::new(usize::MAX);
    }
}
use hints::{PAGE_HINT, ROOM_HINT};

/// Which per-thread hint a bitmap uses.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    Rooms,
    Pages,
}

fn with_hint<R>(kind: Kind, f: impl FnOnce(&Cell<usize>) -> R) -> R {
    match kind {
        Kind::Rooms => ROOM_HINT.with(f),
        Kind::Pages => PAGE_HINT.with(f),
    }
}

/// A thread's first scan position in a bitmap of `len` bits: its seed's bits reversed,
/// read as a fraction of the table (the van der Corput sequence). Threads 0, 1, 2, 3, ...
/// start at 0, 1/2, 1/4, 3/4, 1/8, ... of the table: the first 2^k threads are exactly
/// `len / 2^k` apart, so concurrent claimers start in different words and, advancing at
/// similar rates, stay apart.
fn first_hint(len: usize) -> usize {
    let fraction = (crate::sync::thread_seed() as u64).reverse_bits();
    ((fraction as u128 * len as u128) >> 64) as usize
}

/// A fixed-size atomic bitmap of free indices.
#[derive(Debug)]
pub(crate) struct Bitmap {
    /// Word `w` is `words[w * stride]`; the words in between are padding.
    words: Box<[AtomicU64]>,
    stride: usize,
    len: usize,
    kind: Kind,
}

impl Bitmap {
    /// A bitmap of `len` indices, all free ([`Error::OutOfMemory`] if it cannot be
    /// allocated).
    pub(crate) fn try_full(len: usize, kind: Kind) -> Result<Bitmap, Error> {
        // Room bitmaps are small (64 rooms per word) and every lifecycle writes its room's
        // word twice (claim, free): threads working in neighbouring words would share a
        // cache line. Spacing the words 128 bytes apart gives each its own line pair
        // (see `Padded`). Page bitmaps are 64x larger for the same table and their words are
        // touched once per batch, so they stay dense: threads start `len / 2^k` bits apart.
        let stride = match kind {
            Kind::Rooms if !cfg!(loom) => 128 / core::mem::size_of::<AtomicU64>(),
            _ => 1,
        };
        let nwords = len.div_ceil(64);
        let words = crate::table::try_boxed(nwords * stride, |i| {
            let w = i / stride;
            let live = (len - w * 64).min(64);
            let bits = if i % stride != 0 {
                0
            } else if live == 64 {
                u64::MAX
            } else {
                (1u64 << live) - 1
            };
            AtomicU64::new(bits)
        })?;
        Ok(Bitmap {
            words,
            stride,
            len,
            kind,
        })
    }

    /// [`try_full`](Self::try_full) for tests, where memory does not run out.
    #[cfg(test)]
    pub(crate) fn full(len: usize, kind: Kind) -> Bitmap {
        Self::try_full(len, kind).unwrap()
    }

    #[inline(always)]
    fn word(&self, w: usize) -> &AtomicU64 {
        &self.words[w * self.stride]
    }

    fn nwords(&self) -> usize {
        self.len.div_ceil(64)
    }

    fn hint(&self) -> usize {
        with_hint(self.kind, |h| {
            if h.get() == usize::MAX {
                h.set(first_hint(self.len));
            }
            h.get()
        })
    }

    fn set_hint(&self, bit: usize) {
        with_hint(self.kind, |h| h.set(bit));
    }

    /// Words in scan order, starting with the word holding bit `start`.
    fn scan_order(&self, start: usize) -> impl Iterator<Item = usize> {
        let n = self.nwords();
        let first = (start % self.len) / 64;
        (0..n).map(move |i| (first + i) % n)
    }

    /// Claims one free index, or `None` if there is none.
    pub(crate) fn claim_one(&self) -> Option<usize> {
        let start = self.hint() % self.len;
        for w in self.scan_order(start) {
            let word = self.word(w);
            let mut cur = word.load(Ordering::Relaxed);
            loop {
                if cur == 0 {
                    break;
                }
                // Prefer bits at or after the hint inside the first word, so a thread's
                // successive claims rotate through the word instead of reusing its lowest bit.
                let above = if w == start / 64 {
                    cur & (u64::MAX << (start % 64))
                } else {
                    0
                };
                let pick = if above != 0 { above } else { cur };
                let bit = pick.trailing_zeros() as usize;
                match word.compare_exchange_weak(
                    cur,
                    cur & !(1u64 << bit),
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        let index = w * 64 + bit;
                        self.set_hint(index + 1);
                        return Some(index);
                    }
                    Err(actual) => cur = actual,
                }
            }
        }
        None
    }

    /// Claims `n` free indices all-or-nothing, appending them to `out` grouped by word.
    /// Returns `false` (with `out` unchanged) if fewer than `n` could be gathered.
    pub(crate) fn claim_many(&self, n: usize, out: &mut Vec<u32>) -> bool {
        let base = out.len();
        let mut need = n;
        for w in self.scan_order(self.hint()) {
            if need == 0 {
                break;
            }
            let word = self.word(w);
            let mut cur = word.load(Ordering::Relaxed);
            while cur != 0 && need != 0 {
                let take = lowest_bits(cur, need);
                match word.compare_exchange_weak(
                    cur,
                    cur & !take,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        let base = (w * 64) as u32;
                        if take == u64::MAX {
                            out.extend(base..base + 64); // a whole word: no bit loop
                        } else {
                            let mut t = take;
                            while t != 0 {
                                out.push(base + t.trailing_zeros());
                                t &= t - 1;
                            }
                        }
                        need -= take.count_ones() as usize;
                        self.set_hint(w * 64);
                        break;
                    }
                    Err(actual) => cur = actual,
                }
            }
        }
        if need == 0 {
            return true;
        }
        self.free_all(&out[base..]);
        out.truncate(base);
        false
    }

    /// Frees one index.
    pub(crate) fn free_one(&self, index: usize) {
        let prev = self
            .word(index / 64)
            .fetch_or(1u64 << (index % 64), Ordering::Release);
        debug_assert_eq!(prev & (1u64 << (index % 64)), 0, "double free of {index}");
    }

    /// Frees indices, one `fetch_or` per run of indices that share a word.
    pub(crate) fn free_all(&self, indices: &[u32]) {
        let mut i = 0;
        while i < indices.len() {
            let w = indices[i] as usize / 64;
            // A whole word claimed at once is stored as 64 ascending indices (see
            // `claim_many`): give it back in one step.
            if indices[i] % 64 == 0 && indices.len() - i >= 64 && indices[i + 63] == indices[i] + 63
            {
                let prev = self.word(w).fetch_or(u64::MAX, Ordering::Release);
                debug_assert_eq!(prev, 0, "double free in word {w}");
                i += 64;
                continue;
            }
            let mut bits = 0u64;
            while i < indices.len() && indices[i] as usize / 64 == w {
                bits |= 1u64 << (indices[i] % 64);
                i += 1;
            }
            let prev = self.word(w).fetch_or(bits, Ordering::Release);
            debug_assert_eq!(prev & bits, 0, "double free in word {w}");
        }
    }

    /// Number of free indices right now (exact when no claim or free is in progress).
    /// Whether `index` is free (a snapshot).
    pub(crate) fn is_free(&self, index: usize) -> bool {
        self.word(index / 64).load(Ordering::Relaxed) & 1 << (index % 64) != 0
    }

    pub(crate) fn count_free(&self) -> usize {
        (0..self.nwords())
            .map(|w| self.word(w).load(Ordering::Relaxed).count_ones() as usize)
            .sum()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// The lowest `min(n, popcount(word))` set bits of `word`.
fn lowest_bits(word: u64, n: usize) -> u64 {
    if n >= word.count_ones() as usize {
        return word;
    }
    let mut take = 0;
    let mut rest = word;
    for _ in 0..n {
        take |= rest & rest.wrapping_neg();
        rest &= rest - 1;
    }
    take
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn claims_are_all_or_nothing_and_conserved() {
        let b = Bitmap::full(130, Kind::Pages);
        assert_eq!(b.count_free(), 130);
        let mut got = Vec::new();
        assert!(b.claim_many(100, &mut got));
        assert_eq!(got.len(), 100);
        let mut sorted = got.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 100);
        assert!(sorted.iter().all(|&p| p < 130));
        let mut more = Vec::new();
        assert!(!b.claim_many(31, &mut more));
        assert!(more.is_empty());
        assert_eq!(b.count_free(), 30);
        b.free_all(&got);
        assert_eq!(b.count_free(), 130);
    }

    #[test]
    fn whole_words_and_partial_words_round_trip() {
        let b = Bitmap::full(64 * 5 + 7, Kind::Pages);
        let mut first = Vec::new();
        assert!(b.claim_many(10, &mut first)); // leaves a partial word behind
        let mut big = Vec::new();
        assert!(b.claim_many(64 * 5 + 7 - 10, &mut big));
        let mut all: Vec<u32> = first.iter().chain(&big).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..64 * 5 + 7).collect::<Vec<u32>>());
        assert_eq!(b.count_free(), 0);
        b.free_all(&big);
        assert_eq!(b.count_free(), 64 * 5 + 7 - 10);
        b.free_all(&first);
        assert_eq!(b.count_free(), 64 * 5 + 7);
    }

    #[test]
    fn room_bitmap_words_are_a_line_pair_apart() {
        let b = Bitmap::full(200, Kind::Rooms);
        let gap = b.word(1) as *const AtomicU64 as usize - b.word(0) as *const AtomicU64 as usize;
        assert_eq!(gap, 128);
        assert_eq!(b.count_free(), 200);
        let mut seen: Vec<usize> = (0..200).map(|_| b.claim_one().unwrap()).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..200).collect::<Vec<_>>());
        assert_eq!(b.claim_one(), None);
    }

    #[test]
    fn claim_one_until_empty() {
        let b = Bitmap::full(3, Kind::Rooms);
        let mut seen: Vec<usize> = (0..3).map(|_| b.claim_one().unwrap()).collect();
        assert_eq!(b.claim_one(), None);
        seen.sort_unstable();
        assert_eq!(seen, [0, 1, 2]);
        b.free_one(1);
        assert_eq!(b.claim_one(), Some(1));
    }

    #[test]
    fn lowest_bits_takes_lowest() {
        assert_eq!(lowest_bits(0b1011_0100, 2), 0b0001_0100);
        assert_eq!(lowest_bits(0b1011_0100, 9), 0b1011_0100);
    }
}
