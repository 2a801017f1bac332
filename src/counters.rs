//! Striped event counters (releases, stale refusals, duplicate ACKs, failures,
//! quarantines): what `stats` sums.
//!
//! # Implementation details
//!
//! Counters that the hot path bumps are striped: each thread adds to the stripe picked by
//! its [`thread_seed`](crate::sync::thread_seed), each stripe on its own 128-byte line, and a
//! read sums the stripes. A single global counter bumped on every release would put one
//! cache line on every lifecycle of every thread and serialise them (`docs/DESIGN.md`
//! section 4; measured: 16 threads slower than 1).

use crate::sync::{AtomicU64, Ordering, Padded};

#[cfg(not(loom))]
const STRIPES: usize = 32;
#[cfg(loom)]
const STRIPES: usize = 2;

/// Which counter to bump.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Event {
    Release = 0,
    Stale = 1,
    Duplicate = 2,
    FailedTransfer = 3,
    QuarantinedRoom = 4,
    QuarantinedPages = 5,
}
const EVENTS: usize = 6;

/// Per-thread striped event counters.
#[derive(Debug)]
pub(crate) struct Counters {
    stripes: Box<[Padded<[AtomicU64; EVENTS]>]>,
}

impl Counters {
    pub(crate) fn new() -> Counters {
        Counters {
            stripes: (0..STRIPES)
                .map(|_| Padded(core::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }

    #[inline]
    pub(crate) fn bump(&self, event: Event) {
        self.add(event, 1);
    }

    #[inline]
    pub(crate) fn add(&self, event: Event, n: u64) {
        let stripe = &self.stripes[crate::sync::thread_seed() % STRIPES];
        stripe.0[event as usize].fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn sum(&self, event: Event) -> u64 {
        self.stripes
            .iter()
            .map(|s| s.0[event as usize].load(Ordering::Relaxed))
            .sum()
    }
}
