//! A sequential reference model of the kvfence protocol, the operation generator, and the
//! step checker that drives the library and the model side by side.
//!
//! Shared by `tests/prop_ops.rs` (stable, `cargo test`) and the fuzz targets in `fuzz/`
//! (`#[path = "../../tests/model/mod.rs"] mod model;`).
//!
//! The model is deliberately plain: vectors and sets, no atomics, one thread. It predicts
//! every call's result exactly (the `Ok` value or the `Error` variant with its fields).
//! Where the library's choice is arbitrary (which room index `open` claims, which pages it
//! hands out) the model checks the choice is *legal* (the index is free, the generation is
//! the index's current one, the pages are distinct and free) and adopts it.
//!
//! Invariants checked after every step ([`Harness::check`]): `stats()` equals the model's
//! occupancy (page and room conservation, closing rooms with their pending ranks and
//! transfers, fenced ranks, event counters); no page is in two rooms; every release is
//! reported exactly once (return values and `take_orphaned` are matched one by one against
//! the model's releases, and a handle is never released twice); pages of a room that still
//! has holds are never handed to a new room (`open` may only return pages the model has
//! free).
#![allow(dead_code)]

use arbitrary::{Arbitrary, Unstructured};
use kvfence::{
    Aborted, Config, Error, Fenced, Phase, Quiesced, RankSet, Released, RoomHandle, RoomTable,
    TransferGuard,
};
use std::collections::{BTreeSet, HashSet};
use std::fmt::Debug;

/// Builds a handle through the documented wire layout (`src/handle.rs`: generation in bits
/// 0..32, index in 32..64, check in 64..128) with the check of `like`: a handle whose index
/// or generation was corrupted but whose check half survived.
pub fn forge(index: usize, gen: u32, like: RoomHandle) -> RoomHandle {
    let check = like.to_wire() >> 64;
    RoomHandle::from_wire(check << 64 | ((index as u128) & 0xFFFF_FFFF) << 32 | u128::from(gen))
}

/// Table sizes, kept small so that capacity limits, reuse and mask-word boundaries
/// (16 ranks per word) are all reached.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub struct Setup {
    rooms: u8,
    pages: u8,
    ranks: u8,
}

impl Setup {
    /// The setup whose [`config`](Self::config) is `rooms` rooms, `pages` pages, `ranks`
    /// ranks (each at least 1 and within the ranges below).
    pub fn from_sizes(rooms: u8, pages: u8, ranks: u8) -> Setup {
        Setup {
            rooms: rooms - 1,
            pages: pages - 1,
            ranks: ranks - 1,
        }
    }

    /// 1..=6 rooms, 1..=140 pages (crosses the 64-bit bitmap words), 1..=40 ranks.
    pub fn config(&self) -> Config {
        Config::new(
            1 + self.rooms as usize % 6,
            1 + self.pages as usize % 140,
            1 + self.ranks as usize % 40,
        )
    }
}

/// One operation. Selectors (`room`, `guard`, `rank`) are interpreted against the current
/// state so that most operations hit something real; some deliberately do not.
#[derive(Clone, Debug, Arbitrary)]
pub enum Op {
    /// `open`: page count 0 (NoPages), capacity+1 (TooManyPages) or small; a writer set
    /// of chosen density, sometimes with an extra (maybe out-of-range) rank.
    Open {
        pages: u8,
        width: u8,
        mask: u64,
        extra: u8,
    },
    /// `begin_transfer` on a known handle (live or stale).
    Begin { room: u8 },
    /// `complete` a guard.
    Complete { guard: u8 },
    /// Drop a guard without `complete` (its release goes to `take_orphaned`).
    DropGuard { guard: u8 },
    /// `quiesce`: a pending rank of the room, or a raw rank (duplicate, not in the set,
    /// out of range).
    Quiesce { room: u8, rank: u8 },
    /// Quiesce every pending rank of the room (drives rooms to release).
    Drain { room: u8 },
    /// `abort`.
    Abort { room: u8 },
    /// `finish`.
    Finish { room: u8 },
    /// `fence_rank` (sometimes out of range).
    Fence { rank: u8 },
    /// `readmit_rank` (sometimes out of range).
    Readmit { rank: u8 },
    /// `phase`.
    Phase { room: u8 },
    /// An operation with a forged handle (raw wire value, a known handle's check with
    /// another index or generation, a known handle with one flipped bit).
    Forged {
        how: u8,
        wire: u64,
        action: u8,
        rank: u8,
    },
    /// `take_orphaned`, compared with the model's orphaned releases.
    TakeOrphaned,
    /// `wait_released`, only where the model says it returns at once.
    WaitReleased { room: u8 },
    /// `wait_idle`, only where the model says nothing is live.
    WaitIdle,
}

/// A room's current lifecycle in the model.
#[derive(Clone, Debug)]
struct Room {
    handle: RoomHandle,
    phase: Phase,
    pages: Vec<u32>,
    original: RankSet,
    pending: RankSet,
    transfers: u32,
}

#[derive(Clone, Debug, Default)]
struct Slot {
    gen: u32,
    live: Option<Room>,
}

/// The reference model.
#[derive(Debug)]
pub struct Model {
    pages: usize,
    ranks: u32,
    /// Every handle the table has issued: the only values its check accepts (a value it did
    /// not issue matches a check with probability 2^-64, see `src/handle.rs`).
    issued: HashSet<RoomHandle>,
    slots: Vec<Slot>,
    free_pages: BTreeSet<u32>,
    fenced: RankSet,
    releases: u64,
    stale: u64,
    duplicates: u64,
    orphaned: u64,
    /// Orphaned releases not yet taken.
    orphans: Vec<Released>,
    /// Every lifecycle released so far (wire forms): a second release is a bug.
    released: HashSet<u128>,
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

impl Model {
    /// A model of a fresh table of `config`.
    pub fn new(config: Config) -> Model {
        Model {
            pages: config.pages,
            ranks: config.ranks as u32,
            issued: HashSet::new(),
            slots: vec![Slot::default(); config.rooms],
            free_pages: (0..config.pages as u32).collect(),
            fenced: RankSet::new(),
            releases: 0,
            stale: 0,
            duplicates: 0,
            orphaned: 0,
            orphans: Vec::new(),
            released: HashSet::new(),
            opened: 0,
        }
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
        Ok((slot.gen == h.generation() && slot.live.is_some()).then_some(index))
    }

    fn room(&mut self, index: usize) -> &mut Room {
        self.slots[index]
            .live
            .as_mut()
            .expect("resolved room is live")
    }

    fn check_rank(&self, rank: u32) -> Result<(), Error> {
        if rank >= self.ranks {
            return Err(Error::RankOutOfRange {
                rank,
                max: self.ranks,
            });
        }
        Ok(())
    }

    fn stale_err<T>(&mut self) -> Result<T, Error> {
        self.stale += 1;
        Err(Error::StaleHandle)
    }

    /// Releases room `index` if it is closing and nothing holds it.
    fn maybe_release(&mut self, index: usize) -> Option<Released> {
        let room = self.slots[index].live.as_ref()?;
        if !room.phase.is_closing() || room.transfers != 0 || !room.pending.is_empty() {
            return None;
        }
        let room = self.slots[index].live.take().expect("checked");
        self.slots[index].gen = self.slots[index].gen.wrapping_add(1);
        for &p in &room.pages {
            assert!(self.free_pages.insert(p), "model: page {p} freed twice");
        }
        self.releases += 1;
        assert!(
            self.released.insert(room.handle.to_wire()),
            "model: {:?} released twice",
            room.handle
        );
        Some(Released {
            handle: room.handle,
            pages: room.pages.len(),
            phase: room.phase,
        })
    }

    /// Predicts `open`, checks the library's legal-but-arbitrary choices, and adopts them.
    pub fn open(
        &mut self,
        n: usize,
        writers: &RankSet,
        lib: &Result<kvfence::Opened, Error>,
    ) -> Check {
        let expected = (|| {
            if n == 0 {
                return Err(Error::NoPages);
            }
            if n > self.pages {
                return Err(Error::TooManyPages {
                    requested: n,
                    capacity: self.pages,
                });
            }
            if let Some(max) = writers.max() {
                self.check_rank(max)?;
            }
            if let Some(rank) = writers.intersection(&self.fenced).iter().next() {
                return Err(Error::RankFenced { rank });
            }
            if self.slots.iter().all(|s| s.live.is_some()) {
                return Err(Error::RoomTableFull);
            }
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
        let h = opened.handle;
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
        same("open: generation", &h.generation(), &slot.gen)?;
        same("open: page count", &opened.pages.len(), &n)?;
        let mut seen = BTreeSet::new();
        for &p in &opened.pages {
            if !seen.insert(p) {
                return Err(format!("open: page {p} handed out twice in one room"));
            }
            if !self.free_pages.contains(&p) {
                return Err(format!(
                    "open: page {p} is not free (still in another room, or out of range)"
                ));
            }
        }
        for p in &opened.pages {
            self.free_pages.remove(p);
        }
        self.opened += 1;
        self.slots[index].live = Some(Room {
            handle: h,
            phase: Phase::Owned,
            pages: opened.pages.clone(),
            original: *writers,
            pending: *writers,
            transfers: 0,
        });
        Ok(())
    }

    /// `begin_transfer`: the room index on success.
    pub fn begin(&mut self, h: RoomHandle) -> Result<usize, Error> {
        let Some(index) = self.resolve(h)? else {
            return self.stale_err();
        };
        let room = self.room(index);
        if room.phase != Phase::Owned {
            return Err(Error::RoomClosed { phase: room.phase });
        }
        room.transfers += 1;
        Ok(index)
    }

    /// A guard of room `index` ends; `orphan`: it was dropped, not completed.
    pub fn end_transfer(&mut self, index: usize, orphan: bool) -> Option<Released> {
        self.room(index).transfers -= 1;
        let released = self.maybe_release(index);
        if orphan {
            if let Some(r) = released {
                self.orphaned += 1;
                self.orphans.push(r);
            }
            return None;
        }
        released
    }

    /// `quiesce`.
    pub fn quiesce(&mut self, h: RoomHandle, rank: u32) -> Result<Quiesced, Error> {
        let index = self.resolve(h)?;
        self.check_rank(rank)?;
        let Some(index) = index else {
            return self.stale_err();
        };
        let room = self.room(index);
        if !room.original.contains(rank) {
            return Err(Error::RankNotInRoom { rank });
        }
        if !room.pending.remove(rank) {
            self.duplicates += 1;
            return Ok(Quiesced::Duplicate);
        }
        Ok(match self.maybe_release(index) {
            Some(r) => Quiesced::Released(r),
            None => Quiesced::Recorded,
        })
    }

    fn close(&mut self, h: RoomHandle, to: Phase) -> Result<Option<Released>, Error> {
        let Some(index) = self.resolve(h)? else {
            return self.stale_err();
        };
        let room = self.room(index);
        match room.phase {
            Phase::Aborting => return Err(Error::AlreadyAborted),
            Phase::Draining => return Err(Error::AlreadyFinished),
            _ => room.phase = to,
        }
        Ok(self.maybe_release(index))
    }

    /// `abort`.
    pub fn abort(&mut self, h: RoomHandle) -> Result<Aborted, Error> {
        let released = self.close(h, Phase::Aborting)?;
        let fanout = match released {
            Some(_) => RankSet::new(),
            None => self.room(h.index()).pending,
        };
        Ok(Aborted { fanout, released })
    }

    /// `finish`.
    pub fn finish(&mut self, h: RoomHandle) -> Result<Option<Released>, Error> {
        self.close(h, Phase::Draining)
    }

    /// `fence_rank`.
    pub fn fence(&mut self, rank: u32) -> Result<Fenced, Error> {
        self.check_rank(rank)?;
        self.fenced.insert(rank).expect("rank < 256");
        let mut out = Fenced::default();
        for index in 0..self.slots.len() {
            let Some(room) = self.slots[index].live.as_mut() else {
                continue;
            };
            if room.pending.remove(rank) {
                out.quiesced += 1;
                out.released.extend(self.maybe_release(index));
            }
        }
        Ok(out)
    }

    /// `readmit_rank`.
    pub fn readmit(&mut self, rank: u32) -> Result<bool, Error> {
        self.check_rank(rank)?;
        Ok(self.fenced.remove(rank))
    }

    /// `phase`.
    pub fn phase(&self, h: RoomHandle) -> Result<Phase, Error> {
        Ok(match self.resolve(h)? {
            Some(index) => self.slots[index].live.as_ref().expect("live").phase,
            None => Phase::Free,
        })
    }

    /// Whether nothing is live.
    pub fn idle(&self) -> bool {
        self.slots.iter().all(|s| s.live.is_none())
    }

    /// Pending ranks of the handle's lifecycle (empty if not live).
    pub fn pending(&self, h: RoomHandle) -> RankSet {
        match self.resolve(h) {
            Ok(Some(index)) => self.slots[index].live.as_ref().expect("live").pending,
            _ => RankSet::new(),
        }
    }

    /// The pages of a live room.
    fn pages_of(&self, index: usize) -> &[u32] {
        &self.slots[index].live.as_ref().expect("live").pages
    }

    /// Releases performed so far.
    pub fn releases(&self) -> u64 {
        self.releases
    }

    /// Rooms opened so far.
    pub fn opened(&self) -> u64 {
        self.opened
    }

    /// Compares `table.stats()` with the model, and checks the model's own conservation.
    pub fn check_stats(&self, table: &RoomTable) -> Check {
        let stats = table.stats();
        let (mut owned_r, mut held_r, mut owned_p, mut held_p) = (0, 0, 0, 0);
        let mut in_rooms = BTreeSet::new();
        let mut closing = Vec::new();
        for slot in &self.slots {
            let Some(room) = &slot.live else { continue };
            for &p in &room.pages {
                if !in_rooms.insert(p) || self.free_pages.contains(&p) {
                    return Err(format!("model: page {p} is in two places"));
                }
            }
            if room.phase == Phase::Owned {
                owned_r += 1;
                owned_p += room.pages.len();
            } else {
                held_r += 1;
                held_p += room.pages.len();
                closing.push((
                    room.handle,
                    room.phase,
                    room.pending,
                    room.transfers,
                    room.pages.len(),
                ));
            }
        }
        let rooms = self.slots.len();
        same(
            "model page conservation",
            &(self.free_pages.len() + in_rooms.len()),
            &self.pages,
        )?;
        same(
            "stats.rooms",
            &(stats.rooms.free, stats.rooms.owned, stats.rooms.held),
            &(rooms - owned_r - held_r, owned_r, held_r),
        )?;
        same(
            "stats.pages",
            &(stats.pages.free, stats.pages.owned, stats.pages.held),
            &(self.free_pages.len(), owned_p, held_p),
        )?;
        same("stats.pages.total()", &stats.pages.total(), &self.pages)?;
        same("stats.rooms.total()", &stats.rooms.total(), &rooms)?;
        let lib_closing: Vec<_> = stats
            .closing
            .iter()
            .map(|c| (c.handle, c.phase, c.waiting_on, c.transfers, c.pages))
            .collect();
        same("stats.closing", &lib_closing, &closing)?;
        same("stats.fenced", &stats.fenced, &self.fenced)?;
        same(
            "stats counters (releases, stale, duplicates, orphaned)",
            &(
                stats.releases,
                stats.stale_refused,
                stats.duplicate_acks,
                stats.orphaned_releases,
            ),
            &(self.releases, self.stale, self.duplicates, self.orphaned),
        )
    }
}

/// Drives a [`RoomTable`] and a [`Model`] side by side.
pub struct Harness<'t> {
    table: &'t RoomTable,
    /// The model.
    pub model: Model,
    guards: Vec<(TransferGuard<'t>, usize)>,
    known: Vec<RoomHandle>,
}

impl<'t> Harness<'t> {
    /// A harness over a fresh `table` made with `config`. Opens and finishes one room first,
    /// so that a known handle exists before any forged handle is derived from one.
    pub fn new(table: &'t RoomTable, config: Config) -> Result<Harness<'t>, String> {
        let mut h = Harness {
            table,
            model: Model::new(config),
            guards: Vec::new(),
            known: Vec::new(),
        };
        h.open(1, RankSet::new())?;
        let first = h.known[0];
        h.same_result("prime finish", table.finish(first), |m| m.finish(first))?;
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

    fn open(&mut self, n: usize, writers: RankSet) -> Check {
        let lib = self.table.open(n, &writers);
        self.model.open(n, &writers, &lib)?;
        if let Ok(opened) = lib {
            self.known.push(opened.handle);
        }
        Ok(())
    }

    fn begin(&mut self, h: RoomHandle) -> Check {
        let lib = self.table.begin_transfer(h);
        let expected = self.model.begin(h);
        match (lib, expected) {
            (Ok(guard), Ok(index)) => {
                same("guard.handle()", &guard.handle(), &h)?;
                same("guard.pages()", &guard.pages(), &self.model.pages_of(index))?;
                let via = guard.with_pages(|p| p.to_vec());
                same(
                    "guard.with_pages()",
                    &via.as_slice(),
                    &self.model.pages_of(index),
                )?;
                self.guards.push((guard, index));
                Ok(())
            }
            (lib, expected) => same(
                "begin_transfer",
                &lib.map(|g| g.handle()),
                &expected.map(|_| h),
            ),
        }
    }

    fn end(&mut self, sel: u8, complete: bool) -> Check {
        if self.guards.is_empty() {
            return Ok(());
        }
        let (guard, index) = self.guards.swap_remove(sel as usize % self.guards.len());
        same(
            "guard pages at end",
            &guard.pages(),
            &self.model.pages_of(index),
        )?;
        if complete {
            let lib = guard.complete();
            let expected = self.model.end_transfer(index, false);
            same("complete", &lib, &expected)
        } else {
            drop(guard);
            let none = self.model.end_transfer(index, true);
            debug_assert!(none.is_none());
            Ok(())
        }
    }

    fn quiesce(&mut self, h: RoomHandle, rank: u32) -> Check {
        let lib = self.table.quiesce(h, rank);
        self.same_result("quiesce", lib, |m| m.quiesce(h, rank))
    }

    fn take_orphaned(&mut self) -> Check {
        let lib = self.table.take_orphaned();
        let expected = std::mem::take(&mut self.model.orphans);
        same("take_orphaned", &lib, &expected)
    }

    fn wait_released(&mut self, h: RoomHandle) -> Check {
        // Only where it cannot block: errors, or a lifecycle already over.
        if matches!(self.model.resolve(h), Ok(Some(_))) {
            return Ok(());
        }
        let lib = self.table.wait_released(h);
        let expected = self.model.resolve(h).map(|_| ());
        same("wait_released", &lib, &expected)
    }

    /// Applies one operation to both and compares the results.
    pub fn step(&mut self, op: &Op) -> Check {
        let ranks = self.model.ranks;
        match *op {
            Op::Open {
                pages,
                width,
                mask,
                extra,
            } => {
                let n = match pages {
                    255 => self.model.pages + 1,
                    p => p as usize % (self.model.pages.min(24) + 1),
                };
                let mask = match width % 5 {
                    0 => 0,
                    1 => 1u64 << (mask % u64::from(ranks)),
                    2 => mask & 0xF,
                    3 => mask & 0xFFFF_0000_FFFF,
                    _ => mask,
                };
                let mut writers = RankSet::new();
                for r in 0..ranks.min(64) {
                    if mask >> r & 1 == 1 {
                        writers.insert(r).expect("< 64");
                    }
                }
                if extra % 8 == 0 {
                    writers.insert(u32::from(extra / 8)).expect("< 32");
                }
                self.open(n, writers)
            }
            Op::Begin { room } if !self.known.is_empty() => self.begin(self.pick(room)),
            Op::Complete { guard } => self.end(guard, true),
            Op::DropGuard { guard } => self.end(guard, false),
            Op::Quiesce { room, rank } if !self.known.is_empty() => {
                let h = self.pick(room);
                let pending = self.model.pending(h);
                let rank = if rank % 4 != 0 && !pending.is_empty() {
                    pending
                        .iter()
                        .nth((rank / 4) as usize % pending.len())
                        .expect("in range")
                } else {
                    u32::from(rank / 4)
                };
                self.quiesce(h, rank)
            }
            Op::Drain { room } if !self.known.is_empty() => {
                let h = self.pick(room);
                let pending = self.model.pending(h);
                if pending.is_empty() {
                    return self.quiesce(h, 0);
                }
                for rank in pending.iter() {
                    self.quiesce(h, rank)?;
                }
                Ok(())
            }
            Op::Abort { room } if !self.known.is_empty() => {
                let h = self.pick(room);
                let lib = self.table.abort(h);
                self.same_result("abort", lib, |m| m.abort(h))
            }
            Op::Finish { room } if !self.known.is_empty() => {
                let h = self.pick(room);
                let lib = self.table.finish(h);
                self.same_result("finish", lib, |m| m.finish(h))
            }
            Op::Fence { rank } => {
                let rank = u32::from(rank) % (ranks + 1);
                let lib = self.table.fence_rank(rank);
                self.same_result("fence_rank", lib, |m| m.fence(rank))
            }
            Op::Readmit { rank } => {
                let rank = u32::from(rank) % (ranks + 1);
                let lib = self.table.readmit_rank(rank);
                self.same_result("readmit_rank", lib, |m| m.readmit(rank))
            }
            Op::Phase { room } if !self.known.is_empty() => {
                let h = self.pick(room);
                let lib = self.table.phase(h);
                self.same_result("phase", lib, |m| m.phase(h))
            }
            Op::Forged {
                how,
                wire,
                action,
                rank,
            } => {
                let rooms = self.model.slots.len();
                let known = self.pick(wire as u8);
                let h = match how % 4 {
                    0 => RoomHandle::from_wire(u128::from(wire) << (wire % 3 * 32)),
                    1 => forge(wire as usize, (wire >> 32) as u32, known),
                    2 => {
                        let index = wire as usize % (rooms + 2);
                        let gen = self.model.slots.get(index).map_or(0, |s| s.gen);
                        let delta = ((wire >> 32) % 3) as u32;
                        forge(index, gen.wrapping_add(delta).wrapping_sub(1), known)
                    }
                    _ => RoomHandle::from_wire(known.to_wire() ^ 1 << ((wire >> 8) % 128)),
                };
                same("wire round trip", &RoomHandle::from_wire(h.to_wire()), &h)?;
                match action % 6 {
                    0 => self.begin(h),
                    1 => self.quiesce(h, u32::from(rank) % (ranks + 2)),
                    2 => {
                        let lib = self.table.abort(h);
                        self.same_result("abort (forged)", lib, |m| m.abort(h))
                    }
                    3 => {
                        let lib = self.table.finish(h);
                        self.same_result("finish (forged)", lib, |m| m.finish(h))
                    }
                    4 => {
                        let lib = self.table.phase(h);
                        self.same_result("phase (forged)", lib, |m| m.phase(h))
                    }
                    _ => self.wait_released(h),
                }
            }
            Op::TakeOrphaned => self.take_orphaned(),
            Op::WaitReleased { room } if !self.known.is_empty() => {
                self.wait_released(self.pick(room))
            }
            Op::WaitIdle if self.model.idle() => {
                self.table.wait_idle();
                Ok(())
            }
            // Selectors with nothing to select, or a wait that would block.
            _ => Ok(()),
        }
    }

    /// The invariants, after every step.
    pub fn check(&self) -> Check {
        self.model.check_stats(self.table)
    }

    /// Ends every guard, closes and drains every live room, and checks that everything
    /// came back: all rooms and pages free, every opened lifecycle released exactly once.
    pub fn finish_all(&mut self) -> Check {
        while !self.guards.is_empty() {
            self.end(0, true)?;
            self.check()?;
        }
        for index in 0..self.model.slots.len() {
            let Some(room) = &self.model.slots[index].live else {
                continue;
            };
            let h = room.handle;
            if room.phase == Phase::Owned {
                let lib = self.table.abort(h);
                self.same_result("final abort", lib, |m| m.abort(h))?;
            }
            for rank in self.model.pending(h).iter() {
                self.quiesce(h, rank)?;
            }
            self.check()?;
        }
        self.take_orphaned()?;
        self.check()?;
        if !self.model.idle() {
            return Err("final: a room is still live after draining everything".into());
        }
        same(
            "final: releases == opens",
            &self.model.releases(),
            &self.model.opened(),
        )?;
        let stats = self.table.stats();
        same("final: free pages", &stats.pages.free, &self.model.pages)?;
        same(
            "final: free rooms",
            &stats.rooms.free,
            &self.model.slots.len(),
        )?;
        self.table.wait_idle();
        Ok(())
    }
}

/// Runs one case: a fresh table, the operations with a check after each, then the drain.
/// `Err` describes the first divergence (step index, operation, what differed).
pub fn run_case(setup: Setup, ops: &[Op]) -> Check {
    let config = setup.config();
    let table = RoomTable::new(config).map_err(|e| format!("RoomTable::new: {e}"))?;
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
    let setup = Setup::arbitrary(&mut u).unwrap_or(Setup {
        rooms: 2,
        pages: 8,
        ranks: 2,
    });
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
