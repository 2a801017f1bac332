//! The peer-style tracker (`benches/common`: `Mutex<HashMap>` of room state with a set of
//! ACKed ranks, `Mutex<Vec<u32>>` free page list) on the workloads of `hot_path.rs`, under
//! the same group names, as function `baseline`:
//!
//! * `begin_complete`: begin + complete a transfer on a live room;
//! * `quiesce`: one rank's ACK on a live room of 64 ranks;
//! * `abort_ack_release`: abort a room of 16 pages and 8 ranks, 8 ACKs, release;
//! * `open_finish_release`: open 1, 16 or 256 pages with no writer ranks, finish, release.
//! * `gate_lifecycle`: gate mode: open with 16 engine pages (recorded) and 8 ranks, 2
//!   transfers, abort, 8 ACKs (the last queues the release), drain the release queue.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

mod common;

use common::{config, Baseline, PAGES};
use criterion::{criterion_group, criterion_main, Criterion};

fn baseline(c: &mut Criterion) {
    common::single_thread(c, "baseline", || Baseline::new(PAGES), |_| {});
}

criterion_group! {
    name = benches;
    config = config();
    targets = baseline
}
criterion_main!(benches);
