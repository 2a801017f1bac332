//! Model 6: `fence_rank` races the same rank's own `quiesce` (its ABORT_ACK was in flight
//! when the integrator gave up on it and reset its transport), plus another rank's ACK.
//!
//! Guarantee: the rank's bit is cleared exactly once (by its ACK or by the fence, never
//! both); the room is released exactly once, by the last of the three, and reported once;
//! afterwards a new room naming the fenced rank is refused until it is re-admitted. The
//! ranks' writes all landed before their ACK / the fence (that is the fence's contract), so
//! the releaser can reuse the pages at once.
//!
//! `m6_fence_vs_open` covers the other race of a fence: `open` of a room naming the rank.
//! Either the open is refused (and its room rolled back: nothing leaks), or the room it
//! opened does not wait on the fenced rank (the fence's scan quiesced it): a room is never
//! left waiting on a rank that can no longer answer.
//!
//! `m6_fence_vs_readmit_then_open` models issue 9's finding 1 (a scan still running after
//! `readmit_rank` quiesces a room opened after the readmit). It passes on the fixed library
//! and, because of loom's blind spot (one "last access" per atomic: the scanner's load of
//! the room word is hidden by open's load-then-publish of the same word), it also passes
//! under `--cfg kvfence_unserialized_readmit`, the pre-fix behaviour. That mutation is
//! caught by `tests/scanner_races.rs` on real threads instead; see loom-tests/README.md.
//!
//! Threads: 3 (preemption bound 3) and 2 (exhaustive).
#![cfg(loom)]

mod common;

use common::{assert_at_rest, check, exactly_one, reuse, Arena, A, EXHAUSTIVE};
use kvfence::{Error, Quiesced, Reason};
use loom::thread;

#[test]
fn m6_fence_vs_quiesce_same_rank() {
    check("m6_fence_vs_quiesce_same_rank", 3, Some(3), || {
        let table = common::pool(1, 2);
        let arena = Arena::new(2, 2);
        let both: &[u32] = &[0, 1];
        let a = table.open(both, 2).unwrap();
        let h = a.handle;
        // Both ranks' last writes landed (rank 0's before its transport was torn down).
        arena.write(&a.pages, 0, A);
        arena.write(&a.pages, 1, A);
        let aborted = table.abort(h).expect("first abort");
        assert!(
            aborted.released.is_none(),
            "abort released with ranks pending"
        );
        assert_eq!(&aborted.fanout[..], both);

        let acks: Vec<_> = (0..2u32)
            .map(|rank| {
                let (table, arena) = (table.clone(), arena.clone());
                thread::spawn(move || {
                    let mut out = Vec::new();
                    let cleared = match table.quiesce(h, rank) {
                        Ok(Quiesced::Released(r)) => {
                            out.push(r);
                            reuse(&table, &arena, &mut out);
                            true
                        }
                        Ok(Quiesced::Recorded) => true,
                        // Rank 0 only: the fence got there first (and maybe released).
                        Ok(Quiesced::Duplicate) | Err(Error::StaleHandle) if rank == 0 => false,
                        other => panic!("ACK of rank {rank}: {other:?}"),
                    };
                    (cleared, out)
                })
            })
            .collect();

        let fenced = table.fence_rank(0).unwrap();
        let mut releases = fenced.released.clone();
        if !releases.is_empty() {
            reuse(&table, &arena, &mut releases);
        }
        let mut results = acks.into_iter().map(|t| t.join().unwrap());
        let (ack0_cleared, out0) = results.next().unwrap();
        let (_, out1) = results.next().unwrap();
        releases.extend(out0);
        releases.extend(out1);
        assert!(
            ack0_cleared ^ (fenced.quiesced == 1),
            "rank 0 must be cleared exactly once: by its ACK ({ack0_cleared}) or by the fence \
             ({fenced:?})"
        );
        let r = exactly_one(&releases, h);
        assert_eq!((&r.pages, r.reason), (&a.pages, Reason::Aborted));
        // The fenced rank protects no new room until re-admitted.
        assert_eq!(
            table.open(&[0], 1).unwrap_err(),
            Error::RankFenced { rank: 0 }
        );
        assert!(table.readmit_rank(0).unwrap());
        assert_at_rest(&table, 1, Some(2), 2);
    });
}

#[test]
fn m6_fence_vs_open() {
    check("m6_fence_vs_open", 2, EXHAUSTIVE, || {
        let table = common::pool(1, 2);
        let fencer = {
            let table = table.clone();
            thread::spawn(move || table.fence_rank(0).unwrap())
        };
        let opened = table.open(&[0], 2);
        let fenced = fencer.join().unwrap();
        assert!(
            fenced.released.is_empty(),
            "an OWNED room cannot be released by a fence"
        );
        // Nor queued: a rolled-back room's release is silent, even when the fence's clear
        // of its last writer is the RMW that performs it (cargo-mutants found no test
        // that told `Quiesced::Recorded` from `Queued` there).
        assert_eq!(
            fenced.queued, 0,
            "a fence reported a release it did not queue"
        );
        match opened {
            // Refused, before claiming or after a rollback (the scan may have quiesced the
            // rolled-back room first): nothing may leak either way.
            Err(Error::RankFenced { rank: 0 }) => {
                assert!(fenced.quiesced <= 1);
                // A rolled-back room's release is not counted (no handle was issued).
                assert_at_rest(&table, 1, Some(2), 0);
            }
            Ok(b) => {
                // Rank 0 can no longer answer: B must not wait on it.
                let ab = table.abort(b.handle).unwrap();
                assert!(
                    ab.fanout.is_empty() && ab.released.is_some(),
                    "room opened during a fence still waits on the fenced rank: {ab:?}"
                );
                assert_at_rest(&table, 1, Some(2), 1);
            }
            Err(e) => panic!("open: {e:?}"),
        }
    });
}

#[test]
fn m6_fence_vs_readmit_then_open() {
    check("m6_fence_vs_readmit_then_open", 2, EXHAUSTIVE, || {
        let table = common::pool(1, 2);
        let fencer = {
            let table = table.clone();
            thread::spawn(move || table.fence_rank(0).unwrap())
        };
        // The failure detector re-admits the rank (a new transport) and a request opens a
        // room for that new transport.
        let readmitted = table.readmit_rank(0).unwrap();
        let opened = table.open(&[0], 2);
        let _ = fencer.join().unwrap();
        let mut releases = 0;
        if readmitted {
            // The readmit cleared this fence's bit, so the fence began before the readmit
            // returned, and the open began after: the fence must not touch the room.
            let b = opened.expect("open after readmit");
            let ab = table.abort(b.handle).unwrap();
            assert!(
                ab.released.is_none() && ab.fanout.contains(0),
                "room opened after readmit_rank was stripped by the earlier fence: {ab:?}"
            );
            assert!(matches!(
                table.quiesce(b.handle, 0),
                Ok(kvfence::Quiesced::Released(_))
            ));
            releases = 1;
        } else if let Ok(b) = opened {
            // The readmit ran before the fence: an ordinary fence-vs-open race, so the
            // fence's scan quiesced the room (m6_fence_vs_open).
            let ab = table.abort(b.handle).unwrap();
            assert!(ab.released.is_some(), "{ab:?}");
            releases = 1;
        }
        let _ = table.readmit_rank(0);
        assert_at_rest(&table, 1, Some(2), releases);
    });
}
