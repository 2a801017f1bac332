//! The deterministic reproducer: forces the exact ordering of docs/DESIGN.md section 1 with
//! barriers, once per run and rule.
//!
//! ```text
//! T0  request A owns pages S; prefill rank 0 has a write to S in flight (even runs) or
//!     queued (odd runs; the intent slips past the rank's abort drain)
//! T1  decode aborts A (timeout rule: and waits out its timeout)
//! T2  request B asks for pages; if the rule hands it S, B's KV is written there
//! T3  the stale write for A is released (barrier) and lands, or is refused
//! T4  rank 0's ABORT_ACK reaches the rule; if B had to wait, it gets its pages now
//! T5  B's pages are verified
//! ```

use crate::arena::Arena;
use crate::config::RuleKind;
use crate::rules;
use kvfence::{Config, RoomTable};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// One rule's reproducer results.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReproResult {
    /// Rule name.
    pub rule: &'static str,
    /// Runs.
    pub runs: usize,
    /// Runs in which B's KV was corrupted.
    pub corrupted_runs: usize,
    /// Runs in which B had to wait for A's release (the pages were still held).
    pub reuse_deferred: usize,
    /// Stale intents refused by the prefill-side check.
    pub stale_refused: usize,
    /// Stale writes that landed (into A's held pages or into B's).
    pub stale_landed: usize,
    /// Runs whose pages did not all come back at the end.
    pub leaks: usize,
}

const PAGES: usize = 4;

/// One run of one rule: `Ok(corrupted, deferred, refused, landed, leaked)`.
fn one_run(
    kind: RuleKind,
    run: usize,
    timeout: Duration,
) -> Result<(bool, bool, bool, bool, bool), String> {
    let arena = Arena::new(PAGES, 4096);
    // Exactly one request's worth of pages: B can only get A's pages.
    let mut rule = rules::make(kind, PAGES, 2, 1, timeout)?;
    let prefill = (kind == RuleKind::Kvfence)
        .then(|| RoomTable::new(Config::pool(2, 2)))
        .transpose()
        .map_err(|e| e.to_string())?;
    let in_flight = run.is_multiple_of(2);
    let (req_a, req_b) = (2 * run as u64 + 1, 2 * run as u64 + 2);

    let (room_a, pages_a) = rule
        .open(PAGES, &[0])?
        .ok_or("repro: cannot open request A")?;
    // T0: the rank's source-side room for A, and (even runs) its write already in flight.
    let source = match &prefill {
        Some(t) => Some(t.open(&[], 1).map_err(|e| e.to_string())?.handle),
        None => None,
    };
    let guard = match (&prefill, source, in_flight) {
        (Some(t), Some(h), true) => Some(t.begin_transfer(h).map_err(|e| e.to_string())?),
        _ => None,
    };

    std::thread::scope(|s| -> Result<(bool, bool, bool, bool, bool), String> {
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (ack_tx, ack_rx) = mpsc::channel::<(bool, bool)>();
        let (arena_r, prefill_r, pages_r) = (&arena, prefill.as_ref(), pages_a.clone());
        // The prefill rank: holds the stale write until the barrier opens.
        s.spawn(move || {
            if go_rx.recv().is_err() {
                // The run was given up before the barrier: the write never happened.
                if let Some(g) = guard {
                    let _ = g.complete();
                }
                return;
            }
            let (mut landed, mut refused) = (false, false);
            if in_flight {
                // Posted before the abort: nothing can stop it now; it lands.
                for &p in &pages_r {
                    arena_r.write_page(p, req_a);
                }
                landed = true;
                if let Some(g) = guard {
                    let _ = g.complete();
                }
            } else {
                // Queued, missed by the drain, submitted now: kvfence checks it first. The
                // guard is held across the write and completed after it: that is what
                // keeps the source room (and so the ACK) from being released mid-write.
                // Never `begin_transfer(h).map(drop)` then write.
                let guard = match (prefill_r, source) {
                    (Some(t), Some(h)) => match t.begin_transfer(h) {
                        Ok(g) => Some(Some(g)),
                        Err(_) => None,
                    },
                    _ => Some(None),
                };
                if let Some(guard) = guard {
                    for &p in &pages_r {
                        arena_r.write_page(p, req_a);
                    }
                    landed = true;
                    if let Some(g) = guard {
                        let _ = g.complete();
                    }
                } else {
                    refused = true;
                }
            }
            // Drained: ABORT_ACK.
            let _ = ack_tx.send((landed, refused));
        });

        // T1: abort A; the rank is told (its source-side room is aborted).
        let now = Instant::now();
        let (_fanout, _released) = rule.abort(room_a, &[0], now);
        let mut acked = false;
        if let (Some(t), Some(h)) = (&prefill, source) {
            // Queued runs: nothing of A is in flight, so the source-side room is released
            // at once and the rank ACKs now, before its stale intent is even submitted.
            if matches!(t.abort(h), Ok(a) if a.released.is_some()) {
                let _ = rule.ack(room_a, 0);
                acked = true;
            }
        }
        // The scheduler loop acts on releases decided meanwhile (kvfence: its release
        // queue); only then are pages free for B.
        let _ = rule.drain();
        if kind == RuleKind::Timeout {
            // The stale write outlives the timeout.
            std::thread::sleep(timeout + Duration::from_millis(1));
            let _ = rule.tick(Instant::now());
        }
        // T2: B asks for pages.
        let mut room_b = rule.open(PAGES, &[0])?;
        let deferred = room_b.is_none();
        if let Some((_, pages)) = &room_b {
            for &p in pages {
                arena.write_page(p, req_b);
            }
        }
        // T3: the barrier opens; the stale write lands (or is refused).
        go_tx.send(()).map_err(|_| "repro: rank thread gone")?;
        let (landed, refused) = ack_rx.recv().map_err(|_| "repro: rank thread gone")?;
        // T4: the ACK reaches the rule.
        if !acked {
            let _ = rule.ack(room_a, 0);
        }
        let _ = rule.drain();
        if room_b.is_none() {
            room_b = rule.open(PAGES, &[0])?;
            if let Some((_, pages)) = &room_b {
                for &p in pages {
                    arena.write_page(p, req_b);
                }
            }
        }
        let (room_b, pages_b) = room_b.ok_or("repro: B never got pages after A's ACK")?;
        // T5: verify B.
        let corrupted = pages_b.iter().any(|&p| !arena.verify_page(p, req_b));
        rule.done(room_b, 0);
        let _ = rule.finish(room_b);
        let _ = rule.drain();
        let leaked = rule.conservation().is_err();
        Ok((corrupted, deferred, refused, landed, leaked))
    })
}

/// Runs the reproducer `runs` times for each rule.
pub fn run_repro(runs: usize, timeout_ms: u64) -> Result<Vec<ReproResult>, String> {
    let timeout = Duration::from_millis(timeout_ms);
    RuleKind::REPRO
        .into_iter()
        .map(|kind| {
            let mut r = ReproResult {
                rule: kind.name(),
                runs,
                corrupted_runs: 0,
                reuse_deferred: 0,
                stale_refused: 0,
                stale_landed: 0,
                leaks: 0,
            };
            for run in 0..runs {
                let (c, d, rf, l, lk) = one_run(kind, run, timeout)?;
                r.corrupted_runs += usize::from(c);
                r.reuse_deferred += usize::from(d);
                r.stale_refused += usize::from(rf);
                r.stale_landed += usize::from(l);
                r.leaks += usize::from(lk);
            }
            Ok(r)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn naive_and_timeout_corrupt_every_run_kvfence_none() {
        let results = run_repro(4, 2).unwrap();
        let by = |n: &str| results.iter().find(|r| r.rule == n).unwrap().clone();
        assert_eq!(by("naive").corrupted_runs, 4);
        assert_eq!(by("timeout").corrupted_runs, 4);
        let k = by("kvfence");
        assert_eq!(k.corrupted_runs, 0);
        assert_eq!(k.reuse_deferred, 2, "in-flight runs: B waits for the ACK");
        assert_eq!(
            k.stale_refused, 2,
            "queued runs: the stale intent is refused"
        );
        assert!(results.iter().all(|r| r.leaks == 0));
    }
}
