//! The simulation: real threads writing real bytes. This module holds what the roles
//! share (messages, a rank's transport) and runs one rule: [`crate::prefill`] has the
//! prefill rank threads, [`crate::decode`] the decode scheduler, [`crate::result`] what a
//! run measured, [`crate::progress`] the progress line.
//!
//! Faults: ACKs delayed, dropped (decode re-sends ABORT), duplicated, late; intents that
//! slip past a rank's abort drain; writes that fail (and may still land); a rank dies
//! (hangs: its in-flight writes stall and land late), the failure detector declares it
//! dead, and later its transport is torn down (no write of the old incarnation lands
//! afterwards), the rule handles it (`kvfence`: `fence_rank`), and the rank restarts.

use crate::arena::Arena;
use crate::config::{RuleKind, SimConfig};
use crate::decode::{decode_loop, Decode};
use crate::prefill::{rank_main, RankCounters};
use crate::rules::{self, RoomId};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use crate::progress::Progress;
pub use crate::result::{HeldCauses, RuleResult, Sample};

pub(crate) fn us(v: u64) -> Duration {
    Duration::from_micros(v)
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Decode -> prefill rank.
pub enum ToRank {
    /// Write these chunks of request `req` (room `room`) after `queue_delay`.
    Intent {
        /// The rank incarnation it was sent to.
        inc: u64,
        /// Request id.
        req: u64,
        /// Decode room.
        room: RoomId,
        /// Queueing delay on the rank.
        queue_delay: Duration,
        /// Destination pages, one list per chunk.
        chunks: Vec<Vec<u32>>,
    },
    /// ABORT of request `req`.
    Abort {
        /// The rank incarnation it was sent to.
        inc: u64,
        /// Request id.
        req: u64,
        /// Decode room.
        room: RoomId,
    },
}

/// What a prefill rank tells the decode side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum MsgKind {
    /// Every chunk of the rank's share landed.
    Done,
    /// ABORT_ACK.
    Ack,
    /// A write failed (error returned; its bytes may still land).
    Failed,
    /// The simulator's own note, seen by no rule: the rank drained the aborted request
    /// (only its ACK is outstanding now). Used to split held pages by cause.
    Drained,
}

/// Prefill rank -> decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Msg {
    /// What it says.
    pub kind: MsgKind,
    /// Request id.
    pub req: u64,
    /// Decode room.
    pub room: RoomId,
    /// Sender.
    pub rank: u32,
}

/// The rank's transport to the decode arena (a queue pair): a write lands only while it is
/// up and of the same epoch (incarnation) as the write.
pub struct Transport {
    /// Incarnation the transport belongs to.
    pub epoch: u64,
    /// Not torn down.
    pub up: bool,
}

/// State a rank shares with the decode thread.
pub struct RankShared {
    /// Hung (set at death, cleared at restart).
    pub dead: AtomicBool,
    /// End of run.
    pub stop: AtomicBool,
    /// Current incarnation (bumped at restart).
    pub incarnation: AtomicU64,
    /// The transport.
    pub transport: Mutex<Transport>,
}

/// Runs one rule. `Err` only for a setup failure (thread spawn, table construction).
pub fn run_rule(
    cfg: &SimConfig,
    kind: RuleKind,
    progress: &Progress,
) -> Result<RuleResult, String> {
    let arena = Arena::new(cfg.pages, cfg.page_bytes);
    let rule = rules::make(
        kind,
        cfg.pages,
        cfg.rooms,
        cfg.prefill_ranks,
        cfg.timeout_for(kind),
    )?;
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
        let mut d = Decode::new(cfg, kind, rule, &arena, &shared, to_rank);
        let result = decode_loop(&mut d, &from_ranks, progress);
        for s in &shared {
            s.stop.store(true, Ordering::Release);
        }
        d.to_rank.clear();
        let mut rc = RankCounters::default();
        for h in handles {
            let c = h
                .join()
                .map_err(|_| "a prefill thread panicked".to_string())?;
            rc.add(&c);
        }
        let mut r = result?;
        r.stale_refused = rc.stale_refused;
        r.late_writes_landed = rc.late_writes_landed;
        r.writes_flushed = rc.writes_flushed;
        r.failed_transfers = rc.failed;
        r.failed_landed = rc.failed_landed;
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
