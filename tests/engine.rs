//! The peer behaviours SGLang's disaggregation unit tests pin down
//! (`test/registered/unit/disaggregation/`), each as its own test, through kvfence's
//! gate-mode API as an engine integrates it: the engine owns its KV pages and request
//! slots, opens one room per request with its own page ids, and a scheduler loop drains the
//! release queue and frees what each release hands back (never a quarantined page).

use kvfence::{Config, Error, Outcome, Phase, Quiesced, Reason, Released, RoomHandle, RoomTable};
use std::collections::HashSet;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

/// A decode engine: its page allocator, its request slots, and the kvfence gate.
struct Engine {
    table: Arc<RoomTable>,
    free_pages: Vec<u32>,
    /// Request tokens freed by the scheduler loop, in order (each must appear once).
    freed: Vec<u64>,
    /// Pages the scheduler must never free again (quarantined).
    dead: HashSet<u32>,
    pages: usize,
}

impl Engine {
    fn new(rooms: usize, pages: usize) -> Engine {
        Engine {
            table: Arc::new(RoomTable::new(Config::gate(rooms).release_queue(true)).unwrap()),
            free_pages: (0..pages as u32).rev().collect(),
            freed: Vec::new(),
            dead: HashSet::new(),
            pages,
        }
    }

    /// Pre-allocation: `n` engine pages for request `token`, written by `writers`.
    fn admit(&mut self, token: u64, writers: &[u32], n: usize) -> (RoomHandle, Vec<u32>) {
        let at = self.free_pages.len() - n;
        let pages = self.free_pages.split_off(at);
        let h = self
            .table
            .open_gate(writers, token, pages.clone())
            .expect("admit");
        (h, pages)
    }

    /// One scheduler-loop iteration: drain the release queue and free what it hands back.
    fn tick(&mut self) -> Vec<Released> {
        let mut out = Vec::new();
        self.table.drain_released(&mut out);
        for r in &out {
            assert!(
                !self.freed.contains(&r.token),
                "request {} freed twice",
                r.token
            );
            self.freed.push(r.token);
            if r.reason == Reason::Quarantined {
                self.dead.extend(r.pages.iter().copied());
            } else {
                for &p in &r.pages {
                    assert!(!self.free_pages.contains(&p), "page {p} freed twice");
                }
                self.free_pages.extend(r.pages.iter().copied());
            }
        }
        out
    }

    /// Every page is either free or dead, and no room is left.
    fn assert_settled(&mut self) {
        assert!(self.tick().is_empty());
        assert_eq!(self.free_pages.len() + self.dead.len(), self.pages);
        let s = self.table.stats();
        assert_eq!((s.rooms.owned, s.rooms.held, s.rooms.queued), (0, 0, 0));
    }
}

fn the_one(mut released: Vec<Released>) -> Released {
    assert_eq!(released.len(), 1, "{released:?}");
    released.pop().unwrap()
}

/// SGLang: the decode side frees an aborted request's KV only after *every* required
/// prefill rank has acknowledged the abort; each ACK but the last leaves it held.
#[test]
fn release_only_after_every_required_rank_acks() {
    let mut e = Engine::new(8, 64);
    let (h, pages) = e.admit(17, &[0, 1, 2, 3], 16);
    assert_eq!(&e.table.abort(h).unwrap().fanout[..], &[0, 1, 2, 3]);
    for rank in [2, 0, 3] {
        assert_eq!(e.table.quiesce(h, rank).unwrap(), Quiesced::Recorded);
        assert!(e.tick().is_empty(), "freed before rank 1 acknowledged");
        assert_eq!(e.table.phase(h).unwrap(), Phase::Aborting);
    }
    assert_eq!(e.free_pages.len(), 48);
    assert_eq!(e.table.quiesce(h, 1).unwrap(), Quiesced::Queued);
    let r = the_one(e.tick());
    assert_eq!((r.token, &r.pages, r.reason), (17, &pages, Reason::Aborted));
    e.assert_settled();
}

/// SGLang: a duplicated ACK from one rank is counted once; it never stands in for
/// another rank's.
#[test]
fn duplicate_ack_counts_once() {
    let mut e = Engine::new(8, 64);
    let (h, _) = e.admit(1, &[0, 1], 4);
    let _ = e.table.abort(h).unwrap();
    assert_eq!(e.table.quiesce(h, 0).unwrap(), Quiesced::Recorded);
    for _ in 0..3 {
        assert_eq!(e.table.quiesce(h, 0).unwrap(), Quiesced::Duplicate);
        assert!(e.tick().is_empty(), "a duplicate counted for rank 1");
    }
    assert_eq!(&e.table.room_status(h).unwrap().waiting_on[..], &[1]);
    assert_eq!(e.table.stats().duplicate_acks, 3);
    assert_eq!(e.table.quiesce(h, 1).unwrap(), Quiesced::Queued);
    assert_eq!(the_one(e.tick()).token, 1);
    e.assert_settled();
}

/// SGLang: an ACK that arrives before the abort is registered (a rank reporting "done"
/// early) is recorded, and the count is still right once the room is armed: the abort's
/// fan-out leaves that rank out, and only the others are waited for.
#[test]
fn ack_before_the_room_is_armed_is_recorded_and_counts() {
    let mut e = Engine::new(8, 64);
    let (h, _) = e.admit(2, &[0, 1, 2], 4);
    assert_eq!(e.table.quiesce(h, 1).unwrap(), Quiesced::Recorded);
    assert_eq!(
        e.table.phase(h).unwrap(),
        Phase::Owned,
        "an early ACK does not close"
    );
    let aborted = e.table.abort(h).unwrap();
    assert_eq!(&aborted.fanout[..], &[0, 2]);
    assert_eq!(e.table.quiesce(h, 1).unwrap(), Quiesced::Duplicate);
    assert_eq!(e.table.quiesce(h, 0).unwrap(), Quiesced::Recorded);
    assert!(e.tick().is_empty());
    assert_eq!(e.table.quiesce(h, 2).unwrap(), Quiesced::Queued);
    assert_eq!(the_one(e.tick()).token, 2);
    // Every rank early: the abort itself performs the release (queued).
    let (h, _) = e.admit(3, &[0, 1], 4);
    assert_eq!(e.table.quiesce(h, 0).unwrap(), Quiesced::Recorded);
    assert_eq!(e.table.quiesce(h, 1).unwrap(), Quiesced::Recorded);
    let aborted = e.table.abort(h).unwrap();
    assert!(aborted.fanout.is_empty() && aborted.released.is_none());
    assert_eq!(the_one(e.tick()).token, 3);
    e.assert_settled();
}

/// SGLang: a late ACK for a request that was already released must not touch the room
/// index that now serves another request.
#[test]
fn late_ack_after_release_does_not_touch_a_reused_room() {
    let mut e = Engine::new(1, 16); // one room: the next request reuses the index
    let (old, _) = e.admit(10, &[0, 1], 4);
    let _ = e.table.abort(old).unwrap();
    let _ = e.table.quiesce(old, 0).unwrap();
    let _ = e.table.quiesce(old, 1).unwrap();
    assert_eq!(the_one(e.tick()).token, 10);
    let (new, _) = e.admit(11, &[0, 1], 4);
    assert_eq!(new.index(), old.index());
    // Rank 1's ACK is delivered twice by the transport; the copy arrives now.
    assert_eq!(e.table.quiesce(old, 1), Err(Error::StaleHandle));
    assert_eq!(e.table.quiesce(old, 0), Err(Error::StaleHandle));
    assert_eq!(&e.table.room_status(new).unwrap().waiting_on[..], &[0, 1]);
    assert_eq!(&e.table.abort(new).unwrap().fanout[..], &[0, 1]);
    assert_eq!(e.table.quiesce(new, 1).unwrap(), Quiesced::Recorded);
    assert!(
        e.tick().is_empty(),
        "the late ACK must not have counted for the new request"
    );
    assert_eq!(e.table.quiesce(new, 0).unwrap(), Quiesced::Queued);
    assert_eq!(the_one(e.tick()).token, 11);
    e.assert_settled();
}

/// SGLang: registering a room again (a new request on the same room id) resets its ACKs:
/// what the previous lifecycle's ranks acknowledged does not carry over.
#[test]
fn re_registering_a_room_resets_its_acks() {
    let mut e = Engine::new(1, 16);
    let (first, _) = e.admit(20, &[0, 1, 2], 4);
    // Ranks 0 and 1 finish their transfers for the first request; it completes normally.
    assert_eq!(e.table.quiesce(first, 0).unwrap(), Quiesced::Recorded);
    assert_eq!(e.table.quiesce(first, 1).unwrap(), Quiesced::Recorded);
    assert_eq!(e.table.finish(first).unwrap(), None);
    assert_eq!(e.table.quiesce(first, 2).unwrap(), Quiesced::Queued);
    assert_eq!(the_one(e.tick()).reason, Reason::Finished);
    // The same room index, registered again: every rank pending again.
    let (second, _) = e.admit(21, &[0, 1, 2], 4);
    assert_eq!(second.index(), first.index());
    let st = e.table.room_status(second).unwrap();
    assert_eq!(
        (&st.waiting_on[..], st.phase),
        (&[0, 1, 2][..], Phase::Owned)
    );
    assert_eq!(&e.table.abort(second).unwrap().fanout[..], &[0, 1, 2]);
    assert_eq!(e.table.quiesce(second, 2).unwrap(), Quiesced::Recorded);
    assert!(
        e.tick().is_empty(),
        "ranks 0 and 1 acknowledged the previous request only"
    );
    assert_eq!(e.table.quiesce(second, 0).unwrap(), Quiesced::Recorded);
    assert_eq!(e.table.quiesce(second, 1).unwrap(), Quiesced::Queued);
    assert_eq!(the_one(e.tick()).token, 21);
    e.assert_settled();
}

/// SGLang: an ACK carrying an older generation of a room is ignored once the room was
/// reused, however many generations back it is, and whatever rank it names.
#[test]
fn stale_generation_ack_is_ignored_after_room_reuse() {
    let mut e = Engine::new(1, 16);
    let mut old: Vec<RoomHandle> = Vec::new();
    for token in 0..20u64 {
        let (h, _) = e.admit(token, &[0, 1], 2);
        for &stale in &old {
            for rank in [0, 1] {
                assert_eq!(e.table.quiesce(stale, rank), Err(Error::StaleHandle));
            }
        }
        let st = e.table.room_status(h).unwrap();
        assert_eq!(
            &st.waiting_on[..],
            &[0, 1],
            "a stale ACK touched lifecycle {token}"
        );
        let _ = e.table.abort(h).unwrap();
        assert_eq!(e.table.quiesce(h, 0).unwrap(), Quiesced::Recorded);
        assert_eq!(e.table.quiesce(h, 1).unwrap(), Quiesced::Queued);
        assert_eq!(the_one(e.tick()).token, token);
        old.push(h);
    }
    assert_eq!(e.table.stats().stale_refused, 2 * (19 * 20 / 2));
    e.assert_settled();
}

/// SGLang: the room is held until drained; then it is released once and its index freed
/// (here: the release decided on the ACK thread is acted on by the scheduler loop; until
/// then the index is not reusable; a waiter wakes once it is decided, and may drain).
#[test]
fn hold_until_drained_then_release_once_and_free_the_index() {
    let mut e = Engine::new(1, 16);
    let (h, pages) = e.admit(30, &[5], 8);
    let _ = e.table.abort(h).unwrap();
    assert_eq!(e.table.quiesce(h, 5).unwrap(), Quiesced::Queued);
    assert_eq!(e.table.queued_releases(), 1);
    assert_eq!(
        e.table.open_gate(&[], 31, vec![]).err(),
        Some(Error::RoomTableFull),
        "the index is not free before the scheduler drained the release"
    );
    // Decided and queued: the scheduler's wait ends, then it drains (issue 18 item 9).
    assert_eq!(
        e.table.wait_released_timeout(h, Duration::from_millis(10)),
        Ok(true)
    );
    assert_eq!(e.free_pages.len(), 8, "pages still the request's");
    let r = the_one(e.tick());
    assert_eq!((r.token, r.pages), (30, pages));
    assert!(e.tick().is_empty(), "released once");
    assert_eq!(e.table.wait_released_timeout(h, Duration::ZERO), Ok(true));
    let (next, _) = e.admit(31, &[], 1);
    assert_eq!(next.index(), h.index());
    let _ = e.table.finish(next).unwrap();
    assert_eq!(the_one(e.tick()).token, 31);
    e.assert_settled();
}

/// SGLang: a failing release is isolated and not retried by time. A request whose
/// transfer failed stays held (its pages are not freed) through any number of scheduler
/// iterations and any time, while other requests come and go; it ends only when its peer
/// is fenced, or it is quarantined (then its pages are never freed).
#[test]
fn failing_release_is_isolated_and_not_retried_by_time() {
    let mut e = Engine::new(8, 64);
    let (bad, bad_pages) = e.admit(40, &[0], 4);
    let (lost, lost_pages) = e.admit(41, &[0], 4);
    assert!(e.table.begin_transfer_to(bad, 7).unwrap().fail().is_none());
    let dropped = e.table.begin_transfer(lost).unwrap();
    drop(dropped); // no outcome and no peer: failed, only a quarantine can end it
    for h in [bad, lost] {
        let _ = e.table.abort(h).unwrap();
        assert_eq!(e.table.quiesce(h, 0).unwrap(), Quiesced::Recorded);
    }
    // Other requests keep flowing through the same table.
    for token in 100..110u64 {
        let (h, _) = e.admit(token, &[0], 2);
        let _ = e.table.abort(h).unwrap();
        assert_eq!(e.table.quiesce(h, 0).unwrap(), Quiesced::Queued);
        assert_eq!(the_one(e.tick()).token, token);
        std::thread::sleep(Duration::from_millis(2));
    }
    for h in [bad, lost] {
        let st = e.table.room_status(h).unwrap();
        assert_eq!((st.phase, st.failed), (Phase::Aborting, 1));
        assert!(st.waiting_on.is_empty());
        assert!(
            st.closing_for >= Duration::from_millis(15),
            "{:?}",
            st.closing_for
        );
    }
    assert!(!e.freed.contains(&40) && !e.freed.contains(&41));
    assert_eq!(e.table.stats().failed_transfers, 2);
    // The failed transfer's peer is fenced (its QP reset): released once, pages freed.
    let fenced = e.table.fence_rank(7).unwrap();
    assert_eq!(
        (fenced.failed_ended, fenced.released.len()),
        (1, 0),
        "queued"
    );
    let r = the_one(e.tick());
    assert_eq!(
        (r.token, &r.pages, r.reason),
        (40, &bad_pages, Reason::Aborted)
    );
    assert_eq!(e.table.phase(lost).unwrap(), Phase::Aborting, "isolated");
    // No peer to fence: quarantine. The index comes back, the pages never do.
    assert_eq!(e.table.quarantine(lost).unwrap(), None);
    let r = the_one(e.tick());
    assert_eq!(
        (r.token, &r.pages, r.reason),
        (41, &lost_pages, Reason::Quarantined)
    );
    for p in &lost_pages {
        assert!(!e.free_pages.contains(p), "quarantined page {p} was freed");
    }
    assert_eq!(e.table.stats().quarantined_pages, 4);
    e.assert_settled();
}

/// SGLang: a prefill worker that skips the remaining chunks of an aborted request (its
/// queued chunk transfers are refused once the abort is registered) still acknowledges
/// the abort, without writing, and the release follows.
#[test]
fn worker_that_skips_chunks_after_abort_still_acks() {
    let mut e = Engine::new(4, 64);
    let (h, _) = e.admit(50, &[3], 8);
    // The worker's queue: 4 chunk writes. Chunk 0 is sent before the abort arrives.
    let mut written = 0;
    let g = e.table.begin_transfer_to(h, 3).unwrap();
    written += 1;
    assert!(g.complete().is_none());
    let aborted = e.table.abort(h).unwrap();
    assert!(aborted.fanout.contains(3));
    let mut skipped = 0;
    for _chunk in 1..4 {
        match e.table.begin_transfer_to(h, 3) {
            Ok(g) => {
                written += 1;
                let _ = g.complete();
            }
            Err(Error::RoomClosed {
                phase: Phase::Aborting,
            }) => skipped += 1,
            Err(err) => panic!("{err}"),
        }
    }
    assert_eq!(
        (written, skipped),
        (1, 3),
        "no chunk may start after the abort"
    );
    assert!(e.tick().is_empty());
    // The worker ACKs though it skipped its chunks.
    assert_eq!(e.table.quiesce(h, 3).unwrap(), Quiesced::Queued);
    assert_eq!(the_one(e.tick()).token, 50);
    // Token form (a Python worker): refused the same way.
    let (h, _) = e.admit(51, &[3], 2);
    let _ = e.table.abort(h).unwrap();
    assert!(matches!(
        e.table.begin(h, Some(3)),
        Err(Error::RoomClosed { .. })
    ));
    assert_eq!(e.table.quiesce(h, 3).unwrap(), Quiesced::Queued);
    assert_eq!(the_one(e.tick()).token, 51);
    e.assert_settled();
}

/// SGLang: `clear()` keeps the ACK target while a transfer is outstanding. Here: a room
/// with an in-flight transfer stays held after every ACK, until the transfer completes.
#[test]
fn clear_keeps_the_ack_target_while_a_transfer_is_outstanding() {
    let mut e = Engine::new(4, 64);
    let (h, _) = e.admit(60, &[0, 1], 4);
    let transfer = e.table.begin(h, Some(1)).unwrap(); // token form, still in flight
    let _ = e.table.abort(h).unwrap();
    assert_eq!(e.table.quiesce(h, 0).unwrap(), Quiesced::Recorded);
    assert_eq!(e.table.quiesce(h, 1).unwrap(), Quiesced::Recorded);
    for _ in 0..3 {
        assert!(e.tick().is_empty(), "released with a transfer outstanding");
    }
    let st = e.table.room_status(h).unwrap();
    assert_eq!((st.transfers, st.waiting_on.len()), (1, 0));
    assert_eq!(
        e.table.end(transfer, Outcome::Completed),
        Ok(None),
        "queued"
    );
    assert_eq!(the_one(e.tick()).token, 60);
    e.assert_settled();
}

/// SGLang: a drain ACK fans out to every aborting decode rank: the abort's fan-out lists
/// every writer still pending (all 64, any ids), and each one's ACK is needed.
#[test]
fn drain_ack_fans_out_to_every_aborting_decode_rank() {
    let mut e = Engine::new(4, 64);
    let ranks: Vec<u32> = (0..64u32).map(|i| i * 0x0300_0001 + 5).collect();
    let (h, _) = e.admit(70, &ranks, 4);
    let aborted = e.table.abort(h).unwrap();
    assert_eq!(&aborted.fanout[..], &ranks[..], "every writer must be told");
    // Send the drain to each rank in the fan-out; each ACKs.
    let fanout: Vec<u32> = aborted.fanout.to_vec();
    for (i, &rank) in fanout.iter().enumerate().rev() {
        let q = e.table.quiesce(h, rank).unwrap();
        if i == 0 {
            assert_eq!(q, Quiesced::Queued);
        } else {
            assert_eq!(q, Quiesced::Recorded);
            assert!(
                e.tick().is_empty(),
                "released with {i} ranks still draining"
            );
        }
    }
    assert_eq!(the_one(e.tick()).token, 70);
    // A rank that finished before the abort is not in the fan-out; the rest are.
    let (h, _) = e.admit(71, &ranks[..8], 4);
    assert_eq!(e.table.quiesce(h, ranks[3]).unwrap(), Quiesced::Recorded);
    let aborted = e.table.abort(h).unwrap();
    let expect: Vec<u32> = ranks[..8]
        .iter()
        .copied()
        .filter(|&r| r != ranks[3])
        .collect();
    assert_eq!(&aborted.fanout[..], &expect[..]);
    for &r in &expect {
        let _ = e.table.quiesce(h, r).unwrap();
    }
    assert_eq!(the_one(e.tick()).token, 71);
    e.assert_settled();
}

/// SGLang: after the first transfer of a request fails, a sibling transfer still running
/// is drained (it completes normally); the room then still waits for the failed one's peer
/// to be fenced.
#[test]
fn running_sibling_transfer_is_drained_after_the_first_failure() {
    let mut e = Engine::new(4, 64);
    let (h, _) = e.admit(80, &[1, 2], 8);
    let first = e.table.begin_transfer_to(h, 1).unwrap();
    let sibling = e.table.begin_transfer_to(h, 2).unwrap();
    assert!(first.fail().is_none());
    let _ = e.table.abort(h).unwrap();
    assert_eq!(e.table.room_status(h).unwrap().transfers, 2);
    assert!(
        sibling.complete().is_none(),
        "the sibling drains; the failure still holds"
    );
    assert_eq!(e.table.quiesce(h, 1).unwrap(), Quiesced::Recorded);
    assert_eq!(e.table.quiesce(h, 2).unwrap(), Quiesced::Recorded);
    assert!(e.tick().is_empty());
    let st = e.table.room_status(h).unwrap();
    assert_eq!((st.transfers, st.failed), (1, 1));
    // Fencing the sibling's peer does not end the failed transfer; its own peer's does.
    assert_eq!(e.table.fence_rank(2).unwrap().failed_ended, 0);
    assert!(e.tick().is_empty());
    assert_eq!(e.table.fence_rank(1).unwrap().failed_ended, 1);
    assert_eq!(the_one(e.tick()).token, 80);
    e.assert_settled();
}

/// SGLang: on abort, the prefill side waits for its native transfer worker to finish the
/// write in flight before it ACKs; the release comes only after the last transfer
/// completes, however early the ACKs arrive.
#[test]
fn abort_waits_for_the_native_worker_before_it_acks() {
    let mut e = Engine::new(4, 64);
    let (h, _) = e.admit(90, &[4, 5], 8);
    // Rank 5's native worker has a write in flight on another thread.
    let guard = RoomTable::begin_transfer_owned(&e.table, h, Some(5)).unwrap();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let table = Arc::clone(&e.table);
    let worker = std::thread::spawn(move || {
        go_rx.recv().unwrap(); // the write is still on the wire until now
        let released = guard.complete(); // the release (if any) is queued
                                         // Only now, after its worker finished, does rank 5 ACK the abort.
        let ack = table.quiesce(h, 5).unwrap();
        (released, ack)
    });
    let aborted = e.table.abort(h).unwrap();
    assert_eq!(&aborted.fanout[..], &[4, 5]);
    // Rank 4 (no write in flight) ACKs at once.
    assert_eq!(e.table.quiesce(h, 4).unwrap(), Quiesced::Recorded);
    for _ in 0..5 {
        assert!(
            e.tick().is_empty(),
            "released while the native worker was writing"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(e.table.room_status(h).unwrap().transfers, 1);
    go_tx.send(()).unwrap();
    let (released, ack) = worker.join().unwrap();
    assert_eq!(released, None, "a release goes to the queue");
    assert_eq!(
        ack,
        Quiesced::Queued,
        "the ACK after the write is the last thing"
    );
    assert_eq!(the_one(e.tick()).token, 90);

    // The same when the ACK races ahead of the worker's completion: held until it ends.
    let (h, _) = e.admit(91, &[5], 2);
    let guard = RoomTable::begin_transfer_owned(&e.table, h, Some(5)).unwrap();
    let _ = e.table.abort(h).unwrap();
    assert_eq!(e.table.quiesce(h, 5).unwrap(), Quiesced::Recorded);
    assert!(e.tick().is_empty());
    let done = std::thread::spawn(move || guard.end(Outcome::Completed))
        .join()
        .unwrap();
    assert_eq!(done, None);
    assert_eq!(the_one(e.tick()).token, 91);
    e.assert_settled();
}

/// `finish_drained`: a successful transfer's end in one call. With a release queue the
/// release is still returned (the caller acts on it), not queued.
#[test]
fn finish_drained_releases_at_once_and_bypasses_the_queue() {
    let t = RoomTable::new(Config::gate(4).release_queue(true)).unwrap();
    let h = t.open_gate(&[3, 5, 9], 42, vec![7, 8]).unwrap();
    assert_eq!(t.quiesce(h, 5).unwrap(), Quiesced::Recorded); // one writer already said so
    let r = t.finish_drained(h).unwrap().expect("released by this call");
    assert_eq!((r.handle, r.token, r.reason), (h, 42, Reason::Finished));
    assert_eq!(r.pages, vec![7, 8]);
    assert_eq!(t.queued_releases(), 0, "the release was also queued");
    assert!(matches!(t.finish_drained(h), Err(Error::StaleHandle)));
    assert!(matches!(t.quiesce(h, 3), Err(Error::StaleHandle)));
}

/// A transfer still holding the room: `finish_drained` quiesces and finishes, and the
/// transfer's end releases it (queued, as the table is configured).
#[test]
fn finish_drained_under_a_transfer_releases_when_it_ends() {
    let t = RoomTable::new(Config::gate(4).release_queue(true)).unwrap();
    let h = t.open_gate(&[0], 1, vec![]).unwrap();
    let guard = t.begin_transfer(h).unwrap();
    assert!(t.finish_drained(h).unwrap().is_none());
    assert_eq!(t.phase(h).unwrap(), Phase::Draining);
    assert!(guard.complete().is_none());
    let mut out = Vec::new();
    t.drain_released(&mut out);
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].handle, out[0].reason), (h, Reason::Finished));
}

/// An aborted (or finished) room is refused and nothing is quiesced: an abort's release
/// still waits for its writers' ACKs.
#[test]
fn finish_drained_refuses_a_closed_room_and_quiesces_nothing() {
    let t = RoomTable::new(Config::gate(4)).unwrap();
    let h = t.open_gate(&[0, 1], 1, vec![]).unwrap();
    let _ = t.abort(h).unwrap();
    assert!(matches!(t.finish_drained(h), Err(Error::AlreadyAborted)));
    assert_eq!(t.phase(h).unwrap(), Phase::Aborting);
    assert_eq!(t.quiesce(h, 0).unwrap(), Quiesced::Recorded);
    assert!(matches!(t.quiesce(h, 1).unwrap(), Quiesced::Released(_)));
    let g = t.open_gate(&[0], 2, vec![]).unwrap();
    assert!(t.finish(g).unwrap().is_none());
    assert!(matches!(t.finish_drained(g), Err(Error::AlreadyFinished)));
    assert_eq!(t.phase(g).unwrap(), Phase::Draining);
}
