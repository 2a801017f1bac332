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
//! sample's mean nanoseconds (of the thread's CPU time) per lifecycle.

use core_kvfence::{Config, Outcome, RoomTable};

/// `struct timespec` (Linux, 64-bit).
#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}

extern "C" {
    /// libc's `clock_gettime` (std has no thread CPU clock; no libc crate for one call).
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

/// Linux's `CLOCK_THREAD_CPUTIME_ID`.
const CLOCK_THREAD_CPUTIME_ID: i32 = 3;

/// The thread's CPU time in ns, not the wall clock: on the shared 2-core box a sample is
/// otherwise inflated by whatever time the scheduler gives other jobs (`bench/lifecycle.c`
/// reads the same clock).
fn now_ns() -> f64 {
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: `ts` is a valid, writable `struct timespec`; the clock id is Linux's.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    ts.sec as f64 * 1e9 + ts.nsec as f64
}

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
            drop(a.complete());
            drop(b.complete());
        } else {
            let a = table.begin(h, Some(0))?;
            let b = table.begin(h, Some(1))?;
            drop(table.end(a, Outcome::Completed)?);
            drop(table.end(b, Outcome::Completed)?);
        }
        // The ACKs answer the ABORTs sent to the fan-out list (the C side does the same
        // with the list `kvfence_abort` copied into its buffer).
        let aborted = table.abort(h)?;
        for &w in aborted.fanout.iter() {
            drop(table.quiesce(h, w)?);
        }
        drop(aborted.released);
        let n = table.drain_released(&mut released);
        assert_eq!(n, 1, "one release per lifecycle");
        released.clear();
        Ok(())
    };
    for i in 0..iters / 10 {
        lifecycle(i).expect("warm-up");
    }
    for _ in 0..samples {
        let start = now_ns();
        for i in 0..iters {
            lifecycle(i).expect("lifecycle");
        }
        println!("{:.1}", (now_ns() - start) / iters as f64);
    }
}
