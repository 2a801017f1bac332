//! The protocol through the public API: one test per guarantee of docs/DESIGN.md section 2,
//! every bad input, and every capability of the integration API (issue 10): gate and pool
//! modes, growing rooms, owned guards, integer tokens, failed transfers, the release queue,
//! quarantine, abort while draining, wide rank ids, room status.

use kvfence::{
    Config, Error, Fenced, Outcome, Phase, Quiesced, Reason, Released, RoomHandle, RoomTable,
    TransferToken, MAX_PAGES, MAX_ROOMS, MAX_WRITERS,
};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a stress loop may go without progress before it fails (instead of hanging).
const STALL: Duration = Duration::from_secs(20);

/// A pool-mode table: kvfence owns `pages` pages.
fn pool(rooms: usize, pages: usize) -> RoomTable {
    RoomTable::new(Config::pool(rooms, pages)).expect("valid config")
}

/// A gate-mode table: the engine owns its pages; releases returned directly.
fn gate(rooms: usize) -> RoomTable {
    RoomTable::new(Config::gate(rooms)).expect("valid config")
}

/// A gate-mode table whose releases all go through the release queue.
fn gate_queue(rooms: usize) -> RoomTable {
    RoomTable::new(Config::gate(rooms).release_queue(true)).expect("valid config")
}

/// Tiny deterministic RNG (xorshift64*), so failures replay.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

/// Runs its closure when dropped, also while unwinding (so a panicking thread still tells
/// its peers to stop, and a failing test fails instead of hanging).
struct OnDrop<F: FnMut()>(F);
impl<F: FnMut()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

fn released(q: Result<Quiesced, Error>) -> Released {
    match q {
        Ok(Quiesced::Released(r)) => r,
        other => panic!("expected a release, got {other:?}"),
    }
}

fn drain(t: &RoomTable) -> Vec<Released> {
    let mut out = Vec::new();
    t.drain_released(&mut out);
    out
}

fn sorted(mut v: Vec<u32>) -> Vec<u32> {
    v.sort_unstable();
    v
}

/// 64 distinct rank ids spread over the whole `u32` range, `u32::MAX - 1` first.
fn wide_ranks() -> Vec<u32> {
    (0..64u32).map(|i| u32::MAX - 1 - i * 0x0400_0000).collect()
}

// ---------------------------------------------------------------------------------------
// The guarantees (ported from the RankSet API)
// ---------------------------------------------------------------------------------------

#[test]
fn release_waits_for_every_writer_and_every_transfer() {
    let t = pool(4, 32);
    let room = t.open(&[0, 1, 2], 8).unwrap();
    let h = room.handle;
    let a = t.begin_transfer(h).unwrap();
    let b = t.begin_transfer(h).unwrap();
    let aborted = t.abort(h).unwrap();
    assert_eq!(&aborted.fanout[..], &[0, 1, 2]);
    assert_eq!(aborted.released, None);
    assert_eq!(t.quiesce(h, 0).unwrap(), Quiesced::Recorded);
    assert_eq!(a.complete(), None);
    assert_eq!(t.quiesce(h, 2).unwrap(), Quiesced::Recorded);
    assert_eq!(
        t.quiesce(h, 1).unwrap(),
        Quiesced::Recorded,
        "a transfer is still in flight"
    );
    assert_eq!(t.phase(h).unwrap(), Phase::Aborting);
    assert_eq!(t.stats().pages.held, 8);
    let r = b.complete().expect("the last hold releases");
    assert_eq!(
        (r.handle, &r.pages, r.reason, r.token),
        (h, &room.pages, Reason::Aborted, 0)
    );
    assert_eq!(t.phase(h).unwrap(), Phase::Free);
    let s = t.stats();
    assert_eq!((s.pages.free, s.rooms.free, s.releases), (32, 4, 1));
}

#[test]
fn the_last_writer_ack_releases_after_transfers_are_done() {
    let t = pool(2, 8);
    let room = t.open(&[0, 1], 2).unwrap();
    let h = room.handle;
    assert_eq!(t.begin_transfer(h).unwrap().complete(), None);
    let _ = t.abort(h).unwrap();
    assert_eq!(t.quiesce(h, 1).unwrap(), Quiesced::Recorded);
    let r = released(t.quiesce(h, 0));
    assert_eq!(r.pages, room.pages);
}

#[test]
fn duplicate_ack_counts_once() {
    let t = pool(2, 8);
    let h = t.open(&[0, 1], 2).unwrap().handle;
    let _ = t.abort(h).unwrap();
    assert_eq!(t.quiesce(h, 0).unwrap(), Quiesced::Recorded);
    for _ in 0..5 {
        assert_eq!(t.quiesce(h, 0).unwrap(), Quiesced::Duplicate);
    }
    assert_eq!(
        t.phase(h).unwrap(),
        Phase::Aborting,
        "duplicates must not stand in for rank 1"
    );
    assert_eq!(t.stats().duplicate_acks, 5);
    released(t.quiesce(h, 1));
}

#[test]
fn late_ack_of_an_earlier_lifecycle_does_not_touch_the_reused_room() {
    // One room, so the new request must reuse the same index.
    let t = pool(1, 4);
    let old = t.open(&[0, 1], 2).unwrap().handle;
    let _ = t.abort(old).unwrap();
    let _ = t.quiesce(old, 0).unwrap();
    released(t.quiesce(old, 1));
    let new = t.open(&[0, 1], 2).unwrap().handle;
    assert_eq!(new.index(), old.index());
    assert_ne!(new.generation(), old.generation());
    // Late and duplicate ACKs of the old request arrive now.
    assert_eq!(t.quiesce(old, 0), Err(Error::StaleHandle));
    assert_eq!(t.quiesce(old, 1), Err(Error::StaleHandle));
    assert_eq!(t.abort(old), Err(Error::StaleHandle));
    assert_eq!(t.finish(old), Err(Error::StaleHandle));
    // The new room still waits on both of its ranks.
    let aborted = t.abort(new).unwrap();
    assert_eq!(&aborted.fanout[..], &[0, 1]);
    assert_eq!(t.quiesce(new, 0).unwrap(), Quiesced::Recorded);
    released(t.quiesce(new, 1));
    assert_eq!(t.stats().stale_refused, 4);
}

#[test]
fn stale_queued_intent_is_refused_after_abort_and_after_reuse() {
    let t = pool(1, 4);
    let h = t.open(&[], 2).unwrap().handle;
    let wire = h.to_wire(); // the queued intent carries this
    let _ = t.abort(h).unwrap(); // nothing in flight: released at once
    let intent = RoomHandle::from_wire(wire);
    assert_eq!(t.begin_transfer(intent).err(), Some(Error::StaleHandle));
    assert_eq!(t.begin(intent, None).err(), Some(Error::StaleHandle));
    let reused = t.open(&[], 2).unwrap().handle;
    assert_eq!(reused.index(), h.index());
    assert_eq!(t.begin_transfer(intent).err(), Some(Error::StaleHandle));
    assert_eq!(
        t.begin_transfer_to(intent, 0).err(),
        Some(Error::StaleHandle)
    );
    // And while the room is merely aborting (something still in flight):
    let g = t.begin_transfer(reused).unwrap();
    let _ = t.abort(reused).unwrap();
    assert_eq!(
        t.begin_transfer(reused).err(),
        Some(Error::RoomClosed {
            phase: Phase::Aborting
        })
    );
    assert_eq!(
        t.begin(reused, Some(0)).err(),
        Some(Error::RoomClosed {
            phase: Phase::Aborting
        })
    );
    assert!(g.complete().is_some());
}

#[test]
fn fanout_of_64_ranks_releases_exactly_at_the_last_ack_in_any_order() {
    let t = pool(2, 64);
    let ids = wide_ranks();
    let mut rng = Rng(0x5eed);
    let mut orders: Vec<Vec<usize>> = vec![(0..64).collect(), (0..64).rev().collect()];
    // Interleave the two halves (the two mask words), odd positions first, then random
    // permutations.
    orders.push((0..32).flat_map(|i| [i, 63 - i]).collect());
    orders.push(
        (0..64)
            .filter(|r| r % 2 == 1)
            .chain((0..64).filter(|r| r % 2 == 0))
            .collect(),
    );
    let random = if cfg!(miri) { 4 } else { 500 };
    for _ in 0..random {
        let mut o: Vec<usize> = (0..64).collect();
        rng.shuffle(&mut o);
        orders.push(o);
    }
    for (n, order) in orders.iter().enumerate() {
        let h = t.open(&ids, 4).unwrap().handle;
        // Half the runs: abort first, then ACKs. Other half: ACKs as "done" before finish.
        let abort_first = n % 2 == 0;
        if abort_first {
            assert_eq!(&t.abort(h).unwrap().fanout[..], &ids[..]);
        }
        for (i, &pos) in order.iter().enumerate() {
            let q = t.quiesce(h, ids[pos]).unwrap();
            if i + 1 < order.len() || !abort_first {
                assert_eq!(
                    q,
                    Quiesced::Recorded,
                    "order {n}: released early at ack {i}"
                );
            } else {
                assert_eq!(released(Ok(q)).handle, h);
            }
            // A duplicate somewhere in the middle changes nothing.
            if i == 31 {
                assert_eq!(
                    t.quiesce(h, ids[order[rng.below(32)]]).unwrap(),
                    Quiesced::Duplicate
                );
            }
        }
        if !abort_first {
            assert!(
                t.finish(h).unwrap().is_some(),
                "finish with nothing pending releases"
            );
        }
    }
    assert_eq!(t.stats().releases, orders.len() as u64);
    assert_eq!(t.stats().pages.free, 64);
}

#[test]
fn prefill_source_pages_are_held_until_in_flight_transfers_complete() {
    // Prefill side, push model: source pages, no writer ranks, one guard per chunk write.
    let t = pool(4, 16);
    let room = t.open(&[], 4).unwrap();
    let chunks: Vec<_> = (0..3)
        .map(|_| t.begin_transfer(room.handle).unwrap())
        .collect();
    for c in &chunks {
        assert_eq!(c.handle(), room.handle);
    }
    let aborted = t.abort(room.handle).unwrap();
    assert!(aborted.fanout.is_empty() && aborted.released.is_none());
    // A queued chunk that was not submitted yet is refused.
    assert!(t.begin_transfer(room.handle).is_err());
    // The pages are not reusable: a request needing all free pages + these cannot fit.
    assert_eq!(
        t.open(&[], 16).err(),
        Some(Error::PoolExhausted { requested: 16 })
    );
    let mut chunks = chunks.into_iter();
    assert!(chunks.next().unwrap().complete().is_none());
    assert!(chunks.next().unwrap().complete().is_none());
    assert_eq!(t.stats().pages.held, 4);
    let r = chunks
        .next()
        .unwrap()
        .complete()
        .expect("released: send ABORT_ACK now");
    assert_eq!((r.reason, &r.pages), (Reason::Aborted, &room.pages));
    assert!(t.open(&[], 16).is_ok());
}

#[test]
fn fence_rank_releases_rooms_waiting_only_on_that_rank_and_nothing_else() {
    let t = pool(8, 64);
    let only_dead = t.open(&[3], 2).unwrap().handle;
    let dead_and_live = t.open(&[1, 3], 2).unwrap().handle;
    let dead_and_transfer = t.open(&[3], 2).unwrap().handle;
    let live_only = t.open(&[1], 2).unwrap().handle;
    let owned = t.open(&[3], 2).unwrap().handle;
    let guard = t.begin_transfer(dead_and_transfer).unwrap();
    for h in [only_dead, dead_and_live, dead_and_transfer, live_only] {
        let _ = t.abort(h).unwrap();
    }
    let fenced = t.fence_rank(3).unwrap();
    assert_eq!(fenced.quiesced, 4); // only_dead, dead_and_live, dead_and_transfer, owned
    assert_eq!(fenced.failed_ended, 0);
    assert_eq!(fenced.released.len(), 1);
    assert_eq!(fenced.released[0].handle, only_dead);
    assert_eq!(t.phase(dead_and_live).unwrap(), Phase::Aborting);
    assert_eq!(t.phase(dead_and_transfer).unwrap(), Phase::Aborting);
    assert_eq!(t.phase(live_only).unwrap(), Phase::Aborting);
    assert_eq!(t.phase(owned).unwrap(), Phase::Owned);
    // The fenced rank is gone from every room; a second fence finds nothing.
    assert_eq!(t.fence_rank(3).unwrap(), Fenced::default());
    // Its late ACK is a harmless duplicate.
    assert_eq!(t.quiesce(dead_and_live, 3).unwrap(), Quiesced::Duplicate);
    assert!(guard.complete().is_some());
    released(t.quiesce(dead_and_live, 1));
    released(t.quiesce(live_only, 1));
    // Until re-admitted, no room may name it.
    assert_eq!(
        t.open(&[0, 1, 2, 3], 1).err(),
        Some(Error::RankFenced { rank: 3 })
    );
    assert_eq!(t.stats().fenced, vec![3]);
    assert!(t.readmit_rank(3).unwrap());
    assert!(!t.readmit_rank(3).unwrap());
    assert!(t.stats().fenced.is_empty());
    assert!(t.open(&[0, 1, 2, 3], 1).is_ok());
}

#[test]
fn abort_with_nothing_in_flight_releases_at_once() {
    let t = pool(2, 8);
    let room = t.open(&[], 3).unwrap();
    let h = room.handle;
    let aborted = t.abort(h).unwrap();
    assert!(aborted.fanout.is_empty());
    let r = aborted.released.expect("released by abort");
    assert_eq!(
        (r.handle, &r.pages, r.reason),
        (h, &room.pages, Reason::Aborted)
    );
    // Writers that all reported done before the abort: the same.
    let h = t.open(&[0, 1], 3).unwrap().handle;
    let _ = t.quiesce(h, 0).unwrap();
    let _ = t.quiesce(h, 1).unwrap();
    let aborted = t.abort(h).unwrap();
    assert!(aborted.fanout.is_empty());
    assert!(aborted.released.is_some());
}

#[test]
fn finish_drains_then_releases() {
    let t = pool(2, 8);
    let h = t.open(&[0], 2).unwrap().handle;
    let g = t.begin_transfer(h).unwrap();
    assert_eq!(t.finish(h).unwrap(), None);
    assert_eq!(t.phase(h).unwrap(), Phase::Draining);
    assert_eq!(
        t.begin_transfer(h).err(),
        Some(Error::RoomClosed {
            phase: Phase::Draining
        })
    );
    assert_eq!(t.quiesce(h, 0).unwrap(), Quiesced::Recorded);
    assert_eq!(g.complete().unwrap().reason, Reason::Finished);
}

/// Replaces the old `take_orphaned` test: a guard dropped without an outcome (here while
/// unwinding) is a FAILED transfer. The room stays held after every ACK, until the
/// transfer's peer is fenced; the fence then performs (and returns) the release.
#[test]
fn a_dropped_guard_is_a_failed_transfer_held_until_its_peer_is_fenced() {
    let t = pool(2, 8);
    let room = t.open(&[0], 2).unwrap();
    let h = room.handle;
    let g = t.begin_transfer_to(h, 5).unwrap();
    let _ = t.abort(h).unwrap();
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _g = g;
        panic!("transfer failed");
    }));
    assert!(unwound.is_err());
    assert_eq!(t.quiesce(h, 0).unwrap(), Quiesced::Recorded);
    assert_eq!(
        t.phase(h).unwrap(),
        Phase::Aborting,
        "a dropped guard is not drained"
    );
    let s = t.stats();
    assert_eq!((s.failed_transfers, s.pages.held, s.pages.free), (1, 2, 6));
    assert_eq!(t.room_status(h).unwrap().failed, 1);
    assert_eq!(t.queued_releases(), 0);
    assert!(t.pop_released().is_none());
    // Fencing another rank changes nothing; fencing the peer ends it.
    assert_eq!(t.fence_rank(6).unwrap(), Fenced::default());
    assert_eq!(t.phase(h).unwrap(), Phase::Aborting);
    let fenced = t.fence_rank(5).unwrap();
    assert_eq!(fenced.failed_ended, 1);
    assert_eq!(fenced.released.len(), 1);
    assert_eq!(
        (fenced.released[0].handle, &fenced.released[0].pages),
        (h, &room.pages)
    );
    assert!(t.pop_released().is_none(), "reported exactly once");
    assert_eq!(t.stats().pages.free, 8);
}

/// A guard dropped on a room whose peer is fenced already (or that is quarantined) drops
/// its hold at once; that release has no caller to go to, so it is queued, even on a table
/// without a release queue, and delivered exactly once.
#[test]
fn a_release_caused_by_a_dropped_guard_goes_to_the_release_queue() {
    let t = pool(2, 8);
    let room = t.open(&[], 2).unwrap();
    let h = room.handle;
    let g = t.begin_transfer_to(h, 5).unwrap();
    let _ = t.abort(h).unwrap();
    assert_eq!(t.fence_rank(5).unwrap().failed_ended, 0);
    drop(g);
    assert_eq!(t.phase(h).unwrap(), Phase::Free);
    assert_eq!(t.queued_releases(), 1);
    let s = t.stats();
    assert_eq!((s.rooms.queued, s.pages.queued, s.pages.free), (1, 2, 6));
    // Queued: decided, so a wait for it ends (issue 18 item 9); handed back when drained.
    assert_eq!(
        t.wait_released_timeout(h, Duration::from_millis(10)),
        Ok(true)
    );
    assert_eq!(t.stats().pages.free, 6);
    let r = t.pop_released().expect("queued");
    assert_eq!(
        (r.handle, &r.pages, r.reason),
        (h, &room.pages, Reason::Aborted)
    );
    assert!(t.pop_released().is_none());
    assert_eq!(t.wait_released_timeout(h, Duration::ZERO), Ok(true));
    assert_eq!(t.stats().pages.free, 8);
    assert!(t.readmit_rank(5).unwrap());
}

#[test]
fn failed_opens_leak_nothing() {
    let t = pool(2, 8);
    let _ = t.fence_rank(9).unwrap();
    for bad in [
        t.open(&[u32::MAX], 1).err(),
        t.open(&[1, 1], 1).err(),
        t.open(&[0, 9], 1).err(),
        t.open(&[], 9).err(),
        t.open(&(0..65).collect::<Vec<u32>>(), 1).err(),
    ] {
        assert!(bad.is_some());
    }
    assert_eq!(t.stats().rooms.free, 2);
    assert_eq!(t.stats().pages.free, 8);
    let a = t.open(&[], 6).unwrap().handle;
    assert_eq!(
        t.open(&[], 3).err(),
        Some(Error::PoolExhausted { requested: 3 })
    );
    let b = t.open(&[], 2).unwrap().handle;
    assert_eq!(t.open(&[], 1).err(), Some(Error::RoomTableFull));
    assert_eq!(t.open(&[], 0).err(), Some(Error::RoomTableFull));
    let s = t.stats();
    assert_eq!(
        (s.rooms.free, s.rooms.owned, s.pages.free, s.pages.owned),
        (0, 2, 0, 8)
    );
    let _ = t.abort(a).unwrap();
    let _ = t.finish(b).unwrap();
    let s = t.stats();
    assert_eq!((s.rooms.free, s.pages.free), (2, 8));

    // Gate mode: a refused open holds nothing of the request.
    let g = gate(1);
    let _ = g.fence_rank(9).unwrap();
    assert_eq!(
        g.open_gate(&[9], 1, vec![1]).err(),
        Some(Error::RankFenced { rank: 9 })
    );
    let h = g.open_gate(&[], 1, vec![1, 2]).unwrap();
    assert_eq!(
        g.open_gate(&[], 2, vec![3]).err(),
        Some(Error::RoomTableFull)
    );
    let s = g.stats();
    assert_eq!((s.rooms.owned, s.pages.owned), (1, 2));
    let r = g.finish(h).unwrap().expect("nothing in flight");
    assert_eq!((r.token, r.pages), (1, vec![1, 2]));
    assert_eq!(g.stats().rooms.free, 1);
}

#[test]
fn every_bad_input_is_its_own_error() {
    for bad in [
        Config::pool(0, 1),
        Config::gate(0),
        Config::pool(1, 0),
        Config::pool(1, MAX_PAGES + 1),
        Config::gate(MAX_ROOMS + 1),
        Config::gate(1).max_fenced(0),
        Config::gate(1).max_fenced((1 << 16) + 1),
        Config::gate(1).max_tokens(0),
        Config::gate(1).max_tokens(MAX_ROOMS + 1),
    ] {
        match RoomTable::new(bad) {
            Err(e @ Error::InvalidConfig { reason }) => {
                assert!(!reason.is_empty());
                assert!(e.to_string().contains(reason), "{e}");
            }
            other => panic!("{bad:?}: expected InvalidConfig, got {:?}", other.err()),
        }
    }

    let t = pool(2, 8);
    let other = pool(2, 8);
    assert_eq!(
        t.open(&[], 9).err(),
        Some(Error::TooManyPages {
            requested: 9,
            capacity: 8
        })
    );
    assert_eq!(
        t.open(&[0, u32::MAX], 1).err(),
        Some(Error::InvalidRank { rank: u32::MAX })
    );
    assert_eq!(
        t.open(&[4, 5, 4], 1).err(),
        Some(Error::DuplicateWriter { rank: 4 })
    );
    assert_eq!(
        t.open(&(0..65).collect::<Vec<u32>>(), 1).err(),
        Some(Error::TooManyWriters {
            writers: 65,
            max: MAX_WRITERS
        })
    );

    let h = t.open(&[0, 1], 1).unwrap().handle;
    let foreign = other.open(&[0], 1).unwrap().handle;
    assert_eq!(t.quiesce(foreign, 0), Err(Error::InvalidHandle));
    assert_eq!(t.begin_transfer(foreign).err(), Some(Error::InvalidHandle));
    assert_eq!(
        t.begin_transfer_to(foreign, 0).err(),
        Some(Error::InvalidHandle)
    );
    assert_eq!(t.begin(foreign, None).err(), Some(Error::InvalidHandle));
    assert_eq!(t.grow(foreign, 1).err(), Some(Error::InvalidHandle));
    assert_eq!(t.pages_of(foreign).err(), Some(Error::InvalidHandle));
    assert_eq!(t.quarantine(foreign).err(), Some(Error::InvalidHandle));
    assert_eq!(t.room_status(foreign).err(), Some(Error::InvalidHandle));
    assert_eq!(t.phase(foreign).err(), Some(Error::InvalidHandle));
    // A room index beyond the table, or a generation the room never had: the check of the
    // corrupted value does not match, so neither is ever taken for a room.
    let forged = RoomHandle::from_wire(h.to_wire() | 0xFF_FFFF << 32);
    assert_eq!(t.abort(forged), Err(Error::InvalidHandle));
    let future = RoomHandle::from_wire(h.to_wire() + 1);
    assert_eq!(t.quiesce(future, 0), Err(Error::InvalidHandle));
    assert_eq!(t.quiesce(h, 9), Err(Error::RankNotInRoom { rank: 9 }));
    assert!(matches!(
        t.quiesce(h, u32::MAX),
        Err(Error::RankNotInRoom { .. } | Error::InvalidRank { .. })
    ));
    assert_eq!(
        t.fence_rank(u32::MAX).err(),
        Some(Error::InvalidRank { rank: u32::MAX })
    );
    assert_eq!(
        t.readmit_rank(u32::MAX).err(),
        Some(Error::InvalidRank { rank: u32::MAX })
    );
    assert_eq!(t.wait_released(foreign), Err(Error::InvalidHandle));
    assert_eq!(
        t.wait_released_timeout(foreign, Duration::ZERO),
        Err(Error::InvalidHandle)
    );

    let _ = t.abort(h).unwrap();
    assert_eq!(t.abort(h), Err(Error::AlreadyAborted));
    assert_eq!(t.finish(h), Err(Error::AlreadyAborted));
    let d = t.open(&[0], 1).unwrap().handle;
    assert_eq!(t.finish(d).unwrap(), None);
    assert_eq!(t.finish(d), Err(Error::AlreadyFinished));
    // Abort overtakes a finish (the client left while the room drained)...
    assert_eq!(&t.abort(d).unwrap().fanout[..], &[0]);
    // ...after which both calls say "aborted".
    assert_eq!(t.abort(d), Err(Error::AlreadyAborted));
    assert_eq!(t.finish(d), Err(Error::AlreadyAborted));
    // Once released, every call says "stale".
    let _ = released(t.quiesce(d, 0));
    assert_eq!(t.abort(d), Err(Error::StaleHandle));
    assert_eq!(t.finish(d), Err(Error::StaleHandle));
    assert_eq!(t.quarantine(d).err(), Some(Error::StaleHandle));
    assert_eq!(t.room_status(d).err(), Some(Error::StaleHandle));
    assert_eq!(t.grow(d, 1).err(), Some(Error::StaleHandle));
    assert_eq!(t.pages_of(d).err(), Some(Error::StaleHandle));
}

/// Every variant's message names what went wrong and, where there is one, what to do.
#[test]
fn every_error_message_is_actionable() {
    let cases: Vec<(Error, Vec<&str>)> = vec![
        (
            Error::InvalidConfig {
                reason: "rooms must be",
            },
            vec!["config", "rooms must be"],
        ),
        (
            Error::UnknownRoom {
                index: 77,
                rooms: 4,
            },
            vec!["77", "4 rooms"],
        ),
        (Error::InvalidHandle, vec!["not made by this table"]),
        (Error::StaleHandle, vec!["stale"]),
        (
            Error::RoomClosed {
                phase: Phase::Aborting,
            },
            vec!["aborting", "no new transfer"],
        ),
        (
            Error::RoomClosed {
                phase: Phase::Draining,
            },
            vec!["draining"],
        ),
        (Error::AlreadyAborted, vec!["already aborted"]),
        (Error::AlreadyFinished, vec!["already finished"]),
        (
            Error::InvalidRank { rank: u32::MAX },
            vec!["4294967295", "not a valid rank"],
        ),
        (
            Error::TooManyWriters {
                writers: 65,
                max: 64,
            },
            vec!["65", "at most 64"],
        ),
        (Error::DuplicateWriter { rank: 7 }, vec!["rank 7", "twice"]),
        (
            Error::RankNotInRoom { rank: 9 },
            vec!["rank 9", "not in this room"],
        ),
        (
            Error::RankFenced { rank: 7 },
            vec!["rank 7", "fenced", "re-admit"],
        ),
        (Error::TooManyFenced { max: 2 }, vec!["2 ranks", "re-admit"]),
        (
            Error::WrongMode { table: "gate" },
            vec!["gate-mode", "open_gate"],
        ),
        (
            Error::WrongMode { table: "pool" },
            vec!["pool-mode", "use open "],
        ),
        (Error::TooManyPagesInRoom, vec!["pages"]),
        (Error::InvalidToken, vec!["token", "already ended"]),
        (Error::TooManyTokens, vec!["token", "in flight"]),
        (
            Error::TooManyPages {
                requested: 9,
                capacity: 8,
            },
            vec!["9 pages", "only has 8"],
        ),
        (Error::RoomTableFull, vec!["every room"]),
        (
            Error::PoolExhausted { requested: 3 },
            vec!["3", "nothing was claimed"],
        ),
        (Error::TooManyTransfers, vec!["transfers in flight"]),
        (Error::OutOfMemory { bytes: 12345 }, vec!["12345 bytes"]),
    ];
    for (e, needles) in cases {
        let msg = e.to_string();
        for n in needles {
            assert!(msg.contains(n), "{e:?}: {msg:?} lacks {n:?}");
        }
        let dyn_err: &dyn std::error::Error = &e;
        assert_eq!(dyn_err.to_string(), msg);
    }
}

#[test]
fn forged_wire_values_never_panic() {
    let t = pool(3, 8);
    let h = t.open(&[0, 1], 1).unwrap().handle;
    let tok = t.begin(h, Some(0)).unwrap();
    let mut rng = Rng(42);
    let n = if cfg!(miri) { 50 } else { 20_000 };
    for i in 0..n {
        let random = u128::from(rng.next()) << 64 | u128::from(rng.next());
        let wire = match i % 4 {
            0 => random,
            1 => h.to_wire() ^ (1 << rng.below(128)),
            2 => h.to_wire().wrapping_add(u128::from(rng.next() % 5) << 32),
            _ => random & 0xFFFF_FFFF_0000_0003,
        };
        let f = RoomHandle::from_wire(wire);
        assert_eq!(f.to_wire(), wire);
        assert_eq!(RoomHandle::from_bytes(f.to_bytes()), f);
        if f == h {
            continue;
        }
        assert!(t.begin_transfer(f).is_err());
        assert!(t.begin(f, None).is_err());
        assert!(t.quiesce(f, rng.below(6) as u32).is_err());
        let _ = t.phase(f);
        assert!(t.room_status(f).is_err());
        assert!(t.abort(f).is_err() && t.finish(f).is_err());
        assert!(t.quarantine(f).is_err());
        // Forged tokens: random, a room handle's wire form, a flipped bit of a live token.
        let forged_token = match i % 3 {
            0 => TransferToken::from_wire(random),
            1 => TransferToken::from_wire(wire),
            _ => TransferToken::from_wire(tok.to_wire() ^ (1 << rng.below(128))),
        };
        if forged_token != tok {
            assert_eq!(
                t.end(forged_token, Outcome::Completed),
                Err(Error::InvalidToken)
            );
        }
    }
    assert_eq!(
        t.phase(h).unwrap(),
        Phase::Owned,
        "forgeries changed nothing"
    );
    assert_eq!(
        t.room_status(h).unwrap().transfers,
        1,
        "the live token survived"
    );
    assert_eq!(t.end(tok, Outcome::Completed), Ok(None));
}

#[test]
fn wait_released_and_wait_idle_wake_up() {
    let t = pool(4, 16);
    let a = t.open(&[0], 2).unwrap().handle;
    let b = t.open(&[], 2).unwrap().handle;
    let g = t.begin_transfer(b).unwrap();
    let _ = t.abort(a).unwrap();
    let _ = t.finish(b).unwrap();
    assert_eq!(
        t.wait_released_timeout(a, Duration::from_millis(5)),
        Ok(false)
    );
    assert!(!t.wait_idle_timeout(Duration::from_millis(5)));
    std::thread::scope(|s| {
        let waiter = s.spawn(|| t.wait_released(a));
        let idle = s.spawn(|| t.wait_idle());
        std::thread::sleep(Duration::from_millis(20));
        assert!(!waiter.is_finished() && !idle.is_finished());
        let _ = t.quiesce(a, 0).unwrap();
        waiter.join().unwrap().unwrap();
        assert!(g.complete().is_some());
        idle.join().unwrap();
    });
    assert_eq!(t.wait_released_timeout(a, Duration::ZERO), Ok(true));
    assert!(t.wait_idle_timeout(Duration::ZERO));
    assert_eq!(t.stats().rooms.free, 4);
}

#[test]
fn closing_rooms_are_reported_with_what_they_wait_on() {
    let t = pool(4, 16);
    let h = t.open(&[0, 1, 2, 3], 3).unwrap().handle;
    let g = t.begin_transfer(h).unwrap();
    // A guard dropped without an outcome is failed: it still holds the room.
    drop(t.begin_transfer_to(h, 1).unwrap());
    let _ = t.abort(h).unwrap();
    let _ = t.quiesce(h, 2).unwrap();
    let s = t.stats();
    assert_eq!(s.closing.len(), 1);
    let c = &s.closing[0];
    assert_eq!(
        (
            c.handle,
            c.phase,
            c.transfers,
            c.failed,
            c.pages,
            c.quarantined
        ),
        (h, Phase::Aborting, 2, 1, 3, false)
    );
    assert_eq!(&c.waiting_on[..], &[0, 1, 3]);
    assert_eq!((s.rooms.held, s.pages.held), (1, 3));
    assert!(g.complete().is_none());
    let c = &t.stats().closing[0];
    assert_eq!((c.transfers, c.failed), (1, 1));
}

/// `wait_released` on a lifecycle that never began (forged generations, including the
/// half-range edge 2^31 ahead) returns at once instead of sleeping forever (the forged
/// value's check fails); on one that is over it returns once the pages are back.
/// (Regression: found by the property test.)
#[test]
fn wait_released_never_blocks_on_a_lifecycle_that_never_began() {
    let t = Arc::new(pool(2, 8));
    let old = t.open(&[], 1).unwrap().handle;
    let _ = t.abort(old).unwrap();
    let live = t.open(&[], 1).unwrap().handle;
    let (tx, rx) = std::sync::mpsc::channel();
    let t2 = t.clone();
    std::thread::spawn(move || {
        for ahead in [1u32, 2, 1 << 31, (1 << 31) - 1, (1 << 31) + 1, u32::MAX] {
            let gen = old.generation().wrapping_add(ahead);
            let forged = RoomHandle::from_wire(old.to_wire() & !0xFFFF_FFFF | u128::from(gen));
            assert_eq!(t2.wait_released(forged), Err(Error::InvalidHandle));
        }
        t2.wait_released(old).unwrap();
        tx.send(()).unwrap();
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("wait_released blocked on a lifecycle that never began");
    assert_eq!(t.phase(live).unwrap(), Phase::Owned);
}

// ---------------------------------------------------------------------------------------
// Stress: both modes
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// kvfence owns the pages; releases returned directly by the call that performs them.
    Pool,
    /// The engine owns the pages (a free list here); every release goes through the queue,
    /// drained by one scheduler thread that gives the pages back to the engine.
    GateQueue,
}

/// Real threads, dozens of rooms, random aborts, finishes, ACK orders, duplicates, late
/// ACKs, growing rooms, failed transfers (to a flaky peer fenced from time to time) and
/// quarantines. Each page remembers the lifecycle that last marked it: a page still marked
/// by a live transfer when another lifecycle claims it (released too early) is caught.
/// Every release is reported exactly once, with exactly the pages the lifecycle was given;
/// at the end every page and room is free, except quarantined pages, which are never
/// handed out again.
fn stress(mode: Mode) {
    const THREADS: usize = 4;
    const ROOMS: usize = 64;
    // Few pages for the demand, so that freed pages are claimed again soon.
    const PAGES: usize = 128;
    /// The peer of every transfer that may fail; no room names it as a writer.
    const FLAKY: u32 = 1_000_000;
    /// Pages the test may quarantine in all (so that the pool never runs dry).
    const QUARANTINE_BUDGET: usize = 16;
    let lifecycles = if cfg!(miri) { 20 } else { 4000 };
    let t = match mode {
        Mode::Pool => RoomTable::new(Config::pool(ROOMS, PAGES)),
        Mode::GateQueue => RoomTable::new(Config::gate(ROOMS).release_queue(true)),
    }
    .unwrap();
    // Gate mode: the engine's own page allocator.
    let engine_free: Mutex<Vec<u32>> = Mutex::new((0..PAGES as u32).collect());
    let owner: Vec<AtomicU64> = (0..PAGES).map(|_| AtomicU64::new(u64::MAX)).collect();
    // Lifecycle (handle wire) -> the pages it was given; removed by its release.
    let given: Mutex<HashMap<u128, Vec<u32>>> = Mutex::new(HashMap::new());
    let dead: Mutex<HashSet<u32>> = Mutex::new(HashSet::new());
    let reports = AtomicU64::new(0);
    let opened = AtomicU64::new(0);
    let quarantine_budget = AtomicUsize::new(QUARANTINE_BUDGET);
    let workers_done = AtomicBool::new(false);
    // Rooms handed to "ACK threads": (handle, ranks still to ACK).
    let inbox: Mutex<Vec<(RoomHandle, Vec<u32>)>> = Mutex::new(Vec::new());

    let report = |r: Released| {
        let pages = given
            .lock()
            .unwrap()
            .remove(&r.handle.to_wire())
            .unwrap_or_else(|| panic!("{:?} released twice (or never opened)", r.handle));
        assert_eq!(sorted(r.pages.clone()), sorted(pages), "{:?}", r.handle);
        reports.fetch_add(1, Ordering::Relaxed);
        if r.reason == Reason::Quarantined {
            dead.lock().unwrap().extend(r.pages.iter().copied());
        } else if mode == Mode::GateQueue {
            engine_free.lock().unwrap().extend(r.pages);
        }
    };
    let report_all = |rs: Vec<Released>| rs.into_iter().for_each(report);
    let report_q = |q: Result<Quiesced, Error>| {
        if let Ok(Quiesced::Released(r)) = q {
            report(r);
        }
    };
    // Ends every failed transfer to the flaky peer, then lets it back in.
    let fence_flaky = |t: &RoomTable| {
        report_all(t.fence_rank(FLAKY).unwrap().released);
        let _ = t.readmit_rank(FLAKY).unwrap();
    };
    // Claims `n` pages for a new or growing room.
    let claim = |n: usize| -> Option<Vec<u32>> {
        let mut free = engine_free.lock().unwrap();
        if free.len() < n {
            return None;
        }
        let at = free.len() - n;
        Some(free.split_off(at))
    };
    let unclaim = |pages: Vec<u32>| engine_free.lock().unwrap().extend(pages);
    let check_fresh = |pages: &[u32]| {
        let dead = dead.lock().unwrap();
        for p in pages {
            assert!(
                !dead.contains(p),
                "quarantined page {p} was handed out again"
            );
        }
    };

    std::thread::scope(|s| {
        let _stop_drainer = OnDrop(|| workers_done.store(true, Ordering::Release));
        let drainer = (mode == Mode::GateQueue).then(|| {
            s.spawn(|| {
                let mut buf = Vec::with_capacity(ROOMS);
                loop {
                    let stop = workers_done.load(Ordering::Acquire);
                    if t.drain_released(&mut buf) == 0 {
                        if stop {
                            break;
                        }
                        std::thread::yield_now();
                    }
                    report_all(std::mem::take(&mut buf));
                }
            })
        });
        let workers: Vec<_> = (0..THREADS)
            .map(|id| {
                let (t, owner, inbox, opened, given) = (&t, &owner, &inbox, &opened, &given);
                let (report, report_q, fence_flaky) = (&report, &report_q, &fence_flaky);
                let (claim, unclaim, check_fresh) = (&claim, &unclaim, &check_fresh);
                let quarantine_budget = &quarantine_budget;
                s.spawn(move || {
                    let mut rng = Rng(0x9E37 + id as u64 * 7919);
                    let mut done = 0;
                    let mut stalled: Option<Instant> = None;
                    while done < lifecycles / THREADS {
                        // Half the time, be an ACK thread for someone else's aborted room.
                        if rng.below(2) == 0 {
                            let job = inbox.lock().unwrap().pop();
                            if let Some((h, mut pending)) = job {
                                rng.shuffle(&mut pending);
                                for &rank in &pending {
                                    report_q(t.quiesce(h, rank));
                                    if rng.below(4) == 0 {
                                        // duplicate, or late after release: never harmful
                                        report_q(t.quiesce(h, rank));
                                    }
                                }
                                continue;
                            }
                        }
                        if rng.below(16) == 0 {
                            fence_flaky(t);
                        }
                        let writers: Vec<u32> =
                            (0..rng.below(9) as u32).map(|i| i * 0x1000_0001).collect();
                        let npages = 1 + rng.below(16);
                        let opened_room = match mode {
                            Mode::Pool => t.open(&writers, npages).map(|o| (o.handle, o.pages)),
                            Mode::GateQueue => match claim(npages) {
                                None => Err(Error::PoolExhausted { requested: npages }),
                                Some(pages) => {
                                    let token = rng.next();
                                    match t.open_gate(&writers, token, pages.clone()) {
                                        Ok(h) => Ok((h, pages)),
                                        Err(e) => {
                                            unclaim(pages);
                                            Err(e)
                                        }
                                    }
                                }
                            },
                        };
                        let (h, mut pages) = match opened_room {
                            Ok(room) => room,
                            Err(Error::PoolExhausted { .. } | Error::RoomTableFull) => {
                                // A lost release would starve us: fail, never hang.
                                let since = *stalled.get_or_insert_with(Instant::now);
                                assert!(
                                    since.elapsed() < STALL,
                                    "no room or page freed in {STALL:?}"
                                );
                                fence_flaky(t);
                                std::thread::yield_now();
                                continue;
                            }
                            Err(e) => panic!("{e}"),
                        };
                        stalled = None;
                        check_fresh(&pages);
                        given.lock().unwrap().insert(h.to_wire(), pages.clone());
                        done += 1;
                        opened.fetch_add(1, Ordering::Relaxed);
                        // Sometimes the room grows (prefill-side chunks) before it closes.
                        if rng.below(4) == 0 {
                            let n = 1 + rng.below(4);
                            let grown = match mode {
                                Mode::Pool => t.grow(h, n).ok(),
                                Mode::GateQueue => {
                                    claim(n).map(|more| match t.grow_gate(h, &more) {
                                        Ok(()) => more,
                                        Err(e) => panic!("grow_gate of a live room: {e}"),
                                    })
                                }
                            };
                            if let Some(more) = grown {
                                check_fresh(&more);
                                pages.extend_from_slice(&more);
                                given
                                    .lock()
                                    .unwrap()
                                    .get_mut(&h.to_wire())
                                    .unwrap()
                                    .extend(more);
                            }
                        }
                        let tag = (h.index() as u64) << 32 | u64::from(h.generation());
                        let guards: Vec<_> = (0..rng.below(3))
                            .map(|_| t.begin_transfer_to(h, FLAKY).unwrap())
                            .collect();
                        // While we hold the room, its pages are ours alone: mark them. If
                        // any other lifecycle still held one (release too early), the CAS
                        // fails.
                        if !guards.is_empty() {
                            for &p in &pages {
                                let cas = owner[p as usize].compare_exchange(
                                    u64::MAX,
                                    tag,
                                    Ordering::Relaxed,
                                    Ordering::Relaxed,
                                );
                                assert!(cas.is_ok(), "page {p} is still held by another room");
                            }
                        }
                        let aborting = rng.below(3) != 0;
                        let mut pending = writers.clone();
                        // Some ranks report done before the close.
                        pending.retain(|&r| {
                            rng.below(3) != 0 || t.quiesce(h, r) != Ok(Quiesced::Recorded)
                        });
                        let closed = if aborting {
                            t.abort(h).map(|a| a.released)
                        } else {
                            t.finish(h)
                        };
                        if let Some(r) = closed.unwrap() {
                            report(r);
                        }
                        // The writes are still in flight: let other threads run while the
                        // marks are held, so that a release that came too early (at the
                        // close) lets another lifecycle claim a marked page.
                        if !guards.is_empty() {
                            for _ in 0..1 + rng.below(4) {
                                std::thread::yield_now();
                            }
                        }
                        // Unmark before the last guard ends (after it, the pages may be
                        // reused).
                        if !guards.is_empty() {
                            for &p in &pages {
                                assert_eq!(
                                    owner[p as usize].swap(u64::MAX, Ordering::Relaxed),
                                    tag
                                );
                            }
                        }
                        let mut failed = false;
                        for g in guards {
                            match rng.below(16) {
                                // Failed: held until the flaky peer is fenced.
                                0 => {
                                    failed = true;
                                    if let Some(r) = g.fail() {
                                        report(r);
                                    }
                                }
                                // No outcome (an early return): failed as well; a release
                                // it causes is queued.
                                1 => {
                                    failed = true;
                                    drop(g);
                                }
                                _ => {
                                    if let Some(r) = g.complete() {
                                        report(r);
                                    }
                                }
                            }
                        }
                        // Rarely, give up on the room instead (its pages are never reused).
                        if (failed || !pending.is_empty()) && rng.below(32) == 0 {
                            let budget = quarantine_budget.load(Ordering::Relaxed);
                            if budget >= pages.len()
                                && quarantine_budget
                                    .compare_exchange(
                                        budget,
                                        budget - pages.len(),
                                        Ordering::Relaxed,
                                        Ordering::Relaxed,
                                    )
                                    .is_ok()
                            {
                                if let Ok(Some(r)) = t.quarantine(h) {
                                    report(r);
                                }
                            }
                        }
                        if !pending.is_empty() {
                            inbox.lock().unwrap().push((h, pending));
                        }
                        // Releases caused by dropped guards (pool mode: the only queued
                        // ones) are drained by whoever comes by.
                        if mode == Mode::Pool && rng.below(8) == 0 {
                            let mut buf = Vec::new();
                            t.drain_released(&mut buf);
                            buf.into_iter().for_each(report);
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        // Drain ACKs left in the inbox, end the failed transfers.
        for (h, pending) in std::mem::take(&mut *inbox.lock().unwrap()) {
            for rank in pending {
                report_q(t.quiesce(h, rank));
            }
        }
        fence_flaky(&t);
        workers_done.store(true, Ordering::Release);
        if let Some(d) = drainer {
            d.join().unwrap();
        }
    });
    report_all(drain(&t));
    let n = reports.load(Ordering::Relaxed);
    assert!(given.lock().unwrap().is_empty(), "a release was lost");
    assert_eq!(n, opened.load(Ordering::Relaxed));
    let s = t.stats();
    let dead = dead.lock().unwrap().len();
    assert_eq!(s.releases, n);
    assert_eq!(s.quarantined_pages as usize, dead);
    // The run exercised what it claims to (failed transfers, quarantines, grown rooms).
    assert!(s.failed_transfers > 0, "no failed transfer was registered");
    assert!(s.quarantined_rooms > 0, "no room was quarantined");
    assert_eq!(t.queued_releases(), 0);
    assert_eq!(
        (s.rooms.free, s.rooms.owned, s.rooms.held, s.rooms.queued),
        (64, 0, 0, 0)
    );
    match mode {
        Mode::Pool => assert_eq!(
            (
                s.pages.free + dead,
                s.pages.owned,
                s.pages.held,
                s.pages.queued
            ),
            (PAGES, 0, 0, 0)
        ),
        Mode::GateQueue => assert_eq!(engine_free.lock().unwrap().len() + dead, PAGES),
    }
}

#[test]
fn stress_pool_conserves_pages_and_reports_every_release_once() {
    stress(Mode::Pool);
}

#[test]
fn stress_gate_with_drained_release_queue_conserves_pages_and_reports_every_release_once() {
    stress(Mode::GateQueue);
}

// ---------------------------------------------------------------------------------------
// New capabilities (issue 10)
// ---------------------------------------------------------------------------------------

/// Gate mode: kvfence allocates nothing; a release hands back the engine's token and page
/// ids, exactly once, however it is performed (ACK, transfer end, abort, finish).
#[test]
fn gate_mode_release_hands_back_token_and_pages_exactly_once() {
    let t = gate(4);
    assert!(t.is_gate());
    assert_eq!(t.config().pages, None);
    // Released by the last ACK.
    let a = t.open_gate(&[0, 1], 17, vec![100, 101, 102]).unwrap();
    assert_eq!(&t.abort(a).unwrap().fanout[..], &[0, 1]);
    assert_eq!(t.quiesce(a, 0).unwrap(), Quiesced::Recorded);
    let r = released(t.quiesce(a, 1));
    assert_eq!(
        (r.handle, r.token, &r.pages[..], r.reason),
        (a, 17, &[100, 101, 102][..], Reason::Aborted)
    );
    assert_eq!(t.quiesce(a, 1), Err(Error::StaleHandle), "never twice");
    // Released by the last transfer's end, after finish.
    let b = t.open_gate(&[], 18, vec![7]).unwrap();
    let g = t.begin_transfer(b).unwrap();
    assert_eq!(t.finish(b).unwrap(), None);
    let r = g.complete().expect("last hold");
    assert_eq!(
        (r.token, r.pages, r.reason),
        (18, vec![7], Reason::Finished)
    );
    // Released by abort itself, with an empty page list (pages may be added later).
    let c = t.open_gate(&[], u64::MAX, vec![]).unwrap();
    let r = t.abort(c).unwrap().released.expect("nothing in flight");
    assert_eq!((r.token, r.pages.len()), (u64::MAX, 0));
    assert_eq!(t.abort(c), Err(Error::StaleHandle));
    // Stats count the engine's pages as owned/held, never as free (the engine owns them).
    let d = t.open_gate(&[3], 19, vec![1, 2, 3, 4]).unwrap();
    let s = t.stats();
    assert_eq!((s.pages.free, s.pages.owned, s.rooms.owned), (0, 4, 1));
    let _ = t.abort(d).unwrap();
    assert_eq!(t.stats().pages.held, 4);
    let r = released(t.quiesce(d, 3));
    assert_eq!((r.token, r.pages), (19, vec![1, 2, 3, 4]));
    assert!(t.pop_released().is_none());
    assert_eq!(t.stats().releases, 4);
    assert_eq!(t.stats().rooms.free, 4);
}

/// The same through the release queue: every call that performs a release returns
/// `None`/`Queued`; the scheduler drains each exactly once; until it does, the room index
/// is not reused and `wait_released` waits.
#[test]
fn gate_mode_with_release_queue_hands_back_each_release_once_when_drained() {
    let t = gate_queue(2);
    let a = t.open_gate(&[0], 1, vec![10, 11]).unwrap();
    let b = t.open_gate(&[], 2, vec![12]).unwrap();
    let aborted = t.abort(a).unwrap();
    assert_eq!((&aborted.fanout[..], aborted.released), (&[0u32][..], None));
    assert_eq!(t.quiesce(a, 0).unwrap(), Quiesced::Queued);
    assert_eq!(t.finish(b).unwrap(), None, "queued, not returned");
    assert_eq!(t.queued_releases(), 2);
    let s = t.stats();
    assert_eq!((s.rooms.queued, s.pages.queued, s.rooms.free), (2, 3, 0));
    assert_eq!(t.phase(a).unwrap(), Phase::Free);
    // Not yet handed back: the indices stay claimed; but the releases are decided, so
    // waits for them end at once (the waiter then drains: issue 18 item 9).
    assert_eq!(
        t.open_gate(&[], 3, vec![]).err(),
        Some(Error::RoomTableFull)
    );
    assert_eq!(
        t.wait_released_timeout(a, Duration::from_millis(10)),
        Ok(true)
    );
    t.wait_released(b).unwrap();
    std::thread::scope(|_| {
        let mut out = Vec::new();
        assert_eq!(t.drain_released(&mut out), 2);
        out.sort_by_key(|r| r.token);
        assert_eq!(
            out.iter()
                .map(|r| (r.handle, r.token, r.pages.clone(), r.reason))
                .collect::<Vec<_>>(),
            vec![
                (a, 1, vec![10, 11], Reason::Aborted),
                (b, 2, vec![12], Reason::Finished)
            ]
        );
    });
    assert_eq!(t.drain_released(&mut Vec::new()), 0, "each release once");
    assert!(t.pop_released().is_none());
    assert_eq!(t.queued_releases(), 0);
    assert_eq!(t.stats().rooms.free, 2);
    assert_eq!(t.stats().releases, 2);
}

#[test]
fn growing_rooms_in_pool_mode_until_closing() {
    let t = pool(2, 16);
    let room = t.open(&[0], 2).unwrap();
    let h = room.handle;
    let more = t.grow(h, 3).unwrap();
    assert_eq!(more.len(), 3);
    assert!(more.iter().all(|p| !room.pages.contains(p)), "fresh pages");
    assert_eq!(t.grow(h, 0).unwrap(), Vec::<u32>::new());
    let mut all = room.pages.clone();
    all.extend_from_slice(&more);
    assert_eq!(sorted(t.pages_of(h).unwrap()), sorted(all.clone()));
    assert_eq!(t.stats().pages.owned, 5);
    assert_eq!(t.room_status(h).unwrap().pages, 5);
    // More than is free: refused, nothing claimed.
    assert_eq!(
        t.grow(h, 12).err(),
        Some(Error::PoolExhausted { requested: 12 })
    );
    assert!(t.grow(h, 100).is_err());
    assert_eq!(t.stats().pages.free, 11);
    // Grow while a transfer is in flight is fine; once closing it is refused.
    let g = t.begin_transfer(h).unwrap();
    assert_eq!(t.grow(h, 1).unwrap().len(), 1);
    all = t.pages_of(h).unwrap();
    assert_eq!(t.finish(h).unwrap(), None);
    assert_eq!(
        t.grow(h, 1).err(),
        Some(Error::RoomClosed {
            phase: Phase::Draining
        })
    );
    assert_eq!(
        t.pages_of(h).err(),
        Some(Error::RoomClosed {
            phase: Phase::Draining
        })
    );
    assert!(g.complete().is_none());
    let r = released(t.quiesce(h, 0));
    assert_eq!(sorted(r.pages), sorted(all));
    assert_eq!(t.grow(h, 1).err(), Some(Error::StaleHandle));
    assert_eq!(t.stats().pages.free, 16);
    // Aborting: refused too.
    let h = t.open(&[1], 1).unwrap().handle;
    let _ = t.abort(h).unwrap();
    assert_eq!(
        t.grow(h, 1).err(),
        Some(Error::RoomClosed {
            phase: Phase::Aborting
        })
    );
}

#[test]
fn growing_rooms_in_gate_mode_until_closing() {
    let t = gate(2);
    let h = t.open_gate(&[4], 9, vec![10]).unwrap();
    t.grow_gate(h, &[11, 12]).unwrap();
    t.grow_gate(h, &[]).unwrap();
    let g = t.begin_transfer(h).unwrap();
    t.grow_gate(h, &[13]).unwrap();
    assert_eq!(t.pages_of(h).unwrap(), vec![10, 11, 12, 13]);
    assert_eq!(t.stats().pages.owned, 4);
    let _ = t.abort(h).unwrap();
    assert_eq!(
        t.grow_gate(h, &[14]).err(),
        Some(Error::RoomClosed {
            phase: Phase::Aborting
        })
    );
    assert!(g.complete().is_none());
    let r = released(t.quiesce(h, 4));
    assert_eq!(
        (r.token, r.pages),
        (9, vec![10, 11, 12, 13]),
        "14 was never added"
    );
    assert_eq!(t.grow_gate(h, &[1]).err(), Some(Error::StaleHandle));
    // Draining: refused too.
    let h = t.open_gate(&[4], 9, vec![]).unwrap();
    let _ = t.finish(h).unwrap();
    assert_eq!(
        t.grow_gate(h, &[1]).err(),
        Some(Error::RoomClosed {
            phase: Phase::Draining
        })
    );
}

/// An owned guard ('static: holds an `Arc` of the table) moves to another thread and ends
/// there; its release is returned there. Dropped there without an outcome, it is failed.
#[test]
fn owned_guard_ends_on_another_thread() {
    let t = Arc::new(gate(4));
    let h = t.open_gate(&[], 5, vec![1, 2]).unwrap();
    let g = RoomTable::begin_transfer_owned(&t, h, Some(3)).unwrap();
    assert_eq!(g.handle(), h);
    assert!(Arc::ptr_eq(g.table(), &t));
    let _ = t.abort(h).unwrap();
    let r = std::thread::spawn(move || g.complete())
        .join()
        .unwrap()
        .expect("the last hold releases, on the guard's thread");
    assert_eq!((r.handle, r.token, r.pages), (h, 5, vec![1, 2]));

    // `end(Outcome)` form.
    let h = t.open_gate(&[], 6, vec![3]).unwrap();
    let g = RoomTable::begin_transfer_owned(&t, h, None).unwrap();
    assert_eq!(t.finish(h).unwrap(), None);
    let r = std::thread::spawn(move || g.end(Outcome::Completed))
        .join()
        .unwrap();
    assert_eq!(r.map(|r| r.reason), Some(Reason::Finished));

    // Dropped on another thread: failed, held until its peer is fenced.
    let h = t.open_gate(&[], 7, vec![4]).unwrap();
    let g = RoomTable::begin_transfer_owned(&t, h, Some(3)).unwrap();
    let _ = t.abort(h).unwrap();
    std::thread::spawn(move || drop(g)).join().unwrap();
    assert_eq!(t.phase(h).unwrap(), Phase::Aborting);
    assert_eq!(t.room_status(h).unwrap().failed, 1);
    let fenced = t.fence_rank(3).unwrap();
    assert_eq!(fenced.failed_ended, 1);
    assert_eq!(fenced.released[0].token, 7);

    // Explicit fail on another thread, peer already fenced: the hold drops at once.
    let h = t.open_gate(&[], 8, vec![5]).unwrap();
    let g = RoomTable::begin_transfer_owned(&t, h, Some(3)).unwrap();
    let _ = t.abort(h).unwrap();
    let r = std::thread::spawn(move || g.fail()).join().unwrap();
    assert_eq!(r.map(|r| r.token), Some(8));
}

/// Token form (FFI, Python): a token ends exactly once. A second `end`, a forged token, a
/// room handle passed as a token, or another table's token is refused with `InvalidToken`
/// and never decrements the room a second time.
#[test]
fn tokens_end_once_and_forged_or_repeated_ends_never_decrement() {
    let t = RoomTable::new(Config::gate(4).max_tokens(2)).unwrap();
    let h = t.open_gate(&[], 1, vec![9]).unwrap();
    let t1 = t.begin(h, Some(0)).unwrap();
    let t2 = t.begin(h, None).unwrap();
    assert_ne!(t1, t2);
    assert_eq!(TransferToken::from_wire(t1.to_wire()), t1);
    assert_eq!(t.begin(h, None).err(), Some(Error::TooManyTokens));
    assert_eq!(
        t.room_status(h).unwrap().transfers,
        2,
        "a refused begin holds nothing"
    );
    let _ = t.abort(h).unwrap();
    assert_eq!(t.end(t1, Outcome::Completed), Ok(None));
    // Second end: refused, and the room is still held by t2.
    assert_eq!(t.end(t1, Outcome::Completed), Err(Error::InvalidToken));
    assert_eq!(t.end(t1, Outcome::Failed), Err(Error::InvalidToken));
    assert_eq!(t.phase(h).unwrap(), Phase::Aborting);
    assert_eq!(t.room_status(h).unwrap().transfers, 1);
    // Forgeries: a room handle, zero, a flipped bit, another table's token.
    let other = gate(1);
    let oh = other.open_gate(&[], 0, vec![]).unwrap();
    let foreign = other.begin(oh, None).unwrap();
    for forged in [
        TransferToken::from_wire(h.to_wire()),
        TransferToken::from_wire(0),
        TransferToken::from_wire(t2.to_wire() ^ 1 << 70),
        TransferToken::from_wire(t2.to_wire() + 1),
        foreign,
    ] {
        assert_eq!(t.end(forged, Outcome::Completed), Err(Error::InvalidToken));
    }
    assert_eq!(
        t.phase(h).unwrap(),
        Phase::Aborting,
        "no forgery decremented"
    );
    let r = t
        .end(t2, Outcome::Completed)
        .unwrap()
        .expect("the last hold");
    assert_eq!(r.token, 1);
    // Slot reuse: an ended token whose slot was handed out again is still refused, and the
    // new token is untouched.
    let t = RoomTable::new(Config::gate(2).max_tokens(1)).unwrap();
    let h = t.open_gate(&[], 2, vec![]).unwrap();
    let old = t.begin(h, None).unwrap();
    assert_eq!(t.end(old, Outcome::Completed), Ok(None));
    let new = t.begin(h, None).unwrap();
    let _ = t.finish(h).unwrap();
    assert_eq!(t.end(old, Outcome::Completed), Err(Error::InvalidToken));
    assert_eq!(t.phase(h).unwrap(), Phase::Draining);
    assert!(t.end(new, Outcome::Completed).unwrap().is_some());
}

/// A token ended as failed holds the room, like a failed guard, until its peer is fenced.
#[test]
fn a_failed_token_holds_the_room_until_its_peer_is_fenced() {
    let t = gate(2);
    let h = t.open_gate(&[0], 3, vec![1]).unwrap();
    let tok = t.begin(h, Some(2)).unwrap();
    let _ = t.abort(h).unwrap();
    assert_eq!(t.end(tok, Outcome::Failed), Ok(None));
    assert_eq!(t.end(tok, Outcome::Failed), Err(Error::InvalidToken));
    assert_eq!(t.quiesce(h, 0).unwrap(), Quiesced::Recorded);
    assert_eq!(t.phase(h).unwrap(), Phase::Aborting);
    let fenced = t.fence_rank(2).unwrap();
    assert_eq!((fenced.failed_ended, fenced.released.len()), (1, 1));
    assert_eq!(fenced.released[0].token, 3);
}

/// A failed transfer never counts as drained: the room stays held after every writer
/// ACKed, whatever time passes, until the transfer's peer is fenced.
#[test]
fn a_failed_transfer_holds_the_room_after_every_ack_until_its_peer_is_fenced() {
    let t = gate(4);
    let h = t.open_gate(&[0, 1], 5, vec![20, 21]).unwrap();
    let ok = t.begin_transfer_to(h, 1).unwrap();
    let bad = t.begin_transfer_to(h, 1).unwrap();
    assert!(ok.complete().is_none());
    assert!(bad.fail().is_none());
    let s = t.stats();
    assert_eq!(s.failed_transfers, 1);
    let st = t.room_status(h).unwrap();
    assert_eq!((st.transfers, st.failed), (1, 1));
    assert_eq!(&t.abort(h).unwrap().fanout[..], &[0, 1]);
    assert_eq!(t.quiesce(h, 0).unwrap(), Quiesced::Recorded);
    assert_eq!(
        t.quiesce(h, 1).unwrap(),
        Quiesced::Recorded,
        "the failed transfer holds"
    );
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(t.phase(h).unwrap(), Phase::Aborting, "time never releases");
    assert_eq!(
        t.wait_released_timeout(h, Duration::from_millis(5)),
        Ok(false)
    );
    // Fencing another rank does nothing.
    let other = t.fence_rank(7).unwrap();
    assert_eq!((other.failed_ended, other.released.len()), (0, 0));
    assert_eq!(t.phase(h).unwrap(), Phase::Aborting);
    let fenced = t.fence_rank(1).unwrap();
    assert_eq!(fenced.failed_ended, 1);
    assert_eq!(fenced.quiesced, 0, "rank 1 had ACKed already");
    let r = &fenced.released[0];
    assert_eq!((r.handle, r.token, &r.pages[..]), (h, 5, &[20, 21][..]));
    assert_eq!(t.room_status(h).err(), Some(Error::StaleHandle));
}

/// A failure reported after the peer was fenced (its transport is gone: nothing of it can
/// land) drops the hold at once, and can release the room.
#[test]
fn a_failure_after_the_peer_was_fenced_releases_at_once() {
    let t = pool(2, 8);
    let room = t.open(&[], 3).unwrap();
    let h = room.handle;
    let g = t.begin_transfer_to(h, 4).unwrap();
    let _ = t.abort(h).unwrap();
    assert_eq!(t.fence_rank(4).unwrap().failed_ended, 0);
    let r = g.fail().expect("peer fenced already: released at once");
    assert_eq!(
        (r.handle, r.pages, r.reason),
        (h, room.pages, Reason::Aborted)
    );
    assert_eq!(t.stats().failed_transfers, 0, "never registered");
    // The same for a token.
    let h = t.open(&[], 1).unwrap().handle;
    let tok = t.begin(h, Some(4)).unwrap();
    let _ = t.abort(h).unwrap();
    assert!(t.end(tok, Outcome::Failed).unwrap().is_some());
}

/// Quarantining a room whose close is already decided to be its release (nothing holds
/// it) returns that release to the caller: with the pages counted quarantined, not lost.
#[test]
fn quarantine_that_performs_the_release_returns_it() {
    let t = gate(2);
    let h = t.open_gate(&[], 7, vec![3, 4]).unwrap();
    let r = t
        .quarantine(h)
        .unwrap()
        .expect("nothing holds the room: this call releases it");
    assert_eq!((r.token, r.reason), (7, Reason::Quarantined));
    assert_eq!(t.stats().quarantined_pages, 2);
}

/// A failed transfer with no known peer cannot be ended by any fence: only by quarantine.
#[test]
fn a_failed_transfer_without_a_peer_is_ended_only_by_quarantine() {
    let t = gate(2);
    let h = t.open_gate(&[], 1, vec![5]).unwrap();
    assert!(t.begin_transfer(h).unwrap().fail().is_none());
    let _ = t.abort(h).unwrap();
    for rank in [0, 1, 2, u32::MAX - 1] {
        assert_eq!(t.fence_rank(rank).unwrap().failed_ended, 0);
    }
    assert_eq!(t.phase(h).unwrap(), Phase::Aborting);
    let r = t.quarantine(h).unwrap().expect("quarantine ends it");
    assert_eq!((r.token, r.reason), (1, Reason::Quarantined));
}

/// The release queue delivers every release exactly once, whichever thread performs it
/// and whichever thread drains it: 4 threads releasing, 2 draining concurrently.
#[test]
fn release_queue_delivers_every_release_exactly_once_from_any_thread() {
    // Several rounds: a lost or doubled pop needs a preemption inside a short window.
    for round in 0..3 {
        release_queue_round(round);
    }
}

fn release_queue_round(round: u64) {
    const RELEASERS: u64 = 4;
    let per_thread: u64 = if cfg!(miri) { 20 } else { 10_000 };
    let t = RoomTable::new(Config::gate(64).release_queue(true)).unwrap();
    let delivered: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    let releasers_done = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for id in 0..RELEASERS {
            let t = &t;
            let releasers_done = &releasers_done;
            s.spawn(move || {
                let _done = OnDrop(|| {
                    releasers_done.fetch_add(1, Ordering::Release);
                });
                let mut rng = Rng(0xABCD + id + round * 17);
                let mut i = 0;
                let mut stalled: Option<Instant> = None;
                while i < per_thread {
                    let token = id << 32 | i;
                    let h = match t.open_gate(&[1, 2], token, vec![token as u32]) {
                        Ok(h) => h,
                        Err(Error::RoomTableFull) => {
                            let since = *stalled.get_or_insert_with(Instant::now);
                            assert!(since.elapsed() < STALL, "no room freed in {STALL:?}");
                            std::thread::yield_now();
                            continue;
                        }
                        Err(e) => panic!("{e}"),
                    };
                    i += 1;
                    stalled = None;
                    let g = t.begin_transfer(h).unwrap();
                    // Every way to perform a release; none returns it.
                    match rng.below(4) {
                        0 => {
                            assert_eq!(t.abort(h).unwrap().released, None);
                            assert_eq!(t.quiesce(h, 1).unwrap(), Quiesced::Recorded);
                            assert!(g.complete().is_none());
                            assert_eq!(t.quiesce(h, 2).unwrap(), Quiesced::Queued);
                        }
                        1 => {
                            assert_eq!(t.quiesce(h, 1).unwrap(), Quiesced::Recorded);
                            assert_eq!(t.quiesce(h, 2).unwrap(), Quiesced::Recorded);
                            assert_eq!(t.finish(h).unwrap(), None);
                            assert!(g.complete().is_none());
                        }
                        2 => {
                            assert!(g.complete().is_none());
                            assert_eq!(t.quiesce(h, 2).unwrap(), Quiesced::Recorded);
                            assert_eq!(t.quiesce(h, 1).unwrap(), Quiesced::Recorded);
                            assert_eq!(t.abort(h).unwrap().released, None);
                        }
                        _ => {
                            let _ = t.abort(h).unwrap();
                            assert!(g.complete().is_none());
                            assert_eq!(t.quarantine(h).unwrap(), None);
                        }
                    }
                }
            });
        }
        for _ in 0..2 {
            let (t, delivered, releasers_done) = (&t, &delivered, &releasers_done);
            s.spawn(move || {
                let mut mine = Vec::new();
                let mut buf = Vec::with_capacity(64);
                loop {
                    let stop = releasers_done.load(Ordering::Acquire) == RELEASERS as usize;
                    let n = if mine.len() % 2 == 0 {
                        t.drain_released(&mut buf)
                    } else {
                        t.pop_released().map(|r| buf.push(r)).map_or(0, |()| 1)
                    };
                    for r in buf.drain(..) {
                        assert_eq!(r.pages, vec![r.token as u32]);
                        mine.push(r.token);
                    }
                    if n == 0 {
                        if stop {
                            break;
                        }
                        std::thread::yield_now();
                    }
                }
                delivered.lock().unwrap().extend(mine);
            });
        }
    });
    let mut delivered = delivered.into_inner().unwrap();
    let n = delivered.len();
    delivered.sort_unstable();
    delivered.dedup();
    assert_eq!(delivered.len(), n, "a release was delivered twice");
    assert_eq!(n as u64, RELEASERS * per_thread, "a release was lost");
    assert_eq!(t.stats().releases, n as u64);
    assert_eq!(t.queued_releases(), 0);
    assert_eq!(t.stats().rooms.free, 64);
}

/// Pool mode: a quarantined room's pages never go back to the pool; the room index does.
#[test]
fn quarantine_keeps_pool_pages_out_of_the_pool_and_counts_them() {
    let t = pool(2, 8);
    let room = t.open(&[0], 3).unwrap();
    let h = room.handle;
    assert!(t.begin_transfer(h).unwrap().fail().is_none());
    let _ = t.abort(h).unwrap();
    assert_eq!(t.quiesce(h, 0).unwrap(), Quiesced::Recorded);
    let r = t
        .quarantine(h)
        .unwrap()
        .expect("nothing local in flight: released");
    assert_eq!(
        (r.handle, &r.pages, r.reason),
        (h, &room.pages, Reason::Quarantined)
    );
    let s = t.stats();
    assert_eq!(
        (s.pages.free, s.quarantined_pages, s.quarantined_rooms),
        (5, 3, 1)
    );
    assert_eq!(s.rooms.free, 2, "the room index is back");
    assert_eq!(t.quarantine(h).err(), Some(Error::StaleHandle));
    // The pages are gone for good: 6 pages cannot be had, 5 can, and never a quarantined one.
    assert_eq!(
        t.open(&[], 6).err(),
        Some(Error::PoolExhausted { requested: 6 })
    );
    let fresh = t.open(&[], 5).unwrap();
    assert!(fresh.pages.iter().all(|p| !room.pages.contains(p)));
    let _ = t.abort(fresh.handle).unwrap();
    assert_eq!(t.stats().pages.free, 5);
}

/// Gate mode: the release says `Quarantined` (the engine must never free those pages), the
/// room index returns to service, pending writers and failed transfers are given up.
#[test]
fn quarantine_in_gate_mode_says_quarantined_and_returns_the_room_index() {
    let t = gate(1);
    let h = t.open_gate(&[0, 1], 44, vec![40, 41]).unwrap();
    assert!(t.begin_transfer_to(h, 0).unwrap().fail().is_none());
    assert_eq!(t.quiesce(h, 1).unwrap(), Quiesced::Recorded);
    // Quarantine of a live (owned) room: gives up on rank 0 and the failed transfer.
    let r = t
        .quarantine(h)
        .unwrap()
        .expect("released by the quarantine");
    assert_eq!(
        (r.handle, r.token, &r.pages[..], r.reason),
        (h, 44, &[40, 41][..], Reason::Quarantined)
    );
    assert_eq!(r.reason.to_string(), "quarantined");
    let s = t.stats();
    assert_eq!(
        (s.quarantined_rooms, s.quarantined_pages, s.rooms.free),
        (1, 2, 1)
    );
    // The index is back (one room only), and rank 0's late ACK is stale.
    let next = t.open_gate(&[0], 45, vec![40]).unwrap();
    assert_eq!(next.index(), h.index());
    assert_eq!(t.quiesce(h, 0), Err(Error::StaleHandle));
    // The next lifecycle is not quarantined.
    assert!(!t.room_status(next).unwrap().quarantined);
    let _ = t.abort(next).unwrap();
    assert_eq!(released(t.quiesce(next, 0)).reason, Reason::Aborted);

    // Through the release queue: the queued release says Quarantined too.
    let q = gate_queue(1);
    let h = q.open_gate(&[3], 46, vec![1]).unwrap();
    assert_eq!(q.quarantine(h).unwrap(), None);
    let r = q.pop_released().expect("queued");
    assert_eq!((r.token, r.reason), (46, Reason::Quarantined));
}

/// Quarantine does not end local transfers still in flight: the release waits for them,
/// and is performed by the last one's end (queued if it was a dropped guard).
#[test]
fn quarantine_waits_for_a_local_transfer_in_flight() {
    let t = gate(1);
    let h = t.open_gate(&[0], 1, vec![5, 6]).unwrap();
    let g = t.begin_transfer(h).unwrap();
    let tok = t.begin(h, None).unwrap();
    assert_eq!(t.quarantine(h).unwrap(), None);
    let st = t.room_status(h).unwrap();
    assert_eq!(
        (st.phase, st.quarantined, st.transfers),
        (Phase::Aborting, true, 2)
    );
    assert!(st.waiting_on.is_empty(), "rank 0 given up");
    assert_eq!(
        t.open_gate(&[], 2, vec![]).err(),
        Some(Error::RoomTableFull)
    );
    assert!(t.begin_transfer(h).is_err());
    assert_eq!(t.end(tok, Outcome::Completed), Ok(None));
    let r = g.complete().expect("the last transfer releases");
    assert_eq!((r.token, r.reason), (1, Reason::Quarantined));
    assert_eq!(t.stats().quarantined_pages, 2);

    // A failure on a quarantined room drops its hold at once.
    let h = t.open_gate(&[], 3, vec![7]).unwrap();
    let a = t.begin_transfer(h).unwrap();
    let b = t.begin_transfer(h).unwrap();
    assert_eq!(t.quarantine(h).unwrap(), None);
    assert!(a.fail().is_none());
    let r = b.fail().expect("quarantined: a failure is not waited for");
    assert_eq!(r.reason, Reason::Quarantined);

    // A guard dropped while unwinding on a quarantined room: released into the queue.
    let h = t.open_gate(&[], 4, vec![8]).unwrap();
    let g = t.begin_transfer(h).unwrap();
    assert_eq!(t.quarantine(h).unwrap(), None);
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _g = g;
        panic!("transfer thread died");
    }));
    assert!(unwound.is_err());
    assert_eq!(t.queued_releases(), 1);
    let r = t.pop_released().expect("queued by the drop");
    assert_eq!((r.token, r.reason), (4, Reason::Quarantined));
    assert_eq!(t.stats().quarantined_rooms, 3);
}

/// An abort that overtakes a finish (the client left while the last chunks arrived) moves
/// the room to Aborting and returns the fan-out still to be told.
#[test]
fn abort_while_draining_returns_the_fanout() {
    let t = pool(2, 8);
    let h = t.open(&[0, 1, 2], 2).unwrap().handle;
    let g = t.begin_transfer(h).unwrap();
    assert_eq!(t.quiesce(h, 0).unwrap(), Quiesced::Recorded);
    assert_eq!(t.finish(h).unwrap(), None);
    assert_eq!(t.phase(h).unwrap(), Phase::Draining);
    let aborted = t.abort(h).unwrap();
    assert_eq!(&aborted.fanout[..], &[1, 2]);
    assert!(aborted.fanout.contains(2) && !aborted.fanout.contains(0));
    assert_eq!(aborted.released, None);
    assert_eq!(t.phase(h).unwrap(), Phase::Aborting);
    assert_eq!(t.abort(h), Err(Error::AlreadyAborted));
    assert_eq!(t.finish(h), Err(Error::AlreadyAborted));
    assert_eq!(t.quiesce(h, 1).unwrap(), Quiesced::Recorded);
    assert_eq!(t.quiesce(h, 2).unwrap(), Quiesced::Recorded);
    let r = g.complete().expect("the last hold");
    assert_eq!(r.reason, Reason::Aborted);
}

/// Rank ids are any `u32` but `u32::MAX`; a room takes up to 64 writers, no repeats.
#[test]
fn rank_ids_up_to_u32_max_minus_1_and_at_most_64_writers() {
    let t = pool(4, 64);
    let ids = wide_ranks();
    assert_eq!(ids.len(), MAX_WRITERS);
    let h = t.open(&ids, 1).unwrap().handle;
    let aborted = t.abort(h).unwrap();
    assert_eq!(&aborted.fanout[..], &ids[..]);
    assert!(aborted.fanout.contains(u32::MAX - 1));
    for &r in &ids[1..] {
        assert_eq!(t.quiesce(h, r).unwrap(), Quiesced::Recorded);
    }
    assert_eq!(&t.room_status(h).unwrap().waiting_on[..], &[u32::MAX - 1]);
    released(t.quiesce(h, u32::MAX - 1));
    // Fencing and re-admitting the largest id works.
    let h = t.open(&[u32::MAX - 1, 0], 1).unwrap().handle;
    let _ = t.abort(h).unwrap();
    assert_eq!(t.quiesce(h, 0).unwrap(), Quiesced::Recorded);
    assert_eq!(t.fence_rank(u32::MAX - 1).unwrap().released.len(), 1);
    assert_eq!(
        t.open(&[u32::MAX - 1], 1).err(),
        Some(Error::RankFenced { rank: u32::MAX - 1 })
    );
    assert!(t.readmit_rank(u32::MAX - 1).unwrap());
    // The limits.
    let mut many: Vec<u32> = (0..65).map(|i| i * 1000).collect();
    assert_eq!(
        t.open(&many, 1).err(),
        Some(Error::TooManyWriters {
            writers: 65,
            max: 64
        })
    );
    many.truncate(63);
    many.push(3000); // already at position 3
    assert_eq!(
        t.open(&many, 1).err(),
        Some(Error::DuplicateWriter { rank: 3000 })
    );
    assert_eq!(
        t.open(&[1, u32::MAX], 1).err(),
        Some(Error::InvalidRank { rank: u32::MAX })
    );
    let g = gate(1);
    assert_eq!(
        g.open_gate(&[7, 7], 0, vec![]).err(),
        Some(Error::DuplicateWriter { rank: 7 })
    );
    assert_eq!(g.stats().rooms.free, 1);
    assert_eq!(t.stats().rooms.free, 4);
}

/// `room_status` reports each field of a live lifecycle, and refuses a released one.
#[test]
fn room_status_reports_every_field() {
    let t = gate(4);
    let h = t.open_gate(&[1, 2, 3], 9, vec![10, 11, 12, 13]).unwrap();
    let st = t.room_status(h).unwrap();
    assert_eq!(st.handle, h);
    assert_eq!(st.phase, Phase::Owned);
    assert_eq!(&st.waiting_on[..], &[1, 2, 3]);
    assert_eq!((st.transfers, st.failed, st.pages), (0, 0, 4));
    assert_eq!(st.closing_for, Duration::ZERO);
    assert!(!st.quarantined);
    assert_eq!(t.quiesce(h, 2).unwrap(), Quiesced::Recorded);
    let g1 = t.begin_transfer(h).unwrap();
    let g2 = t.begin_transfer_to(h, 3).unwrap();
    t.grow_gate(h, &[14, 15]).unwrap();
    let st = t.room_status(h).unwrap();
    assert_eq!(&st.waiting_on[..], &[1, 3]);
    assert_eq!((st.transfers, st.failed, st.pages), (2, 0, 6));
    assert!(g2.fail().is_none());
    let st = t.room_status(h).unwrap();
    assert_eq!(
        (st.transfers, st.failed),
        (2, 1),
        "a failed transfer still holds"
    );
    let _ = t.abort(h).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    let st = t.room_status(h).unwrap();
    assert_eq!(st.phase, Phase::Aborting);
    assert!(
        st.closing_for >= Duration::from_millis(25),
        "{:?}",
        st.closing_for
    );
    let closing = t.stats().closing;
    assert_eq!(closing.len(), 1);
    assert_eq!(
        (
            closing[0].handle,
            closing[0].phase,
            &closing[0].waiting_on,
            closing[0].pages
        ),
        (h, Phase::Aborting, &st.waiting_on, 6)
    );
    assert_eq!(t.quarantine(h).unwrap(), None);
    let st = t.room_status(h).unwrap();
    assert!(st.quarantined);
    assert!(st.waiting_on.is_empty());
    assert_eq!((st.transfers, st.failed), (1, 0));
    assert_eq!(g1.complete().map(|r| r.reason), Some(Reason::Quarantined));
    assert_eq!(t.room_status(h).err(), Some(Error::StaleHandle));
}

/// Each mode refuses the other's calls with `WrongMode`, naming what the table is.
#[test]
fn wrong_mode_both_ways() {
    let p = pool(2, 8);
    let g = gate(2);
    assert!(!p.is_gate() && g.is_gate());
    assert_eq!(p.config(), Config::pool(2, 8));
    assert_eq!(g.config(), Config::gate(2));
    assert_eq!(
        p.open_gate(&[], 1, vec![1]).err(),
        Some(Error::WrongMode { table: "pool" })
    );
    assert_eq!(
        g.open(&[], 1).err(),
        Some(Error::WrongMode { table: "gate" })
    );
    let ph = p.open(&[], 1).unwrap().handle;
    let gh = g.open_gate(&[], 1, vec![1]).unwrap();
    assert_eq!(
        p.grow_gate(ph, &[2]).err(),
        Some(Error::WrongMode { table: "pool" })
    );
    assert_eq!(
        g.grow(gh, 1).err(),
        Some(Error::WrongMode { table: "gate" })
    );
    assert!(Error::WrongMode { table: "pool" }
        .to_string()
        .contains("pool-mode"));
    assert!(Error::WrongMode { table: "gate" }
        .to_string()
        .contains("gate-mode"));
    // Nothing was claimed by the refusals.
    assert_eq!(p.stats().rooms.free, 1);
    assert_eq!(g.stats().rooms.free, 1);
    assert_eq!(p.pages_of(ph).unwrap().len(), 1);
    assert_eq!(g.pages_of(gh).unwrap(), vec![1]);
}

/// `TooManyFenced`: the fenced set is bounded; re-admitting one makes room.
#[test]
fn too_many_fenced_until_one_is_readmitted() {
    let t = RoomTable::new(Config::gate(2).max_fenced(2)).unwrap();
    let _ = t.fence_rank(1).unwrap();
    let _ = t.fence_rank(2).unwrap();
    // Fencing one that is fenced already is not a new entry.
    assert!(t.fence_rank(2).is_ok());
    assert_eq!(t.fence_rank(3).err(), Some(Error::TooManyFenced { max: 2 }));
    // The refused rank is not fenced: rooms may name it.
    assert!(t.open_gate(&[3], 0, vec![]).is_ok());
    assert!(t.readmit_rank(1).unwrap());
    assert!(t.fence_rank(3).is_ok());
    assert_eq!(t.stats().fenced, vec![2, 3]);
}

/// Allocates a zeroed page list longer than `MAX_PAGES` without touching its memory
/// (calloc of fresh pages); `None` where the address space or the overcommit policy does
/// not allow it.
fn huge_page_list() -> Option<Vec<u32>> {
    let n = MAX_PAGES + 1;
    let layout = std::alloc::Layout::array::<u32>(n).ok()?;
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as *mut u32;
    if ptr.is_null() {
        return None;
    }
    // SAFETY: allocated by the global allocator with the layout of `[u32; n]`; all `n`
    // elements are initialised (zero is a valid u32).
    Some(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

/// `TooManyPagesInRoom`: a gate-mode page list longer than 2^31 (at open or by growing).
#[test]
fn too_many_pages_in_room_is_refused() {
    if cfg!(miri) {
        return;
    }
    let Some(huge) = huge_page_list() else {
        eprintln!("skipped: cannot reserve 8 GiB of address space here");
        return;
    };
    let t = gate(2);
    let h = t.open_gate(&[], 1, vec![1]).unwrap();
    assert_eq!(t.grow_gate(h, &huge).err(), Some(Error::TooManyPagesInRoom));
    assert_eq!(t.pages_of(h).unwrap(), vec![1], "nothing was added");
    assert_eq!(
        t.open_gate(&[], 2, huge).err(),
        Some(Error::TooManyPagesInRoom)
    );
    assert_eq!(t.stats().rooms.free, 1);
}

/// `OutOfMemory`: a table too large for the address space is an error, not an abort. Run
/// in a child process (this test binary) under `ulimit -v`.
#[test]
#[cfg(target_os = "linux")]
fn a_table_that_does_not_fit_in_memory_is_an_error() {
    // ThreadSanitizer re-executes a process with an address-space limit without it: the
    // limit, and so this test, cannot work there (scripts/tsan.sh sets the variable).
    if std::env::var_os("KVFENCE_UNDER_TSAN").is_some() {
        return;
    }
    if std::env::var_os("KVFENCE_OOM_CHILD").is_some() {
        // 2^24 rooms of several cache lines each: gigabytes, over the 2 GiB limit.
        match RoomTable::new(Config::gate(MAX_ROOMS).max_tokens(MAX_ROOMS)) {
            Err(e @ Error::OutOfMemory { bytes }) => {
                assert!(bytes >= MAX_ROOMS, "{bytes}");
                assert!(e.to_string().contains(&bytes.to_string()));
                println!("KVFENCE-OOM-OK {bytes}");
            }
            Err(e) => panic!("expected OutOfMemory, got {e:?}"),
            Ok(_) => panic!("expected OutOfMemory, got a table"),
        }
        return;
    }
    if cfg!(miri) {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(
            "ulimit -v 2097152 && exec \"$0\" --exact \
             a_table_that_does_not_fit_in_memory_is_an_error --nocapture --test-threads=1",
        )
        .arg(&exe)
        .env("KVFENCE_OOM_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("KVFENCE-OOM-OK"),
        "child: {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The default token capacity (4 per room) must stay inside its documented range for every
/// valid room count: `Config::gate(rooms)` alone is a valid config.
#[test]
fn default_config_is_valid_for_every_room_count() {
    for rooms in [1, 4096, MAX_ROOMS / 4, MAX_ROOMS / 4 + 1, MAX_ROOMS] {
        let c = Config::gate(rooms);
        assert!(
            (1..=MAX_ROOMS).contains(&c.max_tokens),
            "Config::gate({rooms}).max_tokens = {} is outside 1..=2^24: RoomTable::new \
             would refuse a config the caller never set max_tokens on",
            c.max_tokens
        );
        assert_eq!(Config::pool(rooms, 1).max_tokens, c.max_tokens);
    }
}

/// `grow` by more than the whole pool is refused before anything is claimed (as `open`):
/// `TooManyPages`, and no other thread ever sees the pool emptied by the refused call (it
/// used to claim every free page, then give them back with `PoolExhausted`).
#[test]
fn grow_larger_than_the_pool_claims_nothing() {
    const PAGES: usize = 1 << 16;
    let t = pool(4, PAGES);
    let h = t.open(&[], 1).unwrap().handle;
    for n in [PAGES + 1, usize::MAX] {
        assert_eq!(
            t.grow(h, n).err(),
            Some(Error::TooManyPages {
                requested: n,
                capacity: PAGES
            })
        );
    }
    let stop = AtomicBool::new(false);
    let (reads, seen_low, grows) = std::thread::scope(|s| {
        let grower = s.spawn(|| {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                assert!(t.grow(h, PAGES + 1).is_err());
                n += 1;
            }
            n
        });
        let (mut reads, mut seen_low) = (0u64, 0u64);
        let deadline = Instant::now() + Duration::from_millis(500);
        while Instant::now() < deadline {
            reads += 1;
            if t.stats().pages.free != PAGES - 1 {
                seen_low += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        (reads, seen_low, grower.join().unwrap())
    });
    println!("{reads} stats() during {grows} refused grows: {seen_low} saw pages claimed");
    assert!(reads > 0 && grows > 0);
    assert_eq!(seen_low, 0);
    assert_eq!(t.pages_of(h).unwrap().len(), 1);
}

/// `drain_released_with` (the C ABI's drain): each release handed to the callback once, the
/// limit respected, and none lost when the callback panics: the releases it was not given
/// go back to the queue, untouched.
#[test]
fn drain_released_with_hands_each_release_once_and_survives_a_panicking_callback() {
    let t = gate_queue(8);
    for token in 0..5u64 {
        let h = t.open_gate(&[], token, vec![token as u32]).unwrap();
        assert_eq!(t.finish(h).unwrap(), None, "queued");
    }
    let mut seen = Vec::new();
    assert_eq!(t.drain_released_with(2, |r| seen.push(r.token)), 2);
    assert_eq!((seen.len(), t.queued_releases()), (2, 3), "the limit");
    // A callback that panics on the first release it is given.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        t.drain_released_with(usize::MAX, |_| panic!("callback panics"))
    }));
    assert!(outcome.is_err(), "the panic resumes");
    // The one the callback owned was dropped by the unwind (it was delivered: its room index
    // is free again); the other two are still queued, and delivered by the next drain.
    assert_eq!(
        t.queued_releases(),
        2,
        "the releases after the panic went back"
    );
    let mut rest = Vec::new();
    assert_eq!(t.drain_released(&mut rest), 2);
    seen.extend(rest.iter().map(|r| r.token));
    assert_eq!(seen.len(), 4);
    assert_eq!(
        seen.iter().collect::<HashSet<_>>().len(),
        4,
        "each release once"
    );
    assert_eq!(t.stats().rooms.free, 8, "every room index back");
    assert_eq!(t.stats().releases, 5);
}

/// Issue 42, item 2: the page pool's two levels (whole free words in a summary, the rest in
/// the words) under real threads. Four threads open rooms of mixed sizes on a 1,024-page
/// pool (16 words): small ones that move a word down out of the summary, runs of whole
/// words taken from the summary in one CAS, sizes that straddle the two, some `grow`s, and
/// refusals when the pool is short. Every page handed out is marked in an ownership map
/// (a page handed to two rooms at once fails at once); at the end every page is free and
/// one claim of all 1,024 fits (nothing lost between the levels). It reports how often each
/// kind of claim succeeded, so a run that never exercised one says so.
#[test]
fn pool_summary_stress_conserves_pages() {
    const THREADS: usize = 4;
    const PAGES: usize = 1024;
    const SIZES: [usize; 10] = [1, 10, 37, 63, 64, 65, 128, 200, 300, 640];
    let lifecycles = 8_000;
    let t = pool(64, PAGES);
    let owner: Vec<AtomicU64> = (0..PAGES).map(|_| AtomicU64::new(0)).collect();
    let opened: Vec<AtomicUsize> = SIZES.iter().map(|_| AtomicUsize::new(0)).collect();
    let refused = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for id in 0..THREADS {
            let (t, owner, opened, refused) = (&t, &owner, &opened, &refused);
            s.spawn(move || {
                let mut rng = Rng(0x5EED + id as u64 * 104_729);
                let req = |n: usize| ((id as u64) << 32) | n as u64;
                for n in 0..lifecycles / THREADS {
                    let size = rng.below(SIZES.len());
                    let mut room = match t.open(&[], SIZES[size]) {
                        Ok(room) => room,
                        Err(Error::PoolExhausted { .. }) => {
                            refused.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        Err(e) => panic!("open: {e:?}"),
                    };
                    opened[size].fetch_add(1, Ordering::Relaxed);
                    if rng.below(8) == 0 {
                        if let Ok(more) = t.grow(room.handle, 1 + rng.below(70)) {
                            room.pages.extend(more);
                        }
                    }
                    for &p in &room.pages {
                        let was = owner[p as usize].swap(req(n), Ordering::Relaxed);
                        assert_eq!(was, 0, "page {p} handed out twice");
                    }
                    std::thread::yield_now();
                    for &p in &room.pages {
                        assert_eq!(owner[p as usize].swap(0, Ordering::Relaxed), req(n));
                    }
                    let r = t.finish(room.handle).unwrap().expect("finish releases");
                    assert_eq!(r.pages, room.pages);
                }
            });
        }
    });
    let counts: Vec<(usize, usize)> = SIZES
        .iter()
        .zip(&opened)
        .map(|(&s, n)| (s, n.load(Ordering::Relaxed)))
        .collect();
    println!(
        "pool summary stress: opened per size {counts:?}, refused {}",
        refused.load(Ordering::Relaxed)
    );
    assert!(
        counts.iter().all(|&(_, n)| n > 0),
        "a claim size never succeeded: {counts:?}"
    );
    let s = t.stats();
    assert_eq!(
        (s.pages.free, s.pages.owned, s.pages.held),
        (PAGES, 0, 0),
        "{s:?}"
    );
    let all = t
        .open(&[], PAGES)
        .expect("every page back, claimable at once");
    let mut sorted = all.pages.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..PAGES as u32).collect::<Vec<_>>());
    t.finish(all.handle).unwrap().expect("released");
}
