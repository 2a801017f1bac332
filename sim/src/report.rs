//! Output: the side-by-side table, the JSON object, the SVG plot.

use crate::repro::ReproResult;
use crate::sim::RuleResult;
use serde::Serialize;
use std::fmt::Write;

/// A JSON number with 3 decimals, as the output always had; 0 for NaN and infinities
/// (which serde_json would print as `null`).
fn f(x: f64) -> f64 {
    if x.is_finite() {
        (x * 1000.0).round() / 1000.0
    } else {
        0.0
    }
}

/// Corrupted requests per 10,000 completed.
pub fn per_10k(r: &RuleResult) -> f64 {
    if r.completed == 0 {
        0.0
    } else {
        r.corrupted_requests as f64 * 10_000.0 / r.completed as f64
    }
}

/// The side-by-side summary table of a simulation.
pub fn table(results: &[RuleResult]) -> String {
    let mut out = String::new();
    let _ = write!(out, "{:<36}", "per rule");
    for r in results {
        let _ = write!(out, "{:>12}", r.rule);
    }
    out.push('\n');
    type Row = (&'static str, fn(&RuleResult) -> String);
    let rows: [Row; 31] = [
        ("requests opened", |r| r.opened.to_string()),
        ("requests completed", |r| r.completed.to_string()),
        ("requests aborted", |r| r.aborted.to_string()),
        ("corrupted requests", |r| r.corrupted_requests.to_string()),
        ("corrupted per 10,000 completed", |r| {
            format!("{:.2}", per_10k(r))
        }),
        ("corrupted pages", |r| r.corrupted_pages.to_string()),
        ("stale writes refused", |r| r.stale_refused.to_string()),
        ("late/duplicate ACKs ignored", |r| {
            r.late_acks_ignored.to_string()
        }),
        ("ACKs counted for the wrong request", |r| {
            r.acks_misapplied.to_string()
        }),
        ("writes landed after ABORT", |r| {
            r.late_writes_landed.to_string()
        }),
        ("writes flushed by teardown", |r| {
            r.writes_flushed.to_string()
        }),
        ("rank deaths", |r| r.deaths.to_string()),
        ("failed transfers", |r| r.failed_transfers.to_string()),
        ("  of which landed anyway", |r| r.failed_landed.to_string()),
        ("rooms quarantined", |r| r.quarantined_rooms.to_string()),
        ("quarantined pages, max", |r| {
            r.quarantined_pages.max.to_string()
        }),
        ("quarantined pages reclaimed", |r| {
            r.pages_reclaimed.to_string()
        }),
        ("pages held awaiting drain, mean", |r| {
            format!("{:.1}", r.held.mean)
        }),
        ("  slow ACK, mean", |r| format!("{:.1}", r.causes_mean_f[0])),
        ("  transfer in flight, mean", |r| {
            format!("{:.1}", r.causes_mean_f[1])
        }),
        ("  dead rank awaiting teardown, mean", |r| {
            format!("{:.1}", r.causes_mean_f[2])
        }),
        ("  failed transfer, mean", |r| {
            format!("{:.1}", r.causes_mean_f[3])
        }),
        ("pages held awaiting drain, max", |r| r.held.max.to_string()),
        ("  slow ACK / in flight, max", |r| {
            format!("{}/{}", r.causes_max.slow_ack, r.causes_max.in_flight)
        }),
        ("  dead rank / failed, max", |r| {
            format!("{}/{}", r.causes_max.dead_rank, r.causes_max.failed)
        }),
        ("abort->release p50 (ms)", |r| {
            format!("{:.2}", r.release_p50_ms)
        }),
        ("abort->release p99 (ms)", |r| {
            format!("{:.2}", r.release_p99_ms)
        }),
        ("throughput (req/s)", |r| format!("{:.0}", r.throughput_rps)),
        ("wall time (s)", |r| format!("{:.1}", r.wall_s)),
        ("held-cause split sums to held", |r| {
            if r.cause_mismatches == 0 {
                "ok".to_string()
            } else {
                format!("{} off", r.cause_mismatches)
            }
        }),
        ("page conservation at end", |r| {
            if r.conservation.is_ok() {
                "ok"
            } else {
                "FAILED"
            }
            .to_string()
        }),
    ];
    for (name, get) in rows {
        let _ = write!(out, "{name:<36}");
        for r in results {
            let _ = write!(out, "{:>12}", get(r));
        }
        out.push('\n');
    }
    for r in results {
        if let Err(e) = &r.conservation {
            let _ = writeln!(out, "{}: {e}", r.rule);
        }
    }
    out
}

/// Held pages per cause, in the JSON.
#[derive(Serialize)]
pub struct CausesJson<T> {
    /// Every writer drained; the ACK is slow, late or lost.
    pub slow_ack: T,
    /// A writer still has the room's writes queued or in flight.
    pub in_flight: T,
    /// A writer rank is dead and not yet torn down.
    pub dead_rank: T,
    /// A writer's transfer failed.
    pub failed: T,
}

/// One rule's result in the JSON (`rules[]` of `run`, `result.rules[]` of `soak`); the field
/// order is the output's.
#[derive(Serialize)]
pub struct RuleJson {
    /// Rule name (each field is [`RuleResult`]'s, renamed where marked).
    pub rule: &'static str,
    /// `RuleResult::opened`.
    pub opened: u64,
    /// `RuleResult::completed`.
    pub completed: u64,
    /// `RuleResult::aborted`.
    pub aborted: u64,
    /// `RuleResult::corrupted_requests`.
    pub corrupted_requests: u64,
    /// Corrupted requests per 10,000 completed.
    pub corrupted_per_10k: f64,
    /// `RuleResult::corrupted_pages`.
    pub corrupted_pages: u64,
    /// `RuleResult::stale_refused`.
    pub stale_writes_refused: u64,
    /// `RuleResult::late_acks_ignored`.
    pub late_acks_ignored: u64,
    /// `RuleResult::acks_misapplied`.
    pub acks_misapplied: u64,
    /// `RuleResult::late_writes_landed`.
    pub late_writes_landed: u64,
    /// `RuleResult::writes_flushed`.
    pub writes_flushed: u64,
    /// `RuleResult::deaths`.
    pub rank_deaths: u64,
    /// `RuleResult::failed_transfers`.
    pub failed_transfers: u64,
    /// `RuleResult::failed_landed`.
    pub failed_landed: u64,
    /// `RuleResult::quarantined_rooms`.
    pub quarantined_rooms: u64,
    /// `RuleResult::quarantined_pages.max`.
    pub quarantined_pages_max: usize,
    /// `RuleResult::pages_reclaimed`.
    pub pages_reclaimed: u64,
    /// `RuleResult::held.max`.
    pub held_pages_max: usize,
    /// `RuleResult::held.mean`.
    pub held_pages_mean: f64,
    /// `RuleResult::causes_mean_f`.
    pub held_by_cause_mean: CausesJson<f64>,
    /// `RuleResult::causes_max`.
    pub held_by_cause_max: CausesJson<usize>,
    /// `RuleResult::cause_mismatches`.
    pub cause_mismatches: u64,
    /// `RuleResult::release_p50_ms`.
    pub release_p50_ms: f64,
    /// `RuleResult::release_p99_ms`.
    pub release_p99_ms: f64,
    /// `RuleResult::throughput_rps`.
    pub throughput_rps: f64,
    /// `RuleResult::wall_s`.
    pub wall_s: f64,
    /// `RuleResult::conservation` passed.
    pub conservation_ok: bool,
    /// Its error, `null` when it passed.
    pub conservation_error: Option<String>,
}

impl From<&RuleResult> for RuleJson {
    fn from(r: &RuleResult) -> RuleJson {
        let m = &r.causes_mean_f;
        let x = &r.causes_max;
        RuleJson {
            rule: r.rule,
            opened: r.opened,
            completed: r.completed,
            aborted: r.aborted,
            corrupted_requests: r.corrupted_requests,
            corrupted_per_10k: f(per_10k(r)),
            corrupted_pages: r.corrupted_pages,
            stale_writes_refused: r.stale_refused,
            late_acks_ignored: r.late_acks_ignored,
            acks_misapplied: r.acks_misapplied,
            late_writes_landed: r.late_writes_landed,
            writes_flushed: r.writes_flushed,
            rank_deaths: r.deaths,
            failed_transfers: r.failed_transfers,
            failed_landed: r.failed_landed,
            quarantined_rooms: r.quarantined_rooms,
            quarantined_pages_max: r.quarantined_pages.max,
            pages_reclaimed: r.pages_reclaimed,
            held_pages_max: r.held.max,
            held_pages_mean: f(r.held.mean),
            held_by_cause_mean: CausesJson {
                slow_ack: f(m[0]),
                in_flight: f(m[1]),
                dead_rank: f(m[2]),
                failed: f(m[3]),
            },
            held_by_cause_max: CausesJson {
                slow_ack: x.slow_ack,
                in_flight: x.in_flight,
                dead_rank: x.dead_rank,
                failed: x.failed,
            },
            cause_mismatches: r.cause_mismatches,
            release_p50_ms: f(r.release_p50_ms),
            release_p99_ms: f(r.release_p99_ms),
            throughput_rps: f(r.throughput_rps),
            wall_s: f(r.wall_s),
            conservation_ok: r.conservation.is_ok(),
            conservation_error: r.conservation.clone().err(),
        }
    }
}

/// The JSON object of a simulation (`run`).
#[derive(Serialize)]
pub struct RunJson {
    /// `"run"`.
    pub mode: &'static str,
    /// kvfence corrupted nothing and conserved every page.
    pub ok: bool,
    /// One per rule, in run order.
    pub rules: Vec<RuleJson>,
}

impl RunJson {
    /// Over `results`.
    pub fn new(results: &[RuleResult], ok: bool) -> RunJson {
        RunJson {
            mode: "run",
            ok,
            rules: results.iter().map(RuleJson::from).collect(),
        }
    }
}

/// The JSON object of a soak.
#[derive(Serialize)]
pub struct SoakJson {
    /// `"soak"`.
    pub mode: &'static str,
    /// Every check passed.
    pub ok: bool,
    /// Requests asked for.
    pub requests: u64,
    /// The run's object (its one rule is kvfence).
    pub result: RunJson,
}

/// One rule's throughput in the `bench` JSON.
#[derive(Serialize)]
pub struct BenchRuleJson {
    /// Rule name.
    pub rule: &'static str,
    /// Completed requests per second, one per round (1 decimal).
    pub rps: Vec<f64>,
    /// Median over rounds.
    pub median_rps: f64,
    /// Corrupted requests over all rounds.
    pub corrupted_requests: u64,
    /// kvfence's median / this rule's median.
    pub kvfence_ratio_of_medians: f64,
    /// Median over rounds of kvfence / this rule in the same round.
    pub kvfence_median_pair_ratio: f64,
}

/// The JSON object of `bench`.
#[derive(Serialize)]
pub struct BenchJson {
    /// `"bench"`.
    pub mode: &'static str,
    /// Run with the fault mix (`--faults`).
    pub faults: bool,
    /// Interleaved rounds.
    pub rounds: usize,
    /// Seconds of arrivals per run.
    pub seconds: f64,
    /// One per rule.
    pub rules: Vec<BenchRuleJson>,
}

/// `x` rounded to `decimals` (0 for NaN and infinities), for the bench JSON.
pub fn round(x: f64, decimals: i32) -> f64 {
    let p = 10f64.powi(decimals);
    if x.is_finite() {
        (x * p).round() / p
    } else {
        0.0
    }
}

/// One JSON line of `value`.
pub fn to_json<T: Serialize>(value: &T) -> String {
    // Serializing these plain structs (no maps with non-string keys) cannot fail.
    serde_json::to_string(value).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// The JSON object of a simulation.
pub fn json(results: &[RuleResult], ok: bool) -> String {
    to_json(&RunJson::new(results, ok))
}

/// The reproducer's table.
pub fn repro_table(results: &[ReproResult]) -> String {
    let mut out = String::new();
    let runs = results.first().map_or(0, |r| r.runs);
    let _ = writeln!(
        out,
        "docs/DESIGN.md section 1 forced with barriers, {runs} runs per rule \
         (even runs: write in flight at the abort; odd runs: intent queued, missed by the drain)"
    );
    let _ = writeln!(
        out,
        "{:<10}{:>16}{:>16}{:>16}{:>14}",
        "rule", "corrupted runs", "reuse deferred", "stale refused", "stale landed"
    );
    for r in results {
        let _ = writeln!(
            out,
            "{:<10}{:>16}{:>16}{:>16}{:>14}",
            r.rule,
            format!("{}/{}", r.corrupted_runs, r.runs),
            r.reuse_deferred,
            r.stale_refused,
            r.stale_landed
        );
    }
    out
}

/// One rule of the reproducer's JSON.
#[derive(Serialize)]
pub struct ReproRuleJson {
    /// Rule name.
    pub rule: &'static str,
    /// Runs.
    pub runs: usize,
    /// Runs in which the reused page was corrupted.
    pub corrupted_runs: usize,
    /// Runs in which the page's reuse was deferred.
    pub reuse_deferred: usize,
    /// Stale writes refused by `begin_transfer`.
    pub stale_writes_refused: usize,
    /// Stale writes that landed.
    pub stale_writes_landed: usize,
    /// Pages not returned at the end.
    pub leaks: usize,
}

/// The reproducer's JSON.
#[derive(Serialize)]
pub struct ReproJson {
    /// `"repro"`.
    pub mode: &'static str,
    /// Runs per rule.
    pub runs: usize,
    /// One per rule.
    pub rules: Vec<ReproRuleJson>,
}

/// The reproducer's JSON object.
pub fn repro_json(results: &[ReproResult]) -> String {
    to_json(&ReproJson {
        mode: "repro",
        runs: results.first().map_or(0, |r| r.runs),
        rules: results
            .iter()
            .map(|r| ReproRuleJson {
                rule: r.rule,
                runs: r.runs,
                corrupted_runs: r.corrupted_runs,
                reuse_deferred: r.reuse_deferred,
                stale_writes_refused: r.stale_refused,
                stale_writes_landed: r.stale_landed,
                leaks: r.leaks,
            })
            .collect(),
    })
}

/// An SVG of free / owned / held pages over time, one panel per rule.
pub fn svg(results: &[RuleResult], capacity: usize) -> String {
    let (w, ph, left, top) = (900.0, 180.0, 60.0, 30.0);
    let pw = w - left - 20.0;
    let h = top + results.len() as f64 * (ph + 50.0) + 10.0;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"18\" font-size=\"14\">kvfence-sim: decode pages over time \
         (green free, blue owned, red held awaiting drain)</text>\n"
    );
    let cap = capacity.max(1) as f64;
    for (i, r) in results.iter().enumerate() {
        let y0 = top + i as f64 * (ph + 50.0) + 20.0;
        let t_max = r.samples.last().map_or(1.0, |s| s.t_ms.max(1.0));
        let _ = writeln!(
            out,
            "<text x=\"{left}\" y=\"{}\">{} ({} corrupted requests, held max {})</text>\n\
             <rect x=\"{left}\" y=\"{y0}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#888\"/>\n\
             <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{capacity}</text>\n\
             <text x=\"{}\" y=\"{}\" text-anchor=\"end\">0</text>\n\
             <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.1} s</text>",
            y0 - 5.0,
            r.rule,
            r.corrupted_requests,
            r.held.max,
            left - 5.0,
            y0 + 10.0,
            left - 5.0,
            y0 + ph,
            left + pw,
            y0 + ph + 15.0,
            t_max / 1000.0
        );
        for (color, get) in [
            ("#2a2", (|u| u.free) as fn(crate::rules::Usage) -> usize),
            ("#22c", |u| u.owned),
            ("#d22", |u| u.held),
        ] {
            let mut pts = String::new();
            for s in &r.samples {
                let x = left + s.t_ms / t_max * pw;
                let y = y0 + ph - get(s.usage) as f64 / cap * ph;
                let _ = write!(pts, "{x:.1},{y:.1} ");
            }
            let _ = writeln!(
                out,
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.2\" points=\"{pts}\"/>"
            );
        }
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(conservation: Result<(), String>, held_mean: f64) -> RuleResult {
        let causes = crate::result::HeldCauses {
            slow_ack: 1,
            in_flight: 2,
            dead_rank: 3,
            failed: 4,
        };
        RuleResult {
            rule: "kvfence",
            opened: 10,
            completed: 8,
            aborted: 2,
            corrupted_requests: 0,
            corrupted_pages: 0,
            stale_refused: 1,
            late_acks_ignored: 2,
            acks_misapplied: 0,
            late_writes_landed: 3,
            writes_flushed: 4,
            deaths: 5,
            failed_transfers: 6,
            failed_landed: 7,
            quarantined_rooms: 8,
            pages_reclaimed: 9,
            quarantined_pages: crate::result::MeanMax { mean: 0.5, max: 11 },
            held: crate::result::MeanMax {
                mean: held_mean,
                max: 12,
            },
            causes_mean: causes,
            causes_mean_f: [1.23456, 2.0, 3.0, 4.0],
            causes_max: causes,
            cause_mismatches: 0,
            release_p50_ms: 7.5,
            release_p99_ms: 261.0,
            throughput_rps: 5564.1234,
            wall_s: 7.2,
            conservation,
            samples: Vec::new(),
        }
    }

    #[test]
    fn json_is_valid_escaped_and_rounded() {
        let bad = result(Err("page 3 \"lost\"\n\\".into()), f64::NAN);
        let j = json(&[result(Ok(()), 2.5), bad], false);
        let v: serde_json::Value = serde_json::from_str(&j).expect("valid JSON");
        assert_eq!(v["mode"], "run");
        assert_eq!(v["ok"], false);
        let rules = v["rules"].as_array().expect("rules");
        assert_eq!(rules[0]["conservation_error"], serde_json::Value::Null);
        assert_eq!(rules[0]["conservation_ok"], true);
        assert_eq!(rules[1]["conservation_error"], "page 3 \"lost\"\n\\");
        // NaN is written as 0, as before (serde_json alone would write null).
        assert_eq!(rules[1]["held_pages_mean"], 0.0);
        assert_eq!(rules[0]["held_by_cause_mean"]["slow_ack"], 1.235);
        assert_eq!(rules[0]["throughput_rps"], 5564.123);
        assert_eq!(rules[0]["rank_deaths"], 5);
        assert_eq!(rules[0]["held_by_cause_max"]["failed"], 4);
        let r = ReproResult {
            rule: "naive",
            runs: 3,
            corrupted_runs: 3,
            reuse_deferred: 0,
            stale_refused: 1,
            stale_landed: 3,
            leaks: 0,
        };
        let v: serde_json::Value = serde_json::from_str(&repro_json(&[r])).expect("valid");
        assert_eq!(v["runs"], 3);
        assert_eq!(v["rules"][0]["stale_writes_refused"], 1);
        assert_eq!(v["rules"][0]["corrupted_runs"], 3);
    }
}
