//! `threads`: operations spread over 2-4 real threads sharing one table and a real page
//! arena. No model (interleavings are up to the OS); instead every transfer proves it owns
//! its pages:
//!
//! * each page has an `owner` word that `open` sets to the new lifecycle; a guard checks,
//!   before and after writing, that every page it holds is still owned by its lifecycle:
//!   a page handed to a new room while a guard of the old one is alive fails this check
//!   deterministically, and so does a guard obtained with a stale handle;
//! * each guard writes a pattern (lifecycle, page, offset) into its pages, yields, and
//!   verifies it: another lifecycle writing the same page in between shows up as a
//!   mismatch;
//! * at the end every room is drained: all rooms and pages must be free, and the releases
//!   collected from return values and `take_orphaned` must name every opened lifecycle
//!   exactly once.
//!
//! The worker threads are a persistent pool, not spawned per input: a thread that exits
//! while LeakSanitizer checks the input shows up as a leak of glibc's thread-local
//! destructor list (`__cxa_thread_atexit_impl`), a false positive.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use kvfence::{Config, Quiesced, RankSet, Released, RoomHandle, RoomTable};
use libfuzzer_sys::fuzz_target;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex, OnceLock};

const ROOMS: usize = 4;
const PAGES: usize = 24;
const RANKS: u32 = 3;
const WORDS: usize = 8;
const MAX_OPS: usize = 160;

#[derive(Arbitrary, Debug)]
enum TOp {
    Open {
        pages: u8,
        ranks: u8,
    },
    Transfer {
        room: u8,
        complete: bool,
        yield_mid: bool,
    },
    Abort {
        room: u8,
    },
    Finish {
        room: u8,
    },
    Quiesce {
        room: u8,
        rank: u8,
    },
    FenceReadmit {
        rank: u8,
    },
}

struct Shared {
    table: RoomTable,
    arena: Vec<AtomicU64>,
    owner: Vec<AtomicU64>,
    handles: Mutex<Vec<RoomHandle>>,
    releases: Mutex<Vec<Released>>,
}

fn pattern(h: RoomHandle, page: u32, offset: usize) -> u64 {
    h.to_wire() as u64 ^ (u64::from(page) << 8).rotate_left(17) ^ (offset as u64).wrapping_mul(0x9E37_79B9)
}

impl Shared {
    fn pick(&self, sel: u8) -> Option<RoomHandle> {
        let handles = self.handles.lock().unwrap();
        if handles.is_empty() {
            return None;
        }
        // Prefer recent handles (likely live), sometimes any (likely stale).
        let n = handles.len();
        let i = if sel & 0x80 == 0 {
            n - 1 - (sel as usize % n.min(4))
        } else {
            sel as usize % n
        };
        Some(handles[i])
    }

    fn record(&self, r: Option<Released>) {
        if let Some(r) = r {
            self.releases.lock().unwrap().push(r);
        }
    }

    fn check_owned(&self, h: RoomHandle, pages: &[u32], when: &str) {
        for &p in pages {
            let owner = self.owner[p as usize].load(Relaxed);
            assert_eq!(
                owner,
                h.to_wire() as u64 + 1,
                "{when}: page {p} is held by a guard of {h:?} but owned by lifecycle {:#x}",
                owner.wrapping_sub(1)
            );
        }
    }

    fn apply(&self, op: &TOp) {
        let t = &self.table;
        match *op {
            TOp::Open { pages, ranks } => {
                let n = 1 + pages as usize % 6;
                let mut set = RankSet::new();
                for r in 0..RANKS {
                    if ranks >> r & 1 == 1 {
                        set.insert(r).unwrap();
                    }
                }
                if let Ok(opened) = t.open(n, &set) {
                    // Claim the pages for this lifecycle: a guard of an older lifecycle still
                    // holding any of them will see it.
                    for &p in &opened.pages {
                        self.owner[p as usize].store(opened.handle.to_wire() as u64 + 1, Relaxed);
                    }
                    self.handles.lock().unwrap().push(opened.handle);
                }
            }
            TOp::Transfer {
                room,
                complete,
                yield_mid,
            } => {
                let Some(h) = self.pick(room) else { return };
                let Ok(guard) = t.begin_transfer(h) else {
                    return;
                };
                let pages = guard.pages().to_vec();
                self.check_owned(h, &pages, "begin");
                for &p in &pages {
                    for o in 0..WORDS {
                        self.arena[p as usize * WORDS + o].store(pattern(h, p, o), Relaxed);
                    }
                }
                if yield_mid {
                    std::thread::yield_now();
                }
                for &p in &pages {
                    for o in 0..WORDS {
                        let got = self.arena[p as usize * WORDS + o].load(Relaxed);
                        assert_eq!(
                            got,
                            pattern(h, p, o),
                            "page {p} word {o} of {h:?} overwritten"
                        );
                    }
                }
                self.check_owned(h, &pages, "end");
                if complete {
                    self.record(guard.complete());
                } else {
                    drop(guard);
                }
            }
            TOp::Abort { room } => {
                if let Some(h) = self.pick(room) {
                    if let Ok(a) = t.abort(h) {
                        self.record(a.released);
                    }
                }
            }
            TOp::Finish { room } => {
                if let Some(h) = self.pick(room) {
                    if let Ok(r) = t.finish(h) {
                        self.record(r);
                    }
                }
            }
            TOp::Quiesce { room, rank } => {
                if let Some(h) = self.pick(room) {
                    if let Ok(Quiesced::Released(r)) = t.quiesce(h, u32::from(rank) % (RANKS + 1)) {
                        self.record(Some(r));
                    }
                }
            }
            TOp::FenceReadmit { rank } => {
                let rank = u32::from(rank) % RANKS;
                let fenced = t.fence_rank(rank).expect("rank in range");
                for r in fenced.released {
                    self.record(Some(r));
                }
                let _ = t.readmit_rank(rank).expect("rank in range");
            }
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// Four worker threads that live as long as the fuzzer.
fn pool() -> &'static [mpsc::Sender<Job>] {
    static POOL: OnceLock<Vec<mpsc::Sender<Job>>> = OnceLock::new();
    POOL.get_or_init(|| {
        (0..4)
            .map(|_| {
                let (tx, rx) = mpsc::channel::<Job>();
                std::thread::spawn(move || {
                    for job in rx {
                        job();
                    }
                });
                tx
            })
            .collect()
    })
}

/// Runs the jobs on distinct pool threads at once and waits for all of them. A panic in a
/// job aborts the process (libfuzzer-sys's panic hook), so a failed check is a crash.
fn run_parallel(jobs: Vec<Job>) {
    let (done_tx, done_rx) = mpsc::channel();
    let n = jobs.len();
    for (worker, job) in pool().iter().zip(jobs) {
        let done = done_tx.clone();
        worker
            .send(Box::new(move || {
                job();
                let _ = done.send(());
            }))
            .expect("pool worker alive");
    }
    for _ in 0..n {
        done_rx.recv().expect("pool worker finished its job");
    }
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let threads = 2 + u.arbitrary::<u8>().unwrap_or(0) as usize % 3;
    let mut ops: Vec<TOp> = Vec::new();
    while ops.len() < MAX_OPS && !u.is_empty() {
        match TOp::arbitrary(&mut u) {
            Ok(op) => ops.push(op),
            Err(_) => break,
        }
    }
    let shared = Arc::new(Shared {
        table: RoomTable::new(Config::new(ROOMS, PAGES, RANKS as usize)).unwrap(),
        arena: (0..PAGES * WORDS).map(|_| AtomicU64::new(0)).collect(),
        owner: (0..PAGES).map(|_| AtomicU64::new(0)).collect(),
        handles: Mutex::new(Vec::new()),
        releases: Mutex::new(Vec::new()),
    });
    let ops = Arc::new(ops);
    let jobs = (0..threads)
        .map(|t| {
            let shared = Arc::clone(&shared);
            let ops = Arc::clone(&ops);
            Box::new(move || {
                for op in ops.iter().skip(t).step_by(threads) {
                    shared.apply(op);
                }
            }) as Job
        })
        .collect();
    run_parallel(jobs);
    // Drain: close and quiesce every lifecycle ever opened (stale ones are refused).
    let t = &shared.table;
    let handles = shared.handles.lock().unwrap().clone();
    for &h in &handles {
        if let Ok(a) = t.abort(h) {
            shared.record(a.released);
        }
        for rank in 0..RANKS {
            if let Ok(Quiesced::Released(r)) = t.quiesce(h, rank) {
                shared.record(Some(r));
            }
        }
    }
    let mut releases = shared.releases.lock().unwrap().clone();
    releases.extend(t.take_orphaned());
    let stats = t.stats();
    assert_eq!(stats.pages.free, PAGES, "pages leaked: {stats:?}");
    assert_eq!(stats.rooms.free, ROOMS, "rooms leaked: {stats:?}");
    assert_eq!(stats.releases, handles.len() as u64, "releases != opens");
    let released: HashSet<u128> = releases.iter().map(|r| r.handle.to_wire()).collect();
    assert_eq!(
        released.len(),
        releases.len(),
        "a lifecycle was reported released twice"
    );
    let opened: HashSet<u128> = handles.iter().map(|h| h.to_wire()).collect();
    assert_eq!(released, opened, "reported releases != opened lifecycles");
    t.wait_idle();
});
