//! Test-only protocol mutations, all in one build ("mutant schemata").
//!
//! Every deliberate bug the checkers must catch (loom, shuttle, the real-thread stress
//! tests, the property test) sits in the library behind [`mutant!`]`(kvfence_<name>)`, a
//! boolean that is `false` in every normal build: a constant the compiler folds away, so
//! production code carries no trace of it. A mutation is switched on in one of two ways:
//!
//! * `--cfg kvfence_<name>`: a build with that one mutation compiled in (each needs its
//!   own build, and with `RUSTFLAGS` its own build of every dependency);
//! * `--cfg kvfence_mutants`: one build holding every mutation, each off unless chosen at
//!   run time by the environment variable `KVFENCE_MUTANT=kvfence_<name>` (at most one;
//!   unset or empty: none, the correct code). The scripts that check the mutations
//!   (`loom-tests/run.sh`, `scripts/shuttle.sh`, `scripts/mutations.sh`,
//!   `scripts/fuzz-smoke.sh`) build once this way and run each check with its variable,
//!   instead of one build per mutation (about a minute each on 2 cores).
//!
//! # Implementation details
//!
//! The variable is read once, on the first query, into a `OnceLock` (std's, even under
//! loom and shuttle: it is not part of any modelled interleaving, and its value never
//! changes). An unknown name panics with the list of known ones: a typo must not quietly
//! run the correct code and report a mutation "not caught". A call site naming an unknown
//! cfg is refused at build time by the `unexpected_cfgs` lint (denied in CI).

use std::sync::OnceLock;

/// Every mutation a `--cfg kvfence_mutants` build holds (the cfg names of `Cargo.toml`).
pub(crate) const NAMES: [&str; 10] = [
    "kvfence_naive_release",
    "kvfence_skip_ack_gen_check",
    "kvfence_unserialized_readmit",
    "kvfence_failed_counts_as_drained",
    "kvfence_quarantine_frees_pages",
    "kvfence_racy_queue_pop",
    "kvfence_moving_fenced_set",
    "kvfence_quarantine_mark_first",
    "kvfence_finish_drained_skips_writers",
    "kvfence_racy_summary_take",
];

/// Whether `name` is the mutation chosen by `KVFENCE_MUTANT`.
pub(crate) fn on(name: &str) -> bool {
    static CHOSEN: OnceLock<Option<&'static str>> = OnceLock::new();
    let chosen = CHOSEN.get_or_init(|| {
        let value = std::env::var("KVFENCE_MUTANT").unwrap_or_default();
        if value.is_empty() {
            return None;
        }
        match NAMES.iter().find(|n| **n == value) {
            Some(n) => Some(n),
            None => {
                panic!("KVFENCE_MUTANT={value:?} is not a mutation of this build; known: {NAMES:?}")
            }
        }
    });
    *chosen == Some(name)
}
