//! Model 16: the page pool's second level (issue 42, item 2) under concurrent claims and
//! frees: a pool of two whole words (128 pages), both in the summary at the start.
//!
//! Thread 1 opens 100 pages: one word from the summary in one CAS (a run), and 36 of the
//! other, which it moves down (takes the word's summary bit, gives the 28 it does not keep
//! to the leaf). Thread 2 opens 10 pages: it moves a word down, or takes from a leaf thread
//! 1 moved down, or is refused. Every release gives whole words back to the summary and
//! partial ones to their leaves; the final claim of all 128 takes words from both levels.
//!
//! Guarantee: no page is ever in two rooms (an ownership map outside the model marks every
//! page an owner holds; and each owner writes and re-reads a loom cell for every page of
//! its list that is a multiple of 9 or a word's first or last page, so an overlap there
//! that the orderings do not serialise is a loom data race: one cell per page would make
//! each execution 10x slower for the same interleavings), every page list is distinct and
//! in range, a refused `open` claims nothing, and at rest all 128 pages are free and a
//! single claim of all 128 fits (the summary and the leaves together lost nothing).
//!
//! Threads: 2, exhaustive.
#![cfg(loom)]

mod common;

use common::{assert_at_rest, check, open_own_finish, own_and_check, Arena, EXHAUSTIVE};
use kvfence::RoomTable;
use loom::thread;
use std::sync::atomic::{AtomicU64, Ordering};

const PAGES: usize = 128;

/// Which pages get a loom cell (see the module notes).
fn sampled(p: u32) -> bool {
    p.is_multiple_of(9) || p.is_multiple_of(64) || p % 64 == 63
}

/// Who owns each page, outside the model (std atomics: loom runs one thread at a time, so
/// this is the exact ownership at every step): 0 = nobody.
struct Owners([AtomicU64; PAGES]);

impl Owners {
    fn take(&self, pages: &[u32], req: u64) {
        for &p in pages {
            let was = self.0[p as usize].swap(req, Ordering::Relaxed);
            assert_eq!(
                was, 0,
                "page {p} handed to request {req} while request {was} holds it"
            );
        }
    }
    fn give_back(&self, pages: &[u32], req: u64) {
        for &p in pages {
            assert_eq!(
                self.0[p as usize].swap(0, Ordering::Relaxed),
                req,
                "page {p}"
            );
        }
    }
}

/// One request's lifecycle: open `n` pages, own them, finish. Returns whether it opened.
fn lifecycle(table: &RoomTable, arena: &Arena, owners: &Owners, n: usize, req: u64) -> bool {
    open_own_finish(table, n, |pages| {
        assert!(pages.iter().all(|&p| (p as usize) < PAGES));
        owners.take(pages, req);
        let cells: Vec<u32> = pages.iter().copied().filter(|&p| sampled(p)).collect();
        own_and_check(arena, &cells, req);
        owners.give_back(pages, req);
    })
}

#[test]
fn m16_pool_summary_2_threads() {
    check("m16_pool_summary_2_threads", 2, EXHAUSTIVE, || {
        let table = common::pool(3, PAGES);
        let arena = Arena::new(PAGES, 1);
        let owners = loom::sync::Arc::new(Owners(std::array::from_fn(|_| AtomicU64::new(0))));
        let other = {
            let (table, arena, owners) = (table.clone(), arena.clone(), owners.clone());
            thread::spawn(move || lifecycle(&table, &arena, &owners, 100, 10) as u64)
        };
        let mine = lifecycle(&table, &arena, &owners, 10, 20) as u64;
        let opened = mine + other.join().unwrap();
        assert!(opened >= 1, "a lone request must always fit");
        assert_at_rest(&table, 3, Some(PAGES), opened);
        // Nothing lost between the levels: the whole pool is one claim again.
        assert!(
            lifecycle(&table, &arena, &owners, PAGES, 30),
            "128 of 128 free pages refused"
        );
    });
}
