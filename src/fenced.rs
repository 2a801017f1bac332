//! The fenced-rank set, with membership reads that need no lock and are linearizable.
//!
//! # Implementation details
//!
//! See `fence.rs` ("The fenced set") for the representation and the argument.

use crate::error::try_boxed;
use crate::error::Error;
use crate::sync::{AtomicU32, Ordering};

/// The fenced ranks (see the module docs).
#[derive(Debug)]
pub(crate) struct FencedRanks {
    ids: Box<[AtomicU32]>,
    /// Entries ever used: every fenced rank is below it.
    high: AtomicU32,
    /// Ranks fenced now.
    count: AtomicU32,
}

/// An empty entry (`u32::MAX` is no rank id).
const EMPTY: u32 = u32::MAX;

impl FencedRanks {
    pub(crate) fn new(max: usize) -> Result<FencedRanks, Error> {
        Ok(FencedRanks {
            ids: try_boxed(max, |_| AtomicU32::new(EMPTY))?,
            high: AtomicU32::new(0),
            count: AtomicU32::new(0),
        })
    }

    fn entries(&self) -> impl Iterator<Item = u32> + '_ {
        let n = (self.high.load(Ordering::SeqCst) as usize).min(self.ids.len());
        self.ids[..n]
            .iter()
            .map(|id| id.load(Ordering::SeqCst))
            .filter(|&id| id != EMPTY)
    }

    pub(crate) fn contains(&self, rank: u32) -> bool {
        self.count.load(Ordering::SeqCst) != 0 && self.entries().any(|r| r == rank)
    }

    /// The first rank of `writers` that is fenced.
    #[inline] // inlined into kvfence-ffi (see lib.rs)
    pub(crate) fn first_of(&self, writers: &[u32]) -> Option<u32> {
        if self.count.load(Ordering::SeqCst) == 0 {
            return None;
        }
        writers
            .iter()
            .copied()
            .find(|&w| self.entries().any(|r| r == w))
    }

    /// Adds `rank` (under `fence_lock`). `Ok(false)` if it was fenced already.
    pub(crate) fn insert(&self, rank: u32) -> Result<bool, Error> {
        if self.entries().any(|r| r == rank) {
            return Ok(false);
        }
        let high = self.high.load(Ordering::Relaxed) as usize;
        let at = match (0..high).find(|&i| self.ids[i].load(Ordering::Relaxed) == EMPTY) {
            Some(at) => at,
            None if high == self.ids.len() => return Err(Error::TooManyFenced { max: high }),
            None => high,
        };
        self.ids[at].store(rank, Ordering::SeqCst);
        if at == high {
            self.high.store(high as u32 + 1, Ordering::SeqCst);
        }
        self.count.fetch_add(1, Ordering::SeqCst);
        Ok(true)
    }

    /// Removes `rank` (under `fence_lock`); whether it was there.
    pub(crate) fn remove(&self, rank: u32) -> bool {
        let high = self.high.load(Ordering::Relaxed) as usize;
        let Some(at) = (0..high).find(|&i| self.ids[i].load(Ordering::Relaxed) == rank) else {
            return false;
        };
        if mutant!(kvfence_moving_fenced_set) {
            // MUTATION (test-only): the pre-fix removal, which moved the last entry into
            // the removed one's place, so the next insert reused the last place.
            let last = (0..high)
                .rev()
                .find(|&i| self.ids[i].load(Ordering::Relaxed) != EMPTY)
                .unwrap_or(at);
            let moved = self.ids[last].load(Ordering::Relaxed);
            self.ids[at].store(moved, Ordering::SeqCst);
            self.ids[last].store(EMPTY, Ordering::SeqCst);
        } else {
            self.ids[at].store(EMPTY, Ordering::SeqCst);
        }
        self.count.fetch_sub(1, Ordering::SeqCst);
        true
    }

    /// The fenced ranks, sorted; `fallible`: memory running out is
    /// [`Error::OutOfMemory`] instead of an abort.
    pub(crate) fn try_list(&self, fallible: bool) -> Result<Vec<u32>, Error> {
        let n = (self.high.load(Ordering::SeqCst) as usize).min(self.ids.len());
        let mut v: Vec<u32> = Vec::new();
        if fallible && v.try_reserve_exact(n).is_err() {
            return Err(Error::OutOfMemory {
                bytes: n.saturating_mul(core::mem::size_of::<u32>()),
            });
        }
        // At most `n` entries: no growth past the reservation.
        v.extend(self.entries().take(n));
        v.sort_unstable();
        v.dedup();
        Ok(v)
    }
}
