//! The Rust side of the C boundary benchmark (`ffi/bench/run.sh`): the lifecycle that
//! `bench/lifecycle.c` runs through the C ABI, called natively.
//!
//! One lifecycle: `open_gate` (8 writer ranks, 16 pages), 2 token transfers begun and
//! completed, `abort` (fan-out of 8), 8 ACKs (`quiesce`; the last queues the release),
//! `drain_released`, and the release's page list dropped (the C side frees it with
//! `kvfence_release_free`). `--guards` uses transfer guards instead of tokens (the idiomatic
//! Rust form; a different core path, reported for reference only).
//!
//! Usage: `kvfence-ffi-bench [--guards] SAMPLES ITERS`: prints one line per sample, the
//! sample's mean nanoseconds per lifecycle.

use core_kvfence::{Config, Outcome, RoomTable};
use std::hint::black_box;
use std::time::Instant;

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let guards = args.first().is_some_and(|a| a == "--guards");
    if guards {
        args.remove(0);
    }
    let num = |i: usize, default: u64| -> u64 {
        args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default)
    };
    let (samples, iters) = (num(0, 7), num(1, 200_000));
    let table = match RoomTable::new(Config::gate(1024).release_queue(true)) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("kvfence-ffi-bench: {e}");
            std::process::exit(1);
        }
    };
    let writers: [u32; 8] = [0, 1, 2, 3, 4, 5, 6, 7];
    let pages: [u32; 16] = core::array::from_fn(|i| 100 + i as u32);
    let mut released = Vec::with_capacity(4);
    let mut lifecycle = |i: u64| -> Result<(), core_kvfence::Error> {
        let h = table.open_gate(&writers, i, pages.to_vec())?;
        if guards {
            let a = table.begin_transfer_to(h, 0)?;
            let b = table.begin_transfer_to(h, 1)?;
            black_box(a.complete());
            black_box(b.complete());
        } else {
            let a = table.begin(h, Some(0))?;
            let b = table.begin(h, Some(1))?;
            black_box(table.end(a, Outcome::Completed)?);
            black_box(table.end(b, Outcome::Completed)?);
        }
        let aborted = table.abort(h)?;
        black_box(&aborted.fanout[..]);
        for &w in &writers {
            let _ = black_box(table.quiesce(h, w)?);
        }
        let n = table.drain_released(&mut released);
        assert_eq!(n, 1, "one release per lifecycle");
        black_box(&released[0].pages);
        released.clear();
        Ok(())
    };
    for i in 0..iters / 10 {
        lifecycle(i).expect("warm-up");
    }
    for _ in 0..samples {
        let start = Instant::now();
        for i in 0..iters {
            lifecycle(i).expect("lifecycle");
        }
        println!("{:.1}", start.elapsed().as_nanos() as f64 / iters as f64);
    }
}
