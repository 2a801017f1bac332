//! `kvfence-sim`: see `kvfence-sim --help`.

use kvfence_sim::config::{self, Command, RuleKind, SimConfig};
use kvfence_sim::sim::{self, Progress, RuleResult};
use kvfence_sim::{report, repro};
use std::process::ExitCode;

fn fail(msg: &str) -> ExitCode {
    eprintln!("kvfence-sim: error: {msg}");
    ExitCode::from(2)
}

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
        println!(
            "kvfence-sim: {} pages x {} B, {} prefill ranks, fan-in {}, {} rooms, {:.0} s per rule, \
             abort rate {}, --timeout-ms {}, seed {}",
            cfg.pages,
            cfg.page_bytes,
            cfg.prefill_ranks,
            cfg.fan_in,
            cfg.rooms,
            cfg.seconds,
            cfg.abort_rate,
            cfg.timeout_ms,
            cfg.seed
        );
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
    let (mut naive, mut kv, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        // Alternate the order so neither rule always runs on a warmer machine.
        let order = if round % 2 == 0 {
            [RuleKind::Naive, RuleKind::Kvfence]
        } else {
            [RuleKind::Kvfence, RuleKind::Naive]
        };
        let mut pair = [0.0; 2];
        for kind in order {
            progress.label(format!("round {}/{rounds} {}", round + 1, kind.name()));
            let r = match sim::run_rule(cfg, kind, &progress) {
                Ok(r) => r,
                Err(e) => {
                    progress.clear();
                    eprintln!("kvfence-sim: error: {e}");
                    return ExitCode::from(1);
                }
            };
            if r.corrupted_requests > 0 || r.conservation.is_err() {
                progress.clear();
                eprintln!(
                    "kvfence-sim: FAIL: {} corrupted or leaked with no aborts",
                    r.rule
                );
                return ExitCode::from(1);
            }
            pair[usize::from(kind == RuleKind::Kvfence)] = r.throughput_rps;
        }
        naive.push(pair[0]);
        kv.push(pair[1]);
        ratios.push(if pair[0] > 0.0 {
            pair[1] / pair[0]
        } else {
            0.0
        });
    }
    progress.clear();
    let (mn, mk, mr) = (
        median(&mut naive.clone()),
        median(&mut kv.clone()),
        median(&mut ratios.clone()),
    );
    if json {
        println!(
            "{{\"mode\":\"bench\",\"rounds\":{rounds},\"seconds\":{},\"naive_rps\":[{}],\"kvfence_rps\":[{}],\
             \"median_naive_rps\":{mn:.1},\"median_kvfence_rps\":{mk:.1},\"ratio_of_medians\":{:.4},\
             \"median_pair_ratio\":{mr:.4}}}",
            cfg.seconds,
            naive.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(","),
            kv.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(","),
            if mn > 0.0 { mk / mn } else { 0.0 }
        );
    } else {
        println!(
            "bench: --no-delay (no aborts, no faults, zero delays), {} prefill ranks, fan-in {}, {} rooms, \
             {:.1} s per run, {rounds} interleaved rounds",
            cfg.prefill_ranks, cfg.fan_in, cfg.rooms, cfg.seconds
        );
        for (i, ((n, k), r)) in naive.iter().zip(&kv).zip(&ratios).enumerate() {
            println!(
                "  round {}: naive {n:>9.0} req/s   kvfence {k:>9.0} req/s   ratio {r:.4}",
                i + 1
            );
        }
        println!(
            "median: naive {mn:.0} req/s, kvfence {mk:.0} req/s; kvfence/naive = {:.4} (median of per-round ratios {mr:.4})",
            if mn > 0.0 { mk / mn } else { 0.0 }
        );
        let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = ratios.iter().copied().fold(0.0, f64::max);
        println!(
            "per-round ratios span {lo:.4}..{hi:.4}: a difference smaller than that spread is \
             below this machine's noise (9 threads share {} cores here)",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
    }
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cmd = match config::parse(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("(see kvfence-sim --help)");
            return fail(&e);
        }
    };
    match cmd {
        Command::Help => {
            print!("{}", config::USAGE);
            ExitCode::SUCCESS
        }
        Command::Run { cfg, json, plot } => run(&cfg, json, plot.as_deref()),
        Command::Bench { cfg, rounds, json } => bench(&cfg, rounds, json),
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
