//! The hot path allocates nothing: begin/complete, quiesce, abort, finish — including the
//! calls that perform a release — are run under a counting global allocator.

use kvfence::{Config, Quiesced, RankSet, RoomTable};
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
    let table = RoomTable::new(Config::new(16, 1024, 64)).unwrap();
    let writers = RankSet::first(64).unwrap();
    // Warm up thread-locals (scan hints, stats stripe) outside the measured region.
    let warm = table.open(16, &writers).unwrap().handle;
    drop(table.begin_transfer(warm).unwrap());
    let _ = table.abort(warm).unwrap();
    for rank in 0..64 {
        let _ = table.quiesce(warm, rank).unwrap();
    }

    for round in 0..50 {
        let h = table.open(16, &writers).unwrap().handle; // open may allocate: not measured
        let (n, ()) = allocations(|| {
            let a = table.begin_transfer(h).unwrap();
            let b = table.begin_transfer(h).unwrap();
            assert_eq!(a.complete(), None);
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
            for rank in 32..63 {
                assert_eq!(table.quiesce(h, rank).unwrap(), Quiesced::Recorded);
            }
            assert_eq!(table.quiesce(h, 63).unwrap(), Quiesced::Recorded);
            // The release happens in `complete`, and allocates nothing.
            assert!(b.complete().is_some());
            assert!(table.quiesce(h, 1).is_err()); // late ACK
        });
        assert_eq!(n, 0, "round {round}: the hot path allocated {n} times");
    }

    // And a release straight from abort / quiesce.
    let h = table.open(4, &RankSet::first(1).unwrap()).unwrap().handle;
    let (n, ()) = allocations(|| {
        let _ = table.abort(h).unwrap();
        assert!(matches!(
            table.quiesce(h, 0).unwrap(),
            Quiesced::Released(_)
        ));
    });
    assert_eq!(n, 0);
}

/// The counter is live: an allocation in the measured region is seen (so the zero above
/// is a measurement, not a broken probe).
#[test]
fn the_probe_sees_allocations() {
    let (n, v) = allocations(|| vec![1u8; 64]);
    assert!(n >= 1);
    drop(v);
}
