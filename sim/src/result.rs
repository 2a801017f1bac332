//! What one rule's run measured.

use crate::rules::Usage;

/// Why pages are held awaiting drain (closed rooms not yet released).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HeldCauses {
    /// Every writer drained; the ABORT_ACK is delayed, late or lost (re-sent).
    pub slow_ack: usize,
    /// A writer rank still has the room's writes queued or in flight.
    pub in_flight: usize,
    /// A writer rank is dead and its transport not yet torn down (kvfence: not fenced).
    pub dead_rank: usize,
    /// A writer's transfer failed (may still land): held until its rank is fenced or the
    /// room quarantined.
    pub failed: usize,
}

impl HeldCauses {
    /// Sum over causes.
    pub fn total(&self) -> usize {
        self.slow_ack + self.in_flight + self.dead_rank + self.failed
    }
}

/// One sample of page occupancy.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// Milliseconds since the rule's run started.
    pub t_ms: f64,
    /// Occupancy.
    pub usage: Usage,
    /// Held pages by cause (sums to `usage.held`).
    pub causes: HeldCauses,
}

/// Mean and max of a series.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MeanMax {
    /// Mean over samples.
    pub mean: f64,
    /// Max over samples.
    pub max: usize,
}

impl MeanMax {
    /// Over `v`.
    pub fn of(v: impl Iterator<Item = usize> + Clone) -> MeanMax {
        let n = v.clone().count().max(1);
        MeanMax {
            mean: v.clone().sum::<usize>() as f64 / n as f64,
            max: v.max().unwrap_or(0),
        }
    }
}

/// What one rule's run measured.
#[derive(Clone, Debug)]
pub struct RuleResult {
    /// Rule name.
    pub rule: &'static str,
    /// Requests opened.
    pub opened: u64,
    /// Requests whose KV arrived, verified and finished.
    pub completed: u64,
    /// Requests aborted (random abort, waiting timeout, dead rank, failed transfer).
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
    /// Failed transfers (the write returned an error).
    pub failed_transfers: u64,
    /// Failed writes whose bytes landed anyway.
    pub failed_landed: u64,
    /// Rooms quarantined.
    pub quarantined_rooms: u64,
    /// Quarantined pages handed back after their ranks' teardown.
    pub pages_reclaimed: u64,
    /// Pages out of circulation (quarantined): mean and max over samples.
    pub quarantined_pages: MeanMax,
    /// Pages held awaiting drain: mean and max over samples.
    pub held: MeanMax,
    /// Held pages by cause: mean over samples, rounded.
    pub causes_mean: HeldCauses,
    /// Held pages by cause: mean over samples (slow ACK, in flight, dead rank, failed).
    pub causes_mean_f: [f64; 4],
    /// Held pages by cause: max over samples (of each cause separately).
    pub causes_max: HeldCauses,
    /// Samples in which the causes did not sum to the held pages (expected 0).
    pub cause_mismatches: u64,
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

/// The `p` quantile of sorted microsecond values, in ms.
pub fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64 / 1000.0
}
