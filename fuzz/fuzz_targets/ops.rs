//! `ops`: arbitrary operation sequences applied to the library and to the sequential
//! reference model side by side (`tests/model/`), compared after every step, invariants
//! after every step and after a final drain. The first bytes choose the table (pool or
//! gate mode, release queue on or off, sizes and limits); see `tests/model/mod.rs` for
//! the operations (open, grow, transfers in every form and outcome, ACKs, abort, finish,
//! quarantine, fence and readmit, the release queue, forged handles and tokens, waits).
#![no_main]

#[path = "../../tests/model/mod.rs"]
mod model;

use libfuzzer_sys::fuzz_target;

/// Long enough to cycle every room index several times; short enough to stay fast.
const MAX_OPS: usize = 256;

fuzz_target!(|data: &[u8]| {
    let (setup, ops) = model::decode(data, MAX_OPS);
    if let Err(divergence) = model::run_case(setup, &ops) {
        panic!("library and model diverge: {divergence}");
    }
});
