//! Output: the side-by-side table, the JSON object, the SVG plot.

use crate::repro::ReproResult;
use crate::sim::RuleResult;
use std::fmt::Write;

fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

fn f(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.3}")
    } else {
        "0".into()
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

/// The JSON object of a simulation.
pub fn json(results: &[RuleResult], ok: bool) -> String {
    let mut out = String::from("{\"mode\":\"run\",\"ok\":");
    out.push_str(if ok { "true" } else { "false" });
    out.push_str(",\"rules\":[");
    for (i, r) in results.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            "{{\"rule\":\"{}\",\"opened\":{},\"completed\":{},\"aborted\":{},\"corrupted_requests\":{},\
             \"corrupted_per_10k\":{},\
             \"corrupted_pages\":{},\"stale_writes_refused\":{},\"late_acks_ignored\":{},\
             \"acks_misapplied\":{},\"late_writes_landed\":{},\"writes_flushed\":{},\
             \"rank_deaths\":{},\"failed_transfers\":{},\"failed_landed\":{},\
             \"quarantined_rooms\":{},\"quarantined_pages_max\":{},\"pages_reclaimed\":{},\
             \"held_pages_max\":{},\"held_pages_mean\":{},\
             \"held_by_cause_mean\":{{\"slow_ack\":{},\"in_flight\":{},\"dead_rank\":{},\"failed\":{}}},\
             \"held_by_cause_max\":{{\"slow_ack\":{},\"in_flight\":{},\"dead_rank\":{},\"failed\":{}}},\
             \"cause_mismatches\":{},\
             \"release_p50_ms\":{},\"release_p99_ms\":{},\"throughput_rps\":{},\
             \"wall_s\":{},\"conservation_ok\":{},\"conservation_error\":{}}}",
            r.rule,
            r.opened,
            r.completed,
            r.aborted,
            r.corrupted_requests,
            f(per_10k(r)),
            r.corrupted_pages,
            r.stale_refused,
            r.late_acks_ignored,
            r.acks_misapplied,
            r.late_writes_landed,
            r.writes_flushed,
            r.deaths,
            r.failed_transfers,
            r.failed_landed,
            r.quarantined_rooms,
            r.quarantined_pages.max,
            r.pages_reclaimed,
            r.held.max,
            f(r.held.mean),
            f(r.causes_mean_f[0]),
            f(r.causes_mean_f[1]),
            f(r.causes_mean_f[2]),
            f(r.causes_mean_f[3]),
            r.causes_max.slow_ack,
            r.causes_max.in_flight,
            r.causes_max.dead_rank,
            r.causes_max.failed,
            r.cause_mismatches,
            f(r.release_p50_ms),
            f(r.release_p99_ms),
            f(r.throughput_rps),
            f(r.wall_s),
            r.conservation.is_ok(),
            match &r.conservation {
                Ok(()) => "null".to_string(),
                Err(e) => format!("\"{}\"", esc(e)),
            }
        );
    }
    out.push_str("]}");
    out
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

/// The reproducer's JSON object.
pub fn repro_json(results: &[ReproResult]) -> String {
    let runs = results.first().map_or(0, |r| r.runs);
    let mut out = format!("{{\"mode\":\"repro\",\"runs\":{runs},\"rules\":[");
    for (i, r) in results.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            "{{\"rule\":\"{}\",\"runs\":{},\"corrupted_runs\":{},\"reuse_deferred\":{},\
             \"stale_writes_refused\":{},\"stale_writes_landed\":{},\"leaks\":{}}}",
            r.rule,
            r.runs,
            r.corrupted_runs,
            r.reuse_deferred,
            r.stale_refused,
            r.stale_landed,
            r.leaks
        );
    }
    out.push_str("]}");
    out
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

    #[test]
    fn json_escapes_and_is_balanced() {
        assert_eq!(esc("a\"b\\c\n"), "a\\\"b\\\\c\\u000a");
        let r = ReproResult {
            rule: "naive",
            runs: 3,
            corrupted_runs: 3,
            reuse_deferred: 0,
            stale_refused: 0,
            stale_landed: 3,
            leaks: 0,
        };
        let j = repro_json(&[r]);
        assert!(j.contains("\"corrupted_runs\":3"));
        assert_eq!(j.matches('{').count(), j.matches('}').count());
    }
}
