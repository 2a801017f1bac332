//! The simulation: real threads writing real bytes.
//!
//! * P prefill rank threads, each with a transfer queue (intents wait a queueing delay, then
//!   are submitted; at most `max_inflight` chunks are in flight; a chunk lands after its
//!   transfer delay by being written into the decode arena: the one-sided write).
//! * One decode scheduler thread: opens rooms under the release rule, sends each rank its
//!   share of the request's pages, aborts some requests (random aborts and a waiting
//!   timeout), finishes the others after a decode delay and verifies every page of them.
//!   Under `kvfence` the arena's allocator is the engine's and the decode-side table gates
//!   it (gate mode): releases are decided by ACKs and fences, queued, and each loop the
//!   scheduler drains the release queue before it frees pages and opens new requests.
//! * The abort protocol: decode sends ABORT to the fan-out ranks; a rank drains (drops its
//!   queued intents for that request, waits for its in-flight writes), then sends
//!   ABORT_ACK, which decode feeds to the rule. A fraction of queued intents slips past the
//!   drain and is still submitted (the bug variant). Under `kvfence` each rank also keeps a
//!   prefill-side [`RoomTable`] and calls `begin_transfer` before every write, so a slipped
//!   intent is refused; with `--no-prefill-check` it is written anyway, into pages that the
//!   decode side still holds.
//! * Faults: ACKs delayed, dropped (decode re-sends ABORT), duplicated, late. A rank dies
//!   (stops answering; its in-flight writes stall and land late); after a grace period its
//!   transport is torn down (no write of the old incarnation lands afterwards), the rule
//!   handles it (`kvfence`: `fence_rank`), and the rank restarts with a new transport.

use crate::arena::Arena;
use crate::config::{RuleKind, SimConfig};
use crate::rng::Rng;
use crate::rules::{self, AckOutcome, RoomId, Rule, Usage};
use kvfence::{Config as KvConfig, RoomHandle, RoomTable, TransferGuard};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

fn us(v: u64) -> Duration {
    Duration::from_micros(v)
}

/// Decode -> prefill rank.
enum ToRank {
    Intent {
        inc: u64,
        req: u64,
        room: RoomId,
        queue_delay: Duration,
        chunks: Vec<Vec<u32>>,
    },
    Abort {
        inc: u64,
        req: u64,
        room: RoomId,
    },
}

/// Prefill rank -> decode: transfer done (`ack == false`) or ABORT_ACK.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Msg {
    ack: bool,
    req: u64,
    room: RoomId,
    rank: u32,
}

/// The rank's transport to the decode arena (a queue pair): a write lands only while it is
/// up and of the same epoch (incarnation) as the write.
struct Transport {
    epoch: u64,
    up: bool,
}

struct RankShared {
    dead: AtomicBool,
    stop: AtomicBool,
    incarnation: AtomicU64,
    transport: Mutex<Transport>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Per-rank counters, summed per rule.
#[derive(Clone, Copy, Debug, Default)]
struct RankCounters {
    stale_refused: u64,
    late_writes_landed: u64,
    writes_flushed: u64,
    prefill_table_full: u64,
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
    guard: Option<TransferGuard<'t>>,
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
    reqs: HashMap<u64, RankReq>,
    c: RankCounters,
}

impl<'t> Rank<'t> {
    fn dead(&self) -> bool {
        self.shared.dead.load(Ordering::Acquire)
    }

    fn send(&self, at: Instant, msg: Msg) {
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
        let msg = Msg {
            ack: true,
            req,
            room,
            rank: self.id,
        };
        self.send(at, msg);
        if self.rng.chance(self.cfg.ack_dup) {
            let again = at + us(self.rng.range(0, self.cfg.ack_delay_us));
            self.send(again, msg);
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
            // Checked mode: the prefill-side room's release is the ACK (docs/DESIGN.md section 2).
            r.prefill_released
        } else {
            r.inflight == 0 && r.queued == 0
        };
        let room = r.room;
        let forget = r.inflight == 0 && r.queued == 0;
        if drained && !r.acked {
            r.acked = true;
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
            (Some(t), Some(h)) => match t.begin_transfer(h) {
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
        self.inflight.push(InFlight {
            req: q.req,
            pages: q.pages,
            land_at,
            epoch: self.inc,
            guard,
        });
    }

    fn land(&mut self, f: InFlight<'t>, now: Instant) {
        let landed = {
            let t = lock(&self.shared.transport);
            if t.up && t.epoch == f.epoch {
                for &p in &f.pages {
                    self.arena.write_page(p, f.req);
                }
                true
            } else {
                false
            }
        };
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
        if r.landed == r.total {
            let (room, prefill) = (r.room, r.prefill);
            self.reqs.remove(&f.req);
            if let (Some(t), Some(h)) = (self.table, prefill) {
                let _ = t.finish(h);
            }
            if !self.dead() {
                let msg = Msg {
                    ack: false,
                    req: f.req,
                    room,
                    rank: self.id,
                };
                self.send(now, msg);
            }
        }
    }

    /// The transport is gone (torn down, or the run is over): no write still in flight can
    /// land any more, so each of those transfers is over. Its guard is completed
    /// explicitly (dropping it would count as a failure and hold the source room until a
    /// fence or quarantine); the rooms are still owned, so nothing is released here.
    fn flush_inflight(&mut self) -> u64 {
        let n = self.inflight.len() as u64;
        for f in self.inflight.drain(..) {
            if let Some(g) = f.guard {
                let _ = g.complete();
            }
        }
        n
    }

    /// The process restarted with a new transport: everything it knew is gone.
    fn restart(&mut self, inc: u64) {
        self.c.writes_flushed += self.flush_inflight();
        self.queue.clear();
        if let Some(t) = self.table {
            for r in self.reqs.values() {
                if let Some(h) = r.prefill {
                    // Nothing holds it any more: released at once (pool mode: its page
                    // is back in the source pool).
                    let _ = t.abort(h);
                }
            }
            // Nothing should have been queued (no guard was dropped); deliver anything that
            // was, so its page returns to the pool.
            let mut orphans = Vec::new();
            t.drain_released(&mut orphans);
        }
        self.reqs.clear();
        self.inc = inc;
    }
}

fn rank_main(
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
        reqs: HashMap::new(),
        c: RankCounters::default(),
    };
    let stall_max_us = cfg.teardown_ms * 1500;
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

/// One sample of page occupancy.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// Milliseconds since the rule's run started.
    pub t_ms: f64,
    /// Occupancy.
    pub usage: Usage,
}

/// What one rule's run measured.
#[derive(Clone, Debug)]
pub struct RuleResult {
    /// Rule name.
    pub rule: &'static str,
    /// Requests whose KV arrived, verified and finished.
    pub completed: u64,
    /// Requests aborted (random abort, waiting timeout, dead rank).
    pub aborted: u64,
    /// Completed requests with at least one page not holding their own bytes.
    pub corrupted_requests: u64,
    /// Pages of completed requests not holding their own bytes.
    pub corrupted_pages: u64,
    /// Stale intents refused by the prefill-side `begin_transfer` (kvfence only).
    pub stale_refused: u64,
    /// ACKs ignored: late (their room already released), duplicate or stale.
    pub late_acks_ignored: u64,
    /// ACKs counted toward a request other than the one they were sent for.
    pub acks_misapplied: u64,
    /// Writes that landed after their rank had seen the ABORT.
    pub late_writes_landed: u64,
    /// Writes that never landed because their rank's transport was torn down.
    pub writes_flushed: u64,
    /// Rank deaths.
    pub deaths: u64,
    /// Pages held awaiting drain: max over samples.
    pub held_max: usize,
    /// Pages held awaiting drain: mean over samples.
    pub held_mean: f64,
    /// Abort-to-release latency, median, ms.
    pub release_p50_ms: f64,
    /// Abort-to-release latency, 99th percentile, ms.
    pub release_p99_ms: f64,
    /// Completed requests per second of arrivals.
    pub throughput_rps: f64,
    /// Wall time of the run (arrivals and drain), s.
    pub wall_s: f64,
    /// End-of-run conservation check.
    pub conservation: Result<(), String>,
    /// Occupancy over time.
    pub samples: Vec<Sample>,
}

struct Live {
    room: RoomId,
    pages: Vec<u32>,
    pending: Vec<u32>,
    transferred: bool,
}

struct Closing {
    req: u64,
    at: Instant,
    pending: Vec<u32>,
    next_retry: Instant,
}

const T_ABORT: u8 = 0;
const T_DEADLINE: u8 = 1;
const T_FINISH: u8 = 2;

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64 / 1000.0
}

/// The progress line (stderr, only on a terminal).
pub struct Progress {
    on: bool,
    label: String,
}

impl Progress {
    /// A progress line, shown if `want` and stderr is a terminal.
    pub fn new(want: bool) -> Progress {
        Progress {
            on: want && std::io::stderr().is_terminal(),
            label: String::new(),
        }
    }

    /// Sets the label (which rule, which round).
    pub fn label(&mut self, label: String) {
        self.label = label;
    }

    fn show(&self, frac: f64, completed: u64, aborted: u64, corrupted: u64) {
        if !self.on {
            return;
        }
        let width = 30;
        let filled = ((frac.clamp(0.0, 1.0)) * width as f64) as usize;
        eprint!(
            "\r{:<18} [{}{}] {:3.0}%  {completed} completed, {aborted} aborted, {corrupted} corrupted   ",
            self.label,
            "#".repeat(filled),
            ".".repeat(width - filled),
            frac * 100.0
        );
        let _ = std::io::stderr().flush();
    }

    /// Clears the line.
    pub fn clear(&self) {
        if self.on {
            eprint!("\r{:<110}\r", "");
            let _ = std::io::stderr().flush();
        }
    }
}

/// Decode-side state of one run.
struct Decode<'a> {
    cfg: &'a SimConfig,
    rule: Box<dyn Rule>,
    arena: &'a Arena,
    shared: &'a [Arc<RankShared>],
    to_rank: Vec<Sender<ToRank>>,
    rng: Rng,
    live: HashMap<u64, Live>,
    closing: HashMap<RoomId, Closing>,
    timers: BinaryHeap<Reverse<(Instant, u8, u64)>>,
    latencies_us: Vec<u64>,
    opening: bool,
    completed: u64,
    completed_open: u64,
    aborted: u64,
    corrupted_requests: u64,
    corrupted_pages: u64,
    late_acks_ignored: u64,
    acks_misapplied: u64,
    /// Ranks that let a request hit its waiting timeout: no new requests go to them until
    /// their transport is torn down and they reconnect (a health check would do the same).
    suspect: Vec<bool>,
}

impl Decode<'_> {
    fn send(&self, rank: u32, msg: ToRank) {
        let _ = self.to_rank[rank as usize].send(msg);
    }

    fn inc(&self, rank: u32) -> u64 {
        self.shared[rank as usize]
            .incarnation
            .load(Ordering::Acquire)
    }

    fn released(&mut self, room: RoomId, now: Instant) {
        if let Some(c) = self.closing.remove(&room) {
            self.latencies_us
                .push(now.duration_since(c.at).as_micros() as u64);
        }
    }

    fn open_one(&mut self, pages: usize, now: Instant) -> Result<bool, String> {
        let p = self.cfg.prefill_ranks;
        let k = self.cfg.fan_in.min(pages);
        // K distinct healthy ranks, uniformly (partial Fisher-Yates).
        let mut all: Vec<u32> = (0..p as u32)
            .filter(|&r| !self.suspect[r as usize])
            .collect();
        let p = all.len();
        if p < k {
            return Ok(false);
        }
        for i in 0..k {
            let j = i + self.rng.below((p - i) as u64) as usize;
            all.swap(i, j);
        }
        all.truncate(k);
        let ranks = all;
        let Some((room, list)) = self.rule.open(pages, &ranks)? else {
            return Ok(false);
        };
        let req = self.rng.next_u64() | 1;
        for (i, &rank) in ranks.iter().enumerate() {
            let mine: Vec<u32> = list.iter().skip(i).step_by(k).copied().collect();
            let chunks = mine
                .chunks(self.cfg.chunk_pages)
                .map(<[u32]>::to_vec)
                .collect();
            let queue_delay = us(self.rng.range(0, self.cfg.queue_us));
            let inc = self.inc(rank);
            self.send(
                rank,
                ToRank::Intent {
                    inc,
                    req,
                    room,
                    queue_delay,
                    chunks,
                },
            );
        }
        if self.rng.chance(self.cfg.abort_rate) {
            let span = self.cfg.queue_us + 2 * self.cfg.transfer_us;
            let at = now + us(self.rng.range(0, span));
            self.timers.push(Reverse((at, T_ABORT, req)));
        }
        let deadline = now + Duration::from_millis(self.cfg.wait_timeout_ms);
        self.timers.push(Reverse((deadline, T_DEADLINE, req)));
        self.live.insert(
            req,
            Live {
                room,
                pages: list,
                pending: ranks,
                transferred: false,
            },
        );
        Ok(true)
    }

    fn abort(&mut self, req: u64, now: Instant) {
        let Some(l) = self.live.remove(&req) else {
            return;
        };
        self.aborted += 1;
        let (fanout, released) = self.rule.abort(l.room, &l.pending, now);
        for &rank in &fanout {
            let inc = self.inc(rank);
            self.send(
                rank,
                ToRank::Abort {
                    inc,
                    req,
                    room: l.room,
                },
            );
        }
        if released {
            self.latencies_us.push(0);
        } else {
            let retry = now + Duration::from_millis(self.cfg.abort_retry_ms);
            self.closing.insert(
                l.room,
                Closing {
                    req,
                    at: now,
                    pending: fanout,
                    next_retry: retry,
                },
            );
        }
    }

    fn finish(&mut self, req: u64) {
        let Some(l) = self.live.remove(&req) else {
            return;
        };
        let bad = l
            .pages
            .iter()
            .filter(|&&p| !self.arena.verify_page(p, req))
            .count() as u64;
        self.completed += 1;
        if self.opening {
            self.completed_open += 1;
        }
        if bad > 0 {
            self.corrupted_requests += 1;
            self.corrupted_pages += bad;
        }
        // Every rank reported done, so this releases at once under every rule.
        let _ = self.rule.finish(l.room);
    }

    fn on_msg(&mut self, m: Msg, now: Instant) {
        // It answered: it is alive (a dead rank is suspected again at the next timeout).
        self.suspect[m.rank as usize] = false;
        if !m.ack {
            if let Some(l) = self.live.get_mut(&m.req) {
                if let Some(i) = l.pending.iter().position(|&r| r == m.rank) {
                    l.pending.swap_remove(i);
                    self.rule.done(l.room, m.rank);
                    if l.pending.is_empty() && !l.transferred {
                        l.transferred = true;
                        let at = now + us(self.cfg.decode_us);
                        self.timers.push(Reverse((at, T_FINISH, m.req)));
                    }
                }
                return;
            }
            // "Done" after the abort: the same fact as an ACK (this rank writes no more).
        }
        let outcome = self.rule.ack(m.room, m.rank);
        if !self.rule.waits_for_acks() {
            return;
        }
        match outcome {
            AckOutcome::Ignored => self.late_acks_ignored += 1,
            // `Queued`: released, delivered by the scheduler loop's next drain.
            AckOutcome::Recorded | AckOutcome::Released | AckOutcome::Queued => {
                if let Some(c) = self.closing.get_mut(&m.room) {
                    if c.req != m.req {
                        self.acks_misapplied += 1;
                    }
                    c.pending.retain(|&r| r != m.rank);
                } else {
                    self.acks_misapplied += 1;
                }
                if outcome == AckOutcome::Released {
                    self.released(m.room, now);
                }
            }
        }
    }

    /// The dead rank's transport is torn down; the rule handles it; the rank restarts.
    fn teardown(&mut self, rank: u32, now: Instant) {
        let shared = &self.shared[rank as usize];
        lock(&shared.transport).up = false;
        for room in self.rule.rank_torn_down(rank) {
            self.released(room, now);
        }
        for c in self.closing.values_mut() {
            c.pending.retain(|&r| r != rank);
        }
        // Requests still waiting on the dead rank can never complete: abort them.
        let waiting: Vec<u64> = self
            .live
            .iter_mut()
            .filter(|(_, l)| !l.transferred && l.pending.contains(&rank))
            .map(|(&req, l)| {
                l.pending.retain(|&r| r != rank);
                req
            })
            .collect();
        for req in waiting {
            self.abort(req, now);
        }
        // The rank reconnects: a new transport epoch, a fresh process.
        self.rule.rank_readmitted(rank);
        self.suspect[rank as usize] = false;
        let inc = shared.incarnation.load(Ordering::Acquire) + 1;
        {
            let mut t = lock(&shared.transport);
            t.epoch = inc;
            t.up = true;
        }
        shared.incarnation.store(inc, Ordering::Release);
        shared.dead.store(false, Ordering::Release);
    }
}

/// Runs one rule. `Err` only for a setup failure (thread spawn, table construction).
pub fn run_rule(
    cfg: &SimConfig,
    kind: RuleKind,
    progress: &Progress,
) -> Result<RuleResult, String> {
    let arena = Arena::new(cfg.pages, cfg.page_bytes);
    let rule = rules::make(kind, cfg.pages, cfg.rooms, cfg.prefill_ranks, cfg.timeout())?;
    let check = kind == RuleKind::Kvfence && cfg.prefill_check;
    let shared: Vec<Arc<RankShared>> = (0..cfg.prefill_ranks)
        .map(|_| {
            Arc::new(RankShared {
                dead: AtomicBool::new(false),
                stop: AtomicBool::new(false),
                incarnation: AtomicU64::new(0),
                transport: Mutex::new(Transport { epoch: 0, up: true }),
            })
        })
        .collect();
    let (to_decode, from_ranks) = mpsc::channel::<(Instant, Msg)>();

    std::thread::scope(|scope| -> Result<RuleResult, String> {
        let mut to_rank = Vec::new();
        let mut handles = Vec::new();
        for id in 0..cfg.prefill_ranks as u32 {
            let (tx, rx) = mpsc::channel();
            to_rank.push(tx);
            let (arena, sh, tx_d) = (&arena, &*shared[id as usize], to_decode.clone());
            let handle = std::thread::Builder::new()
                .name(format!("prefill-{id}"))
                .spawn_scoped(scope, move || {
                    rank_main(id, cfg, check, arena, sh, rx, tx_d)
                })
                .map_err(|e| format!("cannot start a prefill thread: {e}"))?;
            handles.push(handle);
        }
        drop(to_decode);
        let mut d = Decode {
            cfg,
            rule,
            arena: &arena,
            shared: &shared,
            to_rank,
            rng: Rng::new(cfg.seed, 7),
            live: HashMap::new(),
            closing: HashMap::new(),
            timers: BinaryHeap::new(),
            latencies_us: Vec::new(),
            opening: true,
            completed: 0,
            completed_open: 0,
            aborted: 0,
            corrupted_requests: 0,
            corrupted_pages: 0,
            late_acks_ignored: 0,
            acks_misapplied: 0,
            suspect: vec![false; cfg.prefill_ranks],
        };
        let result = decode_loop(&mut d, &from_ranks, kind, progress);
        for s in &shared {
            s.stop.store(true, Ordering::Release);
        }
        d.to_rank.clear();
        let mut rc = RankCounters::default();
        for h in handles {
            let c = h
                .join()
                .map_err(|_| "a prefill thread panicked".to_string())?;
            rc.stale_refused += c.stale_refused;
            rc.late_writes_landed += c.late_writes_landed;
            rc.writes_flushed += c.writes_flushed;
            rc.prefill_table_full += c.prefill_table_full;
        }
        let mut r = result?;
        r.stale_refused = rc.stale_refused;
        r.late_writes_landed = rc.late_writes_landed;
        r.writes_flushed = rc.writes_flushed;
        if rc.prefill_table_full > 0 && r.conservation.is_ok() {
            r.conservation = Err(format!(
                "{} prefill-side opens failed (table full)",
                rc.prefill_table_full
            ));
        }
        Ok(r)
    })
    .map(|mut r| {
        r.rule = kind.name();
        r
    })
}

fn decode_loop(
    d: &mut Decode<'_>,
    from: &Receiver<(Instant, Msg)>,
    kind: RuleKind,
    progress: &Progress,
) -> Result<RuleResult, String> {
    let cfg = d.cfg;
    let tick = Duration::from_millis(1);
    let sample_every = Duration::from_millis(10);
    let start = Instant::now();
    let open_for = Duration::from_secs_f64(cfg.seconds);
    let open_until = start + open_for;
    let hard_end = open_until + Duration::from_secs(5) + Duration::from_millis(cfg.teardown_ms * 2);
    let period = Duration::from_millis(cfg.death_period_ms);
    let mut next_death = (cfg.death_period_ms > 0).then(|| start + period);
    let mut death_idx = 0u32;
    let mut deaths = 0;
    let mut teardown: Option<(Instant, u32)> = None;
    let mut msgs: BinaryHeap<Reverse<(Instant, u64, Msg)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let (mut next_tick, mut next_sample, mut next_progress) = (start, start, start);
    let mut samples = Vec::new();
    let mut want_pages: Option<usize> = None;
    let mut disconnected = false;
    let mut drained = false;
    loop {
        let now = Instant::now();
        if d.opening && now >= open_until {
            d.opening = false;
        }
        loop {
            match from.try_recv() {
                Ok((at, m)) => {
                    seq += 1;
                    msgs.push(Reverse((at, seq, m)));
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    disconnected = true;
                    break;
                }
            }
        }
        while msgs.peek().is_some_and(|Reverse((at, _, _))| *at <= now) {
            if let Some(Reverse((_, _, m))) = msgs.pop() {
                d.on_msg(m, now);
            }
        }
        while d
            .timers
            .peek()
            .is_some_and(|Reverse((at, _, _))| *at <= now)
        {
            let Some(Reverse((_, kind, req))) = d.timers.pop() else {
                break;
            };
            match kind {
                T_FINISH => d.finish(req),
                _ => {
                    if let Some(l) = d.live.get(&req).filter(|l| !l.transferred) {
                        if kind == T_DEADLINE {
                            for &r in &l.pending {
                                d.suspect[r as usize] = true;
                            }
                        }
                        d.abort(req, now);
                    }
                }
            }
        }
        if now >= next_tick {
            next_tick = now + tick;
            for room in d.rule.tick(now) {
                d.released(room, now);
            }
            if d.rule.waits_for_acks() {
                let retry = Duration::from_millis(cfg.abort_retry_ms);
                let mut resend = Vec::new();
                for (&room, c) in d.closing.iter_mut() {
                    if c.next_retry <= now {
                        c.next_retry = now + retry;
                        resend.extend(c.pending.iter().map(|&r| (r, c.req, room)));
                    }
                }
                for (rank, req, room) in resend {
                    let inc = d.inc(rank);
                    d.send(rank, ToRank::Abort { inc, req, room });
                }
            }
            if let Some(at) = next_death {
                if d.opening && now >= at && teardown.is_none() {
                    let victim = death_idx % cfg.prefill_ranks as u32;
                    death_idx += 1;
                    deaths += 1;
                    d.shared[victim as usize]
                        .dead
                        .store(true, Ordering::Release);
                    teardown = Some((now + Duration::from_millis(cfg.teardown_ms), victim));
                    next_death = Some(at + period);
                }
            }
            if let Some((at, victim)) = teardown {
                if now >= at {
                    teardown = None;
                    d.teardown(victim, now);
                }
            }
        }
        if now >= next_sample {
            next_sample = now + sample_every;
            samples.push(Sample {
                t_ms: now.duration_since(start).as_secs_f64() * 1000.0,
                usage: d.rule.usage(),
            });
        }
        if now >= next_progress {
            next_progress = now + Duration::from_millis(200);
            let frac = now.duration_since(start).as_secs_f64() / open_for.as_secs_f64();
            progress.show(frac, d.completed, d.aborted, d.corrupted_requests);
        }
        // Releases decided elsewhere (queued): only now are their pages freed, and only
        // then can a new request get them.
        for room in d.rule.drain() {
            d.released(room, now);
        }
        if d.opening {
            while d.live.len() < cfg.rooms {
                let pages = match want_pages {
                    Some(p) => p,
                    None => d.rng.range(cfg.min_pages as u64, cfg.max_pages as u64) as usize,
                };
                if d.open_one(pages, now)? {
                    want_pages = None;
                } else {
                    want_pages = Some(pages);
                    break;
                }
            }
        } else if d.live.is_empty() && d.closing.is_empty() && teardown.is_none() {
            drained = true;
            break;
        }
        if now >= hard_end || disconnected {
            break;
        }
        let mut next = next_tick.min(next_sample);
        if let Some(Reverse((at, _, _))) = msgs.peek() {
            next = next.min(*at);
        }
        if let Some(Reverse((at, _, _))) = d.timers.peek() {
            next = next.min(*at);
        }
        let wait = next.saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            match from.recv_timeout(wait) {
                Ok((at, m)) => {
                    seq += 1;
                    msgs.push(Reverse((at, seq, m)));
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => disconnected = true,
            }
        }
    }
    let wall = start.elapsed();
    samples.push(Sample {
        t_ms: wall.as_secs_f64() * 1000.0,
        usage: d.rule.usage(),
    });
    let conservation = if drained {
        d.rule.conservation()
    } else {
        Err(format!(
            "did not drain: {} live and {} closing requests after the drain deadline ({})",
            d.live.len(),
            d.closing.len(),
            d.rule
                .conservation()
                .err()
                .unwrap_or_else(|| "pages all free".into())
        ))
    };
    let mut lat = std::mem::take(&mut d.latencies_us);
    lat.sort_unstable();
    let held: Vec<usize> = samples.iter().map(|s| s.usage.held).collect();
    Ok(RuleResult {
        rule: kind.name(),
        completed: d.completed,
        aborted: d.aborted,
        corrupted_requests: d.corrupted_requests,
        corrupted_pages: d.corrupted_pages,
        stale_refused: 0,
        late_acks_ignored: d.late_acks_ignored,
        acks_misapplied: d.acks_misapplied,
        late_writes_landed: 0,
        writes_flushed: 0,
        deaths,
        held_max: held.iter().copied().max().unwrap_or(0),
        held_mean: held.iter().sum::<usize>() as f64 / held.len().max(1) as f64,
        release_p50_ms: percentile(&lat, 0.5),
        release_p99_ms: percentile(&lat, 0.99),
        throughput_rps: d.completed_open as f64 / open_for.as_secs_f64(),
        wall_s: wall.as_secs_f64(),
        conservation,
        samples,
    })
}
