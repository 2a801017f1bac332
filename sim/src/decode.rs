//! The decode scheduler thread: opens rooms under the release rule, sends each rank its
//! share of the request's pages, aborts some requests (random aborts, a waiting timeout, a
//! dead rank, a failed transfer), finishes the others after a decode delay and verifies
//! every page of them. Under `kvfence` the arena's allocator is the engine's and the
//! decode-side table gates it (gate mode): releases are decided by ACKs and fences, queued,
//! and each loop the scheduler drains the release queue before it frees pages and opens new
//! requests.
//!
//! Rank deaths: a rank hangs; the engine's failure detector declares it dead after
//! `detect` (the rules that trust the detector free its rooms then, as SGLang does); its
//! transport is torn down at `cfg.teardown()` after the death (kvfence fences it then); it
//! restarts.
//! Failed transfers: the request is aborted; a room still held by a failed transfer after
//! `quarantine_ms` is quarantined: its pages leave circulation until every rank it waited
//! on has been torn down.

use crate::arena::Arena;
use crate::config::{RuleKind, SimConfig};
use crate::progress::Progress;
use crate::result::{percentile, HeldCauses, MeanMax, RuleResult, Sample};
use crate::rng::Rng;
use crate::rules::{AckOutcome, RoomId, Rule};
use crate::sim::{lock, us, Msg, MsgKind, RankShared, ToRank};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    pages: Vec<u32>,
    /// Ranks known (to the simulator, not the rule) to have drained the room.
    drained: Vec<u32>,
    /// Ranks whose write into the room failed.
    failed: Vec<u32>,
    /// Quarantined: on release its pages go to the quarantine list, not the free list.
    /// The ranks it waited on then, with their teardown counts.
    quarantine: Option<Vec<(u32, u64)>>,
}

/// Pages out of circulation until each listed rank has been torn down again.
struct Quarantined {
    pages: Vec<u32>,
    ranks: Vec<(u32, u64)>,
}

const T_ABORT: u8 = 0;
const T_DEADLINE: u8 = 1;
const T_FINISH: u8 = 2;

/// Decode-side state of one run.
pub struct Decode<'a> {
    cfg: &'a SimConfig,
    kind: RuleKind,
    rule: Box<dyn Rule>,
    arena: &'a Arena,
    shared: &'a [Arc<RankShared>],
    /// Channels to the rank threads (cleared at the end to let them exit).
    pub to_rank: Vec<Sender<ToRank>>,
    rng: Rng,
    live: HashMap<u64, Live>,
    closing: HashMap<RoomId, Closing>,
    timers: BinaryHeap<Reverse<(Instant, u8, u64)>>,
    quarantine_timers: BinaryHeap<Reverse<(Instant, RoomId, u64)>>,
    quarantined: Vec<Quarantined>,
    teardowns: Vec<u64>,
    latencies_us: Vec<u64>,
    opening: bool,
    opened: u64,
    completed: u64,
    completed_open: u64,
    aborted: u64,
    corrupted_requests: u64,
    corrupted_pages: u64,
    late_acks_ignored: u64,
    acks_misapplied: u64,
    quarantined_rooms: u64,
    pages_reclaimed: u64,
    /// Ranks that let a request hit its waiting timeout or were declared dead: no new
    /// requests go to them until their transport is torn down and they reconnect.
    suspect: Vec<bool>,
}

impl<'a> Decode<'a> {
    /// Decode state for rule `kind`.
    pub fn new(
        cfg: &'a SimConfig,
        kind: RuleKind,
        rule: Box<dyn Rule>,
        arena: &'a Arena,
        shared: &'a [Arc<RankShared>],
        to_rank: Vec<Sender<ToRank>>,
    ) -> Decode<'a> {
        Decode {
            cfg,
            kind,
            rule,
            arena,
            shared,
            to_rank,
            rng: Rng::new(cfg.seed, 7),
            live: HashMap::new(),
            closing: HashMap::new(),
            timers: BinaryHeap::new(),
            quarantine_timers: BinaryHeap::new(),
            quarantined: Vec::new(),
            teardowns: vec![0; cfg.prefill_ranks],
            latencies_us: Vec::new(),
            opening: true,
            opened: 0,
            completed: 0,
            completed_open: 0,
            aborted: 0,
            corrupted_requests: 0,
            corrupted_pages: 0,
            late_acks_ignored: 0,
            acks_misapplied: 0,
            quarantined_rooms: 0,
            pages_reclaimed: 0,
            suspect: vec![false; cfg.prefill_ranks],
        }
    }

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
            match c.quarantine {
                Some(ranks) => self.quarantined.push(Quarantined {
                    pages: c.pages,
                    ranks,
                }),
                None => self
                    .latencies_us
                    .push(now.duration_since(c.at).as_micros() as u64),
            }
        }
    }

    /// Hands back quarantined pages whose ranks have all been torn down since.
    fn reclaim(&mut self, all: bool) {
        let teardowns = &self.teardowns;
        let (done, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.quarantined)
            .into_iter()
            .partition(|q| all || q.ranks.iter().all(|&(r, n)| teardowns[r as usize] > n));
        self.quarantined = keep;
        for q in done {
            self.pages_reclaimed += q.pages.len() as u64;
            self.rule.reclaim(&q.pages);
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
        self.opened += 1;
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
                    pages: l.pages,
                    drained: Vec::new(),
                    failed: Vec::new(),
                    quarantine: None,
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
        match m.kind {
            MsgKind::Drained => {
                if let Some(c) = self.closing.get_mut(&m.room).filter(|c| c.req == m.req) {
                    c.drained.push(m.rank);
                }
                return;
            }
            MsgKind::Failed => {
                // The request cannot complete: abort it (its other ranks get ABORT).
                if self.live.get(&m.req).is_some_and(|l| !l.transferred) {
                    self.abort(m.req, now);
                }
                let Some(c) = self.closing.get_mut(&m.room).filter(|c| c.req == m.req) else {
                    return;
                };
                c.failed.push(m.rank);
                let at = now + Duration::from_millis(self.cfg.quarantine_ms);
                self.quarantine_timers.push(Reverse((at, m.room, m.req)));
                if self.kind.trusts_detector() {
                    c.pending.retain(|&r| r != m.rank);
                }
                for room in self.rule.transfer_failed(m.room, m.rank) {
                    self.released(room, now);
                }
                return;
            }
            MsgKind::Done | MsgKind::Ack => {}
        }
        // It answered: it is alive (a dead rank is suspected again at the next timeout).
        if !self.shared[m.rank as usize].dead.load(Ordering::Acquire) {
            self.suspect[m.rank as usize] = false;
        }
        if m.kind == MsgKind::Done {
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

    /// Aborts the live requests still waiting on `rank`: they can never complete.
    fn abort_waiting_on(&mut self, rank: u32, now: Instant) {
        let waiting: Vec<u64> = self
            .live
            .iter()
            .filter(|(_, l)| !l.transferred && l.pending.contains(&rank))
            .map(|(&req, _)| req)
            .collect();
        for req in waiting {
            self.abort(req, now);
        }
    }

    /// The failure detector declares `rank` dead (its transport may still be up).
    fn detect(&mut self, rank: u32, now: Instant) {
        self.suspect[rank as usize] = true;
        self.abort_waiting_on(rank, now);
        for room in self.rule.rank_detected(rank) {
            self.released(room, now);
        }
        if self.kind.trusts_detector() {
            for c in self.closing.values_mut() {
                c.pending.retain(|&r| r != rank);
            }
        }
    }

    /// A closing room still held by a failed transfer is quarantined.
    fn quarantine(&mut self, room: RoomId, req: u64, now: Instant) {
        let Some(c) = self.closing.get_mut(&room).filter(|c| c.req == req) else {
            return;
        };
        if c.quarantine.is_some() {
            return;
        }
        let mut ranks: Vec<u32> = c.pending.iter().chain(&c.failed).copied().collect();
        ranks.sort_unstable();
        ranks.dedup();
        c.quarantine = Some(
            ranks
                .into_iter()
                .map(|r| (r, self.teardowns[r as usize]))
                .collect(),
        );
        self.quarantined_rooms += 1;
        if self.rule.quarantine(room) {
            self.released(room, now);
        }
    }

    /// The dead rank's transport is torn down; the rule handles it; the rank restarts.
    fn teardown(&mut self, rank: u32, now: Instant) {
        let shared = &self.shared[rank as usize];
        lock(&shared.transport).up = false;
        self.teardowns[rank as usize] += 1;
        for room in self.rule.rank_torn_down(rank) {
            self.released(room, now);
        }
        for c in self.closing.values_mut() {
            c.pending.retain(|&r| r != rank);
        }
        self.abort_waiting_on(rank, now);
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
        self.reclaim(false);
    }

    /// Held pages by cause, from the rule's own view of closing rooms where it has one.
    fn causes(&self) -> HeldCauses {
        let mut h = HeldCauses::default();
        let dead = |r: &u32| self.shared[*r as usize].dead.load(Ordering::Acquire);
        let mut add = |c: Option<&Closing>, waiting: &[u32], pages: usize| {
            let failed = c.is_some_and(|c| !c.failed.is_empty());
            let drained = |r: &u32| c.is_some_and(|c| c.drained.contains(r));
            if waiting.iter().any(dead) {
                h.dead_rank += pages;
            } else if failed {
                h.failed += pages;
            } else if waiting.iter().any(|r| !drained(r)) {
                h.in_flight += pages;
            } else {
                h.slow_ack += pages;
            }
        };
        match self.rule.waiting() {
            Some(rooms) => {
                for (room, waiting, pages) in rooms {
                    add(self.closing.get(&room), &waiting, pages);
                }
            }
            None => {
                for c in self.closing.values() {
                    add(Some(c), &c.pending, c.pages.len());
                }
            }
        }
        h
    }
}

/// Runs the decode scheduler until the arrivals end and everything drained (or a deadline).
pub fn decode_loop(
    d: &mut Decode<'_>,
    from: &Receiver<(Instant, Msg)>,
    progress: &Progress,
) -> Result<RuleResult, String> {
    let cfg = d.cfg;
    let kind = d.kind;
    let tick = Duration::from_millis(1);
    let sample_every = Duration::from_millis(10);
    let start = Instant::now();
    let open_for = Duration::from_secs_f64(cfg.seconds);
    let mut open_until = match cfg.max_requests {
        Some(_) => start + Duration::from_secs(1 << 30),
        None => start + open_for,
    };
    let grace = Duration::from_secs(5)
        + cfg.teardown() * 2
        + Duration::from_millis(cfg.quarantine_ms)
        + cfg.detect();
    let mut hard_end = open_until + grace;
    let period = Duration::from_millis(cfg.death_period_ms);
    let mut next_death = (cfg.death_period_ms > 0).then(|| start + period);
    let mut death_idx = 0u32;
    let mut deaths = 0;
    let mut detection: Option<(Instant, u32)> = None;
    let mut teardown: Option<(Instant, u32)> = None;
    let mut msgs: BinaryHeap<Reverse<(Instant, u64, Msg)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let (mut next_tick, mut next_sample, mut next_progress) = (start, start, start);
    let mut samples = Vec::new();
    let mut cause_mismatches = 0u64;
    let mut want_pages: Option<usize> = None;
    let mut disconnected = false;
    let mut drained = false;
    loop {
        let now = Instant::now();
        if d.opening {
            let done = match cfg.max_requests {
                Some(n) => d.opened >= n,
                None => now >= open_until,
            };
            if done {
                d.opening = false;
                open_until = now;
                hard_end = now + grace;
            }
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
        while d
            .quarantine_timers
            .peek()
            .is_some_and(|Reverse((at, _, _))| *at <= now)
        {
            if let Some(Reverse((_, room, req))) = d.quarantine_timers.pop() {
                d.quarantine(room, req, now);
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
                    detection = Some((now + cfg.detect(), victim));
                    teardown = Some((now + cfg.teardown(), victim));
                    next_death = Some(at + period);
                }
            }
            if let Some((at, victim)) = detection {
                if now >= at {
                    detection = None;
                    // Only if still dead (detection slower than teardown: nothing to do).
                    if d.shared[victim as usize].dead.load(Ordering::Acquire) {
                        d.detect(victim, now);
                    }
                }
            }
            if let Some((at, victim)) = teardown {
                if now >= at {
                    teardown = None;
                    d.teardown(victim, now);
                }
            }
        }
        // Releases decided elsewhere (queued): only now are their pages freed, and only
        // then can a new request get them.
        for room in d.rule.drain() {
            d.released(room, now);
        }
        if now >= next_sample {
            next_sample = now + sample_every;
            let usage = d.rule.usage();
            let causes = d.causes();
            if causes.total() != usage.held {
                cause_mismatches += 1;
            }
            samples.push(Sample {
                t_ms: now.duration_since(start).as_secs_f64() * 1000.0,
                usage,
                causes,
            });
        }
        if now >= next_progress {
            next_progress = now + Duration::from_millis(200);
            let frac = match cfg.max_requests {
                Some(n) => d.opened as f64 / n as f64,
                None => now.duration_since(start).as_secs_f64() / open_for.as_secs_f64(),
            };
            progress.show(frac, d.completed, d.aborted, d.corrupted_requests);
        }
        if d.opening {
            while d.live.len() < cfg.rooms && cfg.max_requests.is_none_or(|n| d.opened < n) {
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
        } else if d.live.is_empty()
            && d.closing.is_empty()
            && teardown.is_none()
            && detection.is_none()
        {
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
        if let Some(Reverse((at, _, _))) = d.quarantine_timers.peek() {
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
    let open_s = open_until.duration_since(start).as_secs_f64().max(1e-9);
    let usage = d.rule.usage();
    let causes = d.causes();
    samples.push(Sample {
        t_ms: wall.as_secs_f64() * 1000.0,
        usage,
        causes,
    });
    // The run is over: no request will reuse a page; quarantined pages are counted back
    // (not reused) so conservation can check every page.
    d.reclaim(true);
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
    let mean = |f: fn(&HeldCauses) -> usize| {
        samples.iter().map(|s| f(&s.causes)).sum::<usize>() as f64 / samples.len().max(1) as f64
    };
    let max = |f: fn(&HeldCauses) -> usize| samples.iter().map(|s| f(&s.causes)).max().unwrap_or(0);
    let fields: [fn(&HeldCauses) -> usize; 4] = [
        |c| c.slow_ack,
        |c| c.in_flight,
        |c| c.dead_rank,
        |c| c.failed,
    ];
    let causes_mean = [
        mean(fields[0]),
        mean(fields[1]),
        mean(fields[2]),
        mean(fields[3]),
    ];
    Ok(RuleResult {
        rule: kind.name(),
        opened: d.opened,
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
        failed_transfers: 0,
        failed_landed: 0,
        quarantined_rooms: d.quarantined_rooms,
        pages_reclaimed: d.pages_reclaimed,
        quarantined_pages: MeanMax::of(samples.iter().map(|s| s.usage.quarantined)),
        held: MeanMax::of(samples.iter().map(|s| s.usage.held)),
        causes_mean: HeldCauses {
            slow_ack: causes_mean[0].round() as usize,
            in_flight: causes_mean[1].round() as usize,
            dead_rank: causes_mean[2].round() as usize,
            failed: causes_mean[3].round() as usize,
        },
        causes_mean_f: causes_mean,
        causes_max: HeldCauses {
            slow_ack: max(fields[0]),
            in_flight: max(fields[1]),
            dead_rank: max(fields[2]),
            failed: max(fields[3]),
        },
        cause_mismatches,
        release_p50_ms: percentile(&lat, 0.5),
        release_p99_ms: percentile(&lat, 0.99),
        throughput_rps: d.completed_open as f64 / open_s,
        wall_s: wall.as_secs_f64(),
        conservation,
        samples,
    })
}
