//! Walks the abort race of DESIGN section 1 through the API, step by step.
//!
//! ```text
//! cargo run --example abort_race
//! ```
//!
//! A decode node opens a room for request A, whose KV comes from prefill rank 0. The
//! rank's write to A's pages is still in flight when the client disconnects. We show what a
//! "free at abort" rule would do, then what kvfence does.

use kvfence::{Config, Quiesced, RankSet, RoomTable};

fn main() -> Result<(), kvfence::Error> {
    let table = RoomTable::new(Config::new(2, 4, 2))?;
    let rank0 = RankSet::first(1)?;

    println!("T0  request A opens a room: 4 pages, writer = prefill rank 0");
    let a = table.open(4, &rank0)?;
    println!("    A = {}, pages {:?}", a.handle, a.pages);
    let in_flight_write = a.handle.to_wire(); // the rank's queued/in-flight RDMA WRITE for A

    println!("T1  decode aborts A (client disconnected)");
    let aborted = table.abort(a.handle)?;
    println!(
        "    A fails at once; fan-out to tell: ranks {:?}; released now: {}",
        aborted.fanout,
        aborted.released.is_some()
    );

    println!("T2  request B asks for pages");
    match table.open(4, &rank0) {
        Ok(_) => println!("    B got A's pages: the stale write would now corrupt B (BUG)"),
        Err(e) => {
            println!("    refused: {e} -- A's pages are still held, nothing can be corrupted")
        }
    }

    println!("T3  the stale write for A completes; rank 0 drains and sends ABORT_ACK");
    let _ = in_flight_write;
    match table.quiesce(a.handle, 0)? {
        Quiesced::Released(r) => println!("    the ACK releases {} pages of {}", r.pages, r.handle),
        other => println!("    unexpected: {other:?}"),
    }

    println!("T4  request B opens now, on pages no one can still write");
    let b = table.open(4, &rank0)?;
    println!("    B = {}, pages {:?}", b.handle, b.pages);

    println!("T5  a duplicate ACK of A arrives late");
    match table.quiesce(a.handle, 0) {
        Err(e) => println!("    refused: {e}; B is untouched"),
        Ok(q) => println!("    BUG: accepted {q:?}"),
    }
    let stats = table.stats();
    println!(
        "    stats: pages owned {}, held {}, free {}; stale refused {}",
        stats.pages.owned, stats.pages.held, stats.pages.free, stats.stale_refused
    );
    Ok(())
}
