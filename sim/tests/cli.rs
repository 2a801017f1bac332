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

/// Key paths and value types of a JSON value, in order (`.rules[].rule: string`); an array
/// contributes its first element's paths, and all its elements must agree.
fn schema(v: &serde_json::Value, path: &str, out: &mut Vec<String>) {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            out.push(format!(
                "{}: object",
                if path.is_empty() { "." } else { path }
            ));
            for (k, x) in m {
                schema(x, &format!("{path}.{k}"), out);
            }
        }
        Value::Array(a) => {
            out.push(format!("{path}: array"));
            let subs: Vec<Vec<String>> = a
                .iter()
                .map(|x| {
                    let mut o = Vec::new();
                    schema(x, &format!("{path}[]"), &mut o);
                    o
                })
                .collect();
            if let Some(first) = subs.first() {
                assert!(subs.iter().all(|s| s == first), "mixed array at {path}");
                out.extend(first.iter().cloned());
            }
        }
        Value::Null => out.push(format!("{path}: null")),
        Value::Bool(_) => out.push(format!("{path}: bool")),
        Value::Number(_) => out.push(format!("{path}: number")),
        Value::String(_) => out.push(format!("{path}: string")),
    }
}

/// The golden schema of one mode (`## mode` section of tests/json-schema.txt, recorded from
/// the hand-written JSON before the move to serde).
fn golden(mode: &str) -> Vec<String> {
    let text = include_str!("json-schema.txt");
    let mut lines = text
        .lines()
        .skip_while(|l| *l != format!("## {mode}"))
        .skip(1);
    let section: Vec<String> = lines
        .by_ref()
        .take_while(|l| !l.starts_with("## "))
        .map(String::from)
        .collect();
    assert!(!section.is_empty(), "no golden schema for {mode}");
    section
}

#[test]
fn json_keys_and_structure_are_unchanged() {
    let cases: [(&str, &[&str]); 4] = [
        ("repro", &["repro", "--runs", "2", "--json"]),
        (
            "run",
            &[
                "--seconds",
                "0.3",
                "--json",
                "--no-progress",
                "--pages",
                "1024",
                "--rooms",
                "64",
            ],
        ),
        (
            "bench",
            &[
                "bench",
                "--rounds",
                "1",
                "--seconds",
                "0.2",
                "--json",
                "--no-progress",
            ],
        ),
        (
            "soak",
            &["soak", "--requests", "1000", "--json", "--no-progress"],
        ),
    ];
    for (mode, args) in cases {
        let out = run_ok(args);
        let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
        let mut got = Vec::new();
        schema(&v, "", &mut got);
        assert_eq!(got, golden(mode), "{mode}: JSON keys or structure changed");
    }
}

#[test]
fn help_lists_every_flag_of_the_old_command_line() {
    // The flags of the hand-written parser (before clap), by the command that takes them.
    let sim = "--preset --rules --seconds --pages --page-bytes --prefill-ranks --fan-in --rooms \
               --min-pages --max-pages --chunk-pages --queue-us --transfer-us --max-inflight \
               --decode-us --abort-rate --wait-timeout-ms --timeout-ms --time-scale \
               --sglang-timeout-s --vllm-timeout-s --heartbeat-s --heartbeat-failures \
               --detect-ms --teardown-ms --death-period-ms --ack-delay-us --ack-drop --ack-dup \
               --ack-late --late-ms --stale-intent-rate --abort-retry-ms --fail-rate \
               --fail-lands --quarantine-ms --no-prefill-check --seed --json --no-progress";
    let commands: [(&[&str], String); 5] = [
        (&["--help"], format!("{sim} --no-delay --plot --help")),
        (&["run", "--help"], format!("{sim} --no-delay --plot")),
        (
            &["bench", "--help"],
            format!("{sim} --no-delay --faults --rounds"),
        ),
        (&["soak", "--help"], format!("{sim} --requests")),
        (
            &["repro", "--help"],
            "--runs --timeout-ms --json".to_string(),
        ),
    ];
    for (args, flags) in commands {
        let help = run_ok(args);
        for flag in flags.split_whitespace() {
            // Its own entry: a line that starts with the flag (not a mention elsewhere).
            let entry = help.lines().any(|l| {
                let l = l.trim_start().trim_start_matches("-h, ");
                l == flag || l.starts_with(&format!("{flag} "))
            });
            assert!(entry, "{args:?} does not document {flag}");
        }
        assert!(
            help.contains("Exit status: 0 ok; 1 kvfence corrupted"),
            "{args:?}"
        );
    }
}
