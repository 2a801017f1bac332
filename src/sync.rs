//! The one place that names synchronisation primitives.
//!
//! Every other module imports atomics, [`UnsafeCell`], `Mutex` and the futex calls from
//! here. A normal build gets `std` types and the `atomic-wait` futex; a `--cfg loom` build
//! gets loom's instrumented types, so the model checker sees every load, store, CAS, fence
//! and cell access the crate makes, and nothing slips past it through a direct `std` import.
//!
//! # Implementation details
//!
//! * [`UnsafeCell`] exposes loom's closure API (`with` / `with_mut`) on both builds, so the
//!   same code is checked for data races under loom and compiles to a plain pointer
//!   access otherwise.
//! * The futex (`futex_wait` / `futex_wake_all`) is `atomic_wait::{wait, wake_all}` on std.
//!   Under loom a sleeping thread must be a *blocked* thread (a yield-spin would let loom
//!   explore an unbounded number of schedules and would hide lost wake-ups), so it is
//!   modelled like the kernel does it: a table of `Mutex + Condvar` buckets keyed by the
//!   word's address. `wait` compares the word under the bucket lock and sleeps on the
//!   condvar; `wake_all` takes the same lock before notifying. A waker that changed the
//!   word before calling `wake_all` therefore either makes the comparison fail or finds the
//!   waiter asleep on the condvar: exactly the futex guarantee. Collisions between
//!   addresses only cause spurious wake-ups, which callers must tolerate anyway.
//! * `thread_seed` gives each thread a distinct number used to spread its bitmap scans and
//!   its statistics stripe. It is a hint only and never affects correctness; under loom it
//!   is constant so that executions are deterministic.

#[cfg(not(loom))]
mod imp {
    pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
    pub(crate) use std::sync::{Mutex, MutexGuard};
    pub(crate) use std::thread_local;

    /// `core::cell::UnsafeCell` behind loom's closure API.
    #[derive(Debug, Default)]
    pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub(crate) const fn new(value: T) -> Self {
            Self(core::cell::UnsafeCell::new(value))
        }

        /// Runs `f` with a shared pointer to the contents.
        #[inline(always)]
        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        /// Runs `f` with an exclusive pointer to the contents.
        #[inline(always)]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }

    /// Sleeps while `word == expected` (may return spuriously).
    pub(crate) fn futex_wait(word: &AtomicU32, expected: u32) {
        atomic_wait::wait(word, expected);
    }

    /// Wakes every thread sleeping in [`futex_wait`] on `word`.
    pub(crate) fn futex_wake_all(word: &AtomicU32) {
        atomic_wait::wake_all(word);
    }

    /// A per-thread number that spreads bitmap scans and statistics stripes.
    pub(crate) fn thread_seed() -> usize {
        use std::cell::Cell;
        // A plain std counter: it only hands out distinct seeds, nothing synchronises on it.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        thread_local! {
            static SEED: Cell<usize> = const { Cell::new(usize::MAX) };
        }
        SEED.with(|seed| {
            if seed.get() == usize::MAX {
                seed.set(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
            }
            seed.get()
        })
    }
}

#[cfg(loom)]
mod imp {
    pub(crate) use loom::cell::UnsafeCell;
    pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
    pub(crate) use loom::sync::{Mutex, MutexGuard};
    pub(crate) use loom::thread_local;

    use loom::sync::Condvar;

    const BUCKETS: usize = 4;

    struct Bucket {
        lock: Mutex<()>,
        cond: Condvar,
    }

    loom::lazy_static! {
        static ref FUTEX: [Bucket; BUCKETS] = core::array::from_fn(|_| Bucket {
            lock: Mutex::new(()),
            cond: Condvar::new(),
        });
    }

    fn bucket(word: &AtomicU32) -> &'static Bucket {
        let addr = word as *const AtomicU32 as usize;
        &FUTEX[(addr >> 3) % BUCKETS]
    }

    /// Sleeps while `word == expected`: compare under the bucket lock, then block.
    pub(crate) fn futex_wait(word: &AtomicU32, expected: u32) {
        let bucket = bucket(word);
        let guard = bucket.lock.lock().unwrap();
        if word.load(Ordering::SeqCst) != expected {
            return;
        }
        drop(bucket.cond.wait(guard).unwrap());
    }

    /// Wakes every sleeper of `word`'s bucket (the lock orders it after their compare).
    pub(crate) fn futex_wake_all(word: &AtomicU32) {
        let bucket = bucket(word);
        let _guard = bucket.lock.lock().unwrap();
        bucket.cond.notify_all();
    }

    /// Constant under loom: executions must be deterministic.
    pub(crate) fn thread_seed() -> usize {
        0
    }
}

pub(crate) use imp::*;

/// A tag for a new table, so that a handle from another table is recognised (8 bits:
/// distinct for the first 256 tables of a process, then best effort). A plain std counter
/// on purpose: it only hands out numbers, nothing synchronises on it; under loom it is
/// constant so that executions are deterministic.
pub(crate) fn next_table_tag() -> u8 {
    if cfg!(loom) {
        return 0;
    }
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) as u8
}

/// Pads and aligns a value to 128 bytes so that two of them never share a cache line.
///
/// 128, not 64: Intel CPUs since Sandy Bridge prefetch cache lines in adjacent pairs (the
/// "spatial prefetcher"), so two hot words 64 bytes apart still contend; Apple M-series
/// cores have 128-byte lines outright. crossbeam-utils' `CachePadded` makes the same choice
/// for the same reason.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Padded<T>(pub(crate) T);

impl<T> core::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}
