//! `kvfence-sim`: see `kvfence-sim --help`.

use kvfence_sim::cli::{self, Command};
use kvfence_sim::config::{RuleKind, SimConfig, MEASURED_TEARDOWN_MS, TEARDOWN_SOURCE};
use kvfence_sim::report::{self, BenchJson, BenchRuleJson, SoakJson};
use kvfence_sim::repro;
use kvfence_sim::sim::{self, Progress, RuleResult};
use std::process::ExitCode;

fn run(cfg: &SimConfig, json: bool, plot: Option<&str>) -> ExitCode {
    let mut progress = Progress::new(cfg.progress);
    let mut results: Vec<RuleResult> = Vec::new();
    let n = cfg.rules.len();
    for (i, &kind) in cfg.rules.iter().enumerate() {
        progress.label(format!("rule {}/{n} {}", i + 1, kind.name()));
        match sim::run_rule(cfg, kind, &progress) {
            Ok(r) => results.push(r),
            Err(e) => {
                progress.clear();
                eprintln!("kvfence-sim: error: {e}");
                return ExitCode::from(1);
            }
        }
    }
    progress.clear();
    let kv_bad: Vec<String> = results
        .iter()
        .filter(|r| r.rule == "kvfence")
        .flat_map(|r| {
            let mut v = Vec::new();
            if r.corrupted_requests > 0 {
                v.push(format!(
                    "kvfence corrupted {} requests",
                    r.corrupted_requests
                ));
            }
            if let Err(e) = &r.conservation {
                v.push(format!("kvfence conservation failed: {e}"));
            }
            v
        })
        .collect();
    if json {
        println!("{}", report::json(&results, kv_bad.is_empty()));
    } else {
        print!("{}", header(cfg));
        print!("{}", report::table(&results));
    }
    if let Some(path) = plot {
        if let Err(e) = std::fs::write(path, report::svg(&results, cfg.pages)) {
            eprintln!("kvfence-sim: error: cannot write {path}: {e}");
            return ExitCode::from(1);
        }
        if !json {
            println!("plot written to {path}");
        }
    }
    for b in &kv_bad {
        eprintln!("kvfence-sim: FAIL: {b}");
    }
    if kv_bad.is_empty() {
        if !json && results.iter().any(|r| r.rule == "kvfence") {
            println!("kvfence: every completed request's KV verified, every page returned.");
        }
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// The settings line(s) above a table.
fn header(cfg: &SimConfig) -> String {
    format!(
        "kvfence-sim: {} pages x {} B, {} prefill ranks, fan-in {}, {} rooms, {} per rule, \
         abort rate {}, seed {}\n\
         peer times / {}: detector {} ms (heartbeat {} s x {}), teardown {} ms{}, rank death every {} ms; \
         timeouts: timeout {} ms, sglang {} ms ({} s), vllm {} ms ({} s)\n\
         faults: ACK drop/dup/late {}/{}/{}, stale intents {}, failed writes {} (land anyway {}), \
         quarantine after {} ms\n",
        cfg.pages,
        cfg.page_bytes,
        cfg.prefill_ranks,
        cfg.fan_in,
        cfg.rooms,
        match cfg.max_requests {
            Some(n) => format!("{n} requests"),
            None => format!("{} s", cfg.seconds),
        },
        cfg.abort_rate,
        cfg.seed,
        cfg.time_scale,
        cfg.detect().as_millis(),
        cfg.heartbeat_s,
        cfg.heartbeat_failures,
        cfg.teardown().as_secs_f64() * 1000.0,
        if cfg.teardown_ms.is_none() {
            format!(" (detection + {MEASURED_TEARDOWN_MS} ms measured / scale: {TEARDOWN_SOURCE})")
        } else {
            String::new()
        },
        cfg.death_period_ms,
        cfg.timeout_ms,
        cfg.timeout_for(RuleKind::Sglang).as_millis(),
        cfg.sglang_timeout_s,
        cfg.timeout_for(RuleKind::Vllm).as_millis(),
        cfg.vllm_timeout_s,
        cfg.ack_drop,
        cfg.ack_dup,
        cfg.ack_late,
        cfg.stale_intent_rate,
        cfg.fail_rate,
        cfg.fail_lands,
        cfg.quarantine_ms,
    )
}

fn soak(cfg: &SimConfig, json: bool) -> ExitCode {
    let mut progress = Progress::logging(cfg.progress);
    progress.label("soak kvfence".into());
    let r = match sim::run_rule(cfg, RuleKind::Kvfence, &progress) {
        Ok(r) => r,
        Err(e) => {
            progress.clear();
            eprintln!("kvfence-sim: error: {e}");
            return ExitCode::from(1);
        }
    };
    progress.clear();
    let want = cfg.max_requests.unwrap_or(0);
    let mut bad = Vec::new();
    if r.corrupted_requests > 0 {
        bad.push(format!("{} corrupted requests", r.corrupted_requests));
    }
    if let Err(e) = &r.conservation {
        bad.push(format!("conservation failed: {e}"));
    }
    if r.opened != want {
        bad.push(format!("opened {} requests, wanted {want}", r.opened));
    }
    if r.completed + r.aborted != r.opened {
        bad.push(format!(
            "{} completed + {} aborted != {} opened",
            r.completed, r.aborted, r.opened
        ));
    }
    if json {
        let ok = bad.is_empty();
        let out = SoakJson {
            mode: "soak",
            ok,
            requests: want,
            result: report::RunJson::new(std::slice::from_ref(&r), ok),
        };
        println!("{}", report::to_json(&out));
    } else {
        print!("{}", header(cfg));
        print!("{}", report::table(std::slice::from_ref(&r)));
        println!(
            "soak: {} requests in {:.1} s ({:.0} req/s): {} completed, {} aborted, {} corrupted, \
             {} rank deaths, {} failed transfers, {} rooms quarantined, conservation {}",
            r.opened,
            r.wall_s,
            r.opened as f64 / r.wall_s.max(1e-9),
            r.completed,
            r.aborted,
            r.corrupted_requests,
            r.deaths,
            r.failed_transfers,
            r.quarantined_rooms,
            if r.conservation.is_ok() {
                "exact"
            } else {
                "FAILED"
            }
        );
    }
    for b in &bad {
        eprintln!("kvfence-sim: FAIL: soak: {b}");
    }
    if bad.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn bench(cfg: &SimConfig, rounds: usize, json: bool) -> ExitCode {
    let mut progress = Progress::new(cfg.progress);
    let rules = cfg.rules.clone();
    let n = rules.len();
    let kv = rules
        .iter()
        .position(|&k| k == RuleKind::Kvfence)
        .unwrap_or(0);
    // rps[rule][round]
    let mut rps: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut corrupted = vec![0u64; n];
    let faults = cfg.abort_rate > 0.0 || cfg.death_period_ms > 0 || cfg.fail_rate > 0.0;
    for round in 0..rounds {
        // Rotate the order so no rule always runs on a warmer (or busier) machine.
        for j in 0..n {
            let i = (j + round) % n;
            let kind = rules[i];
            progress.label(format!("round {}/{rounds} {}", round + 1, kind.name()));
            let r = match sim::run_rule(cfg, kind, &progress) {
                Ok(r) => r,
                Err(e) => {
                    progress.clear();
                    eprintln!("kvfence-sim: error: {e}");
                    return ExitCode::from(1);
                }
            };
            corrupted[i] += r.corrupted_requests;
            let must_be_clean = !faults || kind == RuleKind::Kvfence;
            if must_be_clean && (r.corrupted_requests > 0 || r.conservation.is_err()) {
                progress.clear();
                eprintln!(
                    "kvfence-sim: FAIL: {} corrupted or leaked{}",
                    r.rule,
                    if faults { "" } else { " with no aborts" }
                );
                return ExitCode::from(1);
            }
            rps[i].push(r.throughput_rps);
        }
    }
    progress.clear();
    let med: Vec<f64> = rps.iter().map(|v| median(&mut v.clone())).collect();
    // Per-round ratio kvfence / rule, and its median.
    let ratios: Vec<Vec<f64>> = (0..n)
        .map(|i| {
            (0..rounds)
                .map(|k| {
                    if rps[i][k] > 0.0 {
                        rps[kv][k] / rps[i][k]
                    } else {
                        0.0
                    }
                })
                .collect()
        })
        .collect();
    let med_ratio: Vec<f64> = ratios.iter().map(|v| median(&mut v.clone())).collect();
    if json {
        let out = BenchJson {
            mode: "bench",
            faults,
            rounds,
            seconds: cfg.seconds,
            rules: (0..n)
                .map(|i| BenchRuleJson {
                    rule: rules[i].name(),
                    rps: rps[i].iter().map(|&x| report::round(x, 1)).collect(),
                    median_rps: report::round(med[i], 1),
                    corrupted_requests: corrupted[i],
                    kvfence_ratio_of_medians: report::round(
                        if med[i] > 0.0 { med[kv] / med[i] } else { 0.0 },
                        4,
                    ),
                    kvfence_median_pair_ratio: report::round(med_ratio[i], 4),
                })
                .collect(),
        };
        println!("{}", report::to_json(&out));
    } else {
        if faults {
            print!("bench --faults: {}", header(cfg));
        } else {
            println!(
                "bench: --no-delay (no aborts, no faults, zero delays), {} prefill ranks, fan-in {}, {} rooms",
                cfg.prefill_ranks, cfg.fan_in, cfg.rooms
            );
        }
        println!(
            "{:.1} s per run, {rounds} rounds, rule order rotated each round",
            cfg.seconds
        );
        for round in 0..rounds {
            let line: Vec<String> = rules
                .iter()
                .zip(&rps)
                .map(|(rule, per_round)| format!("{} {:>7.0}", rule.name(), per_round[round]))
                .collect();
            println!("  round {}: {}", round + 1, line.join("  "));
        }
        for i in 0..n {
            let lo = ratios[i].iter().copied().fold(f64::INFINITY, f64::min);
            let hi = ratios[i].iter().copied().fold(0.0, f64::max);
            println!(
                "{:<10} median {:>8.0} req/s, corrupted {:>6}; kvfence/{} = {:.4} (ratio of medians), \
                 {:.4} (median of per-round ratios, span {lo:.4}..{hi:.4})",
                rules[i].name(),
                med[i],
                corrupted[i],
                rules[i].name(),
                if med[i] > 0.0 { med[kv] / med[i] } else { 0.0 },
                med_ratio[i]
            );
        }
        println!(
            "a difference smaller than the per-round span is below this machine's noise \
             ({} prefill threads + 1 decode thread share {} cores)",
            cfg.prefill_ranks,
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
    }
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Bad flags and configs that cannot run: clap's usage error on stderr, exit status 2;
    // --help and --version: on stdout, exit status 0.
    let cmd = match cli::parse(&args) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    match cmd {
        Command::Run { cfg, json, plot } => run(&cfg, json, plot.as_deref()),
        Command::Bench { cfg, rounds, json } => bench(&cfg, rounds, json),
        Command::Soak { cfg, json } => soak(&cfg, json),
        Command::Repro {
            runs,
            timeout_ms,
            json,
        } => match repro::run_repro(runs, timeout_ms) {
            Ok(results) => {
                if json {
                    println!("{}", report::repro_json(&results));
                } else {
                    print!("{}", report::repro_table(&results));
                }
                let bad = results
                    .iter()
                    .any(|r| r.rule == "kvfence" && (r.corrupted_runs > 0 || r.leaks > 0));
                if bad {
                    eprintln!("kvfence-sim: FAIL: kvfence corrupted or leaked in repro");
                    ExitCode::from(1)
                } else {
                    ExitCode::SUCCESS
                }
            }
            Err(e) => {
                eprintln!("kvfence-sim: error: {e}");
                ExitCode::from(1)
            }
        },
    }
}
