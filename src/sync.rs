//! The one place that names synchronisation primitives.
//!
//! Every other module imports atomics, [`UnsafeCell`], `Mutex` and `Condvar` from here. A
//! normal build gets `std` types; a `--cfg loom` build gets loom's instrumented types, so
//! the model checker sees every load, store, CAS, fence, lock and cell access the crate
//! makes, and nothing slips past it through a direct `std` import. A `--cfg shuttle` build
//! gets [shuttle](https://docs.rs/shuttle)'s types (`shuttle-tests/`): every atomic
//! operation, lock and condition-variable wait is a point where shuttle's random or PCT
//! scheduler may switch threads. `loom` and `shuttle` are exclusive.
//!
//! # Implementation details
//!
//! * [`UnsafeCell`] exposes loom's closure API (`with` / `with_mut`) on both builds, so the
//!   same code is checked for data races under loom and compiles to a plain pointer
//!   access otherwise.
//! * Waiting parks on a `Mutex` + `Condvar` per room (see `wait.rs`); [`cond_wait`]
//!   takes an optional timeout, which is real on std and ignored under loom (loom has no
//!   clock: a wait that could time out is checked as one that never does).
//! * `thread_seed` gives each thread a distinct number used to spread its bitmap scans and
//!   its statistics stripe. It is a hint only and never affects correctness; under loom and
//!   shuttle it is constant so that executions are deterministic (a failing shuttle
//!   schedule must replay to the same failure).
//! * Under shuttle: every atomic operation is executed (and scheduled) as `SeqCst`
//!   whatever its `Ordering` (shuttle does not model weak memory: that is loom's job), and
//!   `fence` is shuttle's, a no-op in that sequentially consistent model (it only rejects
//!   `Relaxed`, as std does). shuttle has no checked cell, so [`UnsafeCell`] is the std
//!   wrapper below (data races on it are not detected; loom checks them). shuttle has no
//!   clock either: [`cond_wait`] ignores the timeout, as under loom.

#[cfg(all(loom, shuttle))]
compile_error!("`--cfg loom` and `--cfg shuttle` are exclusive: build one backend at a time");

#[cfg(not(any(loom, shuttle)))]
mod imp {
    pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};
    pub(crate) use std::thread_local;

    pub(crate) use super::std_cell::UnsafeCell;

    /// Waits on `cond` (releasing `guard`) until notified, spuriously, or after `timeout`.
    pub(crate) fn cond_wait<'a>(
        cond: &Condvar,
        guard: MutexGuard<'a, ()>,
        timeout: Option<std::time::Duration>,
    ) -> MutexGuard<'a, ()> {
        let woken = match timeout {
            None => cond.wait(guard).map_err(|e| e.into_inner()),
            Some(t) => cond
                .wait_timeout(guard, t)
                .map(|(g, _)| g)
                .map_err(|e| e.into_inner().0),
        };
        // A poisoned lock guards no data (`Mutex<()>`): carry on.
        woken.unwrap_or_else(|guard| guard)
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
    pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub(crate) use loom::sync::{Mutex, MutexGuard};
    pub(crate) use loom::thread_local;

    pub(crate) use loom::sync::Condvar;

    /// Waits on `cond` until notified; the timeout is ignored (loom has no clock).
    pub(crate) fn cond_wait<'a>(
        cond: &Condvar,
        guard: MutexGuard<'a, ()>,
        _timeout: Option<std::time::Duration>,
    ) -> MutexGuard<'a, ()> {
        cond.wait(guard).unwrap()
    }

    /// Constant under loom: executions must be deterministic.
    pub(crate) fn thread_seed() -> usize {
        0
    }
}

#[cfg(all(shuttle, not(loom)))]
mod imp {
    // shuttle 0.9 exports all five (its `fence` is a no-op: every atomic is SeqCst there).
    pub(crate) use shuttle::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub(crate) use shuttle::sync::{Condvar, Mutex, MutexGuard};
    pub(crate) use shuttle::thread_local;

    // shuttle has no instrumented cell: the plain wrapper (accesses are not race-checked).
    pub(crate) use super::std_cell::UnsafeCell;

    /// Waits on `cond` until notified; the timeout is ignored (shuttle has no clock, and its
    /// own `wait_timeout` never times out): a wait that could time out is explored as one
    /// that never does, the stricter case for lost wake-ups.
    pub(crate) fn cond_wait<'a>(
        cond: &Condvar,
        guard: MutexGuard<'a, ()>,
        _timeout: Option<std::time::Duration>,
    ) -> MutexGuard<'a, ()> {
        // A poisoned lock guards no data (`Mutex<()>`): carry on.
        cond.wait(guard).unwrap_or_else(|e| e.into_inner())
    }

    /// Constant under shuttle: executions must be deterministic, so that a failing schedule
    /// replays (`shuttle::replay`) to the same failure.
    pub(crate) fn thread_seed() -> usize {
        0
    }
}

/// `core::cell::UnsafeCell` behind loom's closure API (the std and shuttle backends).
#[cfg(not(loom))]
mod std_cell {
    #[derive(Debug, Default)]
    pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub(crate) const fn new(value: T) -> Self {
            Self(core::cell::UnsafeCell::new(value))
        }

        /// Runs `f` with a shared pointer to the contents.
        #[inline(always)]
        #[allow(dead_code)] // loom's API has it; the crate currently only needs `with_mut`
        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        /// Runs `f` with an exclusive pointer to the contents.
        #[inline(always)]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }
}

pub(crate) use imp::*;

/// Asks the CPU to bring the cache lines of the first `bytes` bytes at `p` into its caches
/// ahead of use. Only a hint: it reads nothing architecturally and never faults. A no-op off
/// x86_64 and in the model-checking and Miri builds.
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T, bytes: usize) {
    #[cfg(all(target_arch = "x86_64", not(any(loom, shuttle, miri))))]
    {
        let base = p.cast::<i8>();
        let mut offset = 0;
        while offset < bytes {
            // SAFETY: PREFETCHT0 is a hint that never faults, whatever the address, and
            // changes no architectural state; SSE is part of the x86_64 baseline. The
            // address is computed with `wrapping_add`, so no pointer arithmetic rule applies.
            unsafe {
                core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                    base.wrapping_add(offset),
                )
            };
            offset += 64;
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(any(loom, shuttle, miri)))))]
    let _ = (p, bytes);
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

/// Locks a mutex whose data a panic cannot leave inconsistent (a `push`, a `retain`, or no
/// data at all), so poisoning is ignored.
pub(crate) fn lock<T>(mutex: &imp::Mutex<T>) -> imp::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
