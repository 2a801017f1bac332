//! `ops`: arbitrary operation sequences applied to the library and to the sequential
//! reference model side by side (`tests/model/`), compared after every step, invariants
//! after every step and after a final drain.
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
