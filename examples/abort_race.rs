//! Walks the abort race of DESIGN section 1 through the API, step by step.
//!
//! ```text
//! cargo run --example abort_race
//! ```
//!
//! A decode node opens a room for request A, whose KV comes from prefill rank 0. The
//! rank's write to A's pages is still in flight when the client disconnects. We show what a
//! "free at abort" rule would do, then what kvfence does.
//!
//! The decode engine owns its pages (gate mode): here a LIFO free list of 4 pages, so a
//! freed page is handed out again at once, as a typical allocator does. kvfence gates every
//! free: releases go to the release queue, and the scheduler frees pages only after it has
//! drained them from there.

use kvfence::{Config, Quiesced, Released, RoomTable};

/// The engine's page allocator: LIFO, like a typical one.
struct Engine {
    free: Vec<u32>,
}

impl Engine {
    fn alloc(&mut self, n: usize) -> Option<Vec<u32>> {
        let at = self.free.len().checked_sub(n)?;
        Some(self.free.split_off(at))
    }

    /// The scheduler loop: act on the releases kvfence decided, and only then free.
    fn drain(&mut self, table: &RoomTable) {
        let mut released: Vec<Released> = Vec::new();
        table.drain_released(&mut released);
        for r in released {
            println!(
                "    scheduler drains the release of {} (request slot {}, {}): frees pages {:?}",
                r.handle, r.token, r.reason, r.pages
            );
            self.free.extend_from_slice(&r.pages);
        }
    }
}

fn main() -> Result<(), kvfence::Error> {
    let table = RoomTable::new(Config::gate(2).release_queue(true))?;
    let mut engine = Engine {
        free: (0..4).rev().collect(),
    };
    let rank0 = [0u32];

    println!("T0  request A opens a room: 4 engine pages, writer = prefill rank 0");
    let pages_a = engine.alloc(4).expect("4 free pages");
    let a = table.open_gate(&rank0, 1, pages_a.clone())?;
    println!("    A = {a}, pages {pages_a:?}");
    // The rank's in-flight RDMA WRITE for A: a transfer on A's room until it lands.
    let in_flight_write = table.begin_transfer_to(a, 0)?;

    println!("T1  decode aborts A (client disconnected)");
    let aborted = table.abort(a)?;
    println!(
        "    A fails at once; fan-out to tell: ranks {:?}; released now: {}",
        &aborted.fanout[..],
        aborted.released.is_some()
    );
    println!(
        "    a queued intent for A checks the room first: {}",
        match table.begin_transfer(a) {
            Ok(_) => "BUG: accepted".to_string(),
            Err(e) => format!("refused ({e})"),
        }
    );

    println!("T2  request B asks for pages");
    engine.drain(&table);
    match engine.alloc(4) {
        Some(p) => println!("    B got A's pages {p:?}: the stale write would now corrupt B (BUG)"),
        None => println!(
            "    no free page: A's pages are still held (not released), nothing can be corrupted"
        ),
    }

    println!("T3  the stale write for A completes; rank 0 drains and sends ABORT_ACK");
    let _ = in_flight_write.complete();
    match table.quiesce(a, 0)? {
        Quiesced::Queued => println!("    the ACK releases A: queued for the scheduler"),
        other => println!("    unexpected: {other:?}"),
    }

    println!("T4  the scheduler drains; request B opens now, on pages no one can still write");
    engine.drain(&table);
    let pages_b = engine.alloc(4).expect("A's pages are free now");
    let b = table.open_gate(&rank0, 2, pages_b.clone())?;
    println!("    B = {b}, pages {pages_b:?}");

    println!("T5  a duplicate ACK of A arrives late");
    match table.quiesce(a, 0) {
        Err(e) => println!("    refused: {e}; B is untouched"),
        Ok(q) => println!("    BUG: accepted {q:?}"),
    }
    let stats = table.stats();
    println!(
        "    stats: pages owned {}, held {}, queued {}; engine free pages {}; stale refused {}",
        stats.pages.owned,
        stats.pages.held,
        stats.pages.queued,
        engine.free.len(),
        stats.stale_refused
    );
    Ok(())
}
