//! Shared harness of the loom models: the model runner (bound, interleaving count), table
//! constructors and the page arena that models page *contents*.
//!
//! Included by every model file with `mod common;`; not every model uses every item.
#![allow(dead_code)]

use kvfence::{Config, Reason, Released, RoomHandle, RoomTable};
use loom::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering as StdOrdering};
use std::sync::Arc as StdArc;
use std::time::Instant;

/// Exhaustive exploration (no preemption bound): the rule for 2-thread models.
pub const EXHAUSTIVE: Option<usize> = None;

/// Runs `f` under loom with the given preemption bound and prints one summary line:
/// `loom-model <name>: threads=<n> bound=<b> interleavings=<k> time=<s>`.
///
/// `threads` counts the model's threads including the main one (for the report only).
/// `LOOM_MAX_PREEMPTIONS`, if set, overrides `bound` (for experiments), as do the other
/// `LOOM_*` variables read by `loom::model::Builder::new` (`LOOM_CHECKPOINT_FILE`,
/// `LOOM_CHECKPOINT_INTERVAL`, `LOOM_LOCATION`, `LOOM_LOG`, `LOOM_MAX_BRANCHES`).
pub fn check<F>(name: &str, threads: usize, bound: Option<usize>, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = bound;
    }
    let bound_text = match builder.preemption_bound {
        Some(b) => b.to_string(),
        None => "none (exhaustive)".to_string(),
    };
    // A plain std counter: it lives outside the model and counts executions of the closure.
    let runs = StdArc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let start = Instant::now();
    // The same LOOM_LOG-filtered subscriber that `loom::model` installs.
    let subscriber = tracing_subscriber::fmt::Subscriber::builder()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("LOOM_LOG"))
        .with_test_writer()
        .with_ansi(false)
        .without_time()
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        builder.check(move || {
            counter.fetch_add(1, StdOrdering::Relaxed);
            f();
        });
    });
    let n = runs.load(StdOrdering::Relaxed);
    assert!(n > 0, "loom explored no execution");
    println!(
        "loom-model {name}: threads={threads} bound={bound_text} interleavings={n} time={:.3}s",
        start.elapsed().as_secs_f64()
    );
}

/// Keeps the table's loom objects few: every atomic is a loom object created in every
/// execution (token slots: 3 atomics each; fenced-rank slots: 1 each).
fn small(config: Config) -> Config {
    config.max_fenced(2).max_tokens(1)
}

/// A pool-mode table (kvfence owns pages `0..pages`) of `rooms` rooms, shared by loom `Arc`.
pub fn pool(rooms: usize, pages: usize) -> loom::sync::Arc<RoomTable> {
    loom::sync::Arc::new(RoomTable::new(small(Config::pool(rooms, pages))).expect("valid config"))
}

/// [`pool`] behind a std `Arc`, for [`RoomTable::begin_transfer_owned`] (whose guard owns
/// a std `Arc` of the table: it moves into another thread). The table still drops inside
/// the execution (every clone is dropped by the model's threads), so its loom objects do.
pub fn pool_std(rooms: usize, pages: usize) -> StdArc<RoomTable> {
    StdArc::new(RoomTable::new(small(Config::pool(rooms, pages))).expect("valid config"))
}

/// A gate-mode table (the engine owns the pages) of `rooms` rooms; `queue`: every release is
/// delivered through the release queue.
pub fn gate(rooms: usize, queue: bool) -> loom::sync::Arc<RoomTable> {
    loom::sync::Arc::new(
        RoomTable::new(small(Config::gate(rooms).release_queue(queue))).expect("valid config"),
    )
}

/// Id written into a page by a writer of request `req` (0 = never written).
pub type ReqId = u64;

/// Page contents: `slots` cells per page, one per writer that may write the page at the same
/// time (different prefill ranks write different parts of a page, e.g. different KV heads).
///
/// Each cell is a loom `UnsafeCell` holding the id of the request that last wrote it, so two
/// kinds of corruption are caught:
/// * a write not ordered (happens-before) with another access to the same cell: loom
///   reports a data race ("Causality violation"), e.g. a stale writer still writing while
///   the page's new owner writes it;
/// * a write that *is* ordered but comes from the wrong request: [`Arena::expect`] finds
///   another request's id in a page the caller owns.
pub struct Arena {
    cells: Vec<UnsafeCell<ReqId>>,
    slots: usize,
}

impl Arena {
    /// `pages` pages of `slots` writer slots each, all unwritten.
    pub fn new(pages: usize, slots: usize) -> loom::sync::Arc<Arena> {
        loom::sync::Arc::new(Arena {
            cells: (0..pages * slots).map(|_| UnsafeCell::new(0)).collect(),
            slots,
        })
    }

    fn cell(&self, page: u32, slot: usize) -> &UnsafeCell<ReqId> {
        assert!(slot < self.slots, "slot {slot} out of range");
        self.cells
            .get(page as usize * self.slots + slot)
            .unwrap_or_else(|| panic!("page {page} out of the pool"))
    }

    /// Writer `slot` of request `req` writes its part of every page in `pages`.
    pub fn write(&self, pages: &[u32], slot: usize, req: ReqId) {
        for &p in pages {
            // SAFETY: loom's cell checks the access; the pointer is valid for the call.
            self.cell(p, slot).with_mut(|c| unsafe { *c = req });
        }
    }

    /// The new owner `req` writes all parts of every page in `pages`.
    pub fn write_all(&self, pages: &[u32], req: ReqId) {
        for slot in 0..self.slots {
            self.write(pages, slot, req);
        }
    }

    /// Asserts that every part of every page in `pages` holds `req`'s data.
    pub fn expect(&self, pages: &[u32], req: ReqId) {
        for &p in pages {
            for slot in 0..self.slots {
                // SAFETY: loom's cell checks the access; the pointer is valid for the call.
                let got = self.cell(p, slot).with(|c| unsafe { *c });
                assert_eq!(
                    got, req,
                    "page {p} slot {slot}: request {req} owns it but it holds request {got}'s data \
                     (a stale write landed in a reused page)"
                );
            }
        }
    }
}

/// Request ids the models use: `A` is the request whose pages are at stake, `B` the request
/// that reuses them after A's release.
pub const A: ReqId = 1;
/// See [`A`].
pub const B: ReqId = 2;

/// Pool mode: whoever performed A's release reuses its two pages at once for request B (no
/// writer ranks), writes and checks them, and finishes B (which releases it: B holds
/// nothing). A stale write of A racing this is a loom data race or a wrong page content.
pub fn reuse(table: &RoomTable, arena: &Arena, out: &mut Vec<Released>) {
    let b = table
        .open(&[], 2)
        .expect("the releaser must be able to reuse the pages at once");
    own_and_check(arena, &b.pages, B);
    // Nothing of B's holds it, but a stale `begin_transfer` of A may have its transient
    // unit in B's word (the room index is reused): then that call's take-back releases B,
    // into the queue (issue 42), and the test's final drain gets it.
    out.extend(table.finish(b.handle).unwrap());
}

/// The owner's drain after the threads joined: a refused `begin_transfer` whose transient
/// unit was the room's last hold performs the release and queues it (issue 42, see
/// `src/room_word.rs`); whoever drains A's release (`a`) reuses the pages at once, as a
/// direct releaser does (a queued release of B is only collected).
pub fn drain_and_reuse(table: &RoomTable, arena: &Arena, a: RoomHandle, out: &mut Vec<Released>) {
    let mut queued = Vec::new();
    table.drain_released(&mut queued);
    for r in queued {
        let of_a = r.handle == a;
        out.push(r);
        if of_a {
            reuse(table, arena, out);
        }
    }
}

/// Gate mode: the engine got A's release (`released`) and hands its pages to request B at
/// once (its own allocator), in a new room of token `B`; B is written, checked and finished
/// (with a release queue, B's release is queued: whoever drains it next gets it).
pub fn reuse_gate(table: &RoomTable, arena: &Arena, released: &Released, out: &mut Vec<Released>) {
    assert_ne!(
        released.reason,
        Reason::Quarantined,
        "the engine must never reuse quarantined pages"
    );
    let b = table
        .open_gate(&[], B, released.pages.clone())
        .expect("the room index is back once the release is delivered");
    own_and_check(arena, &released.pages, B);
    out.extend(table.finish(b).unwrap());
}

/// The new owner's turn on a page set it was just given: write every part, read it back.
pub fn own_and_check(arena: &Arena, pages: &[u32], req: ReqId) {
    arena.write_all(pages, req);
    arena.expect(pages, req);
}

/// Pool mode, one request with no writer ranks: open `n` pages (all distinct), hand them
/// to `own`, finish (which releases at once, the same pages, reason `Finished`). Returns
/// whether it opened; a refusal (pool or room table full) must name `n` and claim nothing.
pub fn open_own_finish(table: &RoomTable, n: usize, own: impl FnOnce(&[u32])) -> bool {
    match table.open(&[], n) {
        Ok(room) => {
            let mut sorted = room.pages.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(
                sorted.len(),
                n,
                "duplicate page in one room: {:?}",
                room.pages
            );
            own(&room.pages);
            let r = table
                .finish(room.handle)
                .unwrap()
                .expect("nothing holds it: finish releases");
            assert_eq!(
                (r.handle, &r.pages, r.reason),
                (room.handle, &room.pages, Reason::Finished)
            );
            true
        }
        Err(kvfence::Error::PoolExhausted { requested }) => {
            assert_eq!(requested, n);
            false
        }
        Err(kvfence::Error::RoomTableFull) => false,
        Err(e) => panic!("open: {e:?}"),
    }
}

/// Asserts that `releases` holds exactly one release of lifecycle `handle`; returns it.
pub fn exactly_one(releases: &[Released], handle: RoomHandle) -> Released {
    let of_it: Vec<_> = releases.iter().filter(|r| r.handle == handle).collect();
    assert_eq!(
        of_it.len(),
        1,
        "lifecycle {handle:?} must be released and delivered exactly once, got {releases:?}"
    );
    of_it[0].clone()
}

/// Asserts the table is back at rest: every room free (nothing owned, held or queued), in
/// pool mode every page but `quarantined` back in the pool, and `releases` releases counted.
pub fn assert_at_rest(table: &RoomTable, rooms: usize, pages: Option<usize>, releases: u64) {
    assert_at_rest_q(table, rooms, pages, 0, releases);
}

/// [`assert_at_rest`] with `quarantined` pool pages kept out of the pool for good.
pub fn assert_at_rest_q(
    table: &RoomTable,
    rooms: usize,
    pages: Option<usize>,
    quarantined: usize,
    releases: u64,
) {
    let stats = table.stats();
    assert_eq!(
        (
            stats.rooms.free,
            stats.rooms.owned,
            stats.rooms.held,
            stats.rooms.queued
        ),
        (rooms, 0, 0, 0),
        "rooms not conserved: {stats:?}"
    );
    assert_eq!(
        (
            stats.pages.free,
            stats.pages.owned,
            stats.pages.held,
            stats.pages.queued
        ),
        (pages.map_or(0, |p| p - quarantined), 0, 0, 0),
        "pages not conserved: {stats:?}"
    );
    assert_eq!(stats.quarantined_pages, quarantined as u64, "{stats:?}");
    assert_eq!(stats.releases, releases, "release count: {stats:?}");
    assert_eq!(table.queued_releases(), 0, "a release left in the queue");
    assert!(
        table.pop_released().is_none(),
        "unexpected release left in the queue"
    );
}
