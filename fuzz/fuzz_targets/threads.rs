//! `threads`: operations spread over 2-4 real threads sharing one table and a real page
//! arena. No model (interleavings are up to the OS); instead every transfer proves it owns
//! its pages:
//!
//! * each page has an `owner` word that `open` (and `grow`) sets to the new lifecycle; a
//!   transfer checks, before and after writing, that every page of its room is still owned
//!   by its lifecycle: a page handed to a new room while a transfer of the old one is alive
//!   fails this check deterministically, and so does a transfer begun with a stale handle;
//! * each transfer writes a pattern (lifecycle, page, offset) into its pages, maybe yields,
//!   and verifies it: another lifecycle writing the same page in between shows up as a
//!   mismatch;
//! * transfers end every way: completed, failed, guard dropped (= failed), in all three forms
//!   (borrowed guard, owned guard, integer token), with or without a peer rank; failed ones
//!   hold their room until a `FenceReadmit` of the peer or a `Quarantine`;
//! * every release must hand back exactly the pages the room was opened and grown with;
//! * at the end every room is drained (abort, ACKs, fencing every rank, quarantining what is
//!   left): every room must be free, every page free or quarantined, and the releases
//!   collected from return values and the release queue must name every opened lifecycle
//!   exactly once.
//!
//! Four table kinds, chosen by the first byte: pool, pool with a release queue, gate (the
//! engine's page allocator is a free list here), and gate with a release queue drained by
//! one thread (thread 0, the engine's scheduler: only it frees engine pages). With a release
//! queue, no call may return a release directly. Without one, any thread may drain (a
//! dropped guard's release goes to the queue), so drains race each other.
//!
//! The worker threads are a persistent pool, not spawned per input: a thread that exits
//! while LeakSanitizer checks the input shows up as a leak of glibc's thread-local
//! destructor list (`__cxa_thread_atexit_impl`), a false positive.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use kvfence::{Config, Outcome, Quiesced, Reason, Released, RoomHandle, RoomTable, TransferToken};
use libfuzzer_sys::fuzz_target;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex, OnceLock};

const ROOMS: usize = 4;
/// Pool pages (pool mode) or the engine's pages (gate mode).
const PAGES: usize = 24;
/// Writer and peer rank ids: small and large ones.
const RANKS: [u32; 3] = [0, 7, 0xDEAD_BEEF];
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
        /// `% 3`: borrowed guard, owned guard, token.
        form: u8,
        /// `% 4`: complete (twice as likely), fail, drop (tokens: fail).
        end: u8,
        /// `% 4`: no peer, or `RANKS[peer % 4 - 1]`.
        peer: u8,
        yield_mid: bool,
    },
    Grow {
        room: u8,
        pages: u8,
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
    Quarantine {
        room: u8,
    },
    Drain,
}

struct Shared {
    table: Arc<RoomTable>,
    gate: bool,
    queue: bool,
    arena: Vec<AtomicU64>,
    owner: Vec<AtomicU64>,
    handles: Mutex<Vec<RoomHandle>>,
    /// The pages each lifecycle was opened and grown with (recorded while the room cannot
    /// be released: by the opener before it publishes the handle, by a grower under a
    /// transfer hold).
    pages: Mutex<HashMap<u128, Vec<u32>>>,
    releases: Mutex<Vec<Released>>,
    /// Gate mode: the engine's free pages.
    engine_free: Mutex<Vec<u32>>,
    /// Pages of quarantined releases (never freed).
    lost: Mutex<Vec<u32>>,
}

fn pattern(h: RoomHandle, page: u32, offset: usize) -> u64 {
    h.to_wire() as u64
        ^ (u64::from(page) << 8).rotate_left(17)
        ^ (offset as u64).wrapping_mul(0x9E37_79B9)
}

fn stamp(h: RoomHandle) -> u64 {
    h.to_wire() as u64 + 1
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

    /// A release returned directly by a call: never with a release queue.
    fn record(&self, r: Option<Released>, what: &str) {
        if let Some(r) = r {
            assert!(
                !self.queue,
                "{what} returned a release directly although the table has a release queue: {r:?}"
            );
            self.deliver(r);
        }
    }

    /// A release delivered (returned or drained): the engine frees its pages.
    fn deliver(&self, r: Released) {
        let mut expected = self
            .pages
            .lock()
            .unwrap()
            .get(&r.handle.to_wire())
            .cloned()
            .unwrap_or_else(|| panic!("release of a lifecycle never opened: {r:?}"));
        let mut got = r.pages.clone();
        expected.sort_unstable();
        got.sort_unstable();
        assert_eq!(
            got, expected,
            "{:?}: released pages != opened and grown pages",
            r.handle
        );
        if r.reason == Reason::Quarantined {
            self.lost.lock().unwrap().extend_from_slice(&r.pages);
        } else if self.gate {
            self.engine_free.lock().unwrap().extend_from_slice(&r.pages);
        }
        self.releases.lock().unwrap().push(r);
    }

    fn drain(&self) {
        let mut out = Vec::new();
        let n = self.table.drain_released(&mut out);
        assert_eq!(n, out.len());
        for r in out {
            self.deliver(r);
        }
    }

    fn check_owned(&self, h: RoomHandle, pages: &[u32], when: &str) {
        for &p in pages {
            let owner = self.owner[p as usize].load(Relaxed);
            assert_eq!(
                owner,
                stamp(h),
                "{when}: page {p} is held by a transfer of {h:?} but owned by lifecycle {:#x}",
                owner.wrapping_sub(1)
            );
        }
    }

    fn engine_alloc(&self, n: usize) -> Option<Vec<u32>> {
        let mut free = self.engine_free.lock().unwrap();
        if free.len() < n {
            return None;
        }
        let at = free.len() - n;
        Some(free.split_off(at))
    }

    /// Stamps and records pages the room `h` now owns (it cannot be released meanwhile).
    fn claim(&self, h: RoomHandle, pages: &[u32]) {
        for &p in pages {
            self.owner[p as usize].store(stamp(h), Relaxed);
        }
        self.pages
            .lock()
            .unwrap()
            .entry(h.to_wire())
            .or_default()
            .extend_from_slice(pages);
    }

    fn write_and_verify(&self, h: RoomHandle, yield_mid: bool) {
        let pages = self
            .pages
            .lock()
            .unwrap()
            .get(&h.to_wire())
            .cloned()
            .unwrap_or_default();
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
    }

    fn apply(&self, op: &TOp, thread: usize) {
        let t = &*self.table;
        match *op {
            TOp::Open { pages, ranks } => {
                let n = pages as usize % 6;
                let writers: Vec<u32> = (0..RANKS.len())
                    .filter(|r| ranks >> r & 1 == 1)
                    .map(|r| RANKS[r])
                    .collect();
                let (h, pages) = if self.gate {
                    let Some(pages) = self.engine_alloc(n) else {
                        return;
                    };
                    match t.open_gate(&writers, u64::from(ranks), pages.clone()) {
                        Ok(h) => (h, pages),
                        Err(_) => {
                            self.engine_free.lock().unwrap().extend_from_slice(&pages);
                            return;
                        }
                    }
                } else {
                    match t.open(&writers, n) {
                        Ok(opened) => (opened.handle, opened.pages),
                        Err(_) => return,
                    }
                };
                // Claim the pages for this lifecycle: a transfer of an older lifecycle
                // still holding any of them will see it. Then publish the handle.
                self.claim(h, &pages);
                self.handles.lock().unwrap().push(h);
            }
            TOp::Transfer {
                room,
                form,
                end,
                peer,
                yield_mid,
            } => {
                let Some(h) = self.pick(room) else { return };
                let peer = (peer % 4 != 0).then(|| RANKS[(peer % 4 - 1) as usize]);
                let outcome = if end % 4 == 2 {
                    Outcome::Failed
                } else {
                    Outcome::Completed
                };
                match form % 3 {
                    0 => {
                        let guard = match peer {
                            None => t.begin_transfer(h),
                            Some(p) => t.begin_transfer_to(h, p),
                        };
                        let Ok(guard) = guard else { return };
                        self.write_and_verify(h, yield_mid);
                        match (end % 4, outcome) {
                            (3, _) => drop(guard),
                            (_, Outcome::Completed) => self.record(guard.complete(), "complete"),
                            (_, Outcome::Failed) => self.record(guard.fail(), "fail"),
                        }
                    }
                    1 => {
                        let Ok(guard) = RoomTable::begin_transfer_owned(&self.table, h, peer)
                        else {
                            return;
                        };
                        self.write_and_verify(h, yield_mid);
                        if end % 4 == 3 {
                            drop(guard);
                        } else {
                            self.record(guard.end(outcome), "owned guard end");
                        }
                    }
                    _ => {
                        let Ok(token) = t.begin(h, peer) else { return };
                        let token = TransferToken::from_wire(token.to_wire());
                        self.write_and_verify(h, yield_mid);
                        let outcome = if end % 4 == 3 {
                            Outcome::Failed
                        } else {
                            outcome
                        };
                        let r = t.end(token, outcome).expect("a token in flight ends once");
                        self.record(r, "end");
                        assert_eq!(
                            t.end(token, outcome),
                            Err(kvfence::Error::InvalidToken),
                            "a token ended twice"
                        );
                    }
                }
            }
            TOp::Grow { room, pages } => {
                let Some(h) = self.pick(room) else { return };
                // Hold the room while its new pages are stamped and recorded.
                let Ok(guard) = t.begin_transfer(h) else {
                    return;
                };
                let n = pages as usize % 3;
                if self.gate {
                    if let Some(new) = self.engine_alloc(n) {
                        if t.grow_gate(h, &new).is_ok() {
                            self.claim(h, &new);
                        } else {
                            self.engine_free.lock().unwrap().extend_from_slice(&new);
                        }
                    }
                } else if let Ok(new) = t.grow(h, n) {
                    self.claim(h, &new);
                }
                self.record(guard.complete(), "complete after grow");
            }
            TOp::Abort { room } => {
                if let Some(h) = self.pick(room) {
                    if let Ok(a) = t.abort(h) {
                        self.record(a.released, "abort");
                    }
                }
            }
            TOp::Finish { room } => {
                if let Some(h) = self.pick(room) {
                    if let Ok(r) = t.finish(h) {
                        self.record(r, "finish");
                    }
                }
            }
            TOp::Quiesce { room, rank } => {
                if let Some(h) = self.pick(room) {
                    let rank = RANKS[rank as usize % RANKS.len()];
                    match t.quiesce(h, rank) {
                        Ok(Quiesced::Released(r)) => self.record(Some(r), "quiesce"),
                        Ok(Quiesced::Queued) => {
                            assert!(self.queue, "quiesce queued without a queue")
                        }
                        _ => {}
                    }
                }
            }
            TOp::FenceReadmit { rank } => {
                let rank = RANKS[rank as usize % RANKS.len()];
                let fenced = t.fence_rank(rank).expect("a valid rank, few fenced");
                for r in fenced.released {
                    self.record(Some(r), "fence_rank");
                }
                let _ = t.readmit_rank(rank).expect("a valid rank");
            }
            TOp::Quarantine { room } => {
                if let Some(h) = self.pick(room) {
                    if let Ok(r) = t.quarantine(h) {
                        self.record(r, "quarantine");
                    }
                }
            }
            TOp::Drain => {
                // Gate mode with a queue: only the scheduler thread frees engine pages.
                if !(self.gate && self.queue) || thread == 0 {
                    self.drain();
                }
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
    let kind = u.arbitrary::<u8>().unwrap_or(0);
    let threads = 2 + u.arbitrary::<u8>().unwrap_or(0) as usize % 3;
    let mut ops: Vec<TOp> = Vec::new();
    while ops.len() < MAX_OPS && !u.is_empty() {
        match TOp::arbitrary(&mut u) {
            Ok(op) => ops.push(op),
            Err(_) => break,
        }
    }
    let (gate, queue) = (kind & 1 == 1, kind & 2 == 2);
    let config = if gate {
        Config::gate(ROOMS)
    } else {
        Config::pool(ROOMS, PAGES)
    }
    .release_queue(queue);
    let shared = Arc::new(Shared {
        table: Arc::new(RoomTable::new(config).unwrap()),
        gate,
        queue,
        arena: (0..PAGES * WORDS).map(|_| AtomicU64::new(0)).collect(),
        owner: (0..PAGES).map(|_| AtomicU64::new(0)).collect(),
        handles: Mutex::new(Vec::new()),
        pages: Mutex::new(HashMap::new()),
        releases: Mutex::new(Vec::new()),
        engine_free: Mutex::new(if gate {
            (0..PAGES as u32).collect()
        } else {
            Vec::new()
        }),
        lost: Mutex::new(Vec::new()),
    });
    let ops = Arc::new(ops);
    let jobs = (0..threads)
        .map(|thread| {
            let shared = Arc::clone(&shared);
            let ops = Arc::clone(&ops);
            Box::new(move || {
                for op in ops.iter().skip(thread).step_by(threads) {
                    shared.apply(op, thread);
                }
            }) as Job
        })
        .collect();
    run_parallel(jobs);
    // Drain: close and quiesce every lifecycle ever opened (stale ones are refused), fence
    // every rank (ends failed transfers with a peer), quarantine what is still held (failed
    // transfers without a peer), drain the queue.
    let s = &*shared;
    let t = &*s.table;
    let handles = s.handles.lock().unwrap().clone();
    for &h in &handles {
        if let Ok(a) = t.abort(h) {
            s.record(a.released, "final abort");
        }
        for rank in RANKS {
            if let Ok(Quiesced::Released(r)) = t.quiesce(h, rank) {
                s.record(Some(r), "final quiesce");
            }
        }
    }
    for rank in RANKS {
        let fenced = t.fence_rank(rank).expect("a valid rank, few fenced");
        for r in fenced.released {
            s.record(Some(r), "final fence_rank");
        }
    }
    for &h in &handles {
        if let Ok(r) = t.quarantine(h) {
            s.record(r, "final quarantine");
        }
    }
    s.drain();
    let releases = s.releases.lock().unwrap().clone();
    let lost = s.lost.lock().unwrap().len();
    let stats = t.stats();
    assert_eq!(stats.rooms.free, ROOMS, "rooms leaked: {stats:?}");
    assert_eq!(t.queued_releases(), 0, "queue not empty: {stats:?}");
    assert_eq!(
        stats.quarantined_pages, lost as u64,
        "quarantined pages: {stats:?}"
    );
    if gate {
        assert_eq!(
            s.engine_free.lock().unwrap().len() + lost,
            PAGES,
            "engine pages leaked: {stats:?}"
        );
    } else {
        assert_eq!(stats.pages.free + lost, PAGES, "pages leaked: {stats:?}");
    }
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
