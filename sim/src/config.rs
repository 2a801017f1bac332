//! The simulation's settings: [`SimConfig`], its defaults and presets, and their validation
//! (bad values are an `Err(String)` naming the flag; the command line, [`crate::cli`], turns
//! it into a usage error, exit status 2).

use std::time::Duration;

/// The measured teardown, ms: the one place to change it (it feeds
/// [`MEASURED_TEARDOWN_MS`] and the `--teardown-ms` help text).
macro_rules! measured_teardown_ms {
    () => {
        165
    };
}
pub(crate) use measured_teardown_ms;

/// Where [`MEASURED_TEARDOWN_MS`] comes from (named in `--help`).
pub const TEARDOWN_SOURCE: &str = "e2e/hosts/TEARDOWN.md";

#[doc = concat!(
    "The measured teardown: ", measured_teardown_ms!(), " ms, the time the decode needs to ",
    "prove on its own that a dead peer's transport is torn down (from \"declare the peer ",
    "dead\" to \"proven torn down\", the local fence of issue 22 item 2), measured on the ",
    "real engine over Mooncake TCP: `e2e/hosts/TEARDOWN.md` (the median of 178 tries on ",
    "network-namespace hosts: min 64, p90 237, max 347 ms).\n\n",
    "The default teardown ([`SimConfig::teardown`]) places it where it happens: after the ",
    "failure detector declared the rank dead, and on the peers' clock, divided by ",
    "`--time-scale` like the detector, the death period and the 30 s it replaces. Every ",
    "duration that decides how long a dead rank's pages are held (detection + teardown) and ",
    "how often (the death period) is then compressed by the same factor, so the share of ",
    "time a rank's rooms are held is the deployment's. (Left unscaled, 165 ms against a ",
    "scaled 100 ms detector and a 1.5 s death period would overstate that share 1.6x.)"
)]
pub const MEASURED_TEARDOWN_MS: u64 = measured_teardown_ms!();

/// The teardown the simulator assumed before it was measured: 30 s of the peers' time,
/// divided by `--time-scale` like their other control-plane times (300 ms at the default
/// 100, the old default `--teardown-ms 300`). Kept as the preset `--teardown assumed-30s`.
pub const ASSUMED_TEARDOWN_S: f64 = 30.0;

/// The release rules the simulator compares (`--rules`; each variant's doc is its `--help`
/// line). "Trusts the detector": a dead rank's rooms are freed when the failure detector
/// fires and a failed transfer's room at once, without teardown proof (what SGLang does).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RuleKind {
    /// Frees at abort (what peers did before the fix).
    Naive,
    /// Waits for ACKs, frees after --timeout-ms (default 20) anyway; trusts the detector.
    Timeout,
    /// SGLang's rule: waits for ACKs, frees after 30 s (--sglang-timeout-s) anyway; trusts
    /// the detector (heartbeat).
    Sglang,
    /// vLLM NIXL's rule: frees after 480 s (VLLM_NIXL_ABORT_REQUEST_TIMEOUT,
    /// --vllm-timeout-s); trusts the detector.
    Vllm,
    /// kvfence's messages without its bookkeeping: waits for every ACK, frees a dead rank's
    /// rooms at its teardown, no timer, slot ids (the overhead baseline).
    AcksOnly,
    /// This crate (gate mode, release queue); fences a dead rank at its teardown.
    Kvfence,
}

impl RuleKind {
    /// All rules, in display order.
    pub const ALL: [RuleKind; 6] = [
        RuleKind::Naive,
        RuleKind::Timeout,
        RuleKind::Sglang,
        RuleKind::Vllm,
        RuleKind::AcksOnly,
        RuleKind::Kvfence,
    ];

    /// The rules of the forced reproducer (the peers' long timeouts would only add waiting).
    pub const REPRO: [RuleKind; 3] = [RuleKind::Naive, RuleKind::Timeout, RuleKind::Kvfence];

    /// The rule's name on the command line and in output.
    pub fn name(self) -> &'static str {
        match self {
            RuleKind::Naive => "naive",
            RuleKind::Timeout => "timeout",
            RuleKind::Sglang => "sglang",
            RuleKind::Vllm => "vllm",
            RuleKind::AcksOnly => "acks-only",
            RuleKind::Kvfence => "kvfence",
        }
    }

    /// Whether the rule frees a dead rank's rooms when the failure detector fires (without
    /// teardown proof) and a failed transfer's room at once, as the peers do.
    pub fn trusts_detector(self) -> bool {
        matches!(self, RuleKind::Timeout | RuleKind::Sglang | RuleKind::Vllm)
    }
}

/// Everything one simulation run needs.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// Rules to run, one after the other.
    pub rules: Vec<RuleKind>,
    /// Seconds of request arrivals per rule (the drain afterwards is extra).
    pub seconds: f64,
    /// Decode arena pages.
    pub pages: usize,
    /// Bytes per page (multiple of 8).
    pub page_bytes: usize,
    /// Prefill rank threads.
    pub prefill_ranks: usize,
    /// Ranks each request fans in from.
    pub fan_in: usize,
    /// Concurrent requests (decode rooms).
    pub rooms: usize,
    /// Pages per request, uniform in `min_pages..=max_pages`.
    pub min_pages: usize,
    /// See `min_pages`.
    pub max_pages: usize,
    /// Pages per chunk (one write intent).
    pub chunk_pages: usize,
    /// Queueing delay on the prefill rank, uniform in `0..=queue_us` per request.
    pub queue_us: u64,
    /// Transfer (in-flight) time of one chunk, uniform in `0..=transfer_us`.
    pub transfer_us: u64,
    /// Chunks in flight per rank at most.
    pub max_inflight: usize,
    /// Decode time between "all KV arrived" and verification + finish.
    pub decode_us: u64,
    /// Probability that a request is aborted (client disconnect) during its transfer.
    pub abort_rate: f64,
    /// Requests whose KV has not all arrived after this are aborted (waiting timeout).
    pub wait_timeout_ms: u64,
    /// `timeout` rule: release an aborted room after this even without all ACKs.
    pub timeout_ms: u64,
    /// ACK delay, uniform in `0..=ack_delay_us`.
    pub ack_delay_us: u64,
    /// Probability an ACK is dropped (the decode side re-sends ABORT).
    pub ack_drop: f64,
    /// Probability an ACK is duplicated.
    pub ack_dup: f64,
    /// Probability an ACK is late by `late_ms`.
    pub ack_late: f64,
    /// Extra delay of a late ACK.
    pub late_ms: u64,
    /// Fraction of an aborted room's queued intents that the rank's drain misses and still
    /// submits (the bug variant).
    pub stale_intent_rate: f64,
    /// Decode re-sends ABORT to ranks that have not ACKed after this.
    pub abort_retry_ms: u64,
    /// A prefill rank dies (stops answering) every this often; 0 = never.
    pub death_period_ms: u64,
    /// Time from a rank's death to the teardown of its transport (no write of the dead
    /// incarnation lands afterwards; kvfence fences the rank then), wall ms, not scaled by
    /// `time_scale`. `None` (the default): the measured teardown, after detection and on
    /// the peers' clock ([`SimConfig::teardown`], [`MEASURED_TEARDOWN_MS`]).
    pub teardown_ms: Option<u64>,
    /// Dead-rank detection time (the engine's failure detector); `None`: derived from the
    /// heartbeat settings and `time_scale`.
    pub detect_ms: Option<u64>,
    /// The peers' control-plane times (heartbeat, 30 s / 480 s timeouts) are divided by this
    /// to fit a run of seconds; the data plane (queueing, transfers, ACK delays) is not.
    pub time_scale: f64,
    /// SGLang's heartbeat interval, s (`SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL`, 5.0).
    pub heartbeat_s: f64,
    /// SGLang's heartbeat failures before a prefill is marked dead
    /// (`SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE`, 2).
    pub heartbeat_failures: u32,
    /// `sglang` rule: deferred releases "release anyway" after this, s (30).
    pub sglang_timeout_s: f64,
    /// `vllm` rule: `VLLM_NIXL_ABORT_REQUEST_TIMEOUT`, s (480).
    pub vllm_timeout_s: f64,
    /// Probability that a chunk's write fails (the transfer engine returns an error); the
    /// bytes may still land later (`fail_lands`).
    pub fail_rate: f64,
    /// Probability that a failed write's bytes still land (before the rank's teardown).
    pub fail_lands: f64,
    /// A room held by a failed transfer is quarantined after this (its pages leave
    /// circulation until every rank it waited on has been torn down).
    pub quarantine_ms: u64,
    /// Stop opening requests after this many (`soak`); `None`: open for `seconds`.
    pub max_requests: Option<u64>,
    /// kvfence rule: prefill ranks check each intent with `begin_transfer` before writing.
    pub prefill_check: bool,
    /// Random seed.
    pub seed: u64,
    /// Show a progress line on stderr (only when stderr is a terminal).
    pub progress: bool,
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            rules: RuleKind::ALL.to_vec(),
            seconds: 7.0,
            pages: 4096,
            page_bytes: 4096,
            prefill_ranks: 8,
            fan_in: 4,
            rooms: 256,
            min_pages: 4,
            max_pages: 32,
            chunk_pages: 2,
            queue_us: 2000,
            transfer_us: 1000,
            max_inflight: 8,
            decode_us: 2000,
            abort_rate: 0.1,
            wait_timeout_ms: 100,
            timeout_ms: 20,
            ack_delay_us: 1000,
            ack_drop: 0.02,
            ack_dup: 0.05,
            ack_late: 0.02,
            late_ms: 50,
            stale_intent_rate: 0.2,
            abort_retry_ms: 20,
            death_period_ms: 1500,
            teardown_ms: None,
            detect_ms: None,
            time_scale: 100.0,
            heartbeat_s: 5.0,
            heartbeat_failures: 2,
            sglang_timeout_s: 30.0,
            vllm_timeout_s: 480.0,
            fail_rate: 0.00002,
            fail_lands: 0.5,
            quarantine_ms: 50,
            max_requests: None,
            prefill_check: true,
            seed: 1,
            progress: true,
        }
    }
}

impl SimConfig {
    /// `--no-delay`: aborts, faults, deaths off and every delay zero (the overhead benchmark).
    pub fn no_delay(&mut self) {
        self.queue_us = 0;
        self.transfer_us = 0;
        self.decode_us = 0;
        self.ack_delay_us = 0;
        self.abort_rate = 0.0;
        self.ack_drop = 0.0;
        self.ack_dup = 0.0;
        self.ack_late = 0.0;
        self.stale_intent_rate = 0.0;
        self.death_period_ms = 0;
        self.fail_rate = 0.0;
        self.wait_timeout_ms = 3_600_000;
    }

    /// `--preset production`: settings that mirror a production deployment (see `--help`).
    pub fn production(&mut self) {
        self.prefill_ranks = 8;
        self.fan_in = 2;
        self.queue_us = 4000;
        self.transfer_us = 3000;
        self.decode_us = 3000;
        self.abort_rate = 0.01;
        self.ack_drop = 0.001;
        self.ack_dup = 0.01;
        self.ack_late = 0.001;
        self.stale_intent_rate = 0.02;
        self.death_period_ms = 2500;
        self.fail_rate = 0.00001;
        self.wait_timeout_ms = 200;
    }

    /// The `soak` command's defaults: the full fault mix with the data-plane delays cut to
    /// what the faults need (a write can still be in flight at an abort or a death).
    pub fn soak(&mut self) {
        self.rules = vec![RuleKind::Kvfence];
        self.queue_us = 0;
        self.transfer_us = 200;
        self.decode_us = 0;
        self.ack_delay_us = 200;
        self.late_ms = 5;
        self.abort_retry_ms = 5;
        self.wait_timeout_ms = 50;
        self.death_period_ms = 300;
        self.detect_ms = Some(10);
        self.teardown_ms = Some(30);
        self.quarantine_ms = 10;
        self.fail_rate = 0.0002;
        self.max_requests = Some(10_000_000);
    }

    /// Dead-rank detection time in this run.
    pub fn detect(&self) -> Duration {
        match self.detect_ms {
            Some(ms) => Duration::from_millis(ms),
            None => Duration::from_secs_f64(
                self.heartbeat_s * f64::from(self.heartbeat_failures) / self.time_scale,
            ),
        }
    }

    /// The release timeout of `kind` in this run (the peers' compressed by `time_scale`).
    pub fn timeout_for(&self, kind: RuleKind) -> Duration {
        match kind {
            RuleKind::Sglang => Duration::from_secs_f64(self.sglang_timeout_s / self.time_scale),
            RuleKind::Vllm => Duration::from_secs_f64(self.vllm_timeout_s / self.time_scale),
            _ => self.timeout(),
        }
    }

    /// Checks that the configuration can run.
    pub fn validate(&self) -> Result<(), String> {
        if self.rules.is_empty() {
            return Err("--rules: give at least one rule".into());
        }
        if !(self.seconds > 0.0 && self.seconds <= 3600.0) {
            return Err(format!(
                "--seconds must be in (0, 3600], got {}",
                self.seconds
            ));
        }
        if self.pages == 0 || self.pages > 1 << 24 {
            return Err(format!(
                "--pages must be in 1..=16777216, got {}",
                self.pages
            ));
        }
        if self.page_bytes < 8 || !self.page_bytes.is_multiple_of(8) || self.page_bytes > 1 << 20 {
            return Err(format!(
                "--page-bytes must be a multiple of 8 in 8..=1048576, got {}",
                self.page_bytes
            ));
        }
        if self.pages.saturating_mul(self.page_bytes) > 4 << 30 {
            return Err("arena larger than 4 GiB: lower --pages or --page-bytes".into());
        }
        if self.prefill_ranks == 0 || self.prefill_ranks > 256 {
            return Err(format!(
                "--prefill-ranks must be in 1..=256, got {}",
                self.prefill_ranks
            ));
        }
        if self.fan_in == 0 || self.fan_in > self.prefill_ranks {
            return Err(format!(
                "--fan-in must be in 1..=prefill ranks ({}), got {}",
                self.prefill_ranks, self.fan_in
            ));
        }
        if self.rooms == 0 || self.rooms > 65536 {
            return Err(format!("--rooms must be in 1..=65536, got {}", self.rooms));
        }
        if self.min_pages == 0 || self.min_pages > self.max_pages {
            return Err(format!(
                "need 1 <= --min-pages <= --max-pages, got {}..{}",
                self.min_pages, self.max_pages
            ));
        }
        if self.max_pages > self.pages {
            return Err(format!(
                "--max-pages ({}) exceeds the arena (--pages {})",
                self.max_pages, self.pages
            ));
        }
        if self.chunk_pages == 0 {
            return Err("--chunk-pages must be at least 1".into());
        }
        if self.max_inflight == 0 {
            return Err("--max-inflight must be at least 1".into());
        }
        for (name, p) in [
            ("--abort-rate", self.abort_rate),
            ("--ack-drop", self.ack_drop),
            ("--ack-dup", self.ack_dup),
            ("--ack-late", self.ack_late),
            ("--stale-intent-rate", self.stale_intent_rate),
            ("--fail-rate", self.fail_rate),
            ("--fail-lands", self.fail_lands),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("{name} must be a probability in [0, 1], got {p}"));
            }
        }
        if self.ack_drop >= 1.0 {
            return Err("--ack-drop 1 would drop every ACK forever".into());
        }
        if !(self.time_scale >= 1.0 && self.time_scale <= 1e6) {
            return Err(format!(
                "--time-scale must be in [1, 1000000], got {}",
                self.time_scale
            ));
        }
        if !(self.heartbeat_s > 0.0 && self.heartbeat_s <= 3600.0) || self.heartbeat_failures == 0 {
            return Err("--heartbeat-s must be in (0, 3600] and --heartbeat-failures >= 1".into());
        }
        for (name, v) in [
            ("--sglang-timeout-s", self.sglang_timeout_s),
            ("--vllm-timeout-s", self.vllm_timeout_s),
        ] {
            if !(v > 0.0 && v <= 86400.0) {
                return Err(format!("{name} must be in (0, 86400], got {v}"));
            }
        }
        if self.detect() > Duration::from_secs(600) {
            return Err("dead-rank detection above 600 s of wall time: raise --time-scale".into());
        }
        if self.quarantine_ms == 0 {
            return Err("--quarantine-ms must be positive".into());
        }
        if self.max_requests == Some(0) {
            return Err("--requests must be at least 1".into());
        }
        if self.abort_retry_ms == 0 || self.wait_timeout_ms == 0 {
            return Err("--abort-retry-ms and --wait-timeout-ms must be positive".into());
        }
        // Last: the default teardown is derived from the peer times checked above.
        if self.death_period_ms > 0
            && self.teardown() >= Duration::from_millis(self.death_period_ms)
        {
            return Err(format!(
                "--teardown-ms must be below --death-period-ms ({} ms), got {} ms{}",
                self.death_period_ms,
                self.teardown().as_secs_f64() * 1000.0,
                if self.teardown_ms.is_none() {
                    " (detection + the measured teardown)"
                } else {
                    ""
                }
            ));
        }
        Ok(())
    }

    /// Rank death -> its transport proven torn down (kvfence fences it then): `--teardown-ms`
    /// as given (wall ms from the death), or by default the detector's time plus the measured
    /// teardown on the peers' clock, [`MEASURED_TEARDOWN_MS`] / `time_scale` (101.65 ms at
    /// the defaults; see [`MEASURED_TEARDOWN_MS`] why).
    pub fn teardown(&self) -> Duration {
        match self.teardown_ms {
            Some(ms) => Duration::from_millis(ms),
            None => {
                self.detect()
                    + Duration::from_secs_f64(
                        MEASURED_TEARDOWN_MS as f64 / 1000.0 / self.time_scale,
                    )
            }
        }
    }

    /// `--teardown assumed-30s`: [`ASSUMED_TEARDOWN_S`] divided by `time_scale`, ms from
    /// the death (the old default's placement, kept as it was).
    pub fn assumed_teardown_ms(&self) -> u64 {
        (ASSUMED_TEARDOWN_S * 1000.0 / self.time_scale).round() as u64
    }

    /// `timeout_ms` as a duration.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}
