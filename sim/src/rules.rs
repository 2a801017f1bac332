//! The decode side's release rules: when may an aborted request's pages be reused?
//!
//! `naive` and `timeout` keep their own page free list (LIFO, like a typical allocator, so a
//! freed page is reused at once) and name rooms by a reusable slot index, as peers do.
//! `kvfence` is the library's [`RoomTable`]: rooms are named by generation-tagged handles.

use crate::config::RuleKind;
use kvfence::{Config, Error, Quiesced, Reason, Released, RoomHandle, RoomTable};
use std::collections::HashMap;
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
    /// Pages of quarantined rooms: out of circulation until every rank the room waited on
    /// has been torn down.
    pub quarantined: usize,
}

/// What a rule did with an ACK (or a late "transfer done").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckOutcome {
    /// Counted; the room still waits on other ranks.
    Recorded,
    /// Counted, and it released the room.
    Released,
    /// Counted, and it released the room into the release queue: the room counts as
    /// released (its pages reusable) once [`Rule::drain`] delivers it.
    Queued,
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
    /// send ABORT to and whether the pages were released now (a queued release: `false`,
    /// it comes from [`Rule::drain`]).
    fn abort(&mut self, room: RoomId, pending: &[u32], now: Instant) -> (Vec<u32>, bool);
    /// Finishes a live room after verification. Returns whether it was released now.
    fn finish(&mut self, room: RoomId) -> bool;
    /// An ABORT_ACK (or a "done" that arrived after the abort) from `rank` naming `room`.
    fn ack(&mut self, room: RoomId, rank: u32) -> AckOutcome;
    /// Time passes: rooms released by a timer.
    fn tick(&mut self, now: Instant) -> Vec<RoomId>;
    /// The scheduler loop acts on releases decided elsewhere (queued): frees their pages
    /// to the free list and returns their rooms. Rules that release at once: nothing.
    fn drain(&mut self) -> Vec<RoomId> {
        Vec::new()
    }
    /// The failure detector declared `rank` dead (its transport may still be up). Rules
    /// that trust the detector free the rank's rooms now; the others wait for teardown.
    fn rank_detected(&mut self, _rank: u32) -> Vec<RoomId> {
        Vec::new()
    }
    /// `rank`'s write into an aborted `room` failed (error returned, bytes may still land).
    /// Rules that trust the detector count the rank as done with the room.
    fn transfer_failed(&mut self, _room: RoomId, _rank: u32) -> Vec<RoomId> {
        Vec::new()
    }
    /// Gives up on a closing room that cannot be proven drained: its pages leave
    /// circulation (counted in `Usage::quarantined`). Returns whether it was released now
    /// (kvfence: queued, delivered by [`Rule::drain`]).
    fn quarantine(&mut self, room: RoomId) -> bool;
    /// Quarantined pages whose writers have all been torn down go back to the free list.
    fn reclaim(&mut self, pages: &[u32]);
    /// Closing rooms with the ranks each still waits on and its page count, as the rule
    /// itself sees them (kvfence: `stats().closing`); `None`: the decode's own view.
    fn waiting(&self) -> Option<Vec<(RoomId, Vec<u32>, usize)>> {
        None
    }
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

/// Builds the rule `kind` over `pages` pages, `rooms` rooms and `ranks` writer ranks;
/// `timeout` is the release-anyway timeout of the timeout rules.
pub fn make(
    kind: RuleKind,
    pages: usize,
    rooms: usize,
    ranks: usize,
    timeout: Duration,
) -> Result<Box<dyn Rule>, String> {
    Ok(match kind {
        RuleKind::Naive => Box::new(SimplePool::new(pages, rooms, None)),
        RuleKind::Timeout | RuleKind::Sglang | RuleKind::Vllm => {
            Box::new(SimplePool::new(pages, rooms, Some(timeout)))
        }
        RuleKind::AcksOnly => Box::new(SimplePool::acks_only(pages, rooms)),
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

/// `naive` (free at abort), the timeout rules (`timeout`, `sglang`, `vllm`: wait for ACKs,
/// release anyway after the timeout, trust the failure detector) and `acks-only` (wait for
/// ACKs, no timer, free a dead rank's rooms at its teardown). Rooms are slot indices, reused
/// LIFO: an ACK names only the slot, so a late ACK of an earlier request counts toward
/// whichever request has the slot now.
#[derive(Debug)]
pub struct SimplePool {
    free_pages: Vec<u32>,
    free_slots: Vec<u32>,
    slots: Vec<(SlotState, Vec<u32>)>,
    aborting: Vec<u32>,
    /// Aborted rooms wait for ACKs (all but naive).
    wait: bool,
    timeout: Option<Duration>,
    /// Frees a dead rank's rooms when the detector fires, a failed transfer's at once.
    trusts_detector: bool,
    capacity: usize,
    owned: usize,
    held: usize,
    quarantined: usize,
}

impl SimplePool {
    /// A pool of `pages` pages and `rooms` slots; `timeout` `None` is the naive rule,
    /// `Some` a timeout rule (which trusts the failure detector).
    pub fn new(pages: usize, rooms: usize, timeout: Option<Duration>) -> SimplePool {
        SimplePool {
            free_pages: (0..pages as u32).rev().collect(),
            free_slots: (0..rooms as u32).rev().collect(),
            slots: (0..rooms).map(|_| (SlotState::Free, Vec::new())).collect(),
            aborting: Vec::new(),
            wait: timeout.is_some(),
            timeout,
            trusts_detector: timeout.is_some(),
            capacity: pages,
            owned: 0,
            held: 0,
            quarantined: 0,
        }
    }

    /// The `acks-only` rule: waits for every ACK, no timer, does not trust the detector.
    pub fn acks_only(pages: usize, rooms: usize) -> SimplePool {
        SimplePool {
            wait: true,
            timeout: None,
            trusts_detector: false,
            ..SimplePool::new(pages, rooms, None)
        }
    }

    /// Counts `rank` as acknowledged in every aborting room; returns the rooms released.
    fn ack_everywhere(&mut self, rank: u32) -> Vec<RoomId> {
        let slots = self.aborting.clone();
        slots
            .into_iter()
            .filter(|&s| self.ack(RoomId::from(s), rank) == AckOutcome::Released)
            .map(RoomId::from)
            .collect()
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
        match self.wait {
            true if !pending.is_empty() => {
                let (state, pages) = &mut self.slots[slot as usize];
                if matches!(state, SlotState::Owned) {
                    self.owned -= pages.len();
                    self.held += pages.len();
                    // No timer (acks-only): a deadline that never comes.
                    let deadline = now + self.timeout.unwrap_or(Duration::from_secs(1 << 30));
                    *state = SlotState::Aborting {
                        pending: pending.to_vec(),
                        deadline,
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

    fn rank_detected(&mut self, rank: u32) -> Vec<RoomId> {
        if !self.trusts_detector {
            return Vec::new();
        }
        // SGLang's `_handle_node_failure`: the dead rank's rooms are marked failed and freed.
        self.ack_everywhere(rank)
    }

    fn transfer_failed(&mut self, room: RoomId, rank: u32) -> Vec<RoomId> {
        // The peers: a failed transfer marks the room failed; nothing waits for its bytes.
        if self.trusts_detector && self.ack(room, rank) == AckOutcome::Released {
            vec![room]
        } else {
            Vec::new()
        }
    }

    fn quarantine(&mut self, room: RoomId) -> bool {
        let slot = room as u32;
        let Some((state @ SlotState::Aborting { .. }, pages)) = self.slots.get_mut(slot as usize)
        else {
            return false;
        };
        *state = SlotState::Free;
        self.held -= pages.len();
        self.quarantined += pages.len();
        pages.clear();
        self.aborting.retain(|&s| s != slot);
        self.free_slots.push(slot);
        true
    }

    fn reclaim(&mut self, pages: &[u32]) {
        self.quarantined -= pages.len();
        self.free_pages.extend(pages.iter().rev());
    }

    fn rank_torn_down(&mut self, rank: u32) -> Vec<RoomId> {
        // A torn-down rank counts as acknowledged everywhere (nothing of it can land).
        self.ack_everywhere(rank)
    }

    fn rank_readmitted(&mut self, _rank: u32) {}

    fn usage(&self) -> Usage {
        Usage {
            free: self.free_pages.len(),
            owned: self.owned,
            held: self.held,
            quarantined: self.quarantined,
        }
    }

    fn waits_for_acks(&self) -> bool {
        self.wait
    }

    fn conservation(&self) -> Result<(), String> {
        let u = self.usage();
        let mut free = self.free_pages.clone();
        free.sort_unstable();
        free.dedup();
        if u.free != self.capacity
            || free.len() != self.capacity
            || u.owned + u.held + u.quarantined != 0
        {
            return Err(format!(
                "pages: free {} ({} distinct) + owned {} + held {} + quarantined {} != capacity {}",
                u.free,
                free.len(),
                u.owned,
                u.held,
                u.quarantined,
                self.capacity
            ));
        }
        Ok(())
    }
}

/// The kvfence rule: [`RoomTable`] in gate mode on the decode side.
///
/// The engine (this rule) owns the page arena's allocator, a LIFO free list like the other
/// rules'; the table gates every free: a room is opened with the engine's page ids
/// ([`RoomTable::open_gate`]), releases are decided wherever the last ACK, transfer or fence
/// lands and go to the table's release queue, and the scheduler loop drains the queue
/// ([`Rule::drain`]) and only then puts the pages back on the free list.
#[derive(Debug)]
pub struct Kvfence {
    table: RoomTable,
    /// The arena's free list (LIFO: a freed page is handed out again at once).
    free_pages: Vec<u32>,
    /// Page count of every open lifecycle by token: a drained release must name one.
    live: HashMap<u64, usize>,
    next_token: u64,
    pages: usize,
    rooms: usize,
    /// Deliveries that did not match an open lifecycle (never expected).
    bad_releases: Vec<String>,
    /// Buffer for [`RoomTable::drain_released`].
    drained: Vec<Released>,
    /// Pages out of circulation (quarantined, not yet reclaimed).
    quarantined: usize,
    /// Pages quarantined by the table since the start (checked against its stats).
    quarantined_total: u64,
}

impl Kvfence {
    /// A gate-mode table of `rooms` rooms over an arena of `pages` pages. `ranks` (writer
    /// rank ids `0..ranks`) needs no table setting: any `u32` but `u32::MAX` is a rank id.
    pub fn new(pages: usize, rooms: usize, ranks: usize) -> Result<Kvfence, String> {
        if ranks > u32::MAX as usize {
            return Err(format!("kvfence: {ranks} ranks: rank ids are u32"));
        }
        let table =
            RoomTable::new(Config::gate(rooms).release_queue(true)).map_err(|e| e.to_string())?;
        Ok(Kvfence {
            table,
            free_pages: (0..pages as u32).rev().collect(),
            live: HashMap::new(),
            next_token: 0,
            pages,
            rooms,
            bad_releases: Vec::new(),
            drained: Vec::with_capacity(rooms),
            quarantined: 0,
            quarantined_total: 0,
        })
    }
}

impl Rule for Kvfence {
    fn open(&mut self, pages: usize, ranks: &[u32]) -> Result<Option<(RoomId, Vec<u32>)>, String> {
        if self.free_pages.len() < pages {
            return Ok(None);
        }
        let list: Vec<u32> = self
            .free_pages
            .drain(self.free_pages.len() - pages..)
            .rev()
            .collect();
        self.next_token += 1;
        let token = self.next_token;
        match self.table.open_gate(ranks, token, list.clone()) {
            Ok(handle) => {
                self.live.insert(token, pages);
                Ok(Some((handle.to_wire(), list)))
            }
            Err(e) => {
                // Not opened: the pages are still ours.
                self.free_pages.extend(list.into_iter().rev());
                match e {
                    Error::RoomTableFull => Ok(None),
                    e => Err(format!("kvfence open refused: {e}")),
                }
            }
        }
    }

    fn done(&mut self, room: RoomId, rank: u32) {
        // The rank will write no more into this room: the same fact as an ABORT_ACK. It
        // cannot release (the room is live), so the result carries nothing to act on.
        let _ = self.table.quiesce(RoomHandle::from_wire(room), rank);
    }

    fn abort(&mut self, room: RoomId, _pending: &[u32], _now: Instant) -> (Vec<u32>, bool) {
        // A release (nothing held the room) is queued: it counts once drained.
        match self.table.abort(RoomHandle::from_wire(room)) {
            Ok(a) => (a.fanout.to_vec(), a.released.is_some()),
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
            Ok(Quiesced::Queued) => AckOutcome::Queued,
            Ok(Quiesced::Duplicate) | Err(_) => AckOutcome::Ignored,
        }
    }

    fn tick(&mut self, _now: Instant) -> Vec<RoomId> {
        // Time never releases a page.
        Vec::new()
    }

    fn drain(&mut self) -> Vec<RoomId> {
        self.drained.clear();
        if self.table.drain_released(&mut self.drained) == 0 {
            return Vec::new();
        }
        let mut rooms = Vec::with_capacity(self.drained.len());
        for r in self.drained.drain(..) {
            match self.live.remove(&r.token) {
                Some(n) if n == r.pages.len() => {}
                Some(n) => self.bad_releases.push(format!(
                    "token {} released {} pages, opened with {n}",
                    r.token,
                    r.pages.len()
                )),
                None => self
                    .bad_releases
                    .push(format!("token {} released twice or never opened", r.token)),
            }
            if r.reason == Reason::Quarantined {
                // Out of circulation: the engine (the decode loop) hands them back with
                // `reclaim` only once every rank the room waited on has been torn down.
                self.quarantined += r.pages.len();
                self.quarantined_total += r.pages.len() as u64;
            } else {
                // The engine's free: only now can the pages go to another request.
                self.free_pages.extend(r.pages.iter().rev());
            }
            rooms.push(r.handle.to_wire());
        }
        rooms
    }

    fn quarantine(&mut self, room: RoomId) -> bool {
        // Queued (Reason::Quarantined): delivered by the next drain.
        matches!(
            self.table.quarantine(RoomHandle::from_wire(room)),
            Ok(Some(_))
        )
    }

    fn reclaim(&mut self, pages: &[u32]) {
        self.quarantined -= pages.len();
        self.free_pages.extend(pages.iter().rev());
    }

    fn waiting(&self) -> Option<Vec<(RoomId, Vec<u32>, usize)>> {
        Some(
            self.table
                .stats()
                .closing
                .into_iter()
                .map(|s| (s.handle.to_wire(), s.waiting_on.to_vec(), s.pages))
                .collect(),
        )
    }

    fn rank_torn_down(&mut self, rank: u32) -> Vec<RoomId> {
        // What the fence releases goes to the release queue (the next drain).
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
            free: self.free_pages.len(),
            owned: s.pages.owned,
            // Released but not yet drained: not reusable yet either.
            held: s.pages.held + s.pages.queued,
            quarantined: self.quarantined,
        }
    }

    fn waits_for_acks(&self) -> bool {
        true
    }

    fn conservation(&self) -> Result<(), String> {
        let s = self.table.stats();
        if let Some(bad) = self.bad_releases.first() {
            return Err(format!(
                "kvfence: {} bad releases, first: {bad}",
                self.bad_releases.len()
            ));
        }
        let mut free = self.free_pages.clone();
        free.sort_unstable();
        free.dedup();
        if free.len() != self.free_pages.len() {
            return Err(format!(
                "kvfence pages: {} duplicate ids on the free list",
                self.free_pages.len() - free.len()
            ));
        }
        if s.quarantined_pages != self.quarantined_total {
            return Err(format!(
                "kvfence: table counts {} quarantined pages, the engine received {}",
                s.quarantined_pages, self.quarantined_total
            ));
        }
        if self.free_pages.len() != self.pages
            || self.quarantined != 0
            || s.pages.owned + s.pages.held + s.pages.queued != 0
            || !self.live.is_empty()
        {
            return Err(format!(
                "kvfence pages: free {} + owned {} + held {} + queued {} (capacity {}), {} rooms not released",
                self.free_pages.len(),
                s.pages.owned,
                s.pages.held,
                s.pages.queued,
                self.pages,
                self.live.len()
            ));
        }
        if s.rooms.total() != self.rooms || s.rooms.free != self.rooms {
            return Err(format!(
                "kvfence rooms: free {} + owned {} + held {} + queued {} (capacity {})",
                s.rooms.free, s.rooms.owned, s.rooms.held, s.rooms.queued, self.rooms
            ));
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
        assert!(r.drain().is_empty());
        // The fence decides the release; the scheduler's drain acts on it.
        assert!(r.rank_torn_down(1).is_empty(), "queued, not returned");
        assert_eq!(r.usage().free, 0, "not reusable before the drain");
        assert!(r.open(1, &[0]).unwrap().is_none(), "pages still not free");
        assert_eq!(r.drain(), vec![a]);
        assert!(r.drain().is_empty(), "delivered once");
        assert_eq!(r.ack(a, 1), AckOutcome::Ignored, "late ACK after release");
        assert!(r.conservation().is_ok());
    }

    #[test]
    fn kvfence_last_ack_queues_and_the_drain_frees_the_same_pages() {
        let mut r = Kvfence::new(4, 2, 2).unwrap();
        let (a, pa) = r.open(4, &[0, 1]).unwrap().unwrap();
        let _ = r.abort(a, &[0, 1], Instant::now());
        assert_eq!(r.ack(a, 1), AckOutcome::Recorded);
        assert_eq!(r.ack(a, 0), AckOutcome::Queued);
        assert!(r.open(4, &[0]).unwrap().is_none(), "queued, not drained");
        assert_eq!(r.drain(), vec![a]);
        let (b, pb) = r.open(4, &[0]).unwrap().unwrap();
        assert_eq!(pa, pb, "LIFO reuse once drained");
        r.done(b, 0);
        assert!(!r.finish(b), "queued");
        assert_eq!(r.drain(), vec![b]);
        assert!(r.conservation().is_ok());
    }
}
