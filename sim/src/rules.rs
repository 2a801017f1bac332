//! The decode side's release rules: when may an aborted request's pages be reused?
//!
//! `naive` and `timeout` keep their own page free list (LIFO, like a typical allocator, so a
//! freed page is reused at once) and name rooms by a reusable slot index, as peers do.
//! `kvfence` is the library's [`RoomTable`]: rooms are named by generation-tagged handles.

use crate::config::RuleKind;
use kvfence::{Config, Error, Quiesced, RankSet, RoomHandle, RoomTable};
use std::time::{Duration, Instant};

/// A room as the simulator names it: a kvfence handle in its wire form (16 bytes), or a
/// slot number for the rules that have no handles.
pub type RoomId = u128;

/// Page occupancy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Free pages.
    pub free: usize,
    /// Pages of live requests.
    pub owned: usize,
    /// Pages of closed requests not yet released.
    pub held: usize,
}

/// What a rule did with an ACK (or a late "transfer done").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckOutcome {
    /// Counted; the room still waits on other ranks.
    Recorded,
    /// Counted, and it released the room.
    Released,
    /// Not counted: late, duplicate or stale.
    Ignored,
}

/// A decode-side release rule.
pub trait Rule {
    /// Claims a room of `pages` pages written by `ranks`. `Ok(None)`: no capacity right now.
    fn open(&mut self, pages: usize, ranks: &[u32]) -> Result<Option<(RoomId, Vec<u32>)>, String>;
    /// `rank` finished writing its part of a live room.
    fn done(&mut self, room: RoomId, rank: u32);
    /// Aborts a live room whose ranks `pending` have not reported done. Returns the ranks to
    /// send ABORT to and whether the pages were released now.
    fn abort(&mut self, room: RoomId, pending: &[u32], now: Instant) -> (Vec<u32>, bool);
    /// Finishes a live room after verification. Returns whether it was released now.
    fn finish(&mut self, room: RoomId) -> bool;
    /// An ABORT_ACK (or a "done" that arrived after the abort) from `rank` naming `room`.
    fn ack(&mut self, room: RoomId, rank: u32) -> AckOutcome;
    /// Time passes: rooms released by a timer.
    fn tick(&mut self, now: Instant) -> Vec<RoomId>;
    /// `rank`'s transport was torn down (no write of it can land any more).
    fn rank_torn_down(&mut self, rank: u32) -> Vec<RoomId>;
    /// `rank` has a new transport.
    fn rank_readmitted(&mut self, rank: u32);
    /// Page occupancy now.
    fn usage(&self) -> Usage;
    /// Whether aborted rooms wait for ACKs (so lost ACKs need an ABORT re-send).
    fn waits_for_acks(&self) -> bool;
    /// End of run, everything drained: every page must be free and accounted for.
    fn conservation(&self) -> Result<(), String>;
}

/// Builds the rule `kind` over `pages` pages, `rooms` rooms and `ranks` writer ranks.
pub fn make(
    kind: RuleKind,
    pages: usize,
    rooms: usize,
    ranks: usize,
    timeout: Duration,
) -> Result<Box<dyn Rule>, String> {
    Ok(match kind {
        RuleKind::Naive => Box::new(SimplePool::new(pages, rooms, None)),
        RuleKind::Timeout => Box::new(SimplePool::new(pages, rooms, Some(timeout))),
        RuleKind::Kvfence => Box::new(Kvfence::new(pages, rooms, ranks)?),
    })
}

#[derive(Debug)]
enum SlotState {
    Free,
    Owned,
    Aborting {
        pending: Vec<u32>,
        deadline: Instant,
    },
}

/// `naive` (no timeout: free at abort) and `timeout` (wait for ACKs, release anyway after
/// the timeout). Rooms are slot indices, reused LIFO: an ACK names only the slot, so a late
/// ACK of an earlier request counts toward whichever request has the slot now.
#[derive(Debug)]
pub struct SimplePool {
    free_pages: Vec<u32>,
    free_slots: Vec<u32>,
    slots: Vec<(SlotState, Vec<u32>)>,
    aborting: Vec<u32>,
    timeout: Option<Duration>,
    capacity: usize,
    owned: usize,
    held: usize,
}

impl SimplePool {
    /// A pool of `pages` pages and `rooms` slots; `timeout` `None` is the naive rule.
    pub fn new(pages: usize, rooms: usize, timeout: Option<Duration>) -> SimplePool {
        SimplePool {
            free_pages: (0..pages as u32).rev().collect(),
            free_slots: (0..rooms as u32).rev().collect(),
            slots: (0..rooms).map(|_| (SlotState::Free, Vec::new())).collect(),
            aborting: Vec::new(),
            timeout,
            capacity: pages,
            owned: 0,
            held: 0,
        }
    }

    fn release(&mut self, slot: u32) {
        let (state, pages) = &mut self.slots[slot as usize];
        match std::mem::replace(state, SlotState::Free) {
            SlotState::Owned => self.owned -= pages.len(),
            SlotState::Aborting { .. } => {
                self.held -= pages.len();
                self.aborting.retain(|&s| s != slot);
            }
            SlotState::Free => return,
        }
        self.free_pages.extend(pages.drain(..).rev());
        self.free_slots.push(slot);
    }
}

impl Rule for SimplePool {
    fn open(&mut self, pages: usize, _ranks: &[u32]) -> Result<Option<(RoomId, Vec<u32>)>, String> {
        if self.free_pages.len() < pages || self.free_slots.is_empty() {
            return Ok(None);
        }
        let slot = self.free_slots.pop().unwrap_or_default();
        let list: Vec<u32> = self
            .free_pages
            .drain(self.free_pages.len() - pages..)
            .rev()
            .collect();
        self.owned += pages;
        self.slots[slot as usize] = (SlotState::Owned, list.clone());
        Ok(Some((RoomId::from(slot), list)))
    }

    fn done(&mut self, _room: RoomId, _rank: u32) {}

    fn abort(&mut self, room: RoomId, pending: &[u32], now: Instant) -> (Vec<u32>, bool) {
        let slot = room as u32;
        match self.timeout {
            Some(timeout) if !pending.is_empty() => {
                let (state, pages) = &mut self.slots[slot as usize];
                if matches!(state, SlotState::Owned) {
                    self.owned -= pages.len();
                    self.held += pages.len();
                    *state = SlotState::Aborting {
                        pending: pending.to_vec(),
                        deadline: now + timeout,
                    };
                    self.aborting.push(slot);
                }
                (pending.to_vec(), false)
            }
            _ => {
                self.release(slot);
                (pending.to_vec(), true)
            }
        }
    }

    fn finish(&mut self, room: RoomId) -> bool {
        self.release(room as u32);
        true
    }

    fn ack(&mut self, room: RoomId, rank: u32) -> AckOutcome {
        let Some((SlotState::Aborting { pending, .. }, _)) = self.slots.get_mut(room as usize)
        else {
            return AckOutcome::Ignored;
        };
        let Some(i) = pending.iter().position(|&r| r == rank) else {
            return AckOutcome::Ignored;
        };
        pending.swap_remove(i);
        if pending.is_empty() {
            self.release(room as u32);
            AckOutcome::Released
        } else {
            AckOutcome::Recorded
        }
    }

    fn tick(&mut self, now: Instant) -> Vec<RoomId> {
        let due: Vec<u32> = self
            .aborting
            .iter()
            .copied()
            .filter(|&s| {
                matches!(self.slots[s as usize].0, SlotState::Aborting { deadline, .. } if deadline <= now)
            })
            .collect();
        for &s in &due {
            self.release(s);
        }
        due.into_iter().map(RoomId::from).collect()
    }

    fn rank_torn_down(&mut self, rank: u32) -> Vec<RoomId> {
        // A dead rank counts as acknowledged everywhere (peers treat it as gone).
        let slots = self.aborting.clone();
        slots
            .into_iter()
            .filter(|&s| self.ack(RoomId::from(s), rank) == AckOutcome::Released)
            .map(RoomId::from)
            .collect()
    }

    fn rank_readmitted(&mut self, _rank: u32) {}

    fn usage(&self) -> Usage {
        Usage {
            free: self.free_pages.len(),
            owned: self.owned,
            held: self.held,
        }
    }

    fn waits_for_acks(&self) -> bool {
        self.timeout.is_some()
    }

    fn conservation(&self) -> Result<(), String> {
        let u = self.usage();
        if u.free + u.owned + u.held != self.capacity || u.free != self.capacity {
            return Err(format!(
                "pages: free {} + owned {} + held {} != capacity {}",
                u.free, u.owned, u.held, self.capacity
            ));
        }
        Ok(())
    }
}

/// The kvfence rule: [`RoomTable`] on the decode side.
#[derive(Debug)]
pub struct Kvfence {
    table: RoomTable,
    pages: usize,
    rooms: usize,
}

impl Kvfence {
    /// A table of `pages` pages, `rooms` rooms, `ranks` writer ranks.
    pub fn new(pages: usize, rooms: usize, ranks: usize) -> Result<Kvfence, String> {
        let table = RoomTable::new(Config::new(rooms, pages, ranks)).map_err(|e| e.to_string())?;
        Ok(Kvfence {
            table,
            pages,
            rooms,
        })
    }
}

impl Rule for Kvfence {
    fn open(&mut self, pages: usize, ranks: &[u32]) -> Result<Option<(RoomId, Vec<u32>)>, String> {
        let set = RankSet::from_ranks(ranks.iter().copied()).map_err(|e| e.to_string())?;
        match self.table.open(pages, &set) {
            Ok(opened) => Ok(Some((opened.handle.to_wire(), opened.pages))),
            Err(Error::PoolExhausted { .. } | Error::RoomTableFull) => Ok(None),
            Err(e) => Err(format!("kvfence open refused: {e}")),
        }
    }

    fn done(&mut self, room: RoomId, rank: u32) {
        // The rank will write no more into this room: the same fact as an ABORT_ACK. It
        // cannot release (the room is live), so the result carries nothing to act on.
        let _ = self.table.quiesce(RoomHandle::from_wire(room), rank);
    }

    fn abort(&mut self, room: RoomId, _pending: &[u32], _now: Instant) -> (Vec<u32>, bool) {
        match self.table.abort(RoomHandle::from_wire(room)) {
            Ok(a) => (a.fanout.iter().collect(), a.released.is_some()),
            Err(_) => (Vec::new(), false),
        }
    }

    fn finish(&mut self, room: RoomId) -> bool {
        matches!(self.table.finish(RoomHandle::from_wire(room)), Ok(Some(_)))
    }

    fn ack(&mut self, room: RoomId, rank: u32) -> AckOutcome {
        match self.table.quiesce(RoomHandle::from_wire(room), rank) {
            Ok(Quiesced::Recorded) => AckOutcome::Recorded,
            Ok(Quiesced::Released(_)) => AckOutcome::Released,
            Ok(Quiesced::Duplicate) | Err(_) => AckOutcome::Ignored,
        }
    }

    fn tick(&mut self, _now: Instant) -> Vec<RoomId> {
        // Time never releases a page.
        Vec::new()
    }

    fn rank_torn_down(&mut self, rank: u32) -> Vec<RoomId> {
        match self.table.fence_rank(rank) {
            Ok(f) => f.released.iter().map(|r| r.handle.to_wire()).collect(),
            Err(_) => Vec::new(),
        }
    }

    fn rank_readmitted(&mut self, rank: u32) {
        let _ = self.table.readmit_rank(rank);
    }

    fn usage(&self) -> Usage {
        let s = self.table.stats();
        Usage {
            free: s.pages.free,
            owned: s.pages.owned,
            held: s.pages.held,
        }
    }

    fn waits_for_acks(&self) -> bool {
        true
    }

    fn conservation(&self) -> Result<(), String> {
        let s = self.table.stats();
        let orphans = self.table.take_orphaned();
        if s.pages.total() != self.pages || s.pages.free != self.pages {
            return Err(format!(
                "kvfence pages: free {} + owned {} + held {} (capacity {})",
                s.pages.free, s.pages.owned, s.pages.held, self.pages
            ));
        }
        if s.rooms.total() != self.rooms || s.rooms.free != self.rooms {
            return Err(format!(
                "kvfence rooms: free {} + owned {} + held {} (capacity {})",
                s.rooms.free, s.rooms.owned, s.rooms.held, self.rooms
            ));
        }
        if !orphans.is_empty() {
            return Err(format!("{} unexpected orphaned releases", orphans.len()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn naive_frees_at_abort_and_reuses_the_same_pages() {
        let mut r = SimplePool::new(4, 2, None);
        let (a, pa) = r.open(4, &[0]).unwrap().unwrap();
        assert!(r.open(1, &[0]).unwrap().is_none());
        assert_eq!(r.abort(a, &[0], Instant::now()), (vec![0], true));
        let (_, pb) = r.open(4, &[0]).unwrap().unwrap();
        assert_eq!(pa, pb, "LIFO reuse hands out the aborted pages");
    }

    #[test]
    fn timeout_releases_on_acks_or_on_time_and_a_late_ack_counts_for_the_next_request() {
        let now = Instant::now();
        let mut r = SimplePool::new(4, 1, Some(Duration::from_millis(10)));
        let (a, _) = r.open(2, &[0, 1]).unwrap().unwrap();
        assert_eq!(r.abort(a, &[0, 1], now), (vec![0, 1], false));
        assert_eq!(r.usage().held, 2);
        assert_eq!(r.ack(a, 0), AckOutcome::Recorded);
        assert!(r.tick(now).is_empty());
        assert_eq!(r.tick(now + Duration::from_millis(11)), vec![a]);
        // The slot is reused; a late ACK from request A counts toward B.
        let (b, _) = r.open(2, &[0, 1]).unwrap().unwrap();
        assert_eq!(a, b);
        let _ = r.abort(b, &[0, 1], now);
        assert_eq!(
            r.ack(a, 1),
            AckOutcome::Recorded,
            "the peer bug: slot ids only"
        );
        assert_eq!(r.ack(b, 0), AckOutcome::Released);
        assert!(r.conservation().is_ok());
    }

    #[test]
    fn kvfence_holds_until_acked_and_ignores_late_acks() {
        let mut r = Kvfence::new(4, 2, 2).unwrap();
        let (a, _) = r.open(4, &[0, 1]).unwrap().unwrap();
        let (fanout, released) = r.abort(a, &[0, 1], Instant::now());
        assert_eq!((fanout, released), (vec![0, 1], false));
        assert!(r.open(1, &[0]).unwrap().is_none(), "pages held");
        assert!(r
            .tick(Instant::now() + Duration::from_secs(3600))
            .is_empty());
        assert_eq!(r.ack(a, 0), AckOutcome::Recorded);
        assert_eq!(r.ack(a, 0), AckOutcome::Ignored);
        assert!(r.conservation().is_err());
        assert_eq!(r.rank_torn_down(1), vec![a]);
        assert_eq!(r.ack(a, 1), AckOutcome::Ignored, "late ACK after release");
        assert!(r.conservation().is_ok());
    }
}
