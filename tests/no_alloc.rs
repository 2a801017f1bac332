//! The hot path allocates nothing: begin/complete (guards and tokens), quiesce, abort,
//! finish, failing a transfer, the release push and the queue drain — including the calls
//! that perform a release — are run under a counting global allocator.

use kvfence::{Config, Error, Outcome, Quiesced, RoomTable};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    // Per thread, so the test harness's other threads cannot disturb a measurement. A
    // `const` initializer with no destructor: touching it never allocates.
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

fn count() {
    let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: forwards every call unchanged to the system allocator, which upholds the
// `GlobalAlloc` contract; the counter has no effect on the memory returned.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as ours, passed through.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as ours, passed through.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made by this thread while running `f`.
fn allocations<R>(f: impl FnOnce() -> R) -> (usize, R) {
    let before = ALLOCS.with(Cell::get);
    let r = f();
    (ALLOCS.with(Cell::get) - before, r)
}

#[test]
fn hot_path_calls_do_not_allocate() {
    let table = RoomTable::new(Config::pool(16, 1024)).unwrap();
    let writers: Vec<u32> = (0..64).collect();
    // Warm up thread-locals (scan hints, stats stripe) outside the measured region.
    let warm = table.open(&writers, 16).unwrap().handle;
    let _ = table.begin_transfer(warm).unwrap().complete();
    let _ = table.abort(warm).unwrap();
    for &rank in &writers {
        let _ = table.quiesce(warm, rank).unwrap();
    }

    for round in 0..50 {
        let h = table.open(&writers, 16).unwrap().handle; // open may allocate: not measured
        let (n, released) = allocations(|| {
            let a = table.begin_transfer(h).unwrap();
            let b = table.begin_transfer_to(h, 3).unwrap();
            let token = table.begin(h, Some(5)).unwrap();
            assert_eq!(a.complete(), None);
            assert_eq!(table.end(token, Outcome::Completed).unwrap(), None);
            assert_eq!(
                table.end(token, Outcome::Completed),
                Err(Error::InvalidToken)
            );
            for rank in 0..32 {
                assert_eq!(table.quiesce(h, rank).unwrap(), Quiesced::Recorded);
            }
            assert_eq!(table.quiesce(h, 0).unwrap(), Quiesced::Duplicate);
            assert!(table.quiesce(h, 9999).is_err()); // errors allocate nothing either
            if round % 2 == 0 {
                let aborted = table.abort(h).unwrap();
                assert_eq!(aborted.fanout.len(), 32);
            } else {
                assert_eq!(table.finish(h).unwrap(), None);
            }
            assert!(table.begin_transfer(h).is_err());
            for rank in 32..64 {
                assert_eq!(table.quiesce(h, rank).unwrap(), Quiesced::Recorded);
            }
            // The release happens in `complete`, and allocates nothing (the page list is
            // moved out of the room, not copied).
            let released = b.complete().expect("last hold releases");
            assert!(table.quiesce(h, 1).is_err()); // late ACK
            released
        });
        assert_eq!(n, 0, "round {round}: the hot path allocated {n} times");
        assert_eq!(released.pages.len(), 16);
    }

    // And a release straight from abort / quiesce.
    let h = table.open(&[0], 4).unwrap().handle;
    let (n, ()) = allocations(|| {
        let _ = table.abort(h).unwrap();
        assert!(matches!(
            table.quiesce(h, 0).unwrap(),
            Quiesced::Released(_)
        ));
    });
    assert_eq!(n, 0);
}

/// Gate mode with the release queue: the release push (on the ACK thread) and the drain
/// (on the owner thread, into a `Vec` with capacity) allocate nothing; a failed transfer
/// (registered until its peer is fenced) allocates nothing either while the registry's
/// reserved capacity (one per room) lasts.
#[test]
fn gate_mode_queue_push_drain_and_failures_do_not_allocate() {
    let table = RoomTable::new(Config::gate(16).release_queue(true)).unwrap();
    let mut drained = Vec::with_capacity(16);
    let warm = table.open_gate(&[1], 0, vec![1]).unwrap();
    let _ = table.abort(warm).unwrap();
    let _ = table.quiesce(warm, 1).unwrap();
    table.drain_released(&mut drained);
    drained.clear();
    for round in 0..50u64 {
        let pages: Vec<u32> = (0..16).collect(); // the engine's list: not measured
        let h = table.open_gate(&[1, 2, 3], round, pages).unwrap();
        let (n, ()) = allocations(|| {
            let failed = table.begin_transfer_to(h, 2).unwrap();
            assert_eq!(failed.fail(), None);
            let _ = table.abort(h).unwrap();
            for rank in [1, 2, 3] {
                assert_eq!(table.quiesce(h, rank).unwrap(), Quiesced::Recorded);
            }
            assert_eq!(table.room_status(h).unwrap().failed, 1);
            assert_eq!(table.drain_released(&mut drained), 0);
        });
        assert_eq!(n, 0, "round {round}: allocated {n} times");
        // The failed transfer's peer is torn down: fencing it (not a hot-path call) ends it.
        let _ = table.fence_rank(2).unwrap();
        assert!(table.readmit_rank(2).unwrap());
        let (n, got) = allocations(|| table.drain_released(&mut drained));
        assert_eq!((n, got), (0, 1), "round {round}");
        assert_eq!(drained[0].token, round);
        drained.clear();
    }
}

/// The counter is live: an allocation in the measured region is seen (so the zero above
/// is a measurement, not a broken probe).
#[test]
fn the_probe_sees_allocations() {
    let (n, v) = allocations(|| vec![1u8; 64]);
    assert!(n >= 1);
    drop(v);
}

/// Issue 18, item 7: failures per room are unbounded, and the registry used to reserve one
/// entry per room and push one per failure (`fail()` #4, 8, 16, 32 reallocated on a 4-room
/// table). Now a room's failures to one peer share one entry: any number of them allocates
/// nothing. (Fails on f69b486: 4 reallocations.)
#[test]
fn many_failures_of_one_room_do_not_allocate() {
    let table = RoomTable::new(Config::gate(4).max_tokens(64)).unwrap();
    let h = table.open_gate(&[], 1, vec![1, 2]).unwrap();
    let tokens: Vec<_> = (0..64).map(|_| table.begin(h, Some(3)).unwrap()).collect();
    let mut guards = Vec::with_capacity(64);
    for _ in 0..64 {
        guards.push(table.begin_transfer_to(h, 3).unwrap());
    }
    let (n, ()) = allocations(|| {
        for t in &tokens {
            assert!(table.end(*t, Outcome::Failed).unwrap().is_none());
        }
        for g in guards.drain(..) {
            assert!(g.fail().is_none());
        }
    });
    assert_eq!(
        n, 0,
        "failing 128 transfers of one room allocated {n} times"
    );
    assert_eq!(table.room_status(h).unwrap().failed, 128);
    let _ = table.abort(h).unwrap();
    let fenced = table.fence_rank(3).unwrap();
    assert_eq!((fenced.failed_ended, fenced.released.len()), (128, 1));
}
