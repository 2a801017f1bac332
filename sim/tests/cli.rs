//! Runs the built binary as a user would and checks its results.

use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvfence-sim"))
}

/// Runs the binary with `args`, requires exit status 0, returns its stdout.
fn run_ok(args: &[&str]) -> String {
    let out = bin().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn field(json: &str, rule: &str, key: &str) -> u64 {
    let start = json
        .find(&format!("\"rule\":\"{rule}\""))
        .unwrap_or_else(|| panic!("no rule {rule} in {json}"));
    let rest = &json[start..];
    let at = rest
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("no {key} for {rule}"));
    let digits: String = rest[at + key.len() + 3..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("{key} of {rule} not a number"))
}

#[test]
fn repro_naive_corrupts_every_run_and_kvfence_none() {
    let json = run_ok(&["repro", "--runs", "6", "--json"]);
    assert_eq!(field(&json, "naive", "corrupted_runs"), 6);
    assert_eq!(field(&json, "timeout", "corrupted_runs"), 6);
    assert_eq!(field(&json, "kvfence", "corrupted_runs"), 0);
}

#[test]
fn short_simulation_kvfence_has_no_corruption() {
    let json = run_ok(&[
        "--seconds",
        "1",
        "--json",
        "--no-progress",
        "--pages",
        "1024",
        "--rooms",
        "64",
        "--rules",
        "naive,kvfence",
        "--death-period-ms",
        "400",
        "--teardown-ms",
        "150",
    ]);
    assert!(field(&json, "kvfence", "completed") > 0);
    assert_eq!(field(&json, "kvfence", "corrupted_requests"), 0);
    assert_eq!(field(&json, "kvfence", "corrupted_pages"), 0);
    assert!(json.contains("\"conservation_ok\":true"));
}

#[test]
fn peer_rules_run_and_a_short_soak_passes() {
    let json = run_ok(&[
        "--seconds",
        "0.5",
        "--json",
        "--no-progress",
        "--pages",
        "1024",
        "--rooms",
        "64",
        "--rules",
        "sglang,vllm,acks-only,kvfence",
        "--death-period-ms",
        "300",
        "--teardown-ms",
        "150",
        "--detect-ms",
        "50",
    ]);
    for rule in ["sglang", "vllm", "acks-only", "kvfence"] {
        assert!(field(&json, rule, "opened") > 0, "{rule}");
        assert_eq!(field(&json, rule, "cause_mismatches"), 0, "{rule}");
    }
    assert_eq!(field(&json, "kvfence", "corrupted_requests"), 0);
    let soak = run_ok(&["soak", "--requests", "3000", "--json", "--no-progress"]);
    assert_eq!(field(&soak, "kvfence", "opened"), 3000);
    assert_eq!(field(&soak, "kvfence", "corrupted_requests"), 0);
    assert!(soak.contains("\"conservation_ok\":true"));
}

#[test]
fn bad_flags_exit_2_with_a_message() {
    for args in [
        &["--fan-in", "9"][..],
        &["--pages", "0"],
        &["--nope"],
        &["repro", "--runs", "x"],
        &["--preset", "nope"],
        &["--requests", "10"],
        &["soak", "--rules", "naive"],
        &["--fail-rate", "1.5"],
    ] {
        let out = bin().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("error:"), "{args:?}: {err}");
    }
}
