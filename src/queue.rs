//! The release queue: a bitmap over room indices plus a count (see `release.rs` for how
//! it is used, and issue 18's one-pass drain).

use crate::error::try_boxed;
use crate::error::Error;
use crate::sync::{AtomicU64, AtomicUsize, Ordering};

/// Rooms whose release waits in the release queue (see the module docs).
#[derive(Debug)]
pub(crate) struct PendingSet {
    words: Box<[AtomicU64]>,
    count: AtomicUsize,
}

impl PendingSet {
    pub(crate) fn new(rooms: usize) -> Result<PendingSet, Error> {
        Ok(PendingSet {
            words: try_boxed(rooms.div_ceil(64), |_| AtomicU64::new(0))?,
            count: AtomicUsize::new(0),
        })
    }

    pub(crate) fn push(&self, index: usize) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let old = self.words[index / 64].fetch_or(1 << (index % 64), Ordering::Release);
        debug_assert_eq!(old & 1 << (index % 64), 0, "room {index} queued twice");
    }

    /// Takes one pending room index, if any.
    pub(crate) fn pop(&self) -> Option<usize> {
        if self.count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        for (w, word) in self.words.iter().enumerate() {
            let mut bits = word.load(Ordering::Relaxed);
            while bits != 0 {
                let bit = 1u64 << bits.trailing_zeros();
                if mutant!(kvfence_racy_queue_pop) {
                    // MUTATION (test-only): take the bit with a load and a store instead of
                    // one RMW: two drainers can both deliver the same release.
                    word.store(bits & !bit, Ordering::Release);
                    self.count.fetch_sub(1, Ordering::Relaxed);
                    return Some(w * 64 + bit.trailing_zeros() as usize);
                }
                if word.fetch_and(!bit, Ordering::Acquire) & bit != 0 {
                    self.count.fetch_sub(1, Ordering::Relaxed);
                    return Some(w * 64 + bit.trailing_zeros() as usize);
                }
                bits = word.load(Ordering::Relaxed);
            }
        }
        None
    }

    /// Whether room `index`'s release is in the queue (its bit is set). `Acquire`: a
    /// caller that sees the bit also sees the count's increment of the same `push`.
    pub(crate) fn contains(&self, index: usize) -> bool {
        self.words[index / 64].load(Ordering::Acquire) & 1 << (index % 64) != 0
    }

    /// Takes up to `max` pending room indices, in one pass over the words, handing each
    /// to `f`.
    ///
    /// Each word is taken with one `fetch_and` that clears only the bits this drain takes
    /// (at most the `max` still wanted, out of those a load saw set): a bit is cleared only
    /// by the drainer that delivers it, so a queued release is never out of the bitmap
    /// while it is still pending (issue 42 item 4: a `swap(0)` that put the bits past
    /// `max` back left them invisible to another drainer, and to a thread that had just
    /// been woken by their release, for a moment).
    pub(crate) fn drain(&self, max: usize, mut f: impl FnMut(usize)) -> usize {
        let pending = self.count.load(Ordering::Relaxed);
        if pending == 0 || max == 0 {
            return 0;
        }
        let mut taken = 0;
        for (w, word) in self.words.iter().enumerate() {
            let seen = word.load(Ordering::Relaxed);
            if seen == 0 {
                continue;
            }
            // The lowest `max - taken` bits of those seen.
            let mut want = seen;
            let mut left = max - taken;
            let mut rest = seen;
            while rest != 0 {
                if left == 0 {
                    want &= !rest;
                    break;
                }
                rest &= rest - 1;
                left -= 1;
            }
            // One RMW per word; a bit another drainer took meanwhile is not ours.
            let mut bits = word.fetch_and(!want, Ordering::Acquire) & want;
            let n = bits.count_ones() as usize;
            self.count.fetch_sub(n, Ordering::Relaxed);
            while bits != 0 {
                f(w * 64 + bits.trailing_zeros() as usize);
                bits &= bits - 1;
            }
            taken += n;
            // Everything pending when we began is taken (later pushes may wait for the
            // next drain), or the caller's limit is reached.
            if taken >= pending || taken == max {
                break;
            }
        }
        taken
    }

    pub(crate) fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }
}
