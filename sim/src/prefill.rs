//! The prefill rank threads: each has a transfer queue (intents wait a queueing delay, then
//! are submitted; at most `max_inflight` chunks are in flight; a chunk lands after its
//! transfer delay by being written into the decode arena: the one-sided write).
//!
//! The abort protocol on the rank: on ABORT it drains (drops its queued intents for that
//! request, waits for its in-flight writes), then sends ABORT_ACK. A fraction of queued
//! intents slips past the drain and is still submitted (the bug variant). Under `kvfence`
//! each rank keeps a prefill-side [`RoomTable`] and calls `begin_transfer_to` before every
//! write, so a slipped intent is refused; the source room's release is the ACK.
//!
//! Faults here: a dead rank hangs (answers nothing; its in-flight writes stall and land
//! late until its transport is torn down); a write may fail (the transfer engine returns an
//! error) and its bytes may still land later. A failed transfer ends its guard with
//! `fail()`: the source room stays held until the rank's transport is torn down and the
//! decode peer fenced, so the rank never ACKs that room (the peers ACK it anyway).

use crate::arena::Arena;
use crate::config::SimConfig;
use crate::rng::Rng;
use crate::rules::RoomId;
use crate::sim::{lock, us, Msg, MsgKind, RankShared, ToRank};
use kvfence::{Config as KvConfig, RoomHandle, RoomTable, TransferGuard};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::time::{Duration, Instant};

/// The decode instance's peer id in a rank's prefill-side table (transfers go to it).
pub const DECODE_PEER: u32 = 0;

/// Per-rank counters, summed per rule.
#[derive(Clone, Copy, Debug, Default)]
pub struct RankCounters {
    /// Stale intents refused by `begin_transfer_to`.
    pub stale_refused: u64,
    /// Writes that landed after the rank saw the ABORT.
    pub late_writes_landed: u64,
    /// Writes stopped by a transport teardown.
    pub writes_flushed: u64,
    /// Prefill-side opens refused (table full): a sizing error.
    pub prefill_table_full: u64,
    /// Writes that failed.
    pub failed: u64,
    /// Failed writes whose bytes landed anyway.
    pub failed_landed: u64,
}

impl RankCounters {
    /// Adds `o`.
    pub fn add(&mut self, o: &RankCounters) {
        self.stale_refused += o.stale_refused;
        self.late_writes_landed += o.late_writes_landed;
        self.writes_flushed += o.writes_flushed;
        self.prefill_table_full += o.prefill_table_full;
        self.failed += o.failed;
        self.failed_landed += o.failed_landed;
    }
}

struct RankReq {
    room: RoomId,
    prefill: Option<RoomHandle>,
    prefill_released: bool,
    total: usize,
    landed: usize,
    queued: usize,
    inflight: usize,
    aborted: bool,
    acked: bool,
    failed: bool,
}

struct Queued {
    req: u64,
    pages: Vec<u32>,
    ready_at: Instant,
}

struct InFlight<'t> {
    req: u64,
    pages: Vec<u32>,
    land_at: Instant,
    epoch: u64,
    fails: bool,
    guard: Option<TransferGuard<'t>>,
}

/// The bytes of a failed write that still land, later.
struct Ghost {
    req: u64,
    pages: Vec<u32>,
    land_at: Instant,
    epoch: u64,
}

struct Rank<'t> {
    id: u32,
    cfg: &'t SimConfig,
    arena: &'t Arena,
    shared: &'t RankShared,
    table: Option<&'t RoomTable>,
    tx: Sender<(Instant, Msg)>,
    rng: Rng,
    inc: u64,
    queue: VecDeque<Queued>,
    inflight: Vec<InFlight<'t>>,
    ghosts: Vec<Ghost>,
    reqs: HashMap<u64, RankReq>,
    c: RankCounters,
}

impl<'t> Rank<'t> {
    fn dead(&self) -> bool {
        self.shared.dead.load(Ordering::Acquire)
    }

    fn send(&self, at: Instant, kind: MsgKind, req: u64, room: RoomId) {
        let msg = Msg {
            kind,
            req,
            room,
            rank: self.id,
        };
        let _ = self.tx.send((at, msg));
    }

    fn send_ack(&mut self, req: u64, room: RoomId, now: Instant) {
        if self.dead() || self.rng.chance(self.cfg.ack_drop) {
            return;
        }
        let mut at = now + us(self.rng.range(0, self.cfg.ack_delay_us));
        if self.rng.chance(self.cfg.ack_late) {
            at += Duration::from_millis(self.cfg.late_ms);
        }
        self.send(at, MsgKind::Ack, req, room);
        if self.rng.chance(self.cfg.ack_dup) {
            let again = at + us(self.rng.range(0, self.cfg.ack_delay_us));
            self.send(again, MsgKind::Ack, req, room);
        }
    }

    /// ACKs an aborted request once drained; forgets it once nothing refers to it.
    fn settle(&mut self, req: u64, now: Instant) {
        let Some(r) = self.reqs.get_mut(&req) else {
            return;
        };
        if !r.aborted {
            return;
        }
        let drained = if r.prefill.is_some() {
            // Checked mode: the prefill-side room's release is the ACK (docs/DESIGN.md
            // section 2). A failed transfer holds it until the rank's teardown.
            r.prefill_released
        } else {
            // The peers: a failed transfer counts as over (its bytes may still land).
            r.inflight == 0 && r.queued == 0
        };
        let room = r.room;
        let forget = r.inflight == 0 && r.queued == 0;
        if drained && !r.acked {
            r.acked = true;
            if !self.dead() {
                // The simulator's own note (not seen by any rule): from now on the room
                // waits only for the ACK itself (the held-pages cause split).
                self.send(now, MsgKind::Drained, req, room);
            }
            self.send_ack(req, room, now);
        }
        if forget && self.reqs.get(&req).is_some_and(|r| r.acked) {
            self.reqs.remove(&req);
        }
    }

    fn handle(&mut self, msg: ToRank, now: Instant) {
        match msg {
            ToRank::Intent {
                inc,
                req,
                room,
                queue_delay,
                chunks,
            } => {
                if inc != self.inc {
                    return;
                }
                let prefill = match self.table {
                    Some(t) => match t.open(&[], 1) {
                        Ok(opened) => Some(opened.handle),
                        Err(_) => {
                            self.c.prefill_table_full += 1;
                            None
                        }
                    },
                    None => None,
                };
                let total = chunks.len();
                let ready_at = now + queue_delay;
                self.queue.extend(chunks.into_iter().map(|pages| Queued {
                    req,
                    pages,
                    ready_at,
                }));
                self.reqs.insert(
                    req,
                    RankReq {
                        room,
                        prefill,
                        prefill_released: false,
                        total,
                        landed: 0,
                        queued: total,
                        inflight: 0,
                        aborted: false,
                        acked: false,
                        failed: false,
                    },
                );
            }
            ToRank::Abort { inc, req, room } => {
                if inc != self.inc {
                    return;
                }
                let Some(r) = self.reqs.get_mut(&req) else {
                    // Nothing of it here (finished, or already drained): ACK at once.
                    self.send_ack(req, room, now);
                    return;
                };
                if r.aborted {
                    return; // a re-sent ABORT while draining: the ACK follows the drain
                }
                r.aborted = true;
                // Drain: drop the queued intents, except those the drain misses.
                let (rate, rng) = (self.cfg.stale_intent_rate, &mut self.rng);
                let mut kept = 0;
                self.queue.retain(|q| {
                    let keep = q.req != req || rng.chance(rate);
                    kept += usize::from(keep && q.req == req);
                    keep
                });
                r.queued = kept;
                if let (Some(t), Some(h)) = (self.table, r.prefill) {
                    if matches!(t.abort(h), Ok(a) if a.released.is_some()) {
                        r.prefill_released = true;
                    }
                }
                self.settle(req, now);
            }
        }
    }

    fn submit(&mut self, q: Queued, now: Instant) {
        let Some(r) = self.reqs.get_mut(&q.req) else {
            return;
        };
        r.queued -= 1;
        let guard = match (self.table, r.prefill) {
            (Some(t), Some(h)) => match t.begin_transfer_to(h, DECODE_PEER) {
                Ok(g) => Some(g),
                Err(_) => {
                    // The intent is stale (its room was aborted): refused, nothing written.
                    self.c.stale_refused += 1;
                    self.settle(q.req, now);
                    return;
                }
            },
            _ => None,
        };
        r.inflight += 1;
        let land_at = now + us(self.rng.range(0, self.cfg.transfer_us));
        let fails = self.rng.chance(self.cfg.fail_rate);
        self.inflight.push(InFlight {
            req: q.req,
            pages: q.pages,
            land_at,
            epoch: self.inc,
            fails,
            guard,
        });
    }

    /// Writes `pages` for `req` if the transport of `epoch` is still up.
    fn write(&self, pages: &[u32], req: u64, epoch: u64) -> bool {
        let t = lock(&self.shared.transport);
        if t.up && t.epoch == epoch {
            for &p in pages {
                self.arena.write_page(p, req);
            }
            true
        } else {
            false
        }
    }

    fn land(&mut self, f: InFlight<'t>, now: Instant) {
        if f.fails {
            // The transfer engine reports an error; the bytes may still be posted and land
            // later (no cancel). The guard ends as failed: the source room stays held.
            self.c.failed += 1;
            let released = f.guard.and_then(TransferGuard::fail).is_some();
            if self.rng.chance(self.cfg.fail_lands) {
                let late = self
                    .rng
                    .range(0, (self.cfg.teardown().as_micros() as u64).max(1000));
                self.ghosts.push(Ghost {
                    req: f.req,
                    pages: f.pages,
                    land_at: now + us(late),
                    epoch: f.epoch,
                });
            }
            let dead = self.dead();
            let Some(r) = self.reqs.get_mut(&f.req) else {
                return;
            };
            r.inflight -= 1;
            r.failed = true;
            r.prefill_released |= released;
            let room = r.room;
            if !dead {
                self.send(now, MsgKind::Failed, f.req, room);
            }
            self.settle(f.req, now);
            return;
        }
        let landed = self.write(&f.pages, f.req, f.epoch);
        if !landed {
            self.c.writes_flushed += 1;
        }
        let released = f.guard.and_then(TransferGuard::complete).is_some();
        let Some(r) = self.reqs.get_mut(&f.req) else {
            return;
        };
        r.inflight -= 1;
        if r.aborted {
            self.c.late_writes_landed += u64::from(landed);
            r.prefill_released |= released;
            self.settle(f.req, now);
            return;
        }
        r.landed += 1;
        if r.landed == r.total && !r.failed {
            let (room, prefill) = (r.room, r.prefill);
            self.reqs.remove(&f.req);
            if let (Some(t), Some(h)) = (self.table, prefill) {
                let _ = t.finish(h);
            }
            if !self.dead() {
                self.send(now, MsgKind::Done, f.req, room);
            }
        }
    }

    /// The transport is gone (torn down, or the run is over): no write still in flight can
    /// land any more, so each of those transfers is over. Its guard is completed
    /// explicitly (dropping it would count as a failure and hold the source room until a
    /// fence or quarantine); the rooms are still owned, so nothing is released here.
    fn flush_inflight(&mut self) -> u64 {
        let n = (self.inflight.len() + self.ghosts.len()) as u64;
        for f in self.inflight.drain(..) {
            if let Some(g) = f.guard {
                let _ = g.complete();
            }
        }
        self.ghosts.clear();
        n
    }

    /// The process restarted with a new transport: everything it knew is gone.
    fn restart(&mut self, inc: u64) {
        self.c.writes_flushed += self.flush_inflight();
        self.queue.clear();
        if let Some(t) = self.table {
            for r in self.reqs.values() {
                if let Some(h) = r.prefill {
                    // Nothing in flight holds it any more: released at once (pool mode: its
                    // page is back in the source pool), unless a failed transfer holds it.
                    let _ = t.abort(h);
                }
            }
            // The old transport to the decode peer is torn down: no failed write can land
            // any more, so the rooms they held are released (fence), then the new
            // transport is admitted.
            let _ = t.fence_rank(DECODE_PEER);
            let _ = t.readmit_rank(DECODE_PEER);
            // Deliver what was released, so its page returns to the pool.
            let mut orphans = Vec::new();
            t.drain_released(&mut orphans);
        }
        self.reqs.clear();
        self.inc = inc;
    }
}

/// One prefill rank's thread: runs until `shared.stop`; returns its counters.
pub fn rank_main(
    id: u32,
    cfg: &SimConfig,
    check: bool,
    arena: &Arena,
    shared: &RankShared,
    rx: Receiver<ToRank>,
    tx: Sender<(Instant, Msg)>,
) -> RankCounters {
    let rooms = cfg.rooms * 4 + 64;
    let table = if check {
        // Pool mode: one source page per request, from the table's own pool.
        RoomTable::new(KvConfig::pool(rooms, rooms)).ok()
    } else {
        None
    };
    let mut rank = Rank {
        id,
        cfg,
        arena,
        shared,
        table: table.as_ref(),
        tx,
        rng: Rng::new(cfg.seed, 1000 + u64::from(id)),
        inc: shared.incarnation.load(Ordering::Acquire),
        queue: VecDeque::new(),
        inflight: Vec::new(),
        ghosts: Vec::new(),
        reqs: HashMap::new(),
        c: RankCounters::default(),
    };
    let stall_max_us = cfg.teardown().as_micros() as u64 * 3 / 2;
    let mut stalled = false;
    let mut held_msg: Option<ToRank> = None;
    loop {
        if shared.stop.load(Ordering::Acquire) {
            break;
        }
        let inc = shared.incarnation.load(Ordering::Acquire);
        if inc != rank.inc {
            rank.restart(inc);
            stalled = false;
        }
        let now = Instant::now();
        let dead = rank.dead();
        if dead {
            if !stalled {
                // Hung: it answers nothing and submits nothing, but what its NIC already has
                // in flight still lands, late, until the transport is torn down.
                stalled = true;
                for f in &mut rank.inflight {
                    f.land_at = now + us(rank.rng.range(0, stall_max_us));
                }
            }
        } else {
            loop {
                let msg = match held_msg.take() {
                    Some(m) => m,
                    None => match rx.try_recv() {
                        Ok(m) => m,
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => {
                            let _ = rank.flush_inflight();
                            return rank.c;
                        }
                    },
                };
                rank.handle(msg, now);
            }
            while rank.inflight.len() < cfg.max_inflight
                && rank.queue.front().is_some_and(|q| q.ready_at <= now)
            {
                if let Some(q) = rank.queue.pop_front() {
                    rank.submit(q, now);
                }
            }
        }
        let mut i = 0;
        while i < rank.inflight.len() {
            if rank.inflight[i].land_at <= now {
                let f = rank.inflight.swap_remove(i);
                rank.land(f, now);
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < rank.ghosts.len() {
            if rank.ghosts[i].land_at <= now {
                let g = rank.ghosts.swap_remove(i);
                if rank.write(&g.pages, g.req, g.epoch) {
                    rank.c.failed_landed += 1;
                } else {
                    rank.c.writes_flushed += 1;
                }
            } else {
                i += 1;
            }
        }
        // Sleep until the next thing to do (or a message).
        let mut next = now + Duration::from_millis(if dead { 1 } else { 20 });
        if !dead && rank.inflight.len() < cfg.max_inflight {
            if let Some(q) = rank.queue.front() {
                next = next.min(q.ready_at);
            }
        }
        for f in &rank.inflight {
            next = next.min(f.land_at);
        }
        for g in &rank.ghosts {
            next = next.min(g.land_at);
        }
        let wait = next.saturating_duration_since(Instant::now());
        if wait.is_zero() {
            continue;
        }
        if dead {
            std::thread::sleep(wait);
        } else {
            match rx.recv_timeout(wait) {
                Ok(m) => held_msg = Some(m),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
    }
    // The run is over: what is still in flight never lands; end those transfers.
    let _ = rank.flush_inflight();
    rank.c
}
