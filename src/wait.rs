//! Waiting for releases: per-room parking with optional timeouts.
//!
//! # Implementation details
//!
//! Each room slot has a [`Parking`]: a waiter count, a lock and a condition variable. A
//! release ends with `notify`, which costs one `fence(SeqCst)` and one load of the room's
//! own waiter count (in the room's own padded slot) when nobody waits on *that* room: a
//! waiter parked on room A adds nothing to a release of room B.
//!
//! The lost-wake-up argument is the store-buffer pattern plus the lock:
//!
//! ```text
//! waiter                                releaser
//! waiters += 1 (SeqCst)                 released_below = gen + 1 (RMW, Release)
//! fence(SeqCst)                         fence(SeqCst)
//! lock; check released_below; wait      if waiters != 0 { lock; notify_all }
//! ```
//!
//! By the fences' total order, either the releaser sees the waiter (then it takes the lock:
//! before the waiter's check, which then sees the release through the lock, or after the
//! waiter went to sleep on the condition variable, which the notify then wakes), or the
//! waiter's check sees the release and it does not sleep. Spurious wake-ups are harmless:
//! every waiter re-checks its condition under the lock.
//!
//! The releaser's signal is either `released_below` (a delivered release) or, for a
//! release that goes to the release queue, the room's bit in the queue (set after the
//! slot's `queued` tag is stored, and followed by the same `notify`): the argument is the
//! same for both. The waiter checks the tag *and* the bit: the tag alone is visible before
//! the bit is, and a waiter that went on to drain then found nothing (issue 40).
//!
//! **What a wait waits for** (issue 18: before, a wait with the release queue on returned
//! only once someone had drained the release, so a scheduler thread that waits and then
//! drains never woke). A room's release is *decided* by the RMW that takes it to `FREE`;
//! nothing after that can stop it. A wait ends once the release is decided **and** either
//! delivered (the pages and room index are back; the delivering call returned or will
//! return the [`Released`](crate::Released)) or waiting in the release queue (then
//! [`RoomTable::drain_released`] delivers it: the waiter's own thread may call it next).
//! With direct delivery (`release_queue(false)`) nearly every release is delivered by the
//! call that decides it, so a finished wait means the pages are back; the exceptions are
//! the releases that have no caller to return to (a guard dropped while unwinding, a
//! `grow` whose hold was the last, a refused transfer begin whose transient unit was the
//! last), which go to the queue in every mode.
//!
//! `wait_idle` waits room by room: it finds a busy room, parks on it until it is idle,
//! and starts over until one pass finds every room idle.
//!
//! The condition variable is std's (a futex on Linux) and loom's under `--cfg loom`, so the
//! loom models check this exact code. Timeouts are real on std; under loom a wait never
//! times out (loom has no clock), which is the stricter case for lost wake-ups.

use crate::error::Error;
use crate::handle::RoomHandle;
use crate::room_word::Phase;
use crate::state::{queued_of, RoomTable, Slot};
use crate::sync::Ordering;
use std::time::{Duration, Instant};

/// Whether a room is idle: `FREE`, and its last release delivered or waiting in the
/// release queue (not mid-way through being handed back).
fn idle(table: &RoomTable, index: usize) -> bool {
    let slot = &table.slots[index].0;
    let released_below = slot.released_below.load(Ordering::Acquire);
    let state = slot.word.load(Ordering::Acquire);
    state.phase() == Phase::Free
        && (state.gen() == released_below
            || queued(table, index, slot, state.gen().wrapping_sub(1)))
}

/// Whether lifecycle `gen`'s release is in the release queue: its tag is in the slot and
/// its bit in the queue (the tag is stored before the bit is set: a waiter that saw only
/// the tag and drained could find nothing; issue 40). Once a drainer takes the bit, the
/// release is delivered (`released_below` moves past `gen`) and the drainer wakes waiters.
fn queued(table: &RoomTable, index: usize, slot: &Slot, gen: u32) -> bool {
    queued_of(slot.queued.load(Ordering::Acquire)).map(|(g, _)| g) == Some(gen)
        && table.queue.contains(index)
}

/// `Some(now + timeout)`, or `None` (wait forever) if that is beyond what `Instant` holds.
fn deadline(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

impl RoomTable {
    /// Whether `handle`'s lifecycle's release is decided and delivered or queued.
    fn released(&self, index: usize, gen: u32) -> bool {
        let slot = &self.slots[index].0;
        let released_below = slot.released_below.load(Ordering::Acquire);
        let state = slot.word.load(Ordering::Acquire);
        // Generations compare modulo 2^32 (see `handle.rs` for the ABA bound): `behind`
        // is how many lifecycles the room has moved past the handle's.
        match state.gen().wrapping_sub(gen) as i32 {
            // The handle's lifecycle: live, or (FREE) it never began.
            0 => state.phase() == Phase::Free,
            // Over: wait until its release has handed the pages and index back, or is in
            // the release queue.
            behind if behind > 0 => {
                (released_below.wrapping_sub(gen) as i32) > 0 || queued(self, index, slot, gen)
            }
            // Ahead of the room (never issued): nothing to wait for.
            _ => true,
        }
    }

    /// Blocks until the handle's lifecycle's release is decided, and delivered or queued
    /// (returns at once if it already is). With direct delivery the pages and room index
    /// are then back (an `open` right after can use them); a release that went to the
    /// release queue (every release of a [`Config::release_queue`](crate::Config) table)
    /// is delivered by the next [`drain_released`](Self::drain_released), which the
    /// waiting thread may call itself: wait, then drain. See `wait.rs` for the exact rule.
    /// Parks on the room's own condition variable; no polling.
    ///
    /// # Errors
    /// [`Error::InvalidHandle`], [`Error::UnknownRoom`].
    ///
    /// ```
    /// use kvfence::{Config, RoomTable};
    /// let table = RoomTable::new(Config::pool(8, 64))?;
    /// let room = table.open(&[0], 1)?;
    /// let _ = table.abort(room.handle)?;
    /// std::thread::scope(|s| {
    ///     s.spawn(|| table.quiesce(room.handle, 0));          // the ACK arrives
    ///     table.wait_released(room.handle)                     // and wakes us
    /// })?;
    /// assert_eq!(table.stats().pages.free, 64);     // back in the pool, not just "released"
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn wait_released(&self, handle: RoomHandle) -> Result<(), Error> {
        let slot = self.slot(handle)?;
        let gen = handle.generation();
        let index = handle.index();
        slot.parking.wait_until(|| self.released(index, gen), None);
        Ok(())
    }

    /// [`wait_released`](Self::wait_released) for at most `timeout`. Returns `Ok(true)` once
    /// released, `Ok(false)` if the time ran out first; waiting changes nothing in the table
    /// (time never releases a room).
    ///
    /// # Errors
    /// [`Error::InvalidHandle`], [`Error::UnknownRoom`].
    ///
    /// ```
    /// use kvfence::{Config, RoomTable};
    /// use std::time::Duration;
    /// let table = RoomTable::new(Config::pool(8, 64))?;
    /// let room = table.open(&[0], 1)?;
    /// let _ = table.abort(room.handle)?;                   // rank 0 has not ACKed
    /// assert!(!table.wait_released_timeout(room.handle, Duration::from_millis(5))?);
    /// let _ = table.quiesce(room.handle, 0)?;
    /// assert!(table.wait_released_timeout(room.handle, Duration::from_millis(5))?);
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn wait_released_timeout(
        &self,
        handle: RoomHandle,
        timeout: Duration,
    ) -> Result<bool, Error> {
        let slot = self.slot(handle)?;
        let gen = handle.generation();
        let index = handle.index();
        Ok(slot
            .parking
            .wait_until(|| self.released(index, gen), deadline(timeout)))
    }

    fn wait_idle_until(&self, deadline: Option<Instant>) -> bool {
        loop {
            let Some(busy) = (0..self.slots.len()).find(|&i| !idle(self, i)) else {
                return true;
            };
            let slot = &self.slots[busy].0;
            if !slot.parking.wait_until(|| idle(self, busy), deadline) {
                return false;
            }
        }
    }

    /// Blocks until no room is owned or closing, every release having been delivered or
    /// put in the release queue (shutdown drain: abort or finish every room, wait here for
    /// the writers and transfers to drain, then [`drain_released`](Self::drain_released)).
    /// A room whose `open` is mid-way does not count.
    ///
    /// ```
    /// use kvfence::{Config, RoomTable};
    /// let table = RoomTable::new(Config::pool(8, 64))?;
    /// let room = table.open(&[], 1)?;
    /// let _ = table.finish(room.handle)?;
    /// table.wait_idle();
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn wait_idle(&self) {
        self.wait_idle_until(None);
    }

    /// [`wait_idle`](Self::wait_idle) for at most `timeout`: `true` once idle, `false` if
    /// the time ran out first.
    ///
    /// ```
    /// use kvfence::{Config, RoomTable};
    /// use std::time::Duration;
    /// let table = RoomTable::new(Config::pool(8, 64))?;
    /// let room = table.open(&[], 1)?;
    /// assert!(!table.wait_idle_timeout(Duration::from_millis(5)));   // still owned
    /// let _ = table.finish(room.handle)?;
    /// assert!(table.wait_idle_timeout(Duration::from_millis(5)));
    /// # Ok::<(), kvfence::Error>(())
    /// ```
    pub fn wait_idle_timeout(&self, timeout: Duration) -> bool {
        self.wait_idle_until(deadline(timeout))
    }
}
