//! The command line (clap derive): subcommands, flags, their help, and the step from flags to
//! a [`SimConfig`]. Every flag is an `Option` so that a preset (`--preset`, the `soak`
//! defaults) applies first and a flag given anywhere overrides it; the bracketed defaults in
//! the help text are checked against [`SimConfig`] by the tests below. Bad flags are clap's
//! errors and a config that cannot run is a usage error too: both exit with status 2.

use crate::config::{measured_teardown_ms, RuleKind, SimConfig};
use clap::error::ErrorKind;
use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};

const WORKLOAD: &str = "Workload";
const PEERS: &str = "Peers' control plane (divided by --time-scale)";
const FAULTS: &str = "Faults";
const OUTPUT: &str = "Output";

const ABOUT: &str = "Prefill ranks write real bytes into a decode page arena while the decode \
side aborts requests; compares release rules and verifies every byte.";

const LONG_ABOUT: &str = "\
Prefill ranks write real bytes into a decode page arena while the decode side aborts
requests; compares release rules and verifies every byte.

Without a command: the simulation, every rule side by side (the same as `kvfence-sim run`).
Each command has its own --help (`kvfence-sim bench --help`). Brackets give defaults; a
default marked `bench:` or `soak:` is that command's.";

const EXIT_STATUS: &str = "\
Exit status: 0 ok; 1 kvfence corrupted a page or lost one (or the run failed); 2 bad flags
or config.";

const EXAMPLES: &str = "\
Examples:
  kvfence-sim                                 every rule side by side, 7 s each
  kvfence-sim --preset production --plot run.svg
                                              production-like settings, pages over time
  kvfence-sim repro --runs 20                 the forced race, 20 runs per rule
  kvfence-sim bench --rounds 5                kvfence's overhead: faults off, zero delays
  kvfence-sim bench --faults                  throughput with the fault mix, every rule
  kvfence-sim soak --requests 1000000         kvfence alone under every fault, 10^6 requests
  kvfence-sim --teardown assumed-30s          the teardown assumed before it was measured

Exit status: 0 ok; 1 kvfence corrupted a page or lost one (or the run failed); 2 bad flags
or config.";

/// `kvfence-sim`: the arguments as clap parses them.
#[derive(Debug, Parser)]
#[command(
    name = "kvfence-sim",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = EXIT_STATUS,
    after_long_help = EXAMPLES,
    max_term_width = 100,
    // A flag given twice: the last one wins, as scripts that append overrides expect.
    args_override_self = true,
    args_conflicts_with_subcommands = true,
    disable_help_subcommand = true
)]
pub struct Cli {
    /// What to run (default: `run`).
    #[command(subcommand)]
    pub command: Option<Sub>,
    /// The simulation's flags when no command is given.
    #[command(flatten)]
    pub run: RunArgs,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Sub {
    /// Simulation, all rules side by side (the default command).
    #[command(after_help = EXIT_STATUS, args_override_self = true)]
    Run(RunArgs),
    /// Forces the docs/DESIGN.md section-1 race with barriers (deterministic).
    #[command(after_help = EXIT_STATUS, args_override_self = true)]
    Repro(ReproArgs),
    /// Throughput per rule, interleaved rounds; without --faults: aborts and faults off,
    /// zero delays, rules naive,acks-only,kvfence.
    #[command(after_help = EXIT_STATUS, args_override_self = true)]
    Bench(BenchArgs),
    /// kvfence only, full fault mix, N requests (--requests, default 10000000); fails unless 0 corrupted and
    /// exact page conservation.
    #[command(after_help = EXIT_STATUS, args_override_self = true)]
    Soak(SoakArgs),
}

/// `--preset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// The defaults shown here.
    Default,
    /// Mirrors a production deployment: fan-in 2, 1% aborts, 0-4 ms queueing, 0-3 ms
    /// transfers, 0-3 ms decode, 2% of intents missed by the abort drain, few ACK faults, a
    /// rank death every 2.5 s, rare failed transfers, 200 ms waiting timeout.
    Production,
}

/// `--teardown`: named values of `--teardown-ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TeardownPreset {
    /// The measured teardown (the default; see --teardown-ms).
    Measured,
    /// The 30 s assumed before the teardown was measured, divided by --time-scale (300 ms at
    /// the default scale; the old default).
    #[value(name = "assumed-30s")]
    Assumed30s,
}

/// `--json` and `--no-progress`.
#[derive(Debug, Args)]
pub struct OutArgs {
    /// One JSON object on stdout (instead of the table).
    #[arg(long, help_heading = OUTPUT)]
    pub json: bool,
    /// No progress line (it is shown on stderr only when stderr is a terminal).
    #[arg(long, help_heading = OUTPUT)]
    pub no_progress: bool,
}

/// The simulation's settings (run, bench, soak).
#[derive(Debug, Args)]
pub struct SimArgs {
    /// Settings preset, applied first: the other flags override it wherever given.
    #[arg(long, value_enum, value_name = "NAME", help_heading = WORKLOAD)]
    pub preset: Option<Preset>,
    /// Rules to run, a comma list [default: all; bench: naive,acks-only,kvfence; soak:
    /// kvfence].
    ///
    /// Each is run in turn on the same settings (bench: interleaved). "Trusts the detector":
    /// a dead rank's rooms are freed when the failure detector fires and a failed transfer's
    /// room at once, without teardown proof (what SGLang does).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        action = clap::ArgAction::Set,
        value_name = "RULES",
        help_heading = WORKLOAD
    )]
    pub rules: Option<Vec<RuleKind>>,
    /// Seconds of request arrivals per rule; the drain afterwards is extra [default: 7;
    /// bench: 2].
    #[arg(long, value_name = "S", help_heading = WORKLOAD)]
    pub seconds: Option<f64>,
    /// Decode arena pages [default: 4096].
    #[arg(long, value_name = "N", help_heading = WORKLOAD)]
    pub pages: Option<usize>,
    /// Bytes per page, a multiple of 8 [default: 4096].
    #[arg(long, value_name = "B", help_heading = WORKLOAD)]
    pub page_bytes: Option<usize>,
    /// Prefill rank threads [default: 8].
    #[arg(long, value_name = "P", help_heading = WORKLOAD)]
    pub prefill_ranks: Option<usize>,
    /// Ranks each request fans in from, at most --prefill-ranks [default: 4].
    #[arg(long, value_name = "K", help_heading = WORKLOAD)]
    pub fan_in: Option<usize>,
    /// Concurrent requests (decode rooms) [default: 256].
    #[arg(long, value_name = "R", help_heading = WORKLOAD)]
    pub rooms: Option<usize>,
    /// Pages per request at least, uniform in min..=max [default: 4].
    #[arg(long, value_name = "N", help_heading = WORKLOAD)]
    pub min_pages: Option<usize>,
    /// Pages per request at most [default: 32].
    #[arg(long, value_name = "N", help_heading = WORKLOAD)]
    pub max_pages: Option<usize>,
    /// Pages per write intent (chunk) [default: 2].
    #[arg(long, value_name = "N", help_heading = WORKLOAD)]
    pub chunk_pages: Option<usize>,
    /// Prefill queueing delay, uniform 0..US per request [default: 2000; soak: 0].
    #[arg(long, value_name = "US", help_heading = WORKLOAD)]
    pub queue_us: Option<u64>,
    /// Chunk in-flight (transfer) time, uniform 0..US [default: 1000; soak: 200].
    #[arg(long, value_name = "US", help_heading = WORKLOAD)]
    pub transfer_us: Option<u64>,
    /// Chunks in flight per rank at most [default: 8].
    #[arg(long, value_name = "N", help_heading = WORKLOAD)]
    pub max_inflight: Option<usize>,
    /// Decode time between "all KV arrived" and verify + finish [default: 2000; soak: 0].
    #[arg(long, value_name = "US", help_heading = WORKLOAD)]
    pub decode_us: Option<u64>,
    /// Abort requests whose KV is not all in after MS (waiting timeout) [default: 100; soak:
    /// 50].
    #[arg(long, value_name = "MS", help_heading = WORKLOAD)]
    pub wait_timeout_ms: Option<u64>,
    /// Random seed [default: 1].
    #[arg(long, value_name = "N", help_heading = WORKLOAD)]
    pub seed: Option<u64>,
    /// Peer control-plane times (heartbeat, 30 s, 480 s, --teardown assumed-30s) are divided
    /// by S to fit a short run; data-plane delays are not scaled [default: 100].
    #[arg(long, value_name = "S", help_heading = PEERS)]
    pub time_scale: Option<f64>,
    /// `timeout` rule: release an aborted room after MS even without all ACKs, wall ms, not
    /// scaled [default: 20; repro: 5].
    #[arg(long, value_name = "MS", help_heading = PEERS)]
    pub timeout_ms: Option<u64>,
    /// `sglang` rule's release-anyway timeout, s of peer time [default: 30].
    #[arg(long, value_name = "S", help_heading = PEERS)]
    pub sglang_timeout_s: Option<f64>,
    /// `vllm` rule's abort-request timeout (VLLM_NIXL_ABORT_REQUEST_TIMEOUT), s of peer time
    /// [default: 480].
    #[arg(long, value_name = "S", help_heading = PEERS)]
    pub vllm_timeout_s: Option<f64>,
    /// SGLang's failure detector: heartbeat interval
    /// (SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL), s [default: 5].
    #[arg(long, value_name = "S", help_heading = PEERS)]
    pub heartbeat_s: Option<f64>,
    /// SGLang's failure detector: missed heartbeats before a prefill is marked dead
    /// (SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE) [default: 2].
    #[arg(long, value_name = "N", help_heading = PEERS)]
    pub heartbeat_failures: Option<u32>,
    /// Dead-rank detection time, wall ms [default: heartbeat-s x heartbeat-failures /
    /// time-scale = 100; soak: 10].
    ///
    /// The rules that trust the detector free a dead rank's rooms then.
    #[arg(long, value_name = "MS", help_heading = PEERS)]
    pub detect_ms: Option<u64>,
    /// Rank death -> its transport torn down (then kvfence fences it), wall ms from the death
    #[arg(
        long,
        value_name = "MS",
        help_heading = PEERS,
        help = concat!(
            "Rank death -> its transport torn down (then kvfence fences it), wall ms from the ",
            "death [default: detection + ", measured_teardown_ms!(), " ms measured / ",
            "time-scale = 101.65; soak: 30]"
        ),
        long_help = concat!(
            "Rank death -> its transport torn down (then kvfence fences it), wall ms from the ",
            "death [default: detection + ", measured_teardown_ms!(), " ms measured / ",
            "time-scale = 101.65; soak: 30]\n\n",
            "The default is the measured time the decode needs to prove on its own that a ",
            "dead peer's transport is gone (\"declare the peer dead\" -> \"proven torn down\"), ",
            "on the real engine over Mooncake TCP; source: e2e/hosts/TEARDOWN.md ",
            "(MEASURED_TEARDOWN_MS: the median of 178 tries, min 64, p90 237, max 347 ms). ",
            "It starts when the detector declares the rank dead, and runs on the peers' clock ",
            "like the detector and the death period (divided by --time-scale), so a dead ",
            "rank's pages are held for the deployment's share of the time. ",
            "The 30 s assumed before: --teardown assumed-30s (from the death, scaled)."
        ),
        conflicts_with = "teardown"
    )]
    pub teardown_ms: Option<u64>,
    /// Named --teardown-ms values.
    #[arg(long, value_enum, value_name = "PRESET", help_heading = PEERS)]
    pub teardown: Option<TeardownPreset>,
    /// Random aborts (client disconnect during the transfer), a probability [default: 0.1].
    #[arg(long, value_name = "P", help_heading = FAULTS)]
    pub abort_rate: Option<f64>,
    /// A rank dies (hangs) every MS, 0 = never [default: 1500; soak: 300].
    #[arg(long, value_name = "MS", help_heading = FAULTS)]
    pub death_period_ms: Option<u64>,
    /// ACK delay, uniform 0..US [default: 1000; soak: 200].
    #[arg(long, value_name = "US", help_heading = FAULTS)]
    pub ack_delay_us: Option<u64>,
    /// ACK fault: an ACK is dropped (the decode re-sends ABORT) [default: 0.02].
    #[arg(long, value_name = "P", help_heading = FAULTS)]
    pub ack_drop: Option<f64>,
    /// ACK fault: an ACK is duplicated [default: 0.05].
    #[arg(long, value_name = "P", help_heading = FAULTS)]
    pub ack_dup: Option<f64>,
    /// ACK fault: an ACK is late by --late-ms [default: 0.02].
    #[arg(long, value_name = "P", help_heading = FAULTS)]
    pub ack_late: Option<f64>,
    /// Extra delay of a late ACK [default: 50; soak: 5].
    #[arg(long, value_name = "MS", help_heading = FAULTS)]
    pub late_ms: Option<u64>,
    /// Queued intents of an aborted room that the rank's drain misses and still submits
    /// (the bug variant) [default: 0.2].
    #[arg(long, value_name = "P", help_heading = FAULTS)]
    pub stale_intent_rate: Option<f64>,
    /// Re-send ABORT to ranks that have not ACKed after MS [default: 20; soak: 5].
    #[arg(long, value_name = "MS", help_heading = FAULTS)]
    pub abort_retry_ms: Option<u64>,
    /// A chunk's write fails (the transfer engine returns an error) [default: 0.00002;
    /// soak: 0.0002].
    #[arg(long, value_name = "P", help_heading = FAULTS)]
    pub fail_rate: Option<f64>,
    /// A failed write's bytes still land, late (before the rank's teardown) [default: 0.5].
    #[arg(long, value_name = "P", help_heading = FAULTS)]
    pub fail_lands: Option<f64>,
    /// A room held by a failed transfer is quarantined after MS: its pages leave
    /// circulation until every rank it waited on has been torn down [default: 50; soak:
    /// 10].
    #[arg(long, value_name = "MS", help_heading = FAULTS)]
    pub quarantine_ms: Option<u64>,
    /// kvfence rule: ranks submit stale intents too (the decode side alone protects).
    #[arg(long, help_heading = FAULTS)]
    pub no_prefill_check: bool,
}

/// `run` (and no command).
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Settings.
    #[command(flatten)]
    pub sim: SimArgs,
    /// Aborts, faults, deaths off; all delays zero.
    #[arg(long, help_heading = FAULTS)]
    pub no_delay: bool,
    /// Write free/owned/held pages over time, one panel per rule, to FILE.svg.
    #[arg(long, value_name = "FILE.svg", help_heading = OUTPUT)]
    pub plot: Option<String>,
    /// Output.
    #[command(flatten)]
    pub out: OutArgs,
    /// Hidden: `soak`'s flag, refused with a pointer to it.
    #[arg(long, hide = true)]
    pub requests: Option<u64>,
    /// Hidden: `bench`'s flag, refused with a pointer to it.
    #[arg(long, hide = true)]
    pub faults: bool,
}

/// `repro`.
#[derive(Debug, Args)]
pub struct ReproArgs {
    /// Runs per rule; even runs: a write in flight at the abort, odd runs: an intent queued
    /// and missed by the drain [default: 10].
    #[arg(long, value_name = "N")]
    pub runs: Option<usize>,
    /// `timeout` rule: release anyway after MS [default: 5].
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u64>,
    /// Output.
    #[command(flatten)]
    pub out: OutArgs,
}

/// `bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Settings (without --faults, --no-delay's values replace the fault and delay flags).
    #[command(flatten)]
    pub sim: SimArgs,
    /// Interleaved rounds; the rule order rotates each round [default: 5].
    #[arg(long, value_name = "N")]
    pub rounds: Option<usize>,
    /// Keep the fault mix and delays (default: --no-delay).
    #[arg(long, conflicts_with = "no_delay", help_heading = FAULTS)]
    pub faults: bool,
    /// Aborts, faults, deaths off; all delays zero (bench's default).
    #[arg(long, help_heading = FAULTS)]
    pub no_delay: bool,
    /// Output.
    #[command(flatten)]
    pub out: OutArgs,
}

/// `soak`.
#[derive(Debug, Args)]
pub struct SoakArgs {
    /// Settings (the soak defaults first: the fault mix with the data-plane delays cut to
    /// what the faults need).
    #[command(flatten)]
    pub sim: SimArgs,
    /// Requests to run [default: 10000000].
    #[arg(long, value_name = "N", help_heading = WORKLOAD)]
    pub requests: Option<u64>,
    /// Output.
    #[command(flatten)]
    pub out: OutArgs,
}

/// What the command line asked for.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
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

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Run,
    Bench,
    Soak,
}

impl SimArgs {
    /// The mode's defaults, then the preset, then every flag given.
    fn config(&self, mode: Mode, out: &OutArgs) -> SimConfig {
        let mut cfg = SimConfig::default();
        if mode == Mode::Soak {
            cfg.soak();
        }
        if self.preset == Some(Preset::Production) {
            cfg.production();
        }
        macro_rules! set {
            ($($field:ident),* $(,)?) => {
                $(if let Some(v) = self.$field {
                    cfg.$field = v;
                })*
            };
        }
        set!(
            seconds,
            pages,
            page_bytes,
            prefill_ranks,
            fan_in,
            rooms,
            min_pages,
            max_pages,
            chunk_pages,
            queue_us,
            transfer_us,
            max_inflight,
            decode_us,
            wait_timeout_ms,
            seed,
            time_scale,
            timeout_ms,
            sglang_timeout_s,
            vllm_timeout_s,
            heartbeat_s,
            heartbeat_failures,
            abort_rate,
            death_period_ms,
            ack_delay_us,
            ack_drop,
            ack_dup,
            ack_late,
            late_ms,
            stale_intent_rate,
            abort_retry_ms,
            fail_rate,
            fail_lands,
            quarantine_ms,
        );
        if let Some(rules) = &self.rules {
            cfg.rules.clone_from(rules);
        }
        if self.detect_ms.is_some() {
            cfg.detect_ms = self.detect_ms;
        }
        if self.teardown_ms.is_some() {
            cfg.teardown_ms = self.teardown_ms;
        }
        match self.teardown {
            Some(TeardownPreset::Measured) => cfg.teardown_ms = None,
            // After --time-scale: the assumed 30 s is peer time.
            Some(TeardownPreset::Assumed30s) => cfg.teardown_ms = Some(cfg.assumed_teardown_ms()),
            None => {}
        }
        cfg.prefill_check = !self.no_prefill_check;
        cfg.progress = !out.no_progress;
        cfg
    }
}

impl Cli {
    /// The command to run, or a message naming the flag whose value cannot run.
    pub fn into_command(self) -> Result<Command, String> {
        match self.command.unwrap_or(Sub::Run(self.run)) {
            Sub::Run(a) => {
                if a.requests.is_some() {
                    return Err("--requests is a soak flag (kvfence-sim soak --requests N)".into());
                }
                if a.faults {
                    return Err("--faults is a bench flag (kvfence-sim bench --faults)".into());
                }
                let mut cfg = a.sim.config(Mode::Run, &a.out);
                if a.no_delay {
                    cfg.no_delay();
                }
                cfg.validate()?;
                if let Some(p) = &a.plot {
                    if !p.ends_with(".svg") {
                        return Err(format!("--plot: only .svg is supported, got '{p}'"));
                    }
                }
                Ok(Command::Run {
                    cfg,
                    json: a.out.json,
                    plot: a.plot,
                })
            }
            Sub::Repro(a) => {
                let runs = a.runs.unwrap_or(10);
                if runs == 0 || runs > 100_000 {
                    return Err(format!("--runs must be in 1..=100000, got {runs}"));
                }
                let timeout_ms = a.timeout_ms.unwrap_or(5);
                if timeout_ms > 10_000 {
                    return Err("--timeout-ms above 10000 would make repro needlessly slow".into());
                }
                Ok(Command::Repro {
                    runs,
                    timeout_ms,
                    json: a.out.json,
                })
            }
            Sub::Bench(a) => {
                let mut cfg = a.sim.config(Mode::Bench, &a.out);
                if a.sim.seconds.is_none() {
                    cfg.seconds = 2.0;
                }
                if !a.faults {
                    cfg.no_delay();
                    if a.sim.rules.is_none() {
                        cfg.rules = vec![RuleKind::Naive, RuleKind::AcksOnly, RuleKind::Kvfence];
                    }
                }
                if !cfg.rules.contains(&RuleKind::Kvfence) {
                    return Err("bench: --rules must include kvfence (ratios are kvfence's)".into());
                }
                cfg.validate()?;
                let rounds = a.rounds.unwrap_or(5);
                if rounds == 0 || rounds > 1000 {
                    return Err(format!("--rounds must be in 1..=1000, got {rounds}"));
                }
                Ok(Command::Bench {
                    cfg,
                    rounds,
                    json: a.out.json,
                })
            }
            Sub::Soak(a) => {
                let mut cfg = a.sim.config(Mode::Soak, &a.out);
                if cfg.rules != vec![RuleKind::Kvfence] {
                    return Err("soak runs the kvfence rule only (drop --rules)".into());
                }
                if let Some(n) = a.requests {
                    cfg.max_requests = Some(n);
                }
                cfg.validate()?;
                Ok(Command::Soak {
                    cfg,
                    json: a.out.json,
                })
            }
        }
    }
}

/// Parses the arguments (without the program name). `Err` is clap's error, ready for
/// [`clap::Error::exit`]: `--help` and `--version` (exit status 0), bad flags and configs
/// that cannot run (usage errors, exit status 2).
pub fn parse(args: &[String]) -> Result<Command, clap::Error> {
    let argv = std::iter::once("kvfence-sim".to_string()).chain(args.iter().cloned());
    let cli = Cli::try_parse_from(argv)?;
    let sub = cli.command.as_ref().map(|s| match s {
        Sub::Run(_) => "run",
        Sub::Repro(_) => "repro",
        Sub::Bench(_) => "bench",
        Sub::Soak(_) => "soak",
    });
    cli.into_command().map_err(|msg| {
        let mut cmd = Cli::command();
        cmd.build();
        let cmd = match sub.and_then(|s| cmd.find_subcommand_mut(s)) {
            Some(s) => s.clone(),
            None => cmd,
        };
        let mut cmd = cmd.bin_name(match sub {
            Some(s) => format!("kvfence-sim {s}"),
            None => "kvfence-sim".into(),
        });
        clap::Error::raw(ErrorKind::ValueValidation, msg).format(&mut cmd)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    fn ok(s: &str) -> Command {
        parse(&args(s)).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn cfg_of(s: &str) -> SimConfig {
        match ok(s) {
            Command::Run { cfg, .. } | Command::Bench { cfg, .. } | Command::Soak { cfg, .. } => {
                cfg
            }
            Command::Repro { .. } => panic!("{s}: repro has no SimConfig"),
        }
    }

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_are_valid_and_run_all_rules() {
        let Command::Run { cfg, json, plot } = ok("") else {
            panic!("default must be run");
        };
        assert_eq!(cfg, SimConfig::default());
        assert_eq!(cfg.rules, RuleKind::ALL.to_vec());
        assert_eq!((cfg.pages, cfg.page_bytes), (4096, 4096));
        assert!(!json && plot.is_none());
        assert_eq!(ok("run"), ok(""), "`run` is the default command");
    }

    #[test]
    fn rule_names_are_the_command_line_names() {
        for r in RuleKind::ALL {
            let v = r.to_possible_value().expect("every rule is a value");
            assert_eq!(v.get_name(), r.name());
        }
    }

    #[test]
    fn a_flag_given_twice_takes_the_last_value() {
        assert_eq!(cfg_of("--seconds 1 --seconds 2").seconds, 2.0);
        assert_eq!(cfg_of("soak --pages 100 --pages 200").pages, 200);
        assert_eq!(
            cfg_of("--rules naive --rules kvfence").rules,
            vec![RuleKind::Kvfence]
        );
        assert!(matches!(
            ok("bench --rounds 1 --rounds 2"),
            Command::Bench { rounds: 2, .. }
        ));
        assert!(matches!(
            ok("repro --runs 1 --runs 2"),
            Command::Repro { runs: 2, .. }
        ));
    }

    #[test]
    fn flags_are_applied() {
        let Command::Run { cfg, json, .. } =
            ok("--rules kvfence,naive --pages 128 --fan-in 2 --json --timeout-ms 7")
        else {
            panic!("must be run");
        };
        assert_eq!(cfg.rules, vec![RuleKind::Kvfence, RuleKind::Naive]);
        assert_eq!((cfg.pages, cfg.fan_in, cfg.timeout_ms), (128, 2, 7));
        assert!(json);
    }

    /// Every flag of every command, given a value other than its default, changes exactly
    /// what it should; the table must name every flag clap knows (a new flag without a
    /// test fails `every_flag_is_tested`).
    type Check = fn(&Command) -> bool;

    fn sim(c: &Command) -> &SimConfig {
        match c {
            Command::Run { cfg, .. } | Command::Bench { cfg, .. } | Command::Soak { cfg, .. } => {
                cfg
            }
            Command::Repro { .. } => panic!("repro has no SimConfig"),
        }
    }

    const FLAG_CASES: &[(&str, &str, Check)] = &[
        ("", "--preset production", |c| {
            sim(c).fan_in == 2 && sim(c).abort_rate == 0.01
        }),
        ("", "--preset default", |c| *sim(c) == SimConfig::default()),
        ("", "--rules vllm,acks-only", |c| {
            sim(c).rules == vec![RuleKind::Vllm, RuleKind::AcksOnly]
        }),
        ("", "--seconds 1.5", |c| sim(c).seconds == 1.5),
        ("", "--pages 1000", |c| sim(c).pages == 1000),
        ("", "--page-bytes 64", |c| sim(c).page_bytes == 64),
        ("", "--prefill-ranks 5", |c| sim(c).prefill_ranks == 5),
        ("", "--fan-in 3", |c| sim(c).fan_in == 3),
        ("", "--rooms 17", |c| sim(c).rooms == 17),
        ("", "--min-pages 3", |c| sim(c).min_pages == 3),
        ("", "--max-pages 9", |c| sim(c).max_pages == 9),
        ("", "--chunk-pages 4", |c| sim(c).chunk_pages == 4),
        ("", "--queue-us 11", |c| sim(c).queue_us == 11),
        ("", "--transfer-us 12", |c| sim(c).transfer_us == 12),
        ("", "--max-inflight 13", |c| sim(c).max_inflight == 13),
        ("", "--decode-us 14", |c| sim(c).decode_us == 14),
        ("", "--wait-timeout-ms 15", |c| sim(c).wait_timeout_ms == 15),
        ("", "--seed 16", |c| sim(c).seed == 16),
        ("", "--time-scale 10", |c| sim(c).time_scale == 10.0),
        ("", "--timeout-ms 18", |c| sim(c).timeout_ms == 18),
        ("", "--sglang-timeout-s 19", |c| {
            sim(c).sglang_timeout_s == 19.0
        }),
        ("", "--vllm-timeout-s 21", |c| sim(c).vllm_timeout_s == 21.0),
        ("", "--heartbeat-s 2.5", |c| sim(c).heartbeat_s == 2.5),
        ("", "--heartbeat-failures 3", |c| {
            sim(c).heartbeat_failures == 3
        }),
        ("", "--detect-ms 22", |c| sim(c).detect_ms == Some(22)),
        ("", "--teardown-ms 23", |c| sim(c).teardown_ms == Some(23)),
        ("", "--teardown assumed-30s", |c| {
            sim(c).teardown_ms == Some(300)
        }),
        ("", "--abort-rate 0.3", |c| sim(c).abort_rate == 0.3),
        ("", "--death-period-ms 2400", |c| {
            sim(c).death_period_ms == 2400
        }),
        ("", "--ack-delay-us 25", |c| sim(c).ack_delay_us == 25),
        ("", "--ack-drop 0.25", |c| sim(c).ack_drop == 0.25),
        ("", "--ack-dup 0.26", |c| sim(c).ack_dup == 0.26),
        ("", "--ack-late 0.27", |c| sim(c).ack_late == 0.27),
        ("", "--late-ms 28", |c| sim(c).late_ms == 28),
        ("", "--stale-intent-rate 0.29", |c| {
            sim(c).stale_intent_rate == 0.29
        }),
        ("", "--abort-retry-ms 30", |c| sim(c).abort_retry_ms == 30),
        ("", "--fail-rate 0.31", |c| sim(c).fail_rate == 0.31),
        ("", "--fail-lands 0.32", |c| sim(c).fail_lands == 0.32),
        ("", "--quarantine-ms 33", |c| sim(c).quarantine_ms == 33),
        ("", "--no-prefill-check", |c| !sim(c).prefill_check),
        ("", "--no-delay", |c| {
            sim(c).abort_rate == 0.0 && sim(c).queue_us == 0
        }),
        (
            "",
            "--plot x.svg",
            |c| matches!(c, Command::Run { plot: Some(p), .. } if p == "x.svg"),
        ),
        ("", "--json", |c| {
            matches!(c, Command::Run { json: true, .. })
        }),
        ("", "--no-progress", |c| !sim(c).progress),
        ("repro", "--runs 7", |c| {
            matches!(c, Command::Repro { runs: 7, .. })
        }),
        ("repro", "--timeout-ms 9", |c| {
            matches!(c, Command::Repro { timeout_ms: 9, .. })
        }),
        ("repro", "--json", |c| {
            matches!(c, Command::Repro { json: true, .. })
        }),
        ("repro", "--no-progress", |c| {
            matches!(c, Command::Repro { .. })
        }),
        ("bench", "--rounds 3", |c| {
            matches!(c, Command::Bench { rounds: 3, .. })
        }),
        ("bench", "--faults", |c| sim(c).abort_rate > 0.0),
        ("bench", "--no-delay", |c| sim(c).abort_rate == 0.0),
        ("bench", "--json", |c| {
            matches!(c, Command::Bench { json: true, .. })
        }),
        ("soak", "--requests 1000", |c| {
            sim(c).max_requests == Some(1000)
        }),
        ("soak", "--json", |c| {
            matches!(c, Command::Soak { json: true, .. })
        }),
        ("soak", "--teardown measured", |c| {
            sim(c).teardown_ms.is_none()
        }),
    ];

    #[test]
    fn each_flag_is_applied() {
        for &(sub, flag, check) in FLAG_CASES {
            let line = format!("{sub} {flag}");
            let c = ok(&line);
            assert!(check(&c), "{line}: not applied: {c:?}");
            // Not true without the flag (the check can fail).
            // Cases that state what the command does anyway.
            let states_a_default = [
                ("", "--preset default"),
                ("bench", "--no-delay"),
                ("repro", "--no-progress"),
            ];
            if !states_a_default.contains(&(sub, flag)) {
                let without = ok(sub);
                assert!(
                    !check(&without),
                    "{line}: the check holds without the flag too"
                );
            }
        }
    }

    #[test]
    fn each_sim_flag_reaches_every_command_that_has_it() {
        // The shared settings are one struct, flattened into run, bench and soak.
        for sub in ["run", "bench --faults", "soak"] {
            assert_eq!(cfg_of(&format!("{sub} --seed 99")).seed, 99, "{sub}");
            assert_eq!(cfg_of(&format!("{sub} --pages 999")).pages, 999, "{sub}");
        }
    }

    #[test]
    fn every_flag_is_tested() {
        let root = Cli::command();
        let on_root = |flag: &str| root.get_arguments().any(|a| a.get_long() == Some(flag));
        let mut subs: Vec<(&str, &clap::Command)> = vec![("", &root)];
        subs.extend(root.get_subcommands().map(|s| (s.get_name(), s)));
        for (name, c) in subs {
            for a in c.get_arguments() {
                let Some(long) = a.get_long() else { continue };
                // Hidden flags only point to another command (`validation_errors_...`).
                if ["help", "version"].contains(&long) || a.is_hide_set() {
                    continue;
                }
                let flag = format!("--{long}");
                // A case on the default command covers the shared flags of run, bench, soak.
                let tested = FLAG_CASES.iter().any(|&(s, f, _)| {
                    f.split_whitespace().next() == Some(flag.as_str())
                        && (s == name || (s.is_empty() && name != "repro" && on_root(long)))
                });
                assert!(tested, "{name} {flag} has no case in FLAG_CASES");
            }
        }
    }

    /// The bracketed defaults of the help text: `[default: A; bench: B; soak: C]`.
    fn documented_defaults(help: &str) -> Vec<(String, String)> {
        let Some(start) = help.find("[default: ") else {
            return Vec::new();
        };
        let rest = &help[start + 1..];
        let inner = &rest[..rest.find(']').expect("closed bracket")];
        inner
            .split(';')
            .map(|part| {
                let (mode, value) = part.trim().split_once(':').expect("mode: value");
                // "5, measured": the value is the first word.
                let value = value
                    .trim()
                    .split([',', ' '])
                    .next()
                    .unwrap_or("")
                    .to_string();
                (mode.trim().to_string(), value)
            })
            .collect()
    }

    #[test]
    fn documented_defaults_are_the_real_ones() {
        // Given its documented default, each flag leaves the config as it is without it.
        // Described (not literal) defaults are checked by the named tests.
        let described = ["rules", "detect-ms", "teardown-ms"];
        let cmd = Cli::command();
        let mut checked = 0;
        for sub in ["run", "bench", "soak", "repro"] {
            let c = cmd.find_subcommand(sub).expect("subcommand");
            for a in c.get_arguments() {
                let Some(long) = a.get_long() else { continue };
                if described.contains(&long) {
                    continue;
                }
                let help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
                let defaults = documented_defaults(&help);
                let mine = defaults.iter().find(|(m, _)| m == sub);
                let Some((_, value)) =
                    mine.or_else(|| defaults.iter().find(|(m, _)| m == "default"))
                else {
                    continue;
                };
                let base = if sub == "bench" {
                    "bench --faults"
                } else {
                    sub
                };
                let with = ok(&format!("{base} --{long} {value}"));
                assert_eq!(with, ok(base), "{sub} --{long}: documented default {value}");
                checked += 1;
            }
        }
        assert!(checked > 60, "only {checked} documented defaults checked");
        // The described ones.
        assert_eq!(cfg_of("").detect(), Duration::from_millis(100));
        assert_eq!(cfg_of("soak").detect(), Duration::from_millis(10));
        assert_eq!(cfg_of("bench").rules, ok_rules(&[0, 4, 5]));
        assert_eq!(cfg_of("soak").rules, vec![RuleKind::Kvfence]);
    }

    fn ok_rules(idx: &[usize]) -> Vec<RuleKind> {
        idx.iter().map(|&i| RuleKind::ALL[i]).collect()
    }

    #[test]
    fn teardown_default_is_the_measured_constant_and_named_in_help() {
        use crate::config::{MEASURED_TEARDOWN_MS, TEARDOWN_SOURCE};
        use std::time::Duration;
        assert_eq!(SimConfig::default().teardown_ms, None);
        assert_eq!(cfg_of("").teardown_ms, None);
        // The measured teardown starts at detection and runs on the peers' clock.
        let scaled = |ms: f64| Duration::from_secs_f64(ms / 1000.0);
        let d = cfg_of("");
        assert_eq!(
            d.teardown(),
            d.detect() + scaled(MEASURED_TEARDOWN_MS as f64 / 100.0)
        );
        assert_eq!(d.teardown(), scaled(101.65), "the figure --help names");
        let d = cfg_of("--time-scale 10");
        assert_eq!(
            d.teardown(),
            scaled(1000.0 + MEASURED_TEARDOWN_MS as f64 / 10.0)
        );
        let d = cfg_of("--detect-ms 40");
        assert_eq!(
            d.teardown(),
            scaled(40.0 + MEASURED_TEARDOWN_MS as f64 / 100.0)
        );
        assert_eq!(cfg_of("--teardown-ms 7").teardown(), scaled(7.0));
        assert_eq!(cfg_of("soak").teardown_ms, Some(30), "--help: soak: 30");
        assert_eq!(cfg_of("soak --teardown-ms 30"), cfg_of("soak"));
        let help = Cli::command().render_long_help().to_string();
        assert!(
            help.contains(TEARDOWN_SOURCE),
            "--help names the teardown's source"
        );
        assert!(help.contains(&format!(
            "[default: detection + {MEASURED_TEARDOWN_MS} ms measured / time-scale = 101.65"
        )));
        // The preset keeps the assumed 30 s of peer time, scaled like the peers' times.
        assert_eq!(cfg_of("--teardown assumed-30s").teardown_ms, Some(300));
        assert_eq!(
            cfg_of("--teardown assumed-30s --time-scale 1000").teardown_ms,
            Some(30)
        );
        assert!(parse(&args("--teardown assumed-30s --teardown-ms 4")).is_err());
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
            let e = parse(&args(bad)).expect_err(bad);
            assert_eq!(e.exit_code(), 2, "{bad}");
        }
        assert!(parse(&args("--fan-in 8")).is_ok(), "K == P is allowed");
    }

    #[test]
    fn validation_errors_name_the_flag_and_its_range() {
        let e = parse(&args("--fan-in 9")).expect_err("refused").to_string();
        assert!(
            e.contains("--fan-in must be in 1..=prefill ranks (8), got 9"),
            "{e}"
        );
        let e = parse(&args("soak --rules naive"))
            .expect_err("refused")
            .to_string();
        assert!(e.contains("soak runs the kvfence rule only"), "{e}");
        assert!(
            e.contains("kvfence-sim soak"),
            "usage names the command: {e}"
        );
        let e = parse(&args("--requests 5"))
            .expect_err("refused")
            .to_string();
        assert!(e.contains("kvfence-sim soak --requests N"), "{e}");
        let e = parse(&args("run --faults"))
            .expect_err("refused")
            .to_string();
        assert!(e.contains("kvfence-sim bench --faults"), "{e}");
        let e = parse(&args("--pages lots"))
            .expect_err("refused")
            .to_string();
        assert!(e.contains("--pages"), "{e}");
    }

    #[test]
    fn no_delay_turns_off_aborts_and_faults() {
        let Command::Run { cfg, .. } = ok("--no-delay") else {
            panic!("must be run");
        };
        assert_eq!(cfg.abort_rate, 0.0);
        assert_eq!(
            (cfg.queue_us, cfg.transfer_us, cfg.death_period_ms),
            (0, 0, 0)
        );
        let Command::Bench { cfg, rounds, .. } = ok("bench --rounds 3") else {
            panic!("must be bench");
        };
        assert_eq!(rounds, 3);
        assert_eq!(
            cfg.rules,
            vec![RuleKind::Naive, RuleKind::AcksOnly, RuleKind::Kvfence]
        );
        assert_eq!((cfg.abort_rate, cfg.seconds), (0.0, 2.0));
        let Command::Bench { cfg, .. } = ok("bench --faults") else {
            panic!("must be bench");
        };
        assert_eq!(cfg.rules, RuleKind::ALL.to_vec());
        assert!(cfg.abort_rate > 0.0);
        assert!(parse(&args("bench --faults --no-delay")).is_err());
    }

    #[test]
    fn peer_times_presets_and_soak() {
        let cfg = cfg_of("");
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
        let cfg = cfg_of("--detect-ms 7 --preset production --fan-in 3");
        assert_eq!(cfg.detect(), Duration::from_millis(7));
        assert_eq!(
            (cfg.fan_in, cfg.abort_rate),
            (3, 0.01),
            "flags override the preset"
        );
        let Command::Soak { cfg, .. } = ok("soak --requests 1000") else {
            panic!("must be soak");
        };
        assert_eq!(cfg.max_requests, Some(1000));
        assert_eq!(cfg.rules, vec![RuleKind::Kvfence]);
        assert_eq!(cfg_of("soak --rules kvfence"), cfg_of("soak"));
        for bad in [
            "--preset nope",
            "--preset",
            "--requests 5",
            "soak --rules naive",
            "soak --requests 0",
            "soak --plot x.svg",
            "soak --no-delay",
            "--time-scale 0",
            "--fail-rate 2",
            "--faults",
            "--quarantine-ms 0",
            "repro --seed 3",
            "repro --timeout-ms 20000",
        ] {
            assert!(parse(&args(bad)).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn repro_help_and_version() {
        assert_eq!(
            ok("repro --runs 3 --json"),
            Command::Repro {
                runs: 3,
                timeout_ms: 5,
                json: true
            }
        );
        for (flag, kind) in [
            ("--help", ErrorKind::DisplayHelp),
            ("-h", ErrorKind::DisplayHelp),
            ("bench --help", ErrorKind::DisplayHelp),
            ("--version", ErrorKind::DisplayVersion),
        ] {
            let e = parse(&args(flag)).expect_err(flag);
            assert_eq!((e.kind(), e.exit_code()), (kind, 0), "{flag}");
        }
    }
}
