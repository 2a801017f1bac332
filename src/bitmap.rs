//! Atomic free-bitmaps: the room table's free list and the page pool.
//!
//! # Implementation details
//!
//! One bit per index, `1` = free. Claiming is a CAS that clears bits of one word (or, when a
//! batch still wants 64 or more, a `swap` that takes whatever the word has: no load, no
//! retry), freeing a `fetch_or` that sets them, so a whole batch of pages that share a word
//! moves in one atomic operation either way.
//!
//! **Page pools have a second level** (issue 42: a flat bitmap pays one locked RMW per 64
//! pages each way, a locked list two lock sections whatever the batch). Bit `w` of the
//! *summary* (one bit per word, 64 words per summary word) set means: word `w` is wholly
//! free and held by the summary, and its own (leaf) word is 0. Every index is free exactly
//! when its leaf bit or its word's summary bit is set, never both. Who moves a word
//! between the levels:
//!
//! * a claim that wants 64 or more at word `w` first takes the run of consecutive summary
//!   bits from `w` (up to what it still wants) with one CAS: up to 64 words, 4,096 pages;
//! * a claim that wants fewer at a word whose leaf is 0 takes the word's summary bit (a
//!   `fetch_and`, so of two claimers one wins) and gives the bits it does not keep to the
//!   leaf (`fetch_or`): the word moves down;
//! * a free of a whole word (64 ascending indices from a word edge: what a whole-word claim
//!   returns) sets its summary bit, one `fetch_or` per summary word for every whole word of
//!   the list: the word moves up. The freer held all 64 indices, so nobody else can have
//!   set a leaf bit of that word. Partial frees go to the leaf; a leaf filled by partial
//!   frees stays there (a whole-word claim `swap`s it, and its free moves it up).
//!
//! While a word moves down its indices are in neither level for a moment (the claimer owns
//! them all): a concurrent claim may miss them and be refused, as below; none is lost.
//! Room and token bitmaps have no summary (single claims and frees: one RMW already).
//!
//! There is no shared cursor. Each thread starts its scan at its own hint (seeded from
//! [`thread_seed`](crate::sync::thread_seed), then advanced past what it last claimed), so
//! threads claiming at the same time work in different words, and consecutive lifecycles
//! of one thread walk through the table instead of hammering its lowest free index (which
//! also spreads generation reuse over all rooms, see `handle.rs`). The summary does not
//! change which indices a claim takes: words are still visited in scan order and each
//! gives its lowest free indices (the unit tests check this against a one-level model).
//!
//! A batch claim is all-or-nothing: it scans the whole bitmap once, and if it could not
//! gather `n` bits it puts back what it took. Under contention this can refuse a claim
//! that a moment later would fit (two claimers each holding part of the last free pages);
//! it never over-claims and never loses a bit.
//!
//! Orderings: a claim's successful RMW (leaf or summary) is `Acquire` and a free is
//! `Release`, so whatever the previous owner did before freeing (the releaser's reads of a
//! room's page list) is visible to the next claimer. A word moved down is handed on by the
//! claimer's `Release` `fetch_or` into the leaf, after its own `Acquire` take of the
//! summary bit: the chain of ownership stays ordered.

use crate::error::Error;
use crate::sync::{thread_local, AtomicU64, Ordering};
use std::cell::Cell;

// Not a `const` initializer: loom's `thread_local!` does not accept that form.
#[allow(clippy::missing_const_for_thread_local)]
mod hints {
    use super::{thread_local, Cell};
    thread_local! {
    /// Per-thread scan starts, as bit positions (taken modulo each bitmap's length): one
    /// each for room tables, page pools and transfer tokens, so the scans do not drag each
    /// other. (With one shared hint, a lifecycle's two transfers moved the room hint on by
    /// two, and `open` could not tell which room the next `open` will claim.)
    pub(super) static ROOM_HINT: Cell<usize> = Cell::new(usize::MAX);
    pub(super) static PAGE_HINT: Cell<usize> = Cell::new(usize::MAX);
    pub(super) static TOKEN_HINT: Cell<usize> = Cell::new(usize::MAX);
    }
}
use hints::{PAGE_HINT, ROOM_HINT, TOKEN_HINT};

/// Which per-thread hint a bitmap uses.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    Rooms,
    Pages,
    Tokens,
}

fn with_hint<R>(kind: Kind, f: impl FnOnce(&Cell<usize>) -> R) -> R {
    match kind {
        Kind::Rooms => ROOM_HINT.with(f),
        Kind::Pages => PAGE_HINT.with(f),
        Kind::Tokens => TOKEN_HINT.with(f),
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
    /// Page pools only (empty otherwise): bit `w % 64` of `summary[w / 64]` set = word `w`
    /// is wholly free and its leaf word is 0 (see the module notes).
    summary: Box<[AtomicU64]>,
    stride: usize,
    len: usize,
    kind: Kind,
}

impl Bitmap {
    /// A bitmap of `len` indices, all free ([`Error::OutOfMemory`] if it cannot be
    /// allocated).
    pub(crate) fn try_full(len: usize, kind: Kind) -> Result<Bitmap, Error> {
        // Room and token bitmaps are small (64 per word) and every lifecycle (transfer)
        // writes its word twice (claim, free): threads working in neighbouring words would
        // share a cache line. Spacing the words 128 bytes apart gives each its own line pair
        // (see `Padded`). Page bitmaps are 64x larger for the same table and their words are
        // touched once per batch, so they stay dense: threads start `len / 2^k` bits apart.
        let stride = match kind {
            Kind::Rooms | Kind::Tokens if !cfg!(loom) => 128 / core::mem::size_of::<AtomicU64>(),
            _ => 1,
        };
        let nwords = len.div_ceil(64);
        // A page pool starts with every whole word in the summary (so the first batches are
        // claimed 64 words per RMW); a partial last word, and every word of the other kinds,
        // in its leaf.
        let two_level = matches!(kind, Kind::Pages);
        let whole_words = if two_level { len / 64 } else { 0 };
        let words = crate::error::try_boxed(nwords * stride, |i| {
            let w = i / stride;
            let live = (len - w * 64).min(64);
            let bits = if i % stride != 0 || w < whole_words {
                0
            } else if live == 64 {
                u64::MAX
            } else {
                (1u64 << live) - 1
            };
            AtomicU64::new(bits)
        })?;
        let summary_words = if two_level { nwords.div_ceil(64) } else { 0 };
        let summary = crate::error::try_boxed(summary_words, |s| {
            let live = whole_words.saturating_sub(s * 64).min(64);
            AtomicU64::new(if live == 64 {
                u64::MAX
            } else {
                (1u64 << live) - 1
            })
        })?;
        Ok(Bitmap {
            words,
            summary,
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

    /// `hint` as a bit of this bitmap. A hint is per thread and kind, shared by every
    /// bitmap of that kind, so it may lie past this one's end; usually it does not, and
    /// then this costs no division (a claim is on every lifecycle's path).
    #[inline]
    fn start_bit(&self, hint: usize) -> usize {
        if hint < self.len {
            hint
        } else {
            hint % self.len
        }
    }

    /// Words in scan order, starting with the word holding bit `start` (taken modulo the
    /// length).
    fn scan_order(&self, start: usize) -> impl Iterator<Item = usize> {
        let n = self.nwords();
        let first = self.start_bit(start) / 64;
        // `first + i < 2n`: one conditional subtraction instead of a division per word.
        (0..n).map(move |i| {
            let w = first + i;
            if w < n {
                w
            } else {
                w - n
            }
        })
    }

    /// Takes word `w` out of the summary if it is there: then all 64 of its indices are the
    /// caller's, who gives back what it does not keep with a `fetch_or` on the leaf.
    #[inline]
    fn take_whole(&self, w: usize) -> bool {
        let Some(summary) = self.summary.get(w / 64) else {
            return false; // no summary (rooms, tokens)
        };
        let bit = 1u64 << (w % 64);
        if mutant!(kvfence_racy_summary_take) {
            // MUTATION (test-only): take the bit with a load and a store instead of one RMW:
            // two claimers can both move the word down and hand out its pages twice.
            let cur = summary.load(Ordering::Relaxed);
            summary.store(cur & !bit, Ordering::Relaxed);
            return cur & bit != 0;
        }
        // The load keeps claimers that find the word already moved down off the line's
        // exclusive state; the `fetch_and` decides between two that both saw the bit.
        summary.load(Ordering::Relaxed) & bit != 0
            && summary.fetch_and(!bit, Ordering::Acquire) & bit != 0
    }

    /// Takes up to `max` consecutive words from `w` on out of the summary with one CAS (only
    /// words of `w`'s summary word); returns how many (0: word `w` is not in the summary).
    #[inline]
    fn take_run(&self, w: usize, max: usize) -> usize {
        let Some(summary) = self.summary.get(w / 64) else {
            return 0;
        };
        let shift = w % 64;
        let mut cur = summary.load(Ordering::Relaxed);
        loop {
            // Set bits from `shift` up, consecutive; the top `shift` bits of `!(cur >> shift)`
            // are ones, so this is at most `64 - shift`.
            let run = ((!(cur >> shift)).trailing_zeros() as usize).min(max);
            if run == 0 {
                return 0;
            }
            let mask = (u64::MAX >> (64 - run)) << shift;
            match summary.compare_exchange_weak(
                cur,
                cur & !mask,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return run,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Claims one free index, or `None` if there is none.
    #[inline] // a local copy per crate, not a call through the GOT (see lib.rs)
    pub(crate) fn claim_one(&self) -> Option<usize> {
        let start = self.start_bit(self.hint());
        for w in self.scan_order(start) {
            let word = self.word(w);
            let mut cur = word.load(Ordering::Relaxed);
            if cur == 0 && self.take_whole(w) {
                // The whole word is ours: keep the bit the scan would pick (the hint's in the
                // hint's word, else the lowest), give the other 63 to the leaf.
                let bit = if w == start / 64 { start % 64 } else { 0 };
                let prev = word.fetch_or(!(1u64 << bit), Ordering::Release);
                debug_assert_eq!(prev, 0, "word {w} moved down with a non-zero leaf");
                let index = w * 64 + bit;
                self.set_hint(index + 1);
                return Some(index);
            }
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
        let nwords = self.nwords();
        let first = self.start_bit(self.hint()) / 64;
        // Words in scan order: `first`, `first + 1`, ..., wrapping; `seen` counts them.
        let mut seen = 0;
        while seen < nwords && need != 0 {
            let w = if first + seen < nwords {
                first + seen
            } else {
                first + seen - nwords
            };
            let word = self.word(w);
            if need >= 64 {
                // Whole words still wanted. From the summary: the run from `w` on, in one
                // CAS, never past the words this scan has yet to visit (`nwords - seen`).
                let run = self.take_run(w, (need / 64).min(nwords - seen));
                if run != 0 {
                    let from = (w * 64) as u32;
                    out.extend(from..from + 64 * run as u32);
                    need -= 64 * run;
                    seen += run;
                    self.set_hint((w + run - 1) * 64);
                    continue;
                }
                // Else everything the leaf has is wanted: one swap takes it (no load, no
                // retry), what a CAS of `lowest_bits(cur, need) == cur` would take.
                let take = word.swap(0, Ordering::Acquire);
                if take != 0 {
                    push_bits(out, w, take);
                    need -= take.count_ones() as usize;
                    self.set_hint(w * 64);
                }
                seen += 1;
                continue;
            }
            seen += 1;
            let mut cur = word.load(Ordering::Relaxed);
            if cur == 0 && self.take_whole(w) {
                // Fewer than 64 wanted from a word in the summary: keep the lowest `need`,
                // move the rest down to the leaf.
                let take = u64::MAX >> (64 - need);
                let prev = word.fetch_or(!take, Ordering::Release);
                debug_assert_eq!(prev, 0, "word {w} moved down with a non-zero leaf");
                push_bits(out, w, take);
                need = 0;
                self.set_hint(w * 64);
                break;
            }
            while cur != 0 && need != 0 {
                let take = lowest_bits(cur, need);
                match word.compare_exchange_weak(
                    cur,
                    cur & !take,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        push_bits(out, w, take);
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

    /// Frees indices, one `fetch_or` per run of indices that share a word, and (page pools)
    /// one per summary word for all the whole words of the list.
    pub(crate) fn free_all(&self, indices: &[u32]) {
        // Whole words not yet given to the summary: (summary word, bits).
        let mut up: Option<(usize, u64)> = None;
        let mut i = 0;
        while i < indices.len() {
            let w = indices[i] as usize / 64;
            // A whole word claimed at once is stored as 64 ascending indices (see
            // `claim_many`): give it back in one step. Every entry is checked, not only the
            // last: a room's list can be several claims appended (`grow`), and
            // `[0..=31, 128..=158, 63]` starts and ends like word 0 without being it.
            if indices[i] % 64 == 0 && indices.len() - i >= 64 && is_run(&indices[i..i + 64]) {
                i += 64;
                if self.summary.is_empty() {
                    let prev = self.word(w).fetch_or(u64::MAX, Ordering::Release);
                    debug_assert_eq!(prev, 0, "double free in word {w}");
                    continue;
                }
                let (s, bit) = (w / 64, 1u64 << (w % 64));
                match up {
                    Some((at, ref mut bits)) if at == s => *bits |= bit,
                    _ => {
                        if let Some((at, bits)) = up {
                            self.free_whole(at, bits);
                        }
                        up = Some((s, bit));
                    }
                }
                continue;
            }
            // A run of consecutive indices up to the word's end (what a claim from one word
            // lists): one mask, no loop over the entries setting bits one by one.
            let off = indices[i] % 64;
            let most = (64 - off as usize).min(indices.len() - i);
            if most > 1 && is_run(&indices[i..i + most]) {
                let bits = (u64::MAX >> (64 - most)) << off;
                let prev = self.word(w).fetch_or(bits, Ordering::Release);
                debug_assert_eq!(prev & bits, 0, "double free in word {w}");
                i += most;
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
        if let Some((at, bits)) = up {
            self.free_whole(at, bits);
        }
    }

    /// Gives whole words back to summary word `at` (their leaves are 0: the freer held all
    /// their indices).
    #[inline]
    fn free_whole(&self, at: usize, bits: u64) {
        let prev = self.summary[at].fetch_or(bits, Ordering::Release);
        debug_assert_eq!(
            prev & bits,
            0,
            "double free of whole words {bits:#x} of {at}"
        );
    }

    /// Whether `index` is free (a snapshot).
    pub(crate) fn is_free(&self, index: usize) -> bool {
        let w = index / 64;
        self.word(w).load(Ordering::Relaxed) & 1 << (index % 64) != 0
            || self
                .summary
                .get(w / 64)
                .is_some_and(|s| s.load(Ordering::Relaxed) & 1 << (w % 64) != 0)
    }

    /// Number of free indices right now (exact when no claim or free is in progress).
    pub(crate) fn count_free(&self) -> usize {
        let leaves: usize = (0..self.nwords())
            .map(|w| self.word(w).load(Ordering::Relaxed).count_ones() as usize)
            .sum();
        let whole: usize = self
            .summary
            .iter()
            .map(|s| s.load(Ordering::Relaxed).count_ones() as usize)
            .sum();
        leaves + 64 * whole
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// Appends the indices of the set bits of `take` in word `w`, ascending.
#[inline]
fn push_bits(out: &mut Vec<u32>, w: usize, take: u64) {
    let base = (w * 64) as u32;
    if take == 0 {
        return;
    }
    let low = take.trailing_zeros();
    let run = take >> low;
    if run & run.wrapping_add(1) == 0 {
        // One run of consecutive bits (a whole word, or what a batch takes from a word
        // that was handed back whole): a range, no bit loop (issue 42: the loop's
        // per-index `push` was a quarter of a 16-page `claim_many`).
        out.extend(base + low..base + low + run.count_ones());
    } else {
        let mut t = take;
        while t != 0 {
            out.push(base + t.trailing_zeros());
            t &= t - 1;
        }
    }
}

/// Whether the entries are `first, first + 1, ...` (64 of them for a whole word). Every
/// entry is compared (see `free_all`), without an early exit, so the loop vectorises
/// (issue 42: the element-by-element `all` was a quarter of a 256-page lifecycle).
#[inline]
fn is_run(run: &[u32]) -> bool {
    let first = run[0];
    let mut diff = 0u32;
    for (k, &p) in run.iter().enumerate() {
        diff |= p ^ first.wrapping_add(k as u32);
    }
    diff == 0
}

/// The lowest `min(n, popcount(word))` set bits of `word`.
fn lowest_bits(word: u64, n: usize) -> u64 {
    if n >= word.count_ones() as usize {
        return word;
    }
    if n == 0 {
        return 0;
    }
    // Usually the lowest free bits are consecutive: their first `n` in two shifts.
    let low = word.trailing_zeros();
    let first_n = (u64::MAX >> (64 - n)) << low; // 0 < n < popcount <= 64 - low
    if word & first_n == first_n {
        return first_n;
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
        assert_eq!(lowest_bits(0b1011_0100, 0), 0);
        assert_eq!(
            lowest_bits(0b0011_1100, 3),
            0b0001_1100,
            "one run: the fast path"
        );
    }

    /// `lowest_bits` and `push_bits` (each with a fast path for one run of consecutive
    /// bits) against bit-by-bit references, on runs at every position, gaps and random
    /// words, for every `n`.
    #[test]
    fn lowest_bits_and_push_bits_match_bit_by_bit() {
        let reference_lowest = |word: u64, n: usize| -> u64 {
            let (mut take, mut left) = (0u64, n);
            for bit in 0..64 {
                if left > 0 && word >> bit & 1 == 1 {
                    take |= 1 << bit;
                    left -= 1;
                }
            }
            take
        };
        let mut words = vec![0, u64::MAX, 1, 1 << 63, 0b1011_0100];
        for low in [0, 1, 5, 31, 63] {
            for len in [1, 2, 16, 33, 64 - low]
                .into_iter()
                .filter(|&l| l <= 64 - low)
            {
                let run = (u64::MAX >> (64 - len)) << low;
                words.push(run);
                words.push(run & !(1u64 << (low + len / 2))); // a gap in the run
                words.push(run | 1u64 << ((low + len + 1) % 64)); // a run and a stray bit
            }
        }
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..if cfg!(miri) { 8 } else { 400 } {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            words.push(seed);
            words.push(seed & seed >> 3);
        }
        for &word in &words {
            for n in 0..=65 {
                assert_eq!(
                    lowest_bits(word, n),
                    reference_lowest(word, n),
                    "{word:#x}, n {n}"
                );
            }
            for w in [0, 3] {
                let mut out = vec![7];
                push_bits(&mut out, w, word);
                let want: Vec<u32> = std::iter::once(7)
                    .chain(
                        (0..64)
                            .filter(|b| word >> b & 1 == 1)
                            .map(|b| (w * 64 + b) as u32),
                    )
                    .collect();
                assert_eq!(out, want, "push_bits({w}, {word:#x})");
            }
        }
    }

    // Exact-contents tests against a reference model: a `Vec<bool>`, `true` = free. The
    // helpers read and write `words` directly (not through `word`/`nwords`/`count_free`), so
    // a broken accessor cannot hide behind a broken check.

    /// Pool sizes around word edges: one whole word, one word and a bit, one bit short of two
    /// words, two whole words, two words and a partial one, a partial fourth word.
    /// Pool sizes around word boundaries (two of them under Miri, whose interpreter is
    /// thousands of times slower: the edge cases stay, the repetitions go).
    const LENS: &[usize] = if cfg!(miri) {
        &[65, 130]
    } else {
        &[64, 65, 127, 128, 130, 200]
    };

    /// A bitmap of `free.len()` indices whose free set is exactly `free`.
    fn bitmap_from(free: &[bool], kind: Kind) -> Bitmap {
        let b = Bitmap::full(free.len(), kind);
        for (w, chunk) in free.chunks(64).enumerate() {
            let bits = chunk
                .iter()
                .enumerate()
                .filter(|&(_, &f)| f)
                .fold(0u64, |acc, (bit, _)| acc | 1 << bit);
            b.words[w * b.stride].store(bits, Ordering::Relaxed);
        }
        // Everything in the leaves: the summary empty (tests that want words in the summary
        // free them there, or start from `full`).
        b.summary.iter().for_each(|s| s.store(0, Ordering::Relaxed));
        b
    }

    /// Every set bit of every word, as an index (a bit at or past `len` is reported too),
    /// with the 64 indices of every word in the summary; also checks that padding words stay
    /// zero, that a word in the summary has a zero leaf and is a whole word of the bitmap,
    /// and that rooms and tokens have no summary.
    fn free_indices(b: &Bitmap) -> Vec<usize> {
        let mut free = Vec::new();
        for (i, word) in b.words.iter().enumerate() {
            let bits = word.load(Ordering::Relaxed);
            if i % b.stride != 0 {
                assert_eq!(bits, 0, "padding word {i} is not zero");
                continue;
            }
            let w = i / b.stride;
            let whole = b
                .summary
                .get(w / 64)
                .is_some_and(|s| s.load(Ordering::Relaxed) >> (w % 64) & 1 == 1);
            if whole {
                assert_eq!(
                    bits, 0,
                    "word {w} is in the summary but its leaf is {bits:#x}"
                );
                assert!(w * 64 + 64 <= b.len, "partial word {w} in the summary");
                free.extend(w * 64..w * 64 + 64);
                continue;
            }
            free.extend(
                (0..64)
                    .filter(|bit| bits >> bit & 1 == 1)
                    .map(|bit| w * 64 + bit),
            );
        }
        match b.kind {
            Kind::Pages => assert_eq!(b.summary.len(), b.len.div_ceil(64).div_ceil(64)),
            Kind::Rooms | Kind::Tokens => assert!(b.summary.is_empty(), "summary on {:?}", b.kind),
        }
        for (s, word) in b.summary.iter().enumerate() {
            let bits = word.load(Ordering::Relaxed);
            let past = (b.len / 64).saturating_sub(s * 64).min(64);
            assert_eq!(
                if past == 64 { 0 } else { bits >> past },
                0,
                "summary word {s}: a bit past the whole words"
            );
        }
        free
    }

    fn model_free(model: &[bool]) -> Vec<usize> {
        (0..model.len()).filter(|&i| model[i]).collect()
    }

    /// The bitmap holds exactly the model's free set, and `count_free` agrees.
    #[track_caller]
    fn assert_state(b: &Bitmap, model: &[bool], what: &str) {
        assert_eq!(free_indices(b), model_free(model), "{what}: free indices");
        let count = model.iter().filter(|&&f| f).count();
        assert_eq!(b.count_free(), count, "{what}: count_free");
    }

    /// What `claim_many(n)` must do with the hint at `hint`: walk the words from the hint's
    /// word (wrapping), taking the lowest free indices of each, all-or-nothing. Returns the
    /// claimed indices in claim order (`None`, state unchanged, if fewer than `n` are free)
    /// and the hint afterwards: the first index of the last word that gave indices (it moves
    /// on a failed claim too, which put those indices back), unchanged if none did.
    fn model_claim_many(free: &mut [bool], hint: usize, n: usize) -> (Option<Vec<u32>>, usize) {
        let len = free.len();
        let nwords = len.div_ceil(64);
        let first = hint % len / 64;
        let mut out = Vec::new();
        let mut new_hint = hint;
        for k in 0..nwords {
            if out.len() == n {
                break;
            }
            let w = (first + k) % nwords;
            let before = out.len();
            for (bit, &f) in free[w * 64..len.min(w * 64 + 64)].iter().enumerate() {
                if out.len() < n && f {
                    out.push((w * 64 + bit) as u32);
                }
            }
            if out.len() > before {
                new_hint = w * 64;
            }
        }
        if out.len() < n {
            return (None, new_hint);
        }
        for &i in &out {
            free[i as usize] = false;
        }
        (Some(out), new_hint)
    }

    /// What `claim_one` must return with the hint at `hint`: the lowest free index at or
    /// after the hint in the hint's word, else the lowest free index of the first word (from
    /// the hint's word, wrapping) that has one. The hint afterwards is that index + 1.
    fn model_claim_one(free: &mut [bool], hint: usize) -> Option<usize> {
        let len = free.len();
        let nwords = len.div_ceil(64);
        let start = hint % len;
        let first = start / 64;
        let word = |w: usize| w * 64..len.min(w * 64 + 64);
        let pick = (start..word(first).end).find(|&i| free[i]).or_else(|| {
            (0..nwords)
                .map(|k| word((first + k) % nwords))
                .find_map(|mut r| r.find(|&i| free[i]))
        });
        if let Some(i) = pick {
            free[i] = false;
        }
        pick
    }

    /// Free sets that put the claim fast path (a whole free word) and its neighbours at every
    /// word edge of a pool of `len`.
    fn patterns(len: usize) -> Vec<(String, Vec<bool>)> {
        let mut out = vec![
            ("all free".to_string(), vec![true; len]),
            ("all claimed".to_string(), vec![false; len]),
        ];
        for k in [1, 6, 63, 64, 70, 128] {
            if k < len {
                out.push((
                    format!("0..{k} claimed"),
                    (0..len).map(|i| i >= k).collect(),
                ));
            }
        }
        out.push((
            "every third free".to_string(),
            (0..len).map(|i| i % 3 == 0).collect(),
        ));
        out.push((
            "5, 64, 127 claimed".to_string(),
            (0..len).map(|i| ![5, 64, 127].contains(&i)).collect(),
        ));
        let last = (len - 1) / 64 * 64;
        out.push((
            "only the last word free".to_string(),
            (0..len).map(|i| i >= last).collect(),
        ));
        out
    }

    /// Hints at and around every word edge, past the end (taken modulo `len`) included.
    fn hints(len: usize) -> Vec<usize> {
        let mut h = if cfg!(miri) {
            vec![0, 63, len - 1]
        } else {
            vec![0, 5, 63, 64, 70, 127, 128, 129, len - 1, len, len + 5]
        };
        h.sort_unstable();
        h.dedup();
        h
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "edge sweep: far too slow under Miri; runs natively and under TSan"
    )]
    fn full_sets_exactly_the_first_len_bits() {
        for len in [1, 3, 63, 64, 65, 127, 128, 129, 130, 200] {
            for kind in [Kind::Pages, Kind::Rooms, Kind::Tokens] {
                let b = Bitmap::full(len, kind);
                let what = format!("full({len}, {kind:?})");
                assert_eq!(b.len(), len, "{what}");
                assert_eq!(b.nwords(), len.div_ceil(64), "{what}");
                assert_state(&b, &vec![true; len], &what);
            }
        }
    }

    #[test]
    fn free_one_sets_exactly_its_bit() {
        for &len in LENS {
            for index in [0, 1, 63, 64, 65, 126, 127, 128, 129, 199] {
                if index >= len {
                    continue;
                }
                for kind in [Kind::Pages, Kind::Rooms, Kind::Tokens] {
                    let mut model = vec![false; len];
                    let b = bitmap_from(&model, kind);
                    b.free_one(index);
                    model[index] = true;
                    assert_state(
                        &b,
                        &model,
                        &format!("len {len} {kind:?}: free_one({index})"),
                    );
                }
            }
        }
    }

    /// Ascending runs of every length around 64 and 128, starting at every word edge and
    /// ending at the pool's last (partial) word: over an all-claimed background (freeing a
    /// bit outside the run shows up) and over an all-free-but-the-run one (so the
    /// double-free assertions see any bit freed twice).
    #[test]
    #[cfg_attr(
        miri,
        ignore = "edge sweep: far too slow under Miri; runs natively and under TSan"
    )]
    fn free_all_runs_at_word_edges_match_model() {
        for &len in LENS {
            for k in [1, 2, 63, 64, 65, 127, 128, 129] {
                let mut starts = vec![0, 1, 5, 32, 62, 63, 64, 65, 70, 126, 127, 128, 129, 136];
                starts.push(len.saturating_sub(k)); // ends at the last index
                for start in starts {
                    if start + k > len {
                        continue;
                    }
                    let run: Vec<u32> = (start as u32..(start + k) as u32).collect();
                    for kind in [Kind::Pages, Kind::Rooms, Kind::Tokens] {
                        let what = format!("len {len} {kind:?}: free_all({start}..{})", start + k);
                        let mut model = vec![false; len];
                        let b = bitmap_from(&model, kind);
                        b.free_all(&run);
                        run.iter().for_each(|&i| model[i as usize] = true);
                        assert_state(&b, &model, &what);

                        let mut model = vec![true; len];
                        run.iter().for_each(|&i| model[i as usize] = false);
                        let b = bitmap_from(&model, kind);
                        b.free_all(&run);
                        assert_state(&b, &vec![true; len], &format!("{what}, rest free"));
                    }
                }
            }
        }
    }

    /// Lists shaped like `claim_many`'s output (one ascending group per word, words in scan
    /// order, so whole words sit anywhere in the list) and reversed lists, each freed over an
    /// all-claimed pool of 200.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "edge sweep: far too slow under Miri; runs natively and under TSan"
    )]
    fn free_all_mixed_order_matches_model() {
        let r = |a: u32, b: u32| (a..b).collect::<Vec<u32>>();
        let cat = |parts: &[Vec<u32>]| parts.concat();
        let cases: Vec<(&str, Vec<u32>)> = vec![
            (
                "whole word 2, then 3 and 7, then whole word 1",
                cat(&[r(128, 192), vec![3, 7], r(64, 128)]),
            ),
            (
                "wrapped run: tail word 3, then 0..56",
                cat(&[r(192, 200), r(0, 56)]),
            ),
            (
                "aligned start, 64 entries, not one word",
                cat(&[r(0, 3), r(64, 192)]),
            ),
            (
                "aligned index 64 with only 2 entries left",
                cat(&[r(1, 60), r(64, 66)]),
            ),
            ("64 entries from mid-word 0", r(5, 69)),
            ("64 entries from mid-word 1", r(70, 134)),
            ("128 entries from mid-word 0", r(6, 134)),
            ("whole words 0 and 1", r(0, 128)),
            ("whole word 1, then word 0", cat(&[r(64, 128), r(0, 64)])),
            (
                "partial word 3, whole word 0, partial word 1",
                cat(&[r(192, 200), r(0, 64), r(64, 70)]),
            ),
            ("single page 64", vec![64]),
            ("single page 0", vec![0]),
            ("single page 199", vec![199]),
            ("descending 0..200", (0..200).rev().collect()),
            ("descending 5..69", (5..69).rev().collect()),
        ];
        for (what, list) in cases {
            for kind in [Kind::Pages, Kind::Rooms, Kind::Tokens] {
                let mut model = vec![false; 200];
                let b = bitmap_from(&model, kind);
                b.free_all(&list);
                list.iter().for_each(|&i| model[i as usize] = true);
                assert_state(&b, &model, &format!("{kind:?}: {what}"));
            }
        }
    }

    /// A list whose first index is word-aligned and whose 64th is `first * 63` (here 64 and
    /// 4032) is not a whole word: only `first + 63` may take the whole-word step. The list is
    /// a real `claim_many` result: {64} of word 1, 62 indices of word 62, all of word 63.
    #[test]
    fn free_all_whole_word_needs_first_plus_63() {
        let len = 64 * 64 + 7;
        let mut free = vec![false; len];
        free[64] = true;
        (3968..4030).for_each(|i| free[i] = true);
        (4032..4096).for_each(|i| free[i] = true);
        let b = bitmap_from(&free, Kind::Pages);
        b.set_hint(64);
        let mut out = Vec::new();
        assert!(b.claim_many(127, &mut out));
        let want: Vec<u32> = [vec![64], (3968..4030).collect(), (4032..4096).collect()].concat();
        assert_eq!(out, want);
        assert_eq!(out[63], out[0] * 63);
        assert_state(&b, &vec![false; len], "after claim");
        b.free_all(&out);
        assert_state(&b, &free, "after free_all");
    }

    /// Every pattern x hint x batch size around the word edges, on both kinds: the claimed
    /// indices (order included), the result, the bitmap, the hint, and that `out`'s existing
    /// contents are kept; then freeing the batch restores the starting bitmap exactly.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "edge sweep: far too slow under Miri; runs natively and under TSan"
    )]
    fn claim_many_at_word_edges_matches_model() {
        const SENTINEL: u32 = 0xdead;
        for &len in LENS {
            for (name, free) in patterns(len) {
                let nfree = free.iter().filter(|&&f| f).count();
                let mut sizes = vec![0, 1, 2, 63, 64, 65, 127, 128, 129, nfree, nfree + 1];
                sizes.sort_unstable();
                sizes.dedup();
                for hint in hints(len) {
                    for &n in &sizes {
                        for kind in [Kind::Pages, Kind::Rooms, Kind::Tokens] {
                            let what =
                                format!("len {len} {kind:?} [{name}] hint {hint}: claim_many({n})");
                            let b = bitmap_from(&free, kind);
                            b.set_hint(hint);
                            let mut model = free.clone();
                            let (want, want_hint) = model_claim_many(&mut model, hint, n);
                            let mut out = vec![SENTINEL];
                            let ok = b.claim_many(n, &mut out);
                            assert_eq!(ok, want.is_some(), "{what}");
                            assert_eq!(out[0], SENTINEL, "{what}: existing contents");
                            assert_eq!(&out[1..], want.as_deref().unwrap_or(&[]), "{what}");
                            assert_state(&b, &model, &what);
                            assert_eq!(b.hint(), want_hint, "{what}: hint");
                            b.free_all(&out[1..]);
                            assert_state(&b, &free, &format!("{what}, freed again"));
                        }
                    }
                }
            }
        }
    }

    /// `claim_one` from every pattern and hint, repeated until the pool is empty: the index
    /// (at or after the hint in its word first), the bitmap and the advanced hint.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "edge sweep: far too slow under Miri; runs natively and under TSan"
    )]
    fn claim_one_at_word_edges_matches_model() {
        for &len in LENS {
            for (name, free) in patterns(len) {
                for hint in hints(len) {
                    for kind in [Kind::Pages, Kind::Rooms, Kind::Tokens] {
                        let b = bitmap_from(&free, kind);
                        b.set_hint(hint);
                        let mut model = free.clone();
                        let mut h = hint;
                        loop {
                            let what = format!("len {len} {kind:?} [{name}] hint {hint}, now {h}");
                            let want = model_claim_one(&mut model, h);
                            assert_eq!(b.claim_one(), want, "{what}");
                            assert_state(&b, &model, &what);
                            let Some(i) = want else { break };
                            h = i + 1;
                            assert_eq!(b.hint(), h, "{what}: hint");
                        }
                        assert_eq!(b.hint(), h, "hint unchanged by a failed claim_one");
                    }
                }
            }
        }
    }

    /// Random interleavings of every operation on one pool, against the model.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "edge sweep: far too slow under Miri; runs natively and under TSan"
    )]
    fn random_operations_match_model() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        for &len in LENS {
            let b = Bitmap::full(len, Kind::Pages);
            let mut model = vec![true; len];
            let mut held: Vec<Vec<u32>> = Vec::new();
            for step in 0..if cfg!(miri) { 100 } else { 3000 } {
                let what = format!("len {len} step {step}");
                match rand(4) {
                    0 | 1 => {
                        let hint = rand(len + 70);
                        let n = rand(len.min(140) + 1);
                        b.set_hint(hint);
                        let (want, want_hint) = model_claim_many(&mut model, hint, n);
                        let mut out = Vec::new();
                        assert_eq!(b.claim_many(n, &mut out), want.is_some(), "{what}");
                        assert_eq!(out, want.unwrap_or_default(), "{what}");
                        assert_eq!(b.hint(), want_hint, "{what}: hint");
                        held.push(out);
                    }
                    2 => {
                        let hint = rand(len + 70);
                        b.set_hint(hint);
                        let want = model_claim_one(&mut model, hint);
                        assert_eq!(b.claim_one(), want, "{what}");
                        if let Some(i) = want {
                            held.push(vec![i as u32]);
                        }
                    }
                    _ if !held.is_empty() => {
                        let batch = held.swap_remove(rand(held.len()));
                        if batch.len() == 1 && rand(2) == 0 {
                            b.free_one(batch[0] as usize);
                        } else {
                            b.free_all(&batch);
                        }
                        batch.iter().for_each(|&i| model[i as usize] = true);
                    }
                    _ => {}
                }
                assert_state(&b, &model, &what);
            }
        }
    }

    /// A thread's first hint is its seed's bits reversed, read as a fraction of the table;
    /// each kind has its own hint; a fresh thread's `hint()` is its `first_hint`.
    #[test]
    fn hints_start_at_the_reversed_seed_and_are_per_kind() {
        let threads: Vec<_> = (0..6)
            .map(|_| {
                std::thread::spawn(|| {
                    let seed = crate::sync::thread_seed();
                    // The top 20 bits of the reversed 64-bit seed are its low 20 bits reversed.
                    let want = ((seed as u32 & 0xf_ffff).reverse_bits() >> 12) as usize;
                    assert_eq!(first_hint(1 << 20), want, "seed {seed}");
                    for len in [1, 3, 130, 200, 1000] {
                        assert!(first_hint(len) < len, "seed {seed}, len {len}");
                    }
                    let pages = Bitmap::full(1000, Kind::Pages);
                    let rooms = Bitmap::full(1000, Kind::Rooms);
                    assert_eq!(pages.hint(), first_hint(1000));
                    pages.set_hint(7);
                    assert_eq!(
                        rooms.hint(),
                        first_hint(1000),
                        "room hint apart from pages'"
                    );
                    rooms.set_hint(9);
                    assert_eq!(pages.hint(), 7);
                    assert_eq!(rooms.hint(), 9);
                    let tokens = Bitmap::full(1000, Kind::Tokens);
                    assert_eq!(
                        tokens.hint(),
                        first_hint(1000),
                        "token hint apart from rooms'"
                    );
                    tokens.set_hint(11);
                    assert_eq!(rooms.hint(), 9);
                    assert_eq!(tokens.hint(), 11);
                    seed
                })
            })
            .collect();
        let mut seeds: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        seeds.sort_unstable();
        seeds.dedup();
        assert_eq!(seeds.len(), 6, "distinct seeds");
    }

    /// Regression: a room's page list may be several claims appended (`grow`). A run that
    /// starts at a word boundary and ends 63 entries later at that word's last bit, with
    /// other words' pages in between, is not a whole word.
    #[test]
    fn free_all_does_not_take_a_spliced_list_for_a_whole_word() {
        let b = Bitmap::full(256, Kind::Pages);
        let mut all = Vec::new();
        assert!(b.claim_many(256, &mut all));
        let list: Vec<u32> = (0..=31).chain(128..=158).chain([63]).collect();
        assert_eq!(list.len(), 64);
        b.free_all(&list);
        for p in 0..256u32 {
            assert_eq!(b.is_free(p as usize), list.contains(&p), "page {p}");
        }
    }
}
