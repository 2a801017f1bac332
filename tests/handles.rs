//! Finding 3 of issue 9: a handle that is corrupted, forged, zero, or meant for another
//! table or another process is never taken for a live room.
//!
//! Measured, not assumed: every bit of 10^5 live handles is flipped and each flipped value
//! is used as an ACK (`quiesce`, the call whose misrouting released a room on the old
//! library); live handles are routed to a second table and to a second *process* (this test
//! binary re-run as a child); zero and 10^6 random values are tried. Target: 0 accepted.
//! Each count is printed (`-- --nocapture`).

use kvfence::{Config, Error, Quiesced, RoomHandle, RoomTable};
use std::process::Command;

const ROOMS: usize = if cfg!(miri) { 64 } else { 4096 };

/// A deterministic generator (splitmix64), so a failure names a reproducible value.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn wire(&mut self) -> u128 {
        u128::from(self.next()) << 64 | u128::from(self.next())
    }
}

const WRITERS: [u32; 2] = [0, 1];

/// Opens every room of `t` (each waiting on ranks 0 and 1).
fn fill(t: &RoomTable) -> Vec<RoomHandle> {
    (0..ROOMS)
        .map(|_| t.open(&WRITERS, 1).unwrap().handle)
        .collect()
}

/// Uses `wire` as an ACK on `t`; true if the table took it.
fn accepted(t: &RoomTable, wire: u128) -> bool {
    match t.quiesce(RoomHandle::from_wire(wire), 0) {
        Ok(_) => true,
        Err(Error::InvalidHandle | Error::StaleHandle) => false,
        Err(e) => panic!("unexpected refusal of {wire:#x}: {e}"),
    }
}

#[test]
fn every_one_bit_corruption_of_a_live_handle_is_refused() {
    let t = RoomTable::new(Config::pool(ROOMS, ROOMS)).unwrap();
    let rounds = if cfg!(miri) {
        0
    } else {
        100_000usize.div_ceil(ROOMS)
    };
    let (mut handles, mut tried, mut taken) = (0, 0u64, 0u64);
    for _ in 0..rounds {
        let live = fill(&t);
        for &h in &live {
            for bit in 0..128 {
                tried += 1;
                taken += u64::from(accepted(&t, h.to_wire() ^ 1 << bit));
            }
        }
        handles += live.len();
        // Nothing was recorded anywhere: every room still waits on both ranks.
        let stats = t.stats();
        assert_eq!(stats.rooms.owned, ROOMS);
        for h in live {
            let aborted = t.abort(h).unwrap();
            assert_eq!(
                &aborted.fanout[..],
                &WRITERS,
                "a corrupted ACK was recorded in {h:?}"
            );
            let _ = t.quiesce(h, 0).unwrap();
            assert!(matches!(t.quiesce(h, 1), Ok(Quiesced::Released(_))));
        }
    }
    println!("handles: {handles} live handles x 128 one-bit flips: {taken} of {tried} accepted");
    assert_eq!(taken, 0);
}

#[test]
fn zero_and_random_values_are_refused() {
    let t = RoomTable::new(Config::pool(ROOMS, ROOMS)).unwrap();
    let _live = fill(&t);
    assert!(
        !accepted(&t, 0),
        "the all-zero wire value was taken for a room"
    );
    let mut rng = Rng(7);
    let n = if cfg!(miri) { 100 } else { 1_000_000 };
    let taken = (0..n).filter(|_| accepted(&t, rng.wire())).count();
    // Random low halves with a zero check half: a zero-filled check field.
    let zero_check = (0..n / 10)
        .filter(|_| accepted(&t, u128::from(rng.next())))
        .count();
    println!("handles: zero refused; random: {taken} of {n} accepted; zero check: {zero_check} of {} accepted", n / 10);
    assert_eq!((taken, zero_check), (0, 0));
}

#[test]
fn handles_routed_to_another_table_are_refused() {
    let a = RoomTable::new(Config::pool(ROOMS, ROOMS)).unwrap();
    let b = RoomTable::new(Config::pool(ROOMS, ROOMS)).unwrap();
    let (from_a, _from_b) = (fill(&a), fill(&b));
    let taken = from_a.iter().filter(|h| accepted(&b, h.to_wire())).count();
    println!(
        "handles: {} handles of table A used on table B: {taken} accepted",
        from_a.len()
    );
    assert_eq!(taken, 0);
    assert_eq!(
        b.begin_transfer(from_a[0]).err(),
        Some(Error::InvalidHandle)
    );
}

/// The child half of the cross-process test: prints the handles of this process's first
/// table, one wire value per line. Does nothing unless run as the child.
#[test]
fn child_prints_its_handles() {
    if std::env::var_os("KVFENCE_HANDLE_CHILD").is_none() {
        return;
    }
    let t = RoomTable::new(Config::pool(ROOMS, ROOMS)).unwrap();
    for h in fill(&t) {
        println!("wire {:032x}", h.to_wire());
    }
}

#[test]
fn handles_of_another_process_are_refused() {
    if cfg!(miri) {
        return; // Miri cannot spawn processes.
    }
    // This process's *first* table is the one that matters: a per-process counter gave the
    // first table of every process the same tag before the fix.
    let t = RoomTable::new(Config::pool(ROOMS, ROOMS)).unwrap();
    let _mine = fill(&t);
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_prints_its_handles",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("KVFENCE_HANDLE_CHILD", "1")
        .output()
        .expect("re-run this test binary as the child process");
    assert!(out.status.success(), "child failed: {out:?}");
    let theirs: Vec<u128> = String::from_utf8_lossy(&out.stdout)
        .lines()
        // The harness may print "test ... " on the first line before the output.
        .filter_map(|l| l.find("wire ").map(|at| &l[at + 5..]))
        .map(|hex| u128::from_str_radix(hex.trim(), 16).unwrap())
        .collect();
    assert_eq!(
        theirs.len(),
        ROOMS,
        "child printed {} handles",
        theirs.len()
    );
    let taken = theirs.iter().filter(|&&w| accepted(&t, w)).count();
    println!(
        "handles: {} handles of another process: {taken} accepted",
        theirs.len()
    );
    assert_eq!(taken, 0);
}
