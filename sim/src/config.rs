//! Command line: flags, defaults, validation. Bad input is an `Err(String)` (exit status 2).

use std::time::Duration;

/// The release rules the simulator compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleKind {
    /// Free pages at abort (what peers did before the fix).
    Naive,
    /// Wait for every ACK, but release anyway after the short `--timeout-ms`; a dead rank's
    /// rooms are freed when the failure detector fires.
    Timeout,
    /// SGLang's rule: deferred release, "releasing anyway" after 30 s (`--sglang-timeout-s`);
    /// a dead rank's rooms are freed when the heartbeat detector fires.
    Sglang,
    /// vLLM NIXL's rule: blocks freed after `VLLM_NIXL_ABORT_REQUEST_TIMEOUT` (480 s,
    /// `--vllm-timeout-s`); a dead rank's rooms are freed when the detector fires.
    Vllm,
    /// The same messages as kvfence (wait for every ACK, free a dead rank's rooms only after
    /// its teardown, no timer) but plain slot bookkeeping: the baseline for kvfence's overhead.
    AcksOnly,
    /// The kvfence library.
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

    fn parse(s: &str) -> Result<RuleKind, String> {
        RuleKind::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown rule '{s}' (expected naive, timeout, sglang, vllm, acks-only or kvfence)"
                )
            })
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
    /// Grace period from a rank's death to the teardown of its transport (no write of the
    /// dead incarnation lands afterwards; kvfence fences the rank then).
    pub teardown_ms: u64,
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
            teardown_ms: 300,
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
        self.teardown_ms = 30;
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
        if self.death_period_ms > 0 && self.teardown_ms >= self.death_period_ms {
            return Err("--teardown-ms must be below --death-period-ms".into());
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
        Ok(())
    }

    /// `timeout_ms` as a duration.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}

/// What the command line asked for.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Print usage.
    Help,
    /// The simulation (default).
    Run {
        /// Settings.
        cfg: SimConfig,
        /// Print JSON instead of the table.
        json: bool,
        /// Write an SVG plot here.
        plot: Option<String>,
    },
    /// The deterministic reproducer.
    Repro {
        /// Runs per rule.
        runs: usize,
        /// `timeout` rule's timeout.
        timeout_ms: u64,
        /// Print JSON.
        json: bool,
    },
    /// Throughput of several rules, interleaved rounds (`--no-delay` unless `--faults`).
    Bench {
        /// Settings (no-delay applied unless `--faults`).
        cfg: SimConfig,
        /// Interleaved rounds.
        rounds: usize,
        /// Print JSON.
        json: bool,
    },
    /// `soak`: kvfence under the full fault mix for `cfg.max_requests` requests.
    Soak {
        /// Settings (soak defaults, then flags).
        cfg: SimConfig,
        /// Print JSON.
        json: bool,
    },
}

/// Usage text.
pub const USAGE: &str = "\
kvfence-sim: prefill ranks write real bytes into a decode page arena while the decode side
aborts requests; compares release rules and verifies every byte.

USAGE:
  kvfence-sim [run] [OPTIONS]         simulation, all rules side by side (default)
  kvfence-sim repro [--runs N] [--timeout-ms MS] [--json]
                                      forces the docs/DESIGN.md section-1 race with barriers
  kvfence-sim bench [--rounds N] [--faults] [OPTIONS]
                                      throughput per rule, interleaved rounds; without
                                      --faults: aborts/faults off, zero delays, rules
                                      naive,acks-only,kvfence
  kvfence-sim soak [--requests N] [OPTIONS]
                                      kvfence only, full fault mix, N requests [10000000];
                                      fails unless 0 corrupted and exact page conservation

RULES (--rules, comma list) [all]:
  naive       frees at abort
  timeout     waits for ACKs, frees after --timeout-ms [20]; trusts the detector
  sglang      waits for ACKs, frees after 30 s (--sglang-timeout-s); trusts the detector
  vllm        frees after 480 s (VLLM_NIXL_ABORT_REQUEST_TIMEOUT, --vllm-timeout-s);
              trusts the detector
  acks-only   kvfence's messages without its bookkeeping: waits for every ACK, frees a dead
              rank's rooms at its teardown, no timer, slot ids (the overhead baseline)
  kvfence     this crate (gate mode, release queue); fences a dead rank at its teardown
  'trusts the detector': a dead rank's rooms are freed when the failure detector fires and
  a failed transfer's room at once, without teardown proof (what SGLang does).

OPTIONS (defaults in brackets):
  --preset NAME           production: fan-in 2, 1% aborts, 0-4 ms queueing, 0-3 ms
                          transfers, 2% of intents missed by the abort drain, few ACK
                          faults, a rank death every 2.5 s, rare failed transfers; other
                          flags override it wherever given
  --seconds S             request arrivals per rule [7; bench: 2]
  --requests N            soak: requests to run [10000000]
  --pages N               decode arena pages [4096]
  --page-bytes B          bytes per page, multiple of 8 [4096]
  --prefill-ranks P       prefill rank threads [8]
  --fan-in K              ranks per request [4]
  --rooms R               concurrent requests [256]
  --min-pages N --max-pages N   pages per request [4, 32]
  --chunk-pages N         pages per write intent [2]
  --queue-us US           prefill queueing delay, uniform 0..US per request [2000]
  --transfer-us US        chunk in-flight time, uniform 0..US [1000]
  --max-inflight N        chunks in flight per rank [8]
  --decode-us US          decode time before verify + finish [2000]
  --abort-rate P          random aborts (client disconnect) [0.1]
  --wait-timeout-ms MS    abort requests whose KV is not in after MS [100]
  --timeout-ms MS         `timeout` rule: release anyway after MS [20]
  --time-scale S          peer control-plane times (heartbeat, 30 s, 480 s) divided by S
                          to fit a short run; data-plane delays are not scaled [100]
  --sglang-timeout-s S    `sglang` rule's release-anyway timeout [30]
  --vllm-timeout-s S      `vllm` rule's abort-request timeout [480]
  --heartbeat-s S --heartbeat-failures N
                          SGLang's failure detector: interval x failures [5, 2]
  --detect-ms MS          dead-rank detection time, wall ms [heartbeat x failures / scale
                          = 100]
  --teardown-ms MS        death -> transport teardown (then kvfence fences) [300]
  --death-period-ms MS    a rank dies (hangs) every MS, 0 = never [1500]
  --ack-delay-us US       ACK delay, uniform 0..US [1000]
  --ack-drop P --ack-dup P --ack-late P   ACK faults [0.02, 0.05, 0.02]
  --late-ms MS            extra delay of a late ACK [50]
  --stale-intent-rate P   queued intents an abort drain misses (bug variant) [0.2]
  --abort-retry-ms MS     re-send ABORT to ranks that have not ACKed [20]
  --fail-rate P           a chunk's write fails (error returned) [0.00002]
  --fail-lands P          a failed write's bytes still land, late [0.5]
  --quarantine-ms MS      a room held by a failed transfer is quarantined after MS [50]
  --no-prefill-check      kvfence rule: ranks submit stale intents too (decode side alone)
  --no-delay              aborts, faults, deaths off; all delays zero
  --faults                bench: keep the fault mix (default: --no-delay)
  --seed N                random seed [1]
  --json                  one JSON object on stdout
  --plot FILE.svg         free/owned/held pages over time per rule
  --no-progress           no progress line
  --rounds N              bench: interleaved rounds [5]
  --runs N                repro: runs per rule [10]
  -h, --help              this text

Exit status: 0 ok; 1 kvfence corrupted a page or lost one; 2 bad flags or config.
";

fn num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("{flag}: '{v}' is not a valid number"))
}

/// Parses the arguments (without the program name).
pub fn parse(args: &[String]) -> Result<Command, String> {
    let mut it = args.iter().peekable();
    let mode = match it.peek().map(|s| s.as_str()) {
        Some("run") | Some("repro") | Some("bench") | Some("soak") => {
            it.next().cloned().unwrap_or_default()
        }
        _ => "run".to_string(),
    };
    let rest: Vec<&String> = it.collect();
    let mut cfg = SimConfig::default();
    if mode == "soak" {
        cfg.soak();
    }
    // A preset first, wherever it is given: the other flags override it.
    if let Some(i) = rest.iter().position(|a| a.as_str() == "--preset") {
        match rest.get(i + 1).map(|s| s.as_str()) {
            Some("production") => cfg.production(),
            Some("default") => {}
            Some(other) => {
                return Err(format!(
                    "--preset: unknown preset '{other}' (expected production or default)"
                ))
            }
            None => return Err("--preset: missing value (production or default)".into()),
        }
    }
    let (mut json, mut plot, mut runs, mut rounds) = (false, None, 10usize, 5usize);
    let (mut no_delay, mut faults) = (false, false);
    let mut seconds_set = false;
    let mut rules_set = false;
    let mut timeout_set = None;
    let mut it = rest.into_iter();
    while let Some(flag) = it.next() {
        let flag = flag.as_str();
        match flag {
            "-h" | "--help" => return Ok(Command::Help),
            "--json" => json = true,
            "--no-delay" => no_delay = true,
            "--faults" => faults = true,
            "--no-progress" => cfg.progress = false,
            "--no-prefill-check" => cfg.prefill_check = false,
            _ => {
                let Some(v) = it.next() else {
                    return Err(if flag.starts_with('-') {
                        format!("{flag}: unknown flag or missing value (see --help)")
                    } else {
                        format!("unexpected argument '{flag}' (see --help)")
                    });
                };
                match flag {
                    "--preset" => {}
                    "--rules" => {
                        rules_set = true;
                        cfg.rules = v
                            .split(',')
                            .filter(|s| !s.is_empty())
                            .map(RuleKind::parse)
                            .collect::<Result<_, _>>()?
                    }
                    "--seconds" => {
                        cfg.seconds = num(flag, v)?;
                        seconds_set = true;
                    }
                    "--requests" => cfg.max_requests = Some(num(flag, v)?),
                    "--pages" => cfg.pages = num(flag, v)?,
                    "--page-bytes" => cfg.page_bytes = num(flag, v)?,
                    "--prefill-ranks" => cfg.prefill_ranks = num(flag, v)?,
                    "--fan-in" => cfg.fan_in = num(flag, v)?,
                    "--rooms" => cfg.rooms = num(flag, v)?,
                    "--min-pages" => cfg.min_pages = num(flag, v)?,
                    "--max-pages" => cfg.max_pages = num(flag, v)?,
                    "--chunk-pages" => cfg.chunk_pages = num(flag, v)?,
                    "--queue-us" => cfg.queue_us = num(flag, v)?,
                    "--transfer-us" => cfg.transfer_us = num(flag, v)?,
                    "--max-inflight" => cfg.max_inflight = num(flag, v)?,
                    "--decode-us" => cfg.decode_us = num(flag, v)?,
                    "--abort-rate" => cfg.abort_rate = num(flag, v)?,
                    "--wait-timeout-ms" => cfg.wait_timeout_ms = num(flag, v)?,
                    "--timeout-ms" => timeout_set = Some(num(flag, v)?),
                    "--time-scale" => cfg.time_scale = num(flag, v)?,
                    "--sglang-timeout-s" => cfg.sglang_timeout_s = num(flag, v)?,
                    "--vllm-timeout-s" => cfg.vllm_timeout_s = num(flag, v)?,
                    "--heartbeat-s" => cfg.heartbeat_s = num(flag, v)?,
                    "--heartbeat-failures" => cfg.heartbeat_failures = num(flag, v)?,
                    "--detect-ms" => cfg.detect_ms = Some(num(flag, v)?),
                    "--ack-delay-us" => cfg.ack_delay_us = num(flag, v)?,
                    "--ack-drop" => cfg.ack_drop = num(flag, v)?,
                    "--ack-dup" => cfg.ack_dup = num(flag, v)?,
                    "--ack-late" => cfg.ack_late = num(flag, v)?,
                    "--late-ms" => cfg.late_ms = num(flag, v)?,
                    "--stale-intent-rate" => cfg.stale_intent_rate = num(flag, v)?,
                    "--abort-retry-ms" => cfg.abort_retry_ms = num(flag, v)?,
                    "--death-period-ms" => cfg.death_period_ms = num(flag, v)?,
                    "--teardown-ms" => cfg.teardown_ms = num(flag, v)?,
                    "--fail-rate" => cfg.fail_rate = num(flag, v)?,
                    "--fail-lands" => cfg.fail_lands = num(flag, v)?,
                    "--quarantine-ms" => cfg.quarantine_ms = num(flag, v)?,
                    "--seed" => cfg.seed = num(flag, v)?,
                    "--plot" => plot = Some(v.clone()),
                    "--runs" => runs = num(flag, v)?,
                    "--rounds" => rounds = num(flag, v)?,
                    _ => return Err(format!("{flag}: unknown flag (see --help)")),
                }
            }
        }
    }
    if let Some(t) = timeout_set {
        cfg.timeout_ms = t;
    }
    if mode != "soak" && cfg.max_requests.is_some() {
        return Err("--requests is a soak flag (kvfence-sim soak --requests N)".into());
    }
    match mode.as_str() {
        "repro" => {
            if runs == 0 || runs > 100_000 {
                return Err(format!("--runs must be in 1..=100000, got {runs}"));
            }
            if cfg.timeout_ms > 10_000 {
                return Err("--timeout-ms above 10000 would make repro needlessly slow".into());
            }
            Ok(Command::Repro {
                runs,
                timeout_ms: timeout_set.unwrap_or(5),
                json,
            })
        }
        "bench" => {
            if !seconds_set {
                cfg.seconds = 2.0;
            }
            if !faults {
                cfg.no_delay();
                if !rules_set {
                    cfg.rules = vec![RuleKind::Naive, RuleKind::AcksOnly, RuleKind::Kvfence];
                }
            }
            if !cfg.rules.contains(&RuleKind::Kvfence) {
                return Err("bench: --rules must include kvfence (ratios are kvfence's)".into());
            }
            cfg.validate()?;
            if rounds == 0 || rounds > 1000 {
                return Err(format!("--rounds must be in 1..=1000, got {rounds}"));
            }
            Ok(Command::Bench { cfg, rounds, json })
        }
        "soak" => {
            if rules_set && cfg.rules != vec![RuleKind::Kvfence] {
                return Err("soak runs the kvfence rule only (drop --rules)".into());
            }
            if plot.is_some() {
                return Err("--plot is not available for soak".into());
            }
            if no_delay {
                return Err("soak runs the full fault mix: --no-delay does not apply".into());
            }
            cfg.validate()?;
            Ok(Command::Soak { cfg, json })
        }
        _ => {
            if no_delay {
                cfg.no_delay();
            }
            if faults {
                return Err("--faults is a bench flag".into());
            }
            cfg.validate()?;
            if let Some(p) = &plot {
                if !p.ends_with(".svg") {
                    return Err(format!("--plot: only .svg is supported, got '{p}'"));
                }
            }
            Ok(Command::Run { cfg, json, plot })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn defaults_are_valid_and_run_all_rules() {
        let Ok(Command::Run { cfg, json, plot }) = parse(&[]) else {
            panic!("default must parse");
        };
        assert_eq!(cfg.rules, RuleKind::ALL.to_vec());
        assert_eq!((cfg.pages, cfg.page_bytes), (4096, 4096));
        assert!(!json && plot.is_none());
    }

    #[test]
    fn flags_are_applied() {
        let Ok(Command::Run { cfg, json, .. }) = parse(&args(
            "--rules kvfence,naive --pages 128 --fan-in 2 --json --timeout-ms 7",
        )) else {
            panic!("must parse");
        };
        assert_eq!(cfg.rules, vec![RuleKind::Kvfence, RuleKind::Naive]);
        assert_eq!((cfg.pages, cfg.fan_in, cfg.timeout_ms), (128, 2, 7));
        assert!(json);
    }

    #[test]
    fn impossible_configs_are_refused() {
        for bad in [
            "--fan-in 9",
            "--pages 0",
            "--max-pages 5000",
            "--min-pages 9 --max-pages 4",
            "--page-bytes 12",
            "--abort-rate 2",
            "--rules bogus",
            "--pages lots",
            "--frobnicate 1",
            "--json extra",
            "--seconds 0",
            "--prefill-ranks 300",
            "--rooms 0",
            "--ack-drop 1",
            "--plot out.png",
            "repro --runs 0",
            "bench --rounds 0",
            "--seed",
        ] {
            assert!(parse(&args(bad)).is_err(), "{bad} should be refused");
        }
        assert!(parse(&args("--fan-in 8")).is_ok(), "K == P is allowed");
    }

    #[test]
    fn no_delay_turns_off_aborts_and_faults() {
        let Ok(Command::Run { cfg, .. }) = parse(&args("--no-delay")) else {
            panic!("must parse");
        };
        assert_eq!(cfg.abort_rate, 0.0);
        assert_eq!(
            (cfg.queue_us, cfg.transfer_us, cfg.death_period_ms),
            (0, 0, 0)
        );
        let Ok(Command::Bench { cfg, rounds, .. }) = parse(&args("bench --rounds 3")) else {
            panic!("must parse");
        };
        assert_eq!(rounds, 3);
        assert_eq!(
            cfg.rules,
            vec![RuleKind::Naive, RuleKind::AcksOnly, RuleKind::Kvfence]
        );
        assert_eq!(cfg.abort_rate, 0.0);
        let Ok(Command::Bench { cfg, .. }) = parse(&args("bench --faults")) else {
            panic!("must parse");
        };
        assert_eq!(cfg.rules, RuleKind::ALL.to_vec());
        assert!(cfg.abort_rate > 0.0);
    }

    #[test]
    fn peer_times_presets_and_soak() {
        let Ok(Command::Run { cfg, .. }) = parse(&[]) else {
            panic!("must parse");
        };
        // SGLang: 5 s x 2 heartbeats, 30 s; vLLM 480 s; compressed 100x.
        assert_eq!(cfg.detect(), Duration::from_millis(100));
        assert_eq!(
            cfg.timeout_for(RuleKind::Sglang),
            Duration::from_millis(300)
        );
        assert_eq!(cfg.timeout_for(RuleKind::Vllm), Duration::from_millis(4800));
        assert_eq!(
            cfg.timeout_for(RuleKind::Timeout),
            Duration::from_millis(20)
        );
        let Ok(Command::Run { cfg, .. }) =
            parse(&args("--detect-ms 7 --preset production --fan-in 3"))
        else {
            panic!("must parse");
        };
        assert_eq!(cfg.detect(), Duration::from_millis(7));
        assert_eq!(
            (cfg.fan_in, cfg.abort_rate),
            (3, 0.01),
            "flags override the preset"
        );
        let Ok(Command::Soak { cfg, .. }) = parse(&args("soak --requests 1000")) else {
            panic!("must parse");
        };
        assert_eq!(cfg.max_requests, Some(1000));
        assert_eq!(cfg.rules, vec![RuleKind::Kvfence]);
        for bad in [
            "--preset nope",
            "--preset",
            "--requests 5",
            "soak --rules naive",
            "soak --requests 0",
            "--time-scale 0",
            "--fail-rate 2",
            "--faults",
            "--quarantine-ms 0",
        ] {
            assert!(parse(&args(bad)).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn repro_and_help() {
        assert_eq!(
            parse(&args("repro --runs 3 --json")),
            Ok(Command::Repro {
                runs: 3,
                timeout_ms: 5,
                json: true
            })
        );
        assert_eq!(parse(&args("--help")), Ok(Command::Help));
    }
}
