//! Model 7: concurrent `open` and release on a tiny pool (2 rooms, 3 pages: two 2-page
//! requests cannot both fit).
//!
//! Guarantee: no page is ever in two rooms (each owner writes and re-reads all its pages:
//! an overlap is a loom data race or a wrong content), each page list is distinct and in
//! range, a refused `open` claims nothing, and at the end
//! `free + owned + held == capacity` for rooms and pages, with one release per open.
//!
//! Threads: 2 (exhaustive) and 3 (preemption bound 3), each thread one lifecycle.
#![cfg(loom)]

mod common;

use common::{assert_at_rest, check, open_own_finish, own_and_check, Arena, EXHAUSTIVE};
use kvfence::RoomTable;
use loom::thread;

/// One request's lifecycle: open `n` pages, own them, finish. Returns whether it opened.
fn lifecycle(table: &RoomTable, arena: &Arena, n: usize, req: u64) -> bool {
    open_own_finish(table, n, |pages| own_and_check(arena, pages, req))
}

#[test]
fn m7_open_release_tiny_pool_2_threads() {
    check("m7_open_release_tiny_pool_2_threads", 2, EXHAUSTIVE, || {
        let table = common::pool(2, 3);
        let arena = Arena::new(3, 1);
        let other = {
            let (table, arena) = (table.clone(), arena.clone());
            thread::spawn(move || lifecycle(&table, &arena, 2, 10) as u64)
        };
        let mine =
            lifecycle(&table, &arena, 2, 20) as u64 + lifecycle(&table, &arena, 2, 21) as u64;
        let opened = mine + other.join().unwrap();
        assert!(opened >= 1, "a lone request must always fit");
        assert_at_rest(&table, 2, Some(3), opened);
    });
}

#[test]
fn m7_open_release_tiny_pool_3_threads() {
    check("m7_open_release_tiny_pool_3_threads", 3, Some(3), || {
        let table = common::pool(2, 3);
        let arena = Arena::new(3, 1);
        let others: Vec<_> = [(1usize, 10u64), (2, 11)]
            .into_iter()
            .map(|(n, req)| {
                let (table, arena) = (table.clone(), arena.clone());
                thread::spawn(move || lifecycle(&table, &arena, n, req) as u64)
            })
            .collect();
        let mut opened = lifecycle(&table, &arena, 2, 20) as u64;
        for t in others {
            opened += t.join().unwrap();
        }
        assert!(opened >= 1);
        assert_at_rest(&table, 2, Some(3), opened);
    });
}
