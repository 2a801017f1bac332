//! Regressions of the second hostile review (issue 18): each test here failed on f69b486.
//! Items 1 and 2 (the fenced set, quarantine vs the last drop) have their real-thread
//! races in `scanner_races.rs`, models in `loom-tests/` and `shuttle-tests/`; item 7 is
//! in `no_alloc.rs`; item 8 in `python/tests/`.

use kvfence::{Config, Error, Outcome, Phase, Quiesced, Reason, RoomHandle, RoomTable};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Item 3: `room_status.transfers` was `holds - pending mask words`, two values read at
/// different moments, and `quiesce` clears the writer bit before it drops the mask word's
/// hold: a room that never began a transfer could report `transfers: 1`. One thread runs
/// lifecycles that never transfer (open, the writer ACKs, finish); another reads their
/// status. Prints how often a read landed after the ACK's bit was cleared (the window's
/// side of the race) and fails if never.
#[test]
fn status_never_reports_a_transfer_that_never_existed() {
    let table = Arc::new(RoomTable::new(Config::gate(4)).unwrap());
    let current: Arc<Mutex<Option<RoomHandle>>> = Arc::new(Mutex::new(None));
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_secs(3);
    let lifecycles = {
        let (table, current, stop) = (table.clone(), current.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let h = table.open_gate(&[7], n, vec![1]).unwrap();
                *current.lock().unwrap() = Some(h);
                for _ in 0..50 {
                    std::hint::spin_loop();
                }
                assert_eq!(table.quiesce(h, 7).unwrap(), Quiesced::Recorded);
                for _ in 0..50 {
                    std::hint::spin_loop();
                }
                assert!(table.finish(h).unwrap().is_some());
                n += 1;
            }
            n
        })
    };
    let (mut reads, mut after_ack, mut wrong) = (0u64, 0u64, 0u64);
    while Instant::now() < deadline {
        let Some(h) = *current.lock().unwrap() else {
            continue;
        };
        for _ in 0..64 {
            let Ok(s) = table.room_status(h) else { break };
            reads += 1;
            if s.transfers != 0 {
                wrong += 1;
            }
            if s.phase == Phase::Owned && s.waiting_on.is_empty() {
                after_ack += 1;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let n = lifecycles.join().unwrap();
    println!(
        "status race: {reads} reads over {n} lifecycles, {after_ack} after the ACK, {wrong} wrong"
    );
    assert_eq!(
        wrong, 0,
        "room_status reported transfers on a room that never began one"
    );
    assert!(after_ack > 0, "the window was never reached");
}

/// Item 3: a status is one snapshot: with transfers running, what it reports is always
/// a state the room was in (transfers within what is running, writers a suffix of the
/// ACK order).
#[test]
fn status_is_a_snapshot_while_transfers_run() {
    let table = Arc::new(RoomTable::new(Config::gate(2)).unwrap());
    let h = table.open_gate(&[1, 2], 0, vec![5]).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (table, stop) = (table.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let t = table.begin_transfer_to(h, 1).unwrap();
                    std::hint::spin_loop();
                    assert!(t.complete().is_none());
                }
            })
        })
        .collect();
    let mut seen = [0u64; 3];
    for i in 0..200_000 {
        if i == 100_000 {
            assert_eq!(table.quiesce(h, 1).unwrap(), Quiesced::Recorded);
        }
        let s = table.room_status(h).unwrap();
        assert!(s.transfers <= 2, "{} transfers with 2 workers", s.transfers);
        seen[s.transfers as usize] += 1;
        let expected: &[u32] = if i >= 100_000 { &[2] } else { &[1, 2] };
        assert_eq!(&s.waiting_on[..], expected);
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    println!("transfers seen 0/1/2: {seen:?}");
    assert_eq!(table.room_status(h).unwrap().transfers, 0);
}

/// Item 4: `u32::MAX` is no rank id; `fence_rank` refuses it, so a failed transfer to it
/// could only end by quarantine. Every way a rank enters refuses it now.
#[test]
fn u32_max_is_refused_as_a_transfer_peer() {
    let table = Arc::new(RoomTable::new(Config::gate(4)).unwrap());
    let h = table.open_gate(&[], 1, vec![1]).unwrap();
    let bad = Error::InvalidRank { rank: u32::MAX };
    assert_eq!(table.begin_transfer_to(h, u32::MAX).err(), Some(bad));
    assert_eq!(
        RoomTable::begin_transfer_owned(&table, h, Some(u32::MAX)).err(),
        Some(bad)
    );
    assert_eq!(table.begin(h, Some(u32::MAX)).err(), Some(bad));
    assert_eq!(table.fence_rank(u32::MAX).err(), Some(bad));
    // Nothing was taken by the refusals.
    assert_eq!(table.room_status(h).unwrap().transfers, 0);
    assert!(table.finish(h).unwrap().is_some());
}

/// Item 5: a quarantined room reported `closing_for == 0` forever (quarantine skipped the
/// closing stamp). Now quarantining a live room closes it, and its overdue time counts.
#[test]
fn a_quarantined_room_counts_its_closing_time() {
    let table = RoomTable::new(Config::gate(4)).unwrap();
    let h = table.open_gate(&[3], 1, vec![1, 2]).unwrap();
    // A transfer still in flight holds it past the quarantine.
    let t = table.begin_transfer_to(h, 3).unwrap();
    assert!(
        table.quarantine(h).unwrap().is_none(),
        "the transfer holds it"
    );
    std::thread::sleep(Duration::from_millis(30));
    let s = table.room_status(h).unwrap();
    assert!(s.quarantined);
    assert_eq!(s.phase, Phase::Aborting);
    assert!(
        s.closing_for >= Duration::from_millis(30),
        "{:?}",
        s.closing_for
    );
    let stats = table.stats();
    assert!(stats.closing[0].closing_for >= Duration::from_millis(30));
    // A room aborted first keeps its abort time through a later quarantine.
    let g = table.open_gate(&[4], 2, vec![3]).unwrap();
    let _ = table.abort(g).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let before = table.room_status(g).unwrap().closing_for;
    let r = table.quarantine(g).unwrap().expect("nothing else holds it");
    assert_eq!(r.reason, Reason::Quarantined);
    assert!(before >= Duration::from_millis(20));
    let r = t.complete().expect("the last hold");
    assert_eq!(r.reason, Reason::Quarantined);
}

/// Item 9: with the release queue on, `wait_released(h)` returned only after someone had
/// drained the release, so the natural scheduler loop (wait for the room, then drain) on
/// one thread never woke. A wait now ends once the release is decided.
#[test]
fn wait_then_drain_on_one_thread() {
    let table = Arc::new(RoomTable::new(Config::gate(4).release_queue(true)).unwrap());
    // Released by the last ACK, on another thread.
    let h = table.open_gate(&[0, 1], 7, vec![10, 11]).unwrap();
    let _ = table.abort(h).unwrap();
    let acks = {
        let table = table.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            let _ = table.quiesce(h, 0).unwrap();
            assert_eq!(table.quiesce(h, 1).unwrap(), Quiesced::Queued);
        })
    };
    assert!(table
        .wait_released_timeout(h, Duration::from_secs(5))
        .unwrap());
    let mut out = Vec::new();
    assert_eq!(table.drain_released(&mut out), 1);
    assert_eq!((out[0].token, out[0].reason), (7, Reason::Aborted));
    acks.join().unwrap();
    // Released by a fence (the case the review saw), waited for without a timeout.
    let g = table.open_gate(&[5], 8, vec![12]).unwrap();
    let _ = table.abort(g).unwrap();
    let fence = {
        let table = table.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!(table.fence_rank(5).unwrap().queued, 1);
        })
    };
    table.wait_released(g).unwrap();
    out.clear();
    assert_eq!(table.drain_released(&mut out), 1);
    assert_eq!(out[0].token, 8);
    fence.join().unwrap();
    // And the shutdown drain: wait until idle, then drain.
    let k = table.open_gate(&[6], 9, vec![13]).unwrap();
    let _ = table.finish(k).unwrap();
    let t2 = {
        let table = table.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            let _ = table.quiesce(k, 6).unwrap();
        })
    };
    assert!(table.wait_idle_timeout(Duration::from_secs(5)));
    out.clear();
    assert_eq!(table.drain_released(&mut out), 1);
    t2.join().unwrap();
    assert_eq!(table.stats().rooms.free, 4);
}

/// Item 9, direct delivery: a wait that ends means the pages are back.
#[test]
fn wait_with_direct_delivery_means_the_pages_are_back() {
    let table = Arc::new(RoomTable::new(Config::pool(2, 8)).unwrap());
    let room = table.open(&[0], 8).unwrap();
    let _ = table.abort(room.handle).unwrap();
    let t = {
        let table = table.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(10));
            match table.quiesce(room.handle, 0).unwrap() {
                Quiesced::Released(r) => r.pages.len(),
                other => panic!("{other:?}"),
            }
        })
    };
    table.wait_released(room.handle).unwrap();
    assert_eq!(table.stats().pages.free, 8);
    assert_eq!(t.join().unwrap(), 8);
}

/// Item 6: the drain takes every queued release in one pass, and `drain_released_max`
/// stops at its limit, leaving the rest queued (none lost, none twice).
#[test]
fn drain_in_one_pass_and_bounded_drains_lose_nothing() {
    let rooms = 1 << 12;
    let table = RoomTable::new(Config::gate(rooms).release_queue(true)).unwrap();
    let handles: Vec<_> = (0..rooms)
        .map(|i| table.open_gate(&[], i as u64, vec![i as u32]).unwrap())
        .collect();
    // Release the top 300 and a scattered 100 of the rest.
    let mut expect: Vec<u64> = Vec::new();
    for (i, &h) in handles.iter().enumerate() {
        if i >= rooms - 300 || i % 37 == 0 {
            assert!(table.finish(h).unwrap().is_none());
            expect.push(i as u64);
        }
    }
    let mut got = Vec::new();
    let mut out = Vec::new();
    let mut calls = 0;
    loop {
        out.clear();
        let n = table.drain_released_max(&mut out, 7);
        assert_eq!(n, out.len());
        assert!(n <= 7);
        if n == 0 {
            break;
        }
        calls += 1;
        got.extend(out.iter().map(|r| r.token));
    }
    got.sort_unstable();
    assert_eq!(got, expect);
    assert_eq!(calls, expect.len().div_ceil(7));
    assert_eq!(table.queued_releases(), 0);
    assert_eq!(table.drain_released(&mut out), 0);
}

/// Item 6 with concurrent drainers: every release delivered exactly once.
#[test]
fn concurrent_one_pass_drains_deliver_each_release_once() {
    let rooms = 1 << 10;
    let table = Arc::new(RoomTable::new(Config::gate(rooms).release_queue(true)).unwrap());
    let delivered = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let drainers: Vec<_> = (0..2)
        .map(|_| {
            let (table, delivered, stop) = (table.clone(), delivered.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut tokens = Vec::new();
                let mut out = Vec::new();
                while !stop.load(Ordering::Relaxed) || table.queued_releases() > 0 {
                    out.clear();
                    table.drain_released_max(&mut out, 5);
                    delivered.fetch_add(out.len() as u64, Ordering::Relaxed);
                    tokens.extend(out.iter().map(|r| r.token));
                }
                tokens
            })
        })
        .collect();
    let total = 20_000u64;
    for i in 0..total {
        let h = loop {
            match table.open_gate(&[], i, vec![1]) {
                Ok(h) => break h,
                Err(Error::RoomTableFull) => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        };
        let t = table.begin_transfer(h).unwrap();
        assert!(table.finish(h).unwrap().is_none());
        assert!(t.complete().is_none());
    }
    stop.store(true, Ordering::Relaxed);
    let mut all: Vec<u64> = drainers
        .into_iter()
        .flat_map(|d| d.join().unwrap())
        .collect();
    all.sort_unstable();
    assert_eq!(all, (0..total).collect::<Vec<_>>());
    assert_eq!(delivered.load(Ordering::Relaxed), total);
    let _ = Outcome::Completed;
}
