//! Per-room parking: a waiter count, a lock and a condition variable (the lost-wake-up
//! argument is in `wait.rs`, which waits on it).

use crate::sync::{cond_wait, fence, lock, AtomicU32, Condvar, Mutex, Ordering};
use std::time::Instant;

/// One room's waiters.
#[derive(Debug)]
pub(crate) struct Parking {
    waiters: AtomicU32,
    lock: Mutex<()>,
    cond: Condvar,
}

impl Parking {
    pub(crate) fn new() -> Parking {
        Parking {
            waiters: AtomicU32::new(0),
            lock: Mutex::new(()),
            cond: Condvar::new(),
        }
    }

    /// Wakes this room's waiters, if it has any. Called by a releaser after it advanced
    /// `released_below`, or after it queued the release.
    #[inline]
    pub(crate) fn notify(&self) {
        fence(Ordering::SeqCst);
        if self.waiters.load(Ordering::Relaxed) != 0 {
            let _guard = lock(&self.lock);
            self.cond.notify_all();
        }
    }

    /// Parks until `done()` or the deadline. Returns whether `done()` held.
    pub(crate) fn wait_until(&self, done: impl Fn() -> bool, deadline: Option<Instant>) -> bool {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let mut guard = lock(&self.lock);
        let ok = loop {
            if done() {
                break true;
            }
            let timeout = match deadline {
                None => None,
                Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => break false,
                },
            };
            guard = cond_wait(&self.cond, guard, timeout);
        };
        drop(guard);
        self.waiters.fetch_sub(1, Ordering::Relaxed);
        ok
    }
}
