//! A sequential reference model of the kvfence protocol, the operation generator, and the
//! step checker that drives the library and the model side by side.
//!
//! Shared by `tests/prop_ops.rs` (stable, `cargo test`) and the fuzz targets in `fuzz/`
//! (`#[path = "../../tests/model/mod.rs"] mod model;`).
//!
//! The model is deliberately plain: vectors and sets, no atomics, one thread. It knows both
//! modes (pool: kvfence owns pages `0..pages`; gate: the engine's token and page ids), the
//! release queue (on for every release, or forced for a guard's drop), growing rooms, the
//! three ways a transfer ends (completed, failed, guard dropped = failed) in its three forms
//! (borrowed guard, owned guard, integer token), failed transfers holding their room until
//! their peer is fenced or the room quarantined, abort of a draining room, quarantine, and
//! fenced ranks (bounded by `max_fenced`). It predicts every call's result exactly (the `Ok`
//! value or the `Error` variant with its fields). Where the library's choice is arbitrary
//! (which room index `open` claims, which pool pages it hands out, which token slot `begin`
//! uses) the model checks the choice is *legal* (the index is claimable, the generation is
//! the index's current one, the pages are distinct and free, the token is not in use) and
//! adopts it.
//!
//! Invariants checked after every step ([`Harness::check`]): `stats()` equals the model's
//! occupancy (rooms and pages free / owned / held / queued, the closing rooms with their
//! pending ranks, transfers and failed transfers, fenced ranks, every event counter,
//! quarantined rooms and pages) and `queued_releases()` the model's queue; the model's own
//! conservation (every pool page is in exactly one place: free, one room, a queued release,
//! or quarantined for good). Every release is delivered exactly once: each return value and
//! each drained release is compared with the model's, and a lifecycle delivered twice is a
//! failure. A failed transfer is never released before its peer is fenced or its room
//! quarantined (the model holds the room until then, so an earlier release diverges), and a
//! quarantined room's pool pages are never handed out again (`open`/`grow` may only return
//! pages the model has free).
#![allow(dead_code)]

use arbitrary::{Arbitrary, Unstructured};
use kvfence::{
    Config, Error, Fenced, Outcome, OwnedTransferGuard, Phase, Quiesced, Reason, Released,
    RoomHandle, RoomTable, TransferGuard, TransferToken, MAX_WRITERS,
};
use std::collections::{BTreeSet, HashSet};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

/// Rank ids the generator draws from: small ones, both sides of the 32-position mask-word
/// boundary, large ones, and `u32::MAX` (never a rank id: `InvalidRank`).
pub const RANKS: [u32; 16] = [
    0,
    1,
    2,
    3,
    4,
    5,
    7,
    31,
    32,
    63,
    64,
    1_000_042,
    0x8000_0000,
    0xDEAD_BEEF,
    u32::MAX - 1,
    u32::MAX,
];

/// Builds a handle through the documented wire layout (`src/handle.rs`: generation in bits
/// 0..32, index in 32..64, check in 64..128) with the check of `like`: a handle whose index
/// or generation was corrupted but whose check half survived.
pub fn forge(index: usize, gen: u32, like: RoomHandle) -> RoomHandle {
    let check = like.to_wire() >> 64;
    RoomHandle::from_wire(check << 64 | ((index as u128) & 0xFFFF_FFFF) << 32 | u128::from(gen))
}

/// The table: mode, sizes, release queue, fenced and token limits. Small, so that capacity
/// limits (rooms, pool, fenced ranks, tokens), reuse and bitmap-word boundaries are reached.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub struct Setup {
    mode: u8,
    rooms: u8,
    pages: u8,
    fenced: u8,
    tokens: u8,
}

impl Setup {
    /// A pool-mode setup of `rooms` (1..=6) rooms and `pages` (1..=140) pages.
    pub fn pool(rooms: u8, pages: u8, queue: bool) -> Setup {
        Setup {
            mode: if queue { 2 } else { 0 },
            rooms: rooms - 1,
            pages: pages - 1,
            fenced: 5,
            tokens: 7,
        }
    }

    /// A gate-mode setup of `rooms` (1..=6) rooms.
    pub fn gate(rooms: u8, queue: bool) -> Setup {
        Setup {
            mode: if queue { 3 } else { 1 },
            rooms: rooms - 1,
            pages: 0,
            fenced: 5,
            tokens: 7,
        }
    }

    /// Pool (even `mode`) or gate, release queue on `mode & 2`; 1..=6 rooms, 1..=140 pool
    /// pages (crosses the 64-bit bitmap words), 1..=6 fenced ranks, 1..=8 tokens.
    pub fn config(&self) -> Config {
        let rooms = 1 + self.rooms as usize % 6;
        let base = if self.mode & 1 == 0 {
            Config::pool(rooms, 1 + self.pages as usize % 140)
        } else {
            Config::gate(rooms)
        };
        base.release_queue(self.mode & 2 != 0)
            .max_fenced(1 + self.fenced as usize % 6)
            .max_tokens(1 + self.tokens as usize % 8)
    }
}

/// One operation. Selectors (`room`, `guard`, `rank`, ...) are interpreted against the
/// current state so that most operations hit something real; some deliberately do not.
/// Decoded with weights (see the `Arbitrary` impl): opens and transfers are frequent, the
/// operations that end rooms or ranks for good less so, so that rooms live long enough to
/// carry transfers, failures and ACKs.
#[derive(Clone, Debug)]
pub enum Op {
    /// `open` (pool) or `open_gate` (gate); `kind % 8 == 0` calls the other mode's. The
    /// writer list: empty, one, a few, 33 (two mask words), 64, or a bad one (65 writers,
    /// a duplicate, `u32::MAX`). Pool pages: 0..=24, or 255: more than the pool.
    Open {
        kind: u8,
        width: u8,
        seed: u32,
        pages: u8,
        token: u64,
    },
    /// `grow` / `grow_gate` (`n == 255`: more than the pool).
    Grow { room: u8, n: u8, seed: u32 },
    /// `pages_of`.
    PagesOf { room: u8 },
    /// A transfer: `form % 5`: borrowed guard, borrowed guard with peer, owned guard, token,
    /// token with peer.
    Begin { room: u8, peer: u8, form: u8 },
    /// End a guard: `how % 4`: complete (twice as likely), fail, drop.
    End { guard: u8, how: u8 },
    /// End a token: complete, fail, end an ended token again, a forged token, end twice.
    EndToken { token: u8, how: u8, wire: u64 },
    /// `quiesce`: a pending rank of the room, one of the lifecycle's writers (maybe a
    /// duplicate, maybe of an earlier lifecycle), or any rank id.
    Quiesce { room: u8, rank: u8 },
    /// Quiesce every pending rank of the room (drives rooms to release).
    Drain { room: u8 },
    /// `abort`.
    Abort { room: u8 },
    /// `finish`.
    Finish { room: u8 },
    /// `finish_drained`.
    FinishDrained { room: u8 },
    /// `quarantine`.
    Quarantine { room: u8 },
    /// `fence_rank`: a failed transfer's peer, a writer of a live room, or any rank id.
    Fence { rank: u8 },
    /// `readmit_rank`: a fenced rank or any rank id.
    Readmit { rank: u8 },
    /// `phase`.
    Phase { room: u8 },
    /// `room_status`.
    Status { room: u8 },
    /// `pop_released`.
    Pop,
    /// `drain_released`.
    DrainReleased,
    /// An operation with a forged handle (raw wire value, a known handle's check with
    /// another index or generation, a known handle with one flipped bit, a token's wire).
    Forged {
        how: u8,
        wire: u64,
        action: u8,
        rank: u8,
    },
    /// `wait_released` (only where the model says it returns at once) or
    /// `wait_released_timeout(0)`.
    WaitReleased { room: u8, timed: bool },
    /// `wait_idle` (only where the model says nothing is live or queued) or
    /// `wait_idle_timeout(0)`.
    WaitIdle { timed: bool },
}

impl<'a> Arbitrary<'a> for Op {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Op> {
        let room = |u: &mut Unstructured<'a>| u.arbitrary::<u8>();
        Ok(match u.arbitrary::<u8>()? % 36 {
            0..=5 => Op::Open {
                kind: u.arbitrary()?,
                width: u.arbitrary()?,
                seed: u.arbitrary()?,
                pages: u.arbitrary()?,
                token: u.arbitrary()?,
            },
            6 => Op::Grow {
                room: room(u)?,
                n: u.arbitrary()?,
                seed: u.arbitrary()?,
            },
            7 => Op::PagesOf { room: room(u)? },
            8..=12 => Op::Begin {
                room: room(u)?,
                peer: u.arbitrary()?,
                form: u.arbitrary()?,
            },
            13..=15 => Op::End {
                guard: u.arbitrary()?,
                how: u.arbitrary()?,
            },
            16 | 17 => Op::EndToken {
                token: u.arbitrary()?,
                how: u.arbitrary()?,
                wire: u.arbitrary()?,
            },
            18..=20 => Op::Quiesce {
                room: room(u)?,
                rank: u.arbitrary()?,
            },
            21 => Op::Drain { room: room(u)? },
            22 | 23 => Op::Abort { room: room(u)? },
            24 if u.arbitrary::<bool>()? => Op::Finish { room: room(u)? },
            24 => Op::FinishDrained { room: room(u)? },
            25 => Op::Quarantine { room: room(u)? },
            26 => Op::Fence {
                rank: u.arbitrary()?,
            },
            27 => Op::Readmit {
                rank: u.arbitrary()?,
            },
            28 => Op::Phase { room: room(u)? },
            29 => Op::Status { room: room(u)? },
            30 => Op::Pop,
            31 => Op::DrainReleased,
            32 | 33 => Op::Forged {
                how: u.arbitrary()?,
                wire: u.arbitrary()?,
                action: u.arbitrary()?,
                rank: u.arbitrary()?,
            },
            34 => Op::WaitReleased {
                room: room(u)?,
                timed: u.arbitrary()?,
            },
            _ => Op::WaitIdle {
                timed: u.arbitrary()?,
            },
        })
    }
}

/// A transfer in flight (guard or token): its room's lifecycle and peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transfer {
    index: usize,
    gen: u32,
    peer: Option<u32>,
}

/// A room's current lifecycle in the model.
#[derive(Clone, Debug)]
struct Room {
    handle: RoomHandle,
    phase: Phase,
    token: u64,
    pages: Vec<u32>,
    writers: Vec<u32>,
    /// `pending[p]`: the writer at position `p` has not quiesced.
    pending: Vec<bool>,
    /// Transfers in flight (guards and tokens not ended).
    in_flight: u32,
    /// Failed transfers holding the room.
    failed: u32,
    quarantined: bool,
}

impl Room {
    /// Mask words (32 positions each) with a pending writer: each owns one hold.
    fn words(&self) -> u32 {
        self.pending
            .chunks(32)
            .filter(|w| w.iter().any(|&p| p))
            .count() as u32
    }

    fn holds(&self) -> u32 {
        self.in_flight + self.failed + self.words()
    }

    fn waiting_on(&self) -> Vec<u32> {
        self.writers
            .iter()
            .zip(&self.pending)
            .filter(|(_, &p)| p)
            .map(|(&r, _)| r)
            .collect()
    }
}

#[derive(Clone, Debug, Default)]
struct Slot {
    gen: u32,
    live: Option<Room>,
    /// A release decided but waiting in the release queue (the index stays claimed).
    queued: Option<Released>,
}

/// What a step that may release did.
#[derive(Debug)]
enum Decision {
    Held,
    Delivered(Released),
    Queued,
}

impl Decision {
    fn delivered(self) -> Option<Released> {
        match self {
            Decision::Delivered(r) => Some(r),
            _ => None,
        }
    }
}

/// What `room_status` reports, less `closing_for` (time).
pub type StatusView = (RoomHandle, Phase, Vec<u32>, u32, u32, usize, bool);

/// The reference model.
#[derive(Debug)]
pub struct Model {
    config: Config,
    gate: bool,
    /// Every handle the table has issued: the only values its check accepts (a value it did
    /// not issue matches a check with probability 2^-64, see `src/handle.rs`).
    issued: HashSet<RoomHandle>,
    /// Every issued lifecycle with its writer list, in issue order.
    lifecycles: Vec<(RoomHandle, Vec<u32>)>,
    slots: Vec<Slot>,
    /// Pool mode: pages in the pool.
    free_pages: BTreeSet<u32>,
    /// Pool mode: pages of delivered quarantined releases, out of the pool for good.
    lost_pages: BTreeSet<u32>,
    /// Fenced ranks, in fencing order.
    fenced: Vec<u32>,
    /// Failed transfers holding their rooms, in the order they failed.
    failed: Vec<Transfer>,
    /// Token-form transfers in flight.
    tokens: Vec<(TransferToken, Transfer)>,
    /// Tokens already ended (ending one again is `InvalidToken`).
    ended_tokens: Vec<TransferToken>,
    releases: u64,
    stale: u64,
    duplicates: u64,
    failed_transfers: u64,
    quarantined_rooms: u64,
    quarantined_pages: u64,
    /// Every lifecycle delivered so far: a second delivery is a bug.
    delivered: HashSet<RoomHandle>,
    opened: u64,
}

type Check = Result<(), String>;

fn same<T: PartialEq + Debug>(what: &str, lib: &T, model: &T) -> Check {
    if lib == model {
        Ok(())
    } else {
        Err(format!("{what}: library {lib:?}, model {model:?}"))
    }
}

/// The writer-list rules (`Error::TooManyWriters`, `InvalidRank`, `DuplicateWriter`, in
/// list order).
fn check_writers(writers: &[u32]) -> Result<(), Error> {
    if writers.len() > MAX_WRITERS {
        return Err(Error::TooManyWriters {
            writers: writers.len(),
            max: MAX_WRITERS,
        });
    }
    for (i, &rank) in writers.iter().enumerate() {
        if rank == u32::MAX {
            return Err(Error::InvalidRank { rank });
        }
        if writers[..i].contains(&rank) {
            return Err(Error::DuplicateWriter { rank });
        }
    }
    Ok(())
}

impl Model {
    /// A model of a fresh table of `config`.
    pub fn new(config: Config) -> Model {
        Model {
            config,
            gate: config.pages.is_none(),
            issued: HashSet::new(),
            lifecycles: Vec::new(),
            slots: vec![Slot::default(); config.rooms],
            free_pages: (0..config.pages.unwrap_or(0) as u32).collect(),
            lost_pages: BTreeSet::new(),
            fenced: Vec::new(),
            failed: Vec::new(),
            tokens: Vec::new(),
            ended_tokens: Vec::new(),
            releases: 0,
            stale: 0,
            duplicates: 0,
            failed_transfers: 0,
            quarantined_rooms: 0,
            quarantined_pages: 0,
            delivered: HashSet::new(),
            opened: 0,
        }
    }

    /// Whether the table is in gate mode.
    pub fn is_gate(&self) -> bool {
        self.gate
    }

    /// Pool capacity (0 in gate mode).
    pub fn capacity(&self) -> usize {
        self.config.pages.unwrap_or(0)
    }

    /// Resolves a handle: `Err` for one the table never issued, `Ok(Some(index))` for a
    /// live lifecycle, `Ok(None)` for a stale one.
    fn resolve(&self, h: RoomHandle) -> Result<Option<usize>, Error> {
        if !self.issued.contains(&h) {
            return Err(Error::InvalidHandle);
        }
        let index = h.index();
        let Some(slot) = self.slots.get(index) else {
            return Err(Error::UnknownRoom {
                index,
                rooms: self.slots.len(),
            });
        };
        Ok(slot
            .live
            .as_ref()
            .is_some_and(|r| r.handle == h)
            .then_some(index))
    }

    fn room(&mut self, index: usize) -> &mut Room {
        self.slots[index]
            .live
            .as_mut()
            .expect("resolved room is live")
    }

    fn live(&self, h: RoomHandle) -> Option<&Room> {
        match self.resolve(h) {
            Ok(Some(index)) => self.slots[index].live.as_ref(),
            _ => None,
        }
    }

    fn stale_err<T>(&mut self) -> Result<T, Error> {
        self.stale += 1;
        Err(Error::StaleHandle)
    }

    /// Takes a hold on an owned room (grow, pages_of, transfers): the room's index.
    fn hold(&mut self, h: RoomHandle) -> Result<usize, Error> {
        let Some(index) = self.resolve(h)? else {
            return self.stale_err();
        };
        let phase = self.room(index).phase;
        if phase != Phase::Owned {
            return Err(Error::RoomClosed { phase });
        }
        Ok(index)
    }

    fn is_fenced(&self, rank: u32) -> bool {
        self.fenced.contains(&rank)
    }

    /// Releases room `index` if it is closing and nothing holds it: delivered at once, or
    /// queued (release queue configured, or `force_queue`: no caller to return it to).
    fn decide(&mut self, index: usize, force_queue: bool) -> Decision {
        self.decide_to(index, self.config.release_queue || force_queue)
    }

    /// [`decide`](Self::decide), queueing a release only if `queue`.
    fn decide_to(&mut self, index: usize, queue: bool) -> Decision {
        let Some(room) = self.slots[index].live.as_ref() else {
            return Decision::Held;
        };
        if !room.phase.is_closing() || room.holds() != 0 {
            return Decision::Held;
        }
        let room = self.slots[index].live.take().expect("checked");
        self.slots[index].gen = self.slots[index].gen.wrapping_add(1);
        let reason = match (room.quarantined, room.phase) {
            (true, _) => Reason::Quarantined,
            (false, Phase::Aborting) => Reason::Aborted,
            (false, _) => Reason::Finished,
        };
        let released = Released {
            handle: room.handle,
            token: room.token,
            pages: room.pages,
            reason,
        };
        if queue {
            self.slots[index].queued = Some(released);
            Decision::Queued
        } else {
            Decision::Delivered(self.deliver(released))
        }
    }

    /// Hands a release over: pool pages back (or out for good if quarantined), counters.
    fn deliver(&mut self, released: Released) -> Released {
        if released.reason == Reason::Quarantined {
            self.quarantined_rooms += 1;
            self.quarantined_pages += released.pages.len() as u64;
            if !self.gate {
                for &p in &released.pages {
                    assert!(self.lost_pages.insert(p), "model: page {p} lost twice");
                }
            }
        } else if !self.gate {
            for &p in &released.pages {
                assert!(self.free_pages.insert(p), "model: page {p} freed twice");
            }
        }
        self.releases += 1;
        assert!(
            self.delivered.insert(released.handle),
            "model: {:?} delivered twice",
            released.handle
        );
        released
    }

    fn claimable(&self) -> bool {
        self.slots
            .iter()
            .any(|s| s.live.is_none() && s.queued.is_none())
    }

    /// The errors `open`/`open_gate` share, after the mode check.
    fn open_checks(&self, writers: &[u32]) -> Result<(), Error> {
        check_writers(writers)?;
        if let Some(&rank) = writers.iter().find(|&&w| self.is_fenced(w)) {
            return Err(Error::RankFenced { rank });
        }
        if !self.claimable() {
            return Err(Error::RoomTableFull);
        }
        Ok(())
    }

    /// Checks a new handle is legal (claimable index, current generation, never issued)
    /// and adopts it as a live room.
    fn adopt(&mut self, h: RoomHandle, writers: &[u32], token: u64, pages: Vec<u32>) -> Check {
        if !self.issued.insert(h) {
            return Err(format!("open: handle {h:?} issued twice"));
        }
        let index = h.index();
        let Some(slot) = self.slots.get(index) else {
            return Err(format!("open: index {index} outside the table"));
        };
        if slot.live.is_some() {
            return Err(format!("open: room index {index} is already live"));
        }
        if slot.queued.is_some() {
            return Err(format!(
                "open: room index {index} is reused before its queued release was drained"
            ));
        }
        same("open: generation", &h.generation(), &slot.gen)?;
        self.opened += 1;
        self.lifecycles.push((h, writers.to_vec()));
        self.slots[index].live = Some(Room {
            handle: h,
            phase: Phase::Owned,
            token,
            pages,
            writers: writers.to_vec(),
            pending: vec![true; writers.len()],
            in_flight: 0,
            failed: 0,
            quarantined: false,
        });
        Ok(())
    }

    /// Checks pool pages handed out by `open`/`grow`: `n`, distinct, free. Takes them.
    fn take_pages(&mut self, what: &str, pages: &[u32], n: usize) -> Check {
        same(&format!("{what}: page count"), &pages.len(), &n)?;
        let mut seen = BTreeSet::new();
        for &p in pages {
            if !seen.insert(p) {
                return Err(format!("{what}: page {p} handed out twice"));
            }
            if !self.free_pages.contains(&p) {
                return Err(format!(
                    "{what}: page {p} is not free (in another room, queued, quarantined, or out of range)"
                ));
            }
        }
        for p in pages {
            self.free_pages.remove(p);
        }
        Ok(())
    }

    /// Predicts `open` (pool mode), checks the library's choices, and adopts them.
    pub fn open(
        &mut self,
        writers: &[u32],
        n: usize,
        lib: &Result<kvfence::Opened, Error>,
    ) -> Check {
        let expected = (|| {
            if self.gate {
                return Err(Error::WrongMode { table: "gate" });
            }
            if n > self.capacity() {
                return Err(Error::TooManyPages {
                    requested: n,
                    capacity: self.capacity(),
                });
            }
            self.open_checks(writers)?;
            if self.free_pages.len() < n {
                return Err(Error::PoolExhausted { requested: n });
            }
            Ok(())
        })();
        let opened = match (lib, expected) {
            (Ok(opened), Ok(())) => opened,
            (lib, expected) => {
                return same(
                    "open result",
                    &lib.as_ref().map(|_| ()).map_err(|e| *e),
                    &expected,
                )
            }
        };
        self.take_pages("open", &opened.pages, n)?;
        self.adopt(opened.handle, writers, 0, opened.pages.clone())
    }

    /// Predicts `open_gate`, checks the library's choice of index, and adopts it.
    pub fn open_gate(
        &mut self,
        writers: &[u32],
        token: u64,
        pages: &[u32],
        lib: &Result<RoomHandle, Error>,
    ) -> Check {
        let expected = if self.gate {
            self.open_checks(writers)
        } else {
            Err(Error::WrongMode { table: "pool" })
        };
        match (lib, expected) {
            (Ok(h), Ok(())) => self.adopt(*h, writers, token, pages.to_vec()),
            (lib, expected) => same(
                "open_gate result",
                &lib.as_ref().map(|_| ()).map_err(|e| *e),
                &expected,
            ),
        }
    }

    /// Predicts `grow` (pool mode), checks the pages, adopts them.
    pub fn grow(&mut self, h: RoomHandle, n: usize, lib: &Result<Vec<u32>, Error>) -> Check {
        let expected = (|| {
            if self.gate {
                return Err(Error::WrongMode { table: "gate" });
            }
            let index = self.hold(h)?;
            // More than the pool holds: refused before anything is claimed (issue 18).
            if n > self.capacity() {
                return Err(Error::TooManyPages {
                    requested: n,
                    capacity: self.capacity(),
                });
            }
            if self.free_pages.len() < n {
                return Err(Error::PoolExhausted { requested: n });
            }
            Ok(index)
        })();
        match (lib, expected) {
            (Ok(pages), Ok(index)) => {
                self.take_pages("grow", pages, n)?;
                self.room(index).pages.extend_from_slice(pages);
                Ok(())
            }
            (lib, expected) => same(
                "grow result",
                &lib.as_ref().map(|_| ()).map_err(|e| *e),
                &expected.map(|_| ()),
            ),
        }
    }

    /// `grow_gate`.
    pub fn grow_gate(&mut self, h: RoomHandle, pages: &[u32]) -> Result<(), Error> {
        if !self.gate {
            return Err(Error::WrongMode { table: "pool" });
        }
        let index = self.hold(h)?;
        self.room(index).pages.extend_from_slice(pages);
        Ok(())
    }

    /// `pages_of`.
    pub fn pages_of(&mut self, h: RoomHandle) -> Result<Vec<u32>, Error> {
        let index = self.hold(h)?;
        Ok(self.room(index).pages.clone())
    }

    /// `begin_transfer` / `begin_transfer_to` / `begin_transfer_owned`.
    pub fn begin_transfer(&mut self, h: RoomHandle, peer: Option<u32>) -> Result<Transfer, Error> {
        // `u32::MAX` is no rank id: refused first, as a bad argument (issue 18 item 4).
        if peer == Some(u32::MAX) {
            return Err(Error::InvalidRank { rank: u32::MAX });
        }
        let index = self.hold(h)?;
        self.room(index).in_flight += 1;
        Ok(Transfer {
            index,
            gen: h.generation(),
            peer,
        })
    }

    /// Predicts `begin` (token form), checks the token is new, adopts it.
    pub fn begin_token(
        &mut self,
        h: RoomHandle,
        peer: Option<u32>,
        lib: &Result<TransferToken, Error>,
    ) -> Check {
        let expected = (|| {
            if peer == Some(u32::MAX) {
                return Err(Error::InvalidRank { rank: u32::MAX });
            }
            self.resolve(h)?;
            if self.tokens.len() >= self.config.max_tokens {
                return Err(Error::TooManyTokens);
            }
            self.begin_transfer(h, peer)
        })();
        match (lib, expected) {
            (Ok(token), Ok(transfer)) => {
                if self.tokens.iter().any(|(t, _)| t == token) {
                    return Err(format!("begin: token {token:?} is already in flight"));
                }
                if token.to_wire() == h.to_wire() {
                    return Err(format!("begin: token {token:?} equals the room handle"));
                }
                self.tokens.push((*token, transfer));
                Ok(())
            }
            (lib, expected) => same(
                "begin (token) result",
                &lib.as_ref().map(|_| ()).map_err(|e| *e),
                &expected.map(|_| ()),
            ),
        }
    }

    /// A transfer ends with `outcome`; `force_queue`: a guard's drop (no caller).
    pub fn end_transfer(
        &mut self,
        t: Transfer,
        outcome: Outcome,
        force_queue: bool,
    ) -> Option<Released> {
        let fenced = t.peer.is_some_and(|p| self.is_fenced(p));
        let room = self.slots[t.index]
            .live
            .as_mut()
            .filter(|r| r.handle.generation() == t.gen)
            .expect("a held room is live");
        room.in_flight -= 1;
        if outcome == Outcome::Failed && !room.quarantined && !fenced {
            room.failed += 1;
            self.failed.push(t);
            self.failed_transfers += 1;
            return None;
        }
        self.decide(t.index, force_queue).delivered()
    }

    /// `end` (token form).
    pub fn end_token(
        &mut self,
        token: TransferToken,
        outcome: Outcome,
    ) -> Result<Option<Released>, Error> {
        let Some(at) = self.tokens.iter().position(|(t, _)| *t == token) else {
            return Err(Error::InvalidToken);
        };
        let (token, transfer) = self.tokens.remove(at);
        self.ended_tokens.push(token);
        Ok(self.end_transfer(transfer, outcome, false))
    }

    /// `quiesce`.
    pub fn quiesce(&mut self, h: RoomHandle, rank: u32) -> Result<Quiesced, Error> {
        let Some(index) = self.resolve(h)? else {
            return self.stale_err();
        };
        let room = self.room(index);
        let Some(pos) = room.writers.iter().position(|&w| w == rank) else {
            return Err(Error::RankNotInRoom { rank });
        };
        if !room.pending[pos] {
            self.duplicates += 1;
            return Ok(Quiesced::Duplicate);
        }
        room.pending[pos] = false;
        Ok(match self.decide(index, false) {
            Decision::Held => Quiesced::Recorded,
            Decision::Delivered(r) => Quiesced::Released(r),
            Decision::Queued => Quiesced::Queued,
        })
    }

    fn close(&mut self, h: RoomHandle, to: Phase) -> Result<Decision, Error> {
        let Some(index) = self.resolve(h)? else {
            return self.stale_err();
        };
        let room = self.room(index);
        match (room.phase, to) {
            (Phase::Aborting, _) => return Err(Error::AlreadyAborted),
            (Phase::Draining, Phase::Draining) => return Err(Error::AlreadyFinished),
            _ => room.phase = to,
        }
        Ok(self.decide(index, false))
    }

    /// `abort`: the fan-out and the release.
    pub fn abort(&mut self, h: RoomHandle) -> Result<(Vec<u32>, Option<Released>), Error> {
        Ok(match self.close(h, Phase::Aborting)? {
            Decision::Held => (self.room(h.index()).waiting_on(), None),
            Decision::Delivered(r) => (Vec::new(), Some(r)),
            Decision::Queued => (Vec::new(), None),
        })
    }

    /// `finish`.
    pub fn finish(&mut self, h: RoomHandle) -> Result<Option<Released>, Error> {
        Ok(self.close(h, Phase::Draining)?.delivered())
    }

    /// `finish_drained`: `finish`, every writer quiesced, and a release of this call
    /// returned even with a release queue.
    pub fn finish_drained(&mut self, h: RoomHandle) -> Result<Option<Released>, Error> {
        let Some(index) = self.resolve(h)? else {
            return self.stale_err();
        };
        let room = self.room(index);
        match room.phase {
            Phase::Aborting => return Err(Error::AlreadyAborted),
            Phase::Draining => return Err(Error::AlreadyFinished),
            _ => room.phase = Phase::Draining,
        }
        room.pending.iter_mut().for_each(|p| *p = false);
        Ok(self.decide_to(index, false).delivered())
    }

    /// `quarantine`.
    pub fn quarantine(&mut self, h: RoomHandle) -> Result<Option<Released>, Error> {
        let Some(index) = self.resolve(h)? else {
            return self.stale_err();
        };
        let gen = h.generation();
        let room = self.room(index);
        room.quarantined = true;
        room.phase = Phase::Aborting;
        room.pending.iter_mut().for_each(|p| *p = false);
        room.failed = 0;
        self.failed.retain(|f| !(f.index == index && f.gen == gen));
        Ok(self.decide(index, false).delivered())
    }

    /// `fence_rank`.
    pub fn fence(&mut self, rank: u32) -> Result<Fenced, Error> {
        if rank == u32::MAX {
            return Err(Error::InvalidRank { rank });
        }
        if !self.is_fenced(rank) {
            if self.fenced.len() == self.config.max_fenced {
                return Err(Error::TooManyFenced {
                    max: self.config.max_fenced,
                });
            }
            self.fenced.push(rank);
        }
        let mut out = Fenced::default();
        for index in 0..self.slots.len() {
            let Some(room) = self.slots[index].live.as_mut() else {
                continue;
            };
            let Some(pos) = room.writers.iter().position(|&w| w == rank) else {
                continue;
            };
            if !room.pending[pos] {
                continue;
            }
            room.pending[pos] = false;
            out.quiesced += 1;
            match self.decide(index, false) {
                Decision::Held => {}
                Decision::Delivered(r) => out.released.push(r),
                Decision::Queued => out.queued += 1,
            }
        }
        let (mut ended, kept): (Vec<Transfer>, Vec<Transfer>) = std::mem::take(&mut self.failed)
            .into_iter()
            .partition(|f| f.peer == Some(rank));
        self.failed = kept;
        // The library keeps one registry entry per (room lifecycle, peer), made at its first
        // failure, and ends each entry's failures together: a room's releases come in the
        // order of the rooms' first remaining failures to this peer. (A stable sort by that
        // order; ending one failure at a time still decides the release at the last.)
        let first: Vec<(usize, u32)> = ended.iter().fold(Vec::new(), |mut keys, f| {
            if !keys.contains(&(f.index, f.gen)) {
                keys.push((f.index, f.gen));
            }
            keys
        });
        ended.sort_by_key(|f| first.iter().position(|&k| k == (f.index, f.gen)));
        for f in ended {
            out.failed_ended += 1;
            self.room(f.index).failed -= 1;
            match self.decide(f.index, false) {
                Decision::Held => {}
                Decision::Delivered(r) => out.released.push(r),
                Decision::Queued => out.queued += 1,
            }
        }
        Ok(out)
    }

    /// `readmit_rank`.
    pub fn readmit(&mut self, rank: u32) -> Result<bool, Error> {
        if rank == u32::MAX {
            return Err(Error::InvalidRank { rank });
        }
        let before = self.fenced.len();
        self.fenced.retain(|&r| r != rank);
        Ok(self.fenced.len() != before)
    }

    /// `phase`.
    pub fn phase(&self, h: RoomHandle) -> Result<Phase, Error> {
        Ok(match self.resolve(h)? {
            Some(index) => self.slots[index].live.as_ref().expect("live").phase,
            None => Phase::Free,
        })
    }

    fn status_of(room: &Room) -> StatusView {
        (
            room.handle,
            room.phase,
            room.waiting_on(),
            room.in_flight + room.failed,
            room.failed,
            room.pages.len(),
            room.quarantined,
        )
    }

    /// `room_status` (less `closing_for`).
    pub fn room_status(&mut self, h: RoomHandle) -> Result<StatusView, Error> {
        let Some(index) = self.resolve(h)? else {
            return self.stale_err();
        };
        Ok(Self::status_of(self.room(index)))
    }

    /// `pop_released`: the lowest queued room index first.
    pub fn pop(&mut self) -> Option<Released> {
        let index = self.slots.iter().position(|s| s.queued.is_some())?;
        let released = self.slots[index].queued.take().expect("found");
        Some(self.deliver(released))
    }

    /// Releases waiting in the queue.
    pub fn queued(&self) -> usize {
        self.slots.iter().filter(|s| s.queued.is_some()).count()
    }

    /// `wait_released_timeout(h, 0)`: whether the lifecycle's release was decided, and
    /// delivered or queued (issue 18 item 9: a wait ends once nothing more can make the
    /// release happen).
    pub fn released(&self, h: RoomHandle) -> Result<bool, Error> {
        self.resolve(h)?;
        Ok(self.delivered.contains(&h)
            || self
                .slots
                .iter()
                .any(|s| s.queued.as_ref().is_some_and(|r| r.handle == h)))
    }

    /// Whether nothing is live (`wait_idle` returns at once; queued releases wait for a
    /// drain).
    pub fn idle(&self) -> bool {
        self.slots.iter().all(|s| s.live.is_none())
    }

    /// Pending ranks of the handle's lifecycle (empty if not live).
    pub fn pending(&self, h: RoomHandle) -> Vec<u32> {
        self.live(h).map(Room::waiting_on).unwrap_or_default()
    }

    /// The writers of the handle's lifecycle (live or not).
    fn writers_of(&self, h: RoomHandle) -> &[u32] {
        self.lifecycles
            .iter()
            .find(|(k, _)| *k == h)
            .map_or(&[], |(_, w)| &w[..])
    }

    /// Releases delivered so far.
    pub fn releases(&self) -> u64 {
        self.releases
    }

    /// Rooms opened so far.
    pub fn opened(&self) -> u64 {
        self.opened
    }

    /// Compares `table.stats()` and `queued_releases()` with the model, and checks the
    /// model's own conservation.
    pub fn check_stats(&self, table: &RoomTable) -> Check {
        let stats = table.stats();
        let mut rooms = kvfence::Usage::default();
        let mut pages = kvfence::Usage::default();
        let mut in_rooms = BTreeSet::new();
        let mut closing = Vec::new();
        for slot in &self.slots {
            let listed: &[u32] = match (&slot.live, &slot.queued) {
                (Some(_), Some(_)) => return Err("model: a slot is live and queued".into()),
                (Some(room), None) => {
                    if room.phase == Phase::Owned {
                        rooms.owned += 1;
                        pages.owned += room.pages.len();
                    } else {
                        rooms.held += 1;
                        pages.held += room.pages.len();
                        closing.push(Self::status_of(room));
                    }
                    &room.pages
                }
                (None, Some(r)) => {
                    rooms.queued += 1;
                    pages.queued += r.pages.len();
                    &r.pages
                }
                (None, None) => {
                    rooms.free += 1;
                    &[]
                }
            };
            if !self.gate {
                for &p in listed {
                    if !in_rooms.insert(p)
                        || self.free_pages.contains(&p)
                        || self.lost_pages.contains(&p)
                    {
                        return Err(format!("model: page {p} is in two places"));
                    }
                }
            }
        }
        if !self.gate {
            pages.free = self.free_pages.len();
            same(
                "model page conservation",
                &(self.free_pages.len() + in_rooms.len() + self.lost_pages.len()),
                &self.capacity(),
            )?;
            same(
                "quarantined pages",
                &(self.lost_pages.len() as u64),
                &self.quarantined_pages,
            )?;
        }
        same("stats.rooms", &stats.rooms, &rooms)?;
        same("stats.pages", &stats.pages, &pages)?;
        same(
            "stats.rooms.total()",
            &stats.rooms.total(),
            &self.slots.len(),
        )?;
        let lib_closing: Vec<StatusView> = stats
            .closing
            .iter()
            .map(|c| {
                (
                    c.handle,
                    c.phase,
                    c.waiting_on.to_vec(),
                    c.transfers,
                    c.failed,
                    c.pages,
                    c.quarantined,
                )
            })
            .collect();
        same("stats.closing", &lib_closing, &closing)?;
        let mut fenced = self.fenced.clone();
        fenced.sort_unstable();
        same("stats.fenced", &stats.fenced, &fenced)?;
        same(
            "stats counters (releases, stale, duplicates, failed, quarantined rooms, pages)",
            &(
                stats.releases,
                stats.stale_refused,
                stats.duplicate_acks,
                stats.failed_transfers,
                stats.quarantined_rooms,
                stats.quarantined_pages,
            ),
            &(
                self.releases,
                self.stale,
                self.duplicates,
                self.failed_transfers,
                self.quarantined_rooms,
                self.quarantined_pages,
            ),
        )?;
        same(
            "queued_releases()",
            &table.queued_releases(),
            &self.queued(),
        )
    }
}

/// A transfer guard of either form.
enum Guard<'t> {
    Borrowed(TransferGuard<'t>),
    Owned(OwnedTransferGuard),
}

impl Guard<'_> {
    fn handle(&self) -> RoomHandle {
        match self {
            Guard::Borrowed(g) => g.handle(),
            Guard::Owned(g) => g.handle(),
        }
    }
}

/// Drives a [`RoomTable`] and a [`Model`] side by side.
pub struct Harness<'t> {
    table: &'t Arc<RoomTable>,
    /// The model.
    pub model: Model,
    guards: Vec<(Guard<'t>, Transfer)>,
    known: Vec<RoomHandle>,
}

fn project(a: Result<kvfence::Aborted, Error>) -> Result<(Vec<u32>, Option<Released>), Error> {
    a.map(|a| (a.fanout.to_vec(), a.released))
}

fn project_status(s: Result<kvfence::RoomStatus, Error>) -> Result<StatusView, Error> {
    s.map(|s| {
        (
            s.handle,
            s.phase,
            s.waiting_on.to_vec(),
            s.transfers,
            s.failed,
            s.pages,
            s.quarantined,
        )
    })
}

impl<'t> Harness<'t> {
    /// A harness over a fresh `table` made with `config`. Opens and finishes one room first,
    /// so that a known handle exists before any forged handle is derived from one.
    pub fn new(table: &'t Arc<RoomTable>, config: Config) -> Result<Harness<'t>, String> {
        let mut h = Harness {
            table,
            model: Model::new(config),
            guards: Vec::new(),
            known: Vec::new(),
        };
        if h.model.is_gate() {
            h.open_gate(&[], 7, vec![1, 2])?;
        } else {
            h.open_pool(&[], 1)?;
        }
        let first = h.known[0];
        let lib = table.finish(first);
        h.same_result("prime finish", lib, |m| m.finish(first))?;
        h.drain_released()?;
        h.check()?;
        Ok(h)
    }

    fn same_result<T: PartialEq + Debug>(
        &mut self,
        what: &str,
        lib: Result<T, Error>,
        model: impl FnOnce(&mut Model) -> Result<T, Error>,
    ) -> Check {
        let expected = model(&mut self.model);
        same(what, &lib, &expected)
    }

    /// A handle chosen by `sel`: bit 7 clear prefers live rooms, set picks any known one
    /// (often stale).
    fn pick(&self, sel: u8) -> RoomHandle {
        let live: Vec<RoomHandle> = self
            .known
            .iter()
            .copied()
            .filter(|&h| matches!(self.model.resolve(h), Ok(Some(_))))
            .collect();
        let pool = if sel & 0x80 == 0 && !live.is_empty() {
            &live
        } else {
            &self.known
        };
        pool[(sel & 0x7F) as usize % pool.len()]
    }

    /// A rank id from `RANKS`.
    fn any_rank(sel: u8) -> u32 {
        RANKS[sel as usize % RANKS.len()]
    }

    /// A writer list for `open`: see [`Op::Open`].
    fn writers(width: u8, seed: u32) -> Vec<u32> {
        let valid = &RANKS[..RANKS.len() - 1];
        let subset = |n: usize| -> Vec<u32> {
            let mut out: Vec<u32> = (0..valid.len())
                .filter(|i| seed >> i & 1 == 1)
                .map(|i| valid[i])
                .take(n)
                .collect();
            if !out.is_empty() {
                let k = (seed >> 16) as usize % out.len();
                out.rotate_left(k);
            }
            out
        };
        let wide = |n: usize| -> Vec<u32> {
            let mut out = subset(3);
            let mut next = 1000 + (seed >> 20);
            while out.len() < n {
                out.push(next);
                next += 7;
            }
            let k = (seed >> 8) as usize % n;
            out.rotate_left(k);
            out
        };
        match width % 8 {
            0 => Vec::new(),
            1 => vec![Self::any_rank(seed as u8 % 15)],
            2 | 7 => subset(3),
            3 => subset(8),
            4 => wide(33),
            5 => wide(MAX_WRITERS),
            _ => match seed % 3 {
                0 => wide(MAX_WRITERS + 1),
                1 => {
                    let mut w = subset(4);
                    w.push(w.first().copied().unwrap_or(5));
                    if w.len() == 1 {
                        w.push(5);
                    }
                    w
                }
                _ => {
                    let mut w = subset(4);
                    let at = (seed >> 24) as usize % (w.len() + 1);
                    w.insert(at, u32::MAX);
                    w
                }
            },
        }
    }

    fn open_pool(&mut self, writers: &[u32], n: usize) -> Check {
        let lib = self.table.open(writers, n);
        self.model.open(writers, n, &lib)?;
        if let Ok(opened) = lib {
            self.known.push(opened.handle);
        }
        Ok(())
    }

    fn open_gate(&mut self, writers: &[u32], token: u64, pages: Vec<u32>) -> Check {
        let lib = self.table.open_gate(writers, token, pages.clone());
        self.model.open_gate(writers, token, &pages, &lib)?;
        if let Ok(h) = lib {
            self.known.push(h);
        }
        Ok(())
    }

    fn grow(&mut self, h: RoomHandle, n: u8, seed: u32) -> Check {
        if self.model.is_gate() == (seed % 8 != 0) {
            let pages: Vec<u32> = (0..n % 5)
                .map(|i| seed.wrapping_add(u32::from(i)))
                .collect();
            let lib = self.table.grow_gate(h, &pages);
            self.same_result("grow_gate", lib, |m| m.grow_gate(h, &pages))
        } else {
            let n = match n {
                255 => self.model.capacity() + 1,
                n => n as usize % 6,
            };
            let lib = self.table.grow(h, n);
            self.model.grow(h, n, &lib)
        }
    }

    /// A peer rank for a transfer on `h`: none, one of its writers, or any rank id.
    fn peer(&self, h: RoomHandle, sel: u8) -> Option<u32> {
        let writers = self.model.writers_of(h);
        match sel % 4 {
            0 => None,
            1 | 2 if !writers.is_empty() => Some(writers[(sel / 4) as usize % writers.len()]),
            _ => Some(Self::any_rank(sel / 4)),
        }
    }

    fn begin(&mut self, h: RoomHandle, peer_sel: u8, form: u8) -> Check {
        let peer = self.peer(h, peer_sel);
        match form % 5 {
            0 | 1 => {
                let peer = if form % 5 == 0 {
                    None
                } else {
                    peer.or(Some(0))
                };
                let lib = match peer {
                    None => self.table.begin_transfer(h),
                    Some(p) => self.table.begin_transfer_to(h, p),
                };
                let expected = self.model.begin_transfer(h, peer);
                match (lib, expected) {
                    (Ok(guard), Ok(t)) => {
                        same("guard.handle()", &guard.handle(), &h)?;
                        self.guards.push((Guard::Borrowed(guard), t));
                        Ok(())
                    }
                    (lib, expected) => same(
                        "begin_transfer",
                        &lib.map(|g| g.handle()),
                        &expected.map(|_| h),
                    ),
                }
            }
            2 => {
                let lib = RoomTable::begin_transfer_owned(self.table, h, peer);
                let expected = self.model.begin_transfer(h, peer);
                match (lib, expected) {
                    (Ok(guard), Ok(t)) => {
                        same("owned guard.handle()", &guard.handle(), &h)?;
                        if !Arc::ptr_eq(guard.table(), self.table) {
                            return Err("owned guard: table() is another table".into());
                        }
                        self.guards.push((Guard::Owned(guard), t));
                        Ok(())
                    }
                    (lib, expected) => same(
                        "begin_transfer_owned",
                        &lib.map(|g| g.handle()),
                        &expected.map(|_| h),
                    ),
                }
            }
            f => {
                let peer = if f == 3 { None } else { peer };
                let lib = self.table.begin(h, peer);
                self.model.begin_token(h, peer, &lib)?;
                if let Ok(t) = lib {
                    same(
                        "token wire round trip",
                        &TransferToken::from_wire(t.to_wire()),
                        &t,
                    )?;
                }
                Ok(())
            }
        }
    }

    fn end(&mut self, sel: u8, how: u8) -> Check {
        if self.guards.is_empty() {
            return Ok(());
        }
        let (guard, t) = self.guards.swap_remove(sel as usize % self.guards.len());
        same("guard handle at end", &guard.handle().index(), &t.index)?;
        match how % 4 {
            3 => {
                drop(guard);
                let none = self.model.end_transfer(t, Outcome::Failed, true);
                assert!(none.is_none(), "model: a dropped guard returned a release");
                Ok(())
            }
            how => {
                let outcome = if how == 2 {
                    Outcome::Failed
                } else {
                    Outcome::Completed
                };
                let lib = match (guard, outcome, how) {
                    (Guard::Borrowed(g), Outcome::Completed, _) => g.complete(),
                    (Guard::Borrowed(g), Outcome::Failed, _) => g.fail(),
                    (Guard::Owned(g), o, 0) => g.end(o),
                    (Guard::Owned(g), Outcome::Completed, _) => g.complete(),
                    (Guard::Owned(g), Outcome::Failed, _) => g.fail(),
                };
                let expected = self.model.end_transfer(t, outcome, false);
                same(&format!("guard end ({outcome:?})"), &lib, &expected)
            }
        }
    }

    /// Ends `token` on both sides.
    fn end_token(&mut self, token: TransferToken, outcome: Outcome) -> Check {
        let lib = self.table.end(token, outcome);
        self.same_result(&format!("end ({outcome:?})"), lib, |m| {
            m.end_token(token, outcome)
        })
    }

    fn end_token_op(&mut self, sel: u8, how: u8, wire: u64) -> Check {
        let active = self.model.tokens.len();
        let ended = self.model.ended_tokens.len();
        match how % 6 {
            0 | 1 if active > 0 => {
                let t = self.model.tokens[sel as usize % active].0;
                self.end_token(t, Outcome::Completed)
            }
            2 if active > 0 => {
                let t = self.model.tokens[sel as usize % active].0;
                self.end_token(t, Outcome::Failed)
            }
            3 if ended > 0 => {
                let t = self.model.ended_tokens[sel as usize % ended];
                self.end_token(t, Outcome::Completed)
            }
            5 if active > 0 => {
                let t = self.model.tokens[sel as usize % active].0;
                self.end_token(t, Outcome::Completed)?;
                self.check()?;
                self.end_token(t, Outcome::Failed)
            }
            _ => {
                let t = self.forged_token(sel, wire);
                self.end_token(
                    t,
                    if wire & 1 == 0 {
                        Outcome::Completed
                    } else {
                        Outcome::Failed
                    },
                )
            }
        }
    }

    /// A token value the table did not issue (or that is over).
    fn forged_token(&self, sel: u8, wire: u64) -> TransferToken {
        let some = |v: &[TransferToken]| (!v.is_empty()).then(|| v[sel as usize % v.len()]);
        let active: Vec<TransferToken> = self.model.tokens.iter().map(|(t, _)| *t).collect();
        let flip = |t: TransferToken| TransferToken::from_wire(t.to_wire() ^ 1 << (wire % 128));
        match sel % 5 {
            0 => TransferToken::from_wire(0),
            1 => TransferToken::from_wire(u128::from(wire) << (wire % 3 * 32)),
            2 => TransferToken::from_wire(self.pick(sel).to_wire()),
            3 => some(&active).map_or(TransferToken::from_wire(!0), flip),
            _ => some(&self.model.ended_tokens)
                .map_or(TransferToken::from_wire(u128::from(wire) << 64), flip),
        }
    }

    fn quiesce(&mut self, h: RoomHandle, rank: u32) -> Check {
        let lib = self.table.quiesce(h, rank);
        self.same_result("quiesce", lib, |m| m.quiesce(h, rank))
    }

    fn abort(&mut self, what: &str, h: RoomHandle) -> Check {
        let lib = project(self.table.abort(h));
        self.same_result(what, lib, |m| m.abort(h))
    }

    fn fence(&mut self, rank: u32) -> Check {
        let lib = self.table.fence_rank(rank);
        self.same_result("fence_rank", lib, |m| m.fence(rank))
    }

    fn quarantine(&mut self, h: RoomHandle) -> Check {
        let lib = self.table.quarantine(h);
        self.same_result("quarantine", lib, |m| m.quarantine(h))
    }

    fn pop(&mut self) -> Check {
        let lib = self.table.pop_released();
        let expected = self.model.pop();
        same("pop_released", &lib, &expected)
    }

    fn drain_released(&mut self) -> Check {
        let mut lib = Vec::new();
        let n = self.table.drain_released(&mut lib);
        let mut expected = Vec::new();
        while let Some(r) = self.model.pop() {
            expected.push(r);
        }
        same("drain_released count", &n, &lib.len())?;
        same("drain_released", &lib, &expected)
    }

    fn wait_released(&mut self, h: RoomHandle, timed: bool) -> Check {
        if timed {
            let lib = self.table.wait_released_timeout(h, Duration::ZERO);
            return self.same_result("wait_released_timeout(0)", lib, |m| m.released(h));
        }
        // Only where it cannot block: errors, or a lifecycle already delivered.
        let expected = self.model.released(h);
        if expected == Ok(false) {
            return Ok(());
        }
        let lib = self.table.wait_released(h);
        same("wait_released", &lib, &expected.map(|_| ()))
    }

    /// Applies `action` with a handle the table may or may not have issued.
    pub fn with_handle(&mut self, h: RoomHandle, action: u8, rank: u8) -> Check {
        same("wire round trip", &RoomHandle::from_wire(h.to_wire()), &h)?;
        same(
            "bytes round trip",
            &RoomHandle::from_bytes(h.to_bytes()),
            &h,
        )?;
        match action % 13 {
            0 => self.begin(h, 0, 0),
            1 => self.begin(h, rank, 2),
            2 => self.begin(h, rank, 4),
            3 => self.quiesce(h, Self::any_rank(rank)),
            4 => self.abort("abort (forged)", h),
            5 => {
                let lib = self.table.finish(h);
                self.same_result("finish (forged)", lib, |m| m.finish(h))
            }
            6 => self.quarantine(h),
            7 => {
                let lib = self.table.phase(h);
                self.same_result("phase (forged)", lib, |m| m.phase(h))
            }
            8 => {
                let lib = project_status(self.table.room_status(h));
                self.same_result("room_status (forged)", lib, |m| m.room_status(h))
            }
            9 => self.grow(h, rank, u32::from(rank) * 3),
            10 => {
                let lib = self.table.pages_of(h);
                self.same_result("pages_of (forged)", lib, |m| m.pages_of(h))
            }
            11 => self.wait_released(h, false),
            _ => self.wait_released(h, true),
        }
    }

    /// Ends a token value the table may or may not have issued.
    pub fn with_token(&mut self, token: TransferToken, fail: bool) -> Check {
        same(
            "token wire round trip",
            &TransferToken::from_wire(token.to_wire()),
            &token,
        )?;
        let outcome = if fail {
            Outcome::Failed
        } else {
            Outcome::Completed
        };
        self.end_token(token, outcome)
    }

    /// Applies one operation to both and compares the results.
    pub fn step(&mut self, op: &Op) -> Check {
        match *op {
            Op::Open {
                kind,
                width,
                seed,
                pages,
                token,
            } => {
                let writers = Self::writers(width, seed);
                let gate = self.model.is_gate() == (kind % 8 != 0);
                if gate {
                    let pages: Vec<u32> = (0..pages % 9)
                        .map(|i| seed.rotate_left(7).wrapping_add(u32::from(i)))
                        .collect();
                    self.open_gate(&writers, token, pages)
                } else {
                    let n = match pages {
                        255 => self.model.capacity() + 1,
                        p => p as usize % (self.model.capacity().min(24) + 1),
                    };
                    self.open_pool(&writers, n)
                }
            }
            Op::Grow { room, n, seed } => self.grow(self.pick(room), n, seed),
            Op::PagesOf { room } => {
                let h = self.pick(room);
                let lib = self.table.pages_of(h);
                self.same_result("pages_of", lib, |m| m.pages_of(h))
            }
            Op::Begin { room, peer, form } => self.begin(self.pick(room), peer, form),
            Op::End { guard, how } => self.end(guard, how),
            Op::EndToken { token, how, wire } => self.end_token_op(token, how, wire),
            Op::Quiesce { room, rank } => {
                let h = self.pick(room);
                let pending = self.model.pending(h);
                let writers = self.model.writers_of(h);
                let rank = match rank % 4 {
                    1 | 2 if !pending.is_empty() => pending[(rank / 4) as usize % pending.len()],
                    3 if !writers.is_empty() => writers[(rank / 4) as usize % writers.len()],
                    _ => Self::any_rank(rank / 4),
                };
                self.quiesce(h, rank)
            }
            Op::Drain { room } => {
                let h = self.pick(room);
                let pending = self.model.pending(h);
                if pending.is_empty() {
                    return self.quiesce(h, 0);
                }
                for rank in pending {
                    self.quiesce(h, rank)?;
                }
                Ok(())
            }
            Op::Abort { room } => self.abort("abort", self.pick(room)),
            Op::Finish { room } => {
                let h = self.pick(room);
                let lib = self.table.finish(h);
                self.same_result("finish", lib, |m| m.finish(h))
            }
            Op::FinishDrained { room } => {
                let h = self.pick(room);
                let lib = self.table.finish_drained(h);
                self.same_result("finish_drained", lib, |m| m.finish_drained(h))
            }
            Op::Quarantine { room } => self.quarantine(self.pick(room)),
            Op::Fence { rank } => {
                let failed_peers: Vec<u32> =
                    self.model.failed.iter().filter_map(|f| f.peer).collect();
                let live_writers: Vec<u32> = self
                    .model
                    .slots
                    .iter()
                    .filter_map(|s| s.live.as_ref())
                    .flat_map(|r| r.writers.iter().copied())
                    .collect();
                let rank = match rank % 4 {
                    0 if !failed_peers.is_empty() => {
                        failed_peers[(rank / 4) as usize % failed_peers.len()]
                    }
                    1 if !live_writers.is_empty() => {
                        live_writers[(rank / 4) as usize % live_writers.len()]
                    }
                    _ => Self::any_rank(rank / 4),
                };
                self.fence(rank)
            }
            Op::Readmit { rank } => {
                let fenced = &self.model.fenced;
                let rank = if rank % 2 == 0 && !fenced.is_empty() {
                    fenced[(rank / 2) as usize % fenced.len()]
                } else {
                    Self::any_rank(rank / 2)
                };
                let lib = self.table.readmit_rank(rank);
                self.same_result("readmit_rank", lib, |m| m.readmit(rank))
            }
            Op::Phase { room } => {
                let h = self.pick(room);
                let lib = self.table.phase(h);
                self.same_result("phase", lib, |m| m.phase(h))
            }
            Op::Status { room } => {
                let h = self.pick(room);
                let lib = self.table.room_status(h);
                if let Ok(s) = &lib {
                    if s.phase == Phase::Owned && s.closing_for != Duration::ZERO {
                        return Err(format!("room_status: owned room closing for {s:?}"));
                    }
                }
                let lib = project_status(lib);
                self.same_result("room_status", lib, |m| m.room_status(h))
            }
            Op::Pop => self.pop(),
            Op::DrainReleased => self.drain_released(),
            Op::Forged {
                how,
                wire,
                action,
                rank,
            } => {
                let rooms = self.model.slots.len();
                let known = self.pick(wire as u8);
                let h = match how % 5 {
                    0 => RoomHandle::from_wire(u128::from(wire) << (wire % 3 * 32)),
                    1 => forge(wire as usize, (wire >> 32) as u32, known),
                    2 => {
                        let index = wire as usize % (rooms + 2);
                        let gen = self.model.slots.get(index).map_or(0, |s| s.gen);
                        let delta = ((wire >> 32) % 3) as u32;
                        forge(index, gen.wrapping_add(delta).wrapping_sub(1), known)
                    }
                    3 => RoomHandle::from_wire(known.to_wire() ^ 1 << ((wire >> 8) % 128)),
                    _ => {
                        let tokens: Vec<TransferToken> = self
                            .model
                            .tokens
                            .iter()
                            .map(|(t, _)| *t)
                            .chain(self.model.ended_tokens.iter().copied())
                            .collect();
                        let t = if tokens.is_empty() {
                            TransferToken::from_wire(0)
                        } else {
                            tokens[wire as usize % tokens.len()]
                        };
                        RoomHandle::from_wire(t.to_wire())
                    }
                };
                self.with_handle(h, action, rank)
            }
            Op::WaitReleased { room, timed } => self.wait_released(self.pick(room), timed),
            Op::WaitIdle { timed } => {
                if timed {
                    let lib = self.table.wait_idle_timeout(Duration::ZERO);
                    same("wait_idle_timeout(0)", &lib, &self.model.idle())
                } else {
                    if self.model.idle() {
                        self.table.wait_idle();
                    }
                    Ok(())
                }
            }
        }
    }

    /// The invariants, after every step.
    pub fn check(&self) -> Check {
        self.model.check_stats(self.table)
    }

    /// Ends every guard and token, closes and drains every live room (fencing failed
    /// transfers' peers where the fenced set has room, quarantining the rest), drains the
    /// queue, and checks that everything came back: every room free, every pool page free
    /// or quarantined, every opened lifecycle delivered exactly once.
    pub fn finish_all(&mut self) -> Check {
        while !self.guards.is_empty() {
            self.end(0, 0)?;
            self.check()?;
        }
        while let Some(&(t, _)) = self.model.tokens.first() {
            self.end_token(t, Outcome::Completed)?;
            self.check()?;
        }
        for index in 0..self.model.slots.len() {
            let Some(room) = &self.model.slots[index].live else {
                continue;
            };
            let h = room.handle;
            if room.phase != Phase::Aborting {
                self.abort("final abort", h)?;
            }
            for rank in self.model.pending(h) {
                self.quiesce(h, rank)?;
            }
            self.check()?;
        }
        let peers: BTreeSet<u32> = self.model.failed.iter().filter_map(|f| f.peer).collect();
        for peer in peers {
            self.fence(peer)?;
            self.check()?;
        }
        for index in 0..self.model.slots.len() {
            if let Some(room) = &self.model.slots[index].live {
                let h = room.handle;
                self.quarantine(h)?;
                self.check()?;
            }
        }
        self.drain_released()?;
        self.check()?;
        if !self.model.idle() {
            return Err("final: a room is still live after draining everything".into());
        }
        same(
            "final: releases == opens",
            &self.model.releases(),
            &self.model.opened(),
        )?;
        for h in &self.model.issued {
            if !self.model.delivered.contains(h) {
                return Err(format!("final: {h:?} was never delivered"));
            }
        }
        let stats = self.table.stats();
        same(
            "final: free rooms",
            &stats.rooms.free,
            &self.model.slots.len(),
        )?;
        if !self.model.is_gate() {
            same(
                "final: free + quarantined pages",
                &(stats.pages.free as u64 + stats.quarantined_pages),
                &(self.model.capacity() as u64),
            )?;
        }
        self.table.wait_idle();
        same(
            "final: wait_idle_timeout(0)",
            &self.table.wait_idle_timeout(Duration::ZERO),
            &true,
        )
    }
}

/// Runs one case: a fresh table, the operations with a check after each, then the drain.
/// `Err` describes the first divergence (step index, operation, what differed).
pub fn run_case(setup: Setup, ops: &[Op]) -> Check {
    let config = setup.config();
    let table = Arc::new(RoomTable::new(config).map_err(|e| format!("RoomTable::new: {e}"))?);
    let mut h = Harness::new(&table, config)?;
    for (i, op) in ops.iter().enumerate() {
        h.step(op)
            .and_then(|()| h.check())
            .map_err(|e| format!("{config:?} step {i} {op:?}: {e}"))?;
    }
    h.finish_all()
        .map_err(|e| format!("{config:?} final drain: {e}"))
}

/// Decodes a case from raw bytes (the fuzz input or a seeded RNG's output).
pub fn decode(bytes: &[u8], max_ops: usize) -> (Setup, Vec<Op>) {
    let mut u = Unstructured::new(bytes);
    let setup = Setup::arbitrary(&mut u).unwrap_or(Setup::pool(2, 8, false));
    let mut ops = Vec::new();
    while ops.len() < max_ops && !u.is_empty() {
        match Op::arbitrary(&mut u) {
            Ok(op) => ops.push(op),
            Err(_) => break,
        }
    }
    (setup, ops)
}

/// SplitMix64: a tiny seeded generator for the stable property test (no `rand` needed).
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            out.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        out.truncate(len);
        out
    }
}
