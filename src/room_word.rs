//! The room word: one `AtomicU64` holding a room's whole lifecycle.
//!
//! # Implementation details
//!
//! ```text
//!  63 62  61  60  59  58 57 56                32 31                              0
//! +-----+---+---+---+-----+--------------------+--------------------------------+
//! |phase| Q | S | G |words|     transfers      |           generation           |
//! +-----+---+---+---+-----+--------------------+--------------------------------+
//! ```
//!
//! * `phase` is [`Phase`]: `FREE -> OWNED -> (ABORTING | DRAINING) -> FREE`.
//! * Four kinds of *hold* keep a closing room from being released, each in its own field
//!   so that one load of the word says exactly what holds the room ([`Hold`]):
//!   `transfers` (local transfers in flight or failed: one per live
//!   [`TransferGuard`](crate::TransferGuard) or token), `words` (writer-mask words that
//!   still have a pending rank, at most two: see `writers.rs`), `G` (the *grow* hold:
//!   `grow` and `pages_of` hold the room while they touch its page list, under the room's
//!   grow lock, so at most one at a time) and `S` (the *stamp* hold: the closer of an
//!   `OWNED` room holds it while it stores the closing time, so that the time it stores
//!   can only belong to its own lifecycle).
//! * `Q`: the lifecycle is quarantined. It is set by the same CAS that closes the room (or
//!   by a CAS on a closing room that is still held), so the RMW that decides the release
//!   reads it in the value it observes: a quarantine either takes part in the decision or
//!   is refused and changes nothing (never "refused, yet the pages are kept").
//! * `generation` numbers the room's lifecycles; a handle carries the generation it was
//!   opened with, and every operation compares it first.
//!
//! Every transition is one atomic read-modify-write of this word (a CAS; a `fetch_sub`
//! to drop an owned hold; a `fetch_add` to add a transfer hold), and the release
//! (`ABORTING|DRAINING` with no hold -> `FREE`, generation + 1) is always a CAS from exactly
//! "closing, this generation, no hold", so "no hold of any kind" is *observed* and *acted
//! on* in one RMW: the release cannot be performed twice (the generation moves on with
//! it), and cannot be performed while a hold can still be added, because a hold is only
//! *kept* by a call that found the room `OWNED` and of its generation. The release's
//! [`Reason`] is a function of the value that CAS replaced (the closing phase and `Q`),
//! never of a separate store.
//!
//! **Transient units** (issue 42): a transfer hold is taken optimistically, one
//! `fetch_add` whose returned value is checked afterwards ([`RoomWord::begin_transfer`]),
//! the cheapest hold there is (a CAS loop needs a load and a compare first). A refused
//! call has then added a unit to a word that did not want it (closing, full, `FREE`, or a
//! later lifecycle's) and takes it back with a `fetch_sub` right away. Until then the unit
//! *is* a transfer hold to everyone (nothing can tell it apart), so the rules are written
//! for it:
//! * it can only delay a release, never cause one; if the last real hold's drop saw it, the
//!   unit's take-back is the drop that takes the room to no hold, and it performs the
//!   release (delivered through the release queue: a refused `begin` has nobody to return
//!   it to);
//! * nothing erases it: the release CAS needs the count at zero, and
//!   [`RoomWord::publish`] adds `OWNED` to a `FREE` word instead of storing one, so the
//!   take-back always finds its unit (a word never goes below zero or borrows from the
//!   field above); a later lifecycle inherits the units of stale calls still in flight,
//!   and their take-back may be its release;
//! * the count never carries: [`MAX_TRANSFERS`] is half the field, and at most one unit
//!   per thread inside `begin_transfer` is transient.
//!
//! Who writes the word:
//! * the opener, once per lifecycle, with [`RoomWord::publish`] (a `Release` `fetch_add` of
//!   `OWNED` and the writer holds: it owns the room through the room bitmap, and nothing
//!   else changes a `FREE` word but transient units);
//! * everyone else by RMW, and a hold is only kept while the phase is `OWNED` (added) or
//!   not `FREE` (dropped) and the generation matches the handle: a CAS for every checked
//!   transition, a `fetch_add` for a transfer hold, a `fetch_sub` to drop an owned hold
//!   or take back a transient unit; the `fetch_sub` that takes a closing room to no hold
//!   then tries the release CAS (see [`RoomWord::drop_hold`]).
//!
//! Orderings: every CAS is `AcqRel`. The `Release` half publishes the caller's writes to
//! the pages (a transfer's bytes, an ACK's "I have drained") to whoever performs the
//! release; the `Acquire` half of the release CAS receives them all (RMWs continue a
//! release sequence), so the releaser, and through the page bitmap the next owner,
//! happen-after every write to the pages made under the old lifecycle.

use crate::pack::Field;
use crate::sync::{AtomicU64, Ordering};

const GEN: Field = Field::after(None, 32);
const TRANSFERS: Field = Field::after(Some(GEN), 25);
const WORDS: Field = Field::after(Some(TRANSFERS), 2);
const GROW: Field = Field::after(Some(WORDS), 1);
const STAMP: Field = Field::after(Some(GROW), 1);
const QUARANTINED: Field = Field::after(Some(STAMP), 1);
const PHASE: Field = Field::after(Some(QUARANTINED), 2);

/// The most transfers one room can carry at once: half the field, so that the transient
/// units of refused [`RoomWord::begin_transfer`]s (one per thread inside the call at most)
/// can never carry out of it.
pub(crate) const MAX_TRANSFERS: u32 = (TRANSFERS.max() / 2 + 1) as u32;
// Headroom for the transient units: the limit plus as many again still fit the field.
const _: () = assert!(MAX_TRANSFERS as u64 * 2 - 1 <= TRANSFERS.max());

/// What holds a room (see the module docs); each is one unit of its own field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hold {
    /// A local transfer (guard or token), in flight or failed.
    Transfer,
    /// A writer-mask word with a pending rank.
    Writers,
    /// `grow` or `pages_of`, under the room's grow lock.
    Grow,
    /// The closer of an `OWNED` room, while it stamps the closing time.
    Stamp,
}

impl Hold {
    const fn one(self) -> u64 {
        match self {
            Hold::Transfer => TRANSFERS.set(0, 1),
            Hold::Writers => WORDS.set(0, 1),
            Hold::Grow => GROW.set(0, 1),
            Hold::Stamp => STAMP.set(0, 1),
        }
    }
}

/// Where a room is in its lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not in use; its pages are back in the pool.
    Free,
    /// Live: transfers may begin, writer ranks report done with `quiesce`.
    Owned,
    /// Aborted: no transfer may begin; waits for writers' ACKs and in-flight transfers.
    Aborting,
    /// Finished normally: no transfer may begin; waits for what is still in flight.
    Draining,
}

impl Phase {
    const fn from_bits(bits: u64) -> Phase {
        match bits {
            0 => Phase::Free,
            1 => Phase::Owned,
            2 => Phase::Aborting,
            _ => Phase::Draining,
        }
    }

    const fn bits(self) -> u64 {
        match self {
            Phase::Free => 0,
            Phase::Owned => 1,
            Phase::Aborting => 2,
            Phase::Draining => 3,
        }
    }

    /// `Aborting` or `Draining`: closed to new transfers, pages still held.
    pub const fn is_closing(self) -> bool {
        matches!(self, Phase::Aborting | Phase::Draining)
    }
}

impl core::fmt::Display for Phase {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Phase::Free => "free",
            Phase::Owned => "owned",
            Phase::Aborting => "aborting",
            Phase::Draining => "draining",
        })
    }
}

/// Why a room was released.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Finished normally (`finish`), and everything in flight drained.
    Finished,
    /// Aborted, and every writer acknowledged (or was fenced) and every transfer ended.
    Aborted,
    /// Quarantined: the room index is back, but the pages must **never** be freed or
    /// reused (a write to them may still land). Pool mode keeps them out of the pool.
    Quarantined,
}

impl Reason {
    pub(crate) const fn code(self) -> u32 {
        match self {
            Reason::Finished => 0,
            Reason::Aborted => 1,
            Reason::Quarantined => 2,
        }
    }
    pub(crate) const fn from_code(code: u32) -> Reason {
        match code {
            0 => Reason::Finished,
            1 => Reason::Aborted,
            _ => Reason::Quarantined,
        }
    }
}

impl core::fmt::Display for Reason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Reason::Finished => "finished",
            Reason::Aborted => "aborted",
            Reason::Quarantined => "quarantined",
        })
    }
}

/// A decoded room word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct State(u64);

impl State {
    /// A state with `transfers` transfer holds and `words` writer holds.
    pub(crate) const fn new(phase: Phase, transfers: u32, words: u32, gen: u32) -> State {
        State(PHASE.set(
            WORDS.set(
                TRANSFERS.set(GEN.set(0, gen as u64), transfers as u64),
                words as u64,
            ),
            phase.bits(),
        ))
    }
    pub(crate) const fn phase(self) -> Phase {
        Phase::from_bits(PHASE.get(self.0))
    }
    /// Transfers holding the room (in flight or failed).
    pub(crate) const fn transfers(self) -> u32 {
        TRANSFERS.get(self.0) as u32
    }
    /// Writer-mask words holding the room.
    pub(crate) const fn words(self) -> u32 {
        WORDS.get(self.0) as u32
    }
    /// Whether a grower holds the grow hold.
    const fn growing(self) -> bool {
        GROW.get(self.0) != 0
    }
    /// Whether a closer holds the stamp hold.
    const fn stamping(self) -> bool {
        STAMP.get(self.0) != 0
    }
    /// Whether this lifecycle is quarantined.
    pub(crate) const fn quarantined(self) -> bool {
        QUARANTINED.get(self.0) != 0
    }
    /// Every hold, of every kind.
    pub(crate) const fn holds(self) -> u32 {
        self.transfers() + self.words() + (GROW.get(self.0) + STAMP.get(self.0)) as u32
    }
    pub(crate) const fn gen(self) -> u32 {
        GEN.get(self.0) as u32
    }
    const fn with_phase(self, phase: Phase) -> State {
        State(PHASE.set(self.0, phase.bits()))
    }
    const fn with_quarantine(self) -> State {
        State(QUARANTINED.set(self.0, 1))
    }
    const fn with_stamp(self) -> State {
        State(STAMP.set(self.0, 1))
    }
    /// The state a release moves to: `FREE`, no holds, next generation.
    const fn released(self) -> State {
        State::new(Phase::Free, 0, 0, self.gen().wrapping_add(1))
    }
    /// Why a release from this (closing) state happened.
    pub(crate) const fn reason(self) -> Reason {
        if self.quarantined() {
            Reason::Quarantined
        } else if matches!(self.phase(), Phase::Aborting) {
            Reason::Aborted
        } else {
            Reason::Finished
        }
    }
}

/// Why the room word refused a transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The word is in another lifecycle (or `FREE`), or its release is decided: the handle
    /// is stale.
    Stale,
    /// Same lifecycle, but the phase forbids the transition.
    Phase(Phase),
    /// The hold's field is full.
    HoldsFull,
}

/// A refused [`RoomWord::begin_transfer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Refused {
    /// Why.
    pub(crate) refusal: Refusal,
    /// The release that taking the transient unit back performed, if it did: the
    /// generation it ended (not necessarily the caller's) and why. The caller must deliver
    /// it (it has no caller of its own to return it to: the release queue).
    pub(crate) released: Option<(u32, Reason)>,
}

/// What a transition that may release did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub(crate) enum Step {
    /// The room is still held.
    Held,
    /// This call performed the release, for the given reason: the caller now owns the
    /// room's pages and must return them and the room index.
    Released(Reason),
}

/// What closing (or quarantining) a room did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub(crate) enum Closed {
    /// Released in the same CAS (nothing held it).
    Released(Reason),
    /// Still held; it was closing already, so its closing time is stamped already.
    Held,
    /// Still held, closed by this call: the caller holds the stamp hold, stores the
    /// closing time and then drops it ([`RoomWord::drop_hold`] with [`Hold::Stamp`]).
    Stamp,
}

/// One room's lifecycle word.
#[derive(Debug)]
pub(crate) struct RoomWord(AtomicU64);

impl RoomWord {
    pub(crate) fn new() -> RoomWord {
        RoomWord(AtomicU64::new(State::new(Phase::Free, 0, 0, 0).0))
    }

    #[inline]
    pub(crate) fn load(&self, order: Ordering) -> State {
        State(self.0.load(order))
    }

    /// Makes a claimed room live with `words` pending mask words.
    ///
    /// Only the thread that claimed the room's index in the room bitmap may call this, while
    /// the word is `FREE`; `Release` publishes the page list and the mask words it wrote.
    ///
    /// A `fetch_add` of the difference, not a store: a `FREE` word may carry transient
    /// transfer units of refused [`begin_transfer`](Self::begin_transfer)s with stale
    /// handles, which their callers take back with a `fetch_sub`; a store would erase them
    /// and that `fetch_sub` would then take a unit the new lifecycle never had. Everything
    /// else of a `FREE` word is zero (phase, `Q`, `S`, `G`, `words`: see
    /// [`State::released`]), so adding `OWNED` and `words` sets exactly those fields.
    #[inline] // inlined into kvfence-ffi (see lib.rs)
    pub(crate) fn publish(&self, gen: u32, words: u32) {
        debug_assert_eq!(
            State(self.load(Ordering::Relaxed).0 & !TRANSFERS.set(0, TRANSFERS.max())),
            State::new(Phase::Free, 0, 0, gen)
        );
        self.0
            .fetch_add(State::new(Phase::Owned, 0, words, 0).0, Ordering::Release);
    }

    /// The CAS loop every checked transition goes through: `f` maps the current state to the
    /// next one or refuses.
    #[inline(always)]
    fn transition(
        &self,
        mut f: impl FnMut(State) -> Result<State, Refusal>,
    ) -> Result<(State, State), Refusal> {
        let mut cur = self.load(Ordering::Acquire);
        loop {
            let next = f(cur)?;
            match self
                .0
                .compare_exchange_weak(cur.0, next.0, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok((cur, next)),
                Err(actual) => cur = State(actual),
            }
        }
    }

    /// Adds the grow hold: only to an `OWNED` room of generation `gen`. It is taken under
    /// the room's grow lock, so it is never taken twice.
    pub(crate) fn begin_grow(&self, gen: u32) -> Result<(), Refusal> {
        self.transition(|s| {
            refusal(s, gen)?;
            if s.growing() {
                return Err(Refusal::HoldsFull);
            }
            Ok(State(s.0 + Hold::Grow.one()))
        })
        .map(|_| ())
    }

    /// Adds a transfer hold: only to an `OWNED` room of generation `gen` with fewer than
    /// [`MAX_TRANSFERS`] transfers.
    ///
    /// **Optimistic**: one `fetch_add` of a transfer unit, then the checks on the value it
    /// returns. If they pass, the unit is the hold (the same RMW that checked the word added
    /// it). If not, the caller put a *transient unit* into a word that refuses it (closing,
    /// full, `FREE`, or another lifecycle's) and takes it back at once ([`Self::back_out`]);
    /// that take-back may perform a release (possibly of another lifecycle), which comes
    /// back in [`Refused::released`] for the caller to deliver.
    ///
    /// A transient unit counts as a hold for as long as it is in the word (every rule reads
    /// `transfers` whatever put it there): it can delay a release, never cause one early;
    /// and because the release is a CAS that needs the count at zero (see
    /// [`drop_hold`](Self::drop_hold)), never erase a unit, and `publish` adds to the word
    /// rather than storing it, the unit is still there when its `fetch_sub` comes.
    #[inline]
    pub(crate) fn begin_transfer(&self, gen: u32) -> Result<(), Refused> {
        if mutant!(kvfence_naive_release) {
            // Under the test-only mutation a release can happen under a hold: keep the
            // checked CAS (as `drop_hold` does) so no unit lands in a word it freed.
            return self
                .transition(|s| {
                    refusal(s, gen)?;
                    if s.transfers() >= MAX_TRANSFERS {
                        return Err(Refusal::HoldsFull);
                    }
                    Ok(State(s.0 + Hold::Transfer.one()))
                })
                .map(|_| ())
                .map_err(|refusal| Refused {
                    refusal,
                    released: None,
                });
        }
        let old = State(self.0.fetch_add(Hold::Transfer.one(), Ordering::AcqRel));
        let checked = match refusal(old, gen) {
            Ok(()) if old.transfers() >= MAX_TRANSFERS => Err(Refusal::HoldsFull),
            checked => checked,
        };
        match checked {
            Ok(()) => Ok(()),
            Err(refusal) => Err(Refused {
                refusal,
                released: self.back_out(),
            }),
        }
    }

    /// Takes back the transient unit of a refused [`begin_transfer`](Self::begin_transfer):
    /// one `fetch_sub`. If that took a closing room to no hold, tries the release (it may be
    /// this call's to perform: the last real hold's drop saw the unit and left the room
    /// held) and returns it, with the generation it ended, for the caller to deliver.
    #[cold]
    pub(crate) fn back_out(&self) -> Option<(u32, Reason)> {
        let old = State(self.0.fetch_sub(Hold::Transfer.one(), Ordering::AcqRel));
        debug_assert!(old.transfers() > 0, "back_out without a unit: {old:?}");
        self.release_if_last(old, Hold::Transfer)
            .map(|reason| (old.gen(), reason))
    }

    /// The first half of a refused `begin_transfer`, for tests: its unit, not taken back.
    #[cfg(test)]
    pub(crate) fn add_transient_unit(&self) {
        self.0.fetch_add(Hold::Transfer.one(), Ordering::AcqRel);
    }

    /// After a `fetch_sub` of `kind` that returned `old`: if it took a closing room to no
    /// hold, the release, by CAS from exactly that state (see [`drop_hold`](Self::drop_hold)).
    #[inline]
    fn release_if_last(&self, old: State, kind: Hold) -> Option<Reason> {
        if old.holds() != 1 || !old.phase().is_closing() {
            return None;
        }
        let mut cur = State(old.0 - kind.one());
        loop {
            // Only a closing room of the same lifecycle with no hold at all: anything else
            // means a transient unit came in (its `back_out` tries again) or the release is
            // done (by that `back_out`).
            if cur.gen() != old.gen() || !cur.phase().is_closing() || cur.holds() != 0 {
                return None;
            }
            match self.0.compare_exchange_weak(
                cur.0,
                cur.released().0,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(cur.reason()),
                Err(actual) => cur = State(actual),
            }
        }
    }

    /// Drops one hold of kind `kind` the caller owns; the call that drops the last hold of
    /// a closing room releases it (unless a transient unit came in: see below).
    ///
    /// One `fetch_sub`, not a CAS loop: the caller *owns* the hold, so the word cannot be
    /// in another generation or `FREE` (a held room is never released), and no check is
    /// needed before the decrement. A decrement that takes a closing room from one hold to
    /// none then performs the release with a CAS from exactly "closing, this lifecycle, no
    /// hold" to `FREE`, generation + 1: that CAS is the deciding RMW, and the reason
    /// (phase, quarantine bit) is read from the value it replaced. In between, the word
    /// can only change by the transient units of refused `begin_transfer`s (`close` and
    /// `quarantine` refuse a closing room with no hold, every other decrement needs a
    /// hold, and none is left). If one came in, the CAS finds a hold and gives up: the
    /// unit's `back_out` is now the decrement that takes the room to no hold, and it tries
    /// the same CAS. So exactly one CAS releases (the generation moves on with it), and one
    /// is always tried after the last change.
    #[inline]
    pub(crate) fn drop_hold(&self, gen: u32, kind: Hold) -> Result<Step, Refusal> {
        if mutant!(kvfence_naive_release) {
            // Under the test-only mutation a hold can outlive its room; keep the checked
            // CAS so the mutation is observed as wrong releases, not as a corrupted word.
            return self.drop_hold_checked(gen, kind);
        }
        let old = State(self.0.fetch_sub(kind.one(), Ordering::AcqRel));
        debug_assert!(
            old.gen() == gen && old.phase() != Phase::Free && held_by(old, kind),
            "drop_hold without a hold: {old:?} {kind:?}"
        );
        Ok(match self.release_if_last(old, kind) {
            Some(reason) => Step::Released(reason),
            None => Step::Held,
        })
    }

    /// `drop_hold` as a checked CAS loop (generation, phase and count verified first).
    fn drop_hold_checked(&self, gen: u32, kind: Hold) -> Result<Step, Refusal> {
        let (old, new) = self.transition(|s| {
            if s.gen() != gen || s.phase() == Phase::Free || !held_by(s, kind) {
                return Err(Refusal::Stale);
            }
            let next = State(s.0 - kind.one());
            if next.holds() == 0 && s.phase().is_closing() {
                Ok(s.released())
            } else {
                Ok(next)
            }
        })?;
        Ok(if new.phase() == Phase::Free {
            Step::Released(old.reason())
        } else {
            Step::Held
        })
    }

    /// Closes an `OWNED` room to `to` (`Aborting` or `Draining`), or a `DRAINING` room to
    /// `Aborting`; releases it in the same CAS if nothing holds it. A room closed from
    /// `OWNED` that stays held comes back with the stamp hold ([`Closed::Stamp`]).
    pub(crate) fn close(&self, gen: u32, to: Phase) -> Result<Closed, Refusal> {
        debug_assert!(to.is_closing());
        let (old, new) = self.transition(|s| {
            if s.gen() != gen || s.phase() == Phase::Free {
                return Err(Refusal::Stale);
            }
            // A closing room with no hold is being released: a `fetch_sub` took it there
            // and its thread is about to try the release CAS. Refused, so that this call's
            // answer matches that release (which would also win against a close here: both
            // are CASes from the same value, issue 42).
            if s.phase().is_closing() && s.holds() == 0 {
                return Err(Refusal::Stale);
            }
            // An abort may also overtake a finish (the client left while the room drained).
            let closable = s.phase() == Phase::Owned
                || (s.phase() == Phase::Draining && to == Phase::Aborting);
            if !closable {
                return Err(Refusal::Phase(s.phase()));
            }
            if mutant!(kvfence_naive_release) && to == Phase::Aborting {
                // MUTATION (test-only): the rule peers used before the fix, "free the
                // pages at abort". The loom models and the fuzz comparison must reject it.
                return Ok(s.with_phase(to).released());
            }
            Ok(closing(s, s.with_phase(to)))
        })?;
        // A quarantined room is `Aborting`, which no close accepts: never quarantined here.
        let reason = if to == Phase::Aborting {
            Reason::Aborted
        } else {
            Reason::Finished
        };
        Ok(closed(old, new, reason))
    }

    /// Quarantines lifecycle `gen`: sets the quarantine bit and closes the room to
    /// `Aborting` (if it was `OWNED` or `DRAINING`), in one CAS; releases it in that CAS if
    /// nothing holds it. Refused (and nothing changes) once the release is decided.
    pub(crate) fn quarantine(&self, gen: u32) -> Result<Closed, Refusal> {
        let (old, new) = self.transition(|s| {
            if s.gen() != gen || s.phase() == Phase::Free {
                return Err(Refusal::Stale);
            }
            if s.phase().is_closing() && s.holds() == 0 {
                return Err(Refusal::Stale);
            }
            Ok(closing(s, s.with_phase(Phase::Aborting).with_quarantine()))
        })?;
        Ok(closed(old, new, Reason::Quarantined))
    }
}

/// Why a hold cannot be added to `s` by a handle of lifecycle `gen`, if it cannot.
#[inline(always)]
const fn refusal(s: State, gen: u32) -> Result<(), Refusal> {
    if s.gen() != gen || matches!(s.phase(), Phase::Free) {
        return Err(Refusal::Stale);
    }
    if !matches!(s.phase(), Phase::Owned) {
        return Err(Refusal::Phase(s.phase()));
    }
    Ok(())
}

/// Whether `s` carries a hold of `kind`.
const fn held_by(s: State, kind: Hold) -> bool {
    match kind {
        Hold::Transfer => s.transfers() > 0,
        Hold::Writers => s.words() > 0,
        Hold::Grow => s.growing(),
        Hold::Stamp => s.stamping(),
    }
}

/// The state a close from `s` to `to` moves to: released if nothing holds it, with the
/// stamp hold if it leaves `OWNED`.
const fn closing(s: State, to: State) -> State {
    if s.holds() == 0 {
        to.released()
    } else if matches!(s.phase(), Phase::Owned) {
        to.with_stamp()
    } else {
        to
    }
}

/// What a closing CAS from `old` to `new` did; `reason`: the release's, if it released.
fn closed(old: State, new: State, reason: Reason) -> Closed {
    if new.phase() == Phase::Free {
        Closed::Released(reason)
    } else if new.stamping() && !old.stamping() {
        Closed::Stamp
    } else {
        Closed::Held
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn layout_round_trips() {
        let s = State::new(Phase::Draining, MAX_TRANSFERS, 2, u32::MAX);
        assert_eq!(
            (s.phase(), s.transfers(), s.words(), s.gen()),
            (Phase::Draining, MAX_TRANSFERS, 2, u32::MAX)
        );
        assert!(!s.quarantined() && !s.stamping() && !s.growing());
        let q = State(s.with_quarantine().with_stamp().0 + Hold::Grow.one());
        assert!(q.quarantined() && q.stamping() && q.growing());
        assert_eq!(
            (q.phase(), q.transfers(), q.words(), q.gen()),
            (Phase::Draining, MAX_TRANSFERS, 2, u32::MAX)
        );
        assert_eq!(q.holds(), MAX_TRANSFERS + 4);
        let s = State::new(Phase::Owned, 7, 1, 3);
        assert_eq!(
            (s.phase(), s.transfers(), s.words(), s.gen()),
            (Phase::Owned, 7, 1, 3)
        );
    }

    #[test]
    fn release_needs_close_and_no_hold() {
        let w = RoomWord::new();
        w.publish(0, 1);
        w.begin_transfer(0).unwrap();
        assert_eq!(w.drop_hold(0, Hold::Transfer), Ok(Step::Held));
        assert_eq!(w.close(0, Phase::Aborting), Ok(Closed::Stamp));
        assert_eq!(
            w.begin_transfer(0).map_err(|r| r.refusal),
            Err(Refusal::Phase(Phase::Aborting))
        );
        assert_eq!(w.drop_hold(0, Hold::Stamp), Ok(Step::Held));
        assert_eq!(
            w.drop_hold(0, Hold::Writers),
            Ok(Step::Released(Reason::Aborted))
        );
        assert_eq!(w.load(Ordering::Relaxed), State::new(Phase::Free, 0, 0, 1));
        assert_eq!(w.drop_hold_checked(0, Hold::Transfer), Err(Refusal::Stale));
        assert_eq!(
            w.begin_transfer(0).map_err(|r| r.refusal),
            Err(Refusal::Stale)
        );
    }

    /// The checked drop refuses a hold the room does not carry (a room in its lifecycle,
    /// not only a stale generation): without the count check it would underflow the word.
    #[test]
    fn a_hold_the_room_does_not_carry_cannot_be_dropped() {
        let w = RoomWord::new();
        w.publish(0, 0);
        assert_eq!(w.drop_hold_checked(0, Hold::Transfer), Err(Refusal::Stale));
        assert_eq!(w.drop_hold_checked(0, Hold::Writers), Err(Refusal::Stale));
        assert_eq!(w.load(Ordering::Relaxed), State::new(Phase::Owned, 0, 0, 0));
        w.begin_transfer(0).unwrap();
        assert_eq!(w.drop_hold_checked(0, Hold::Transfer), Ok(Step::Held));
        assert_eq!(w.load(Ordering::Relaxed), State::new(Phase::Owned, 0, 0, 0));
    }

    /// The stamp hold alone keeps a room: its drop may be the release.
    #[test]
    fn the_stamp_hold_can_be_the_last() {
        let w = RoomWord::new();
        w.publish(0, 0);
        w.begin_transfer(0).unwrap();
        assert_eq!(w.close(0, Phase::Draining), Ok(Closed::Stamp));
        assert_eq!(w.drop_hold(0, Hold::Transfer), Ok(Step::Held));
        assert_eq!(
            w.drop_hold(0, Hold::Stamp),
            Ok(Step::Released(Reason::Finished))
        );
        // An abort of the draining room takes no second stamp.
        let w = RoomWord::new();
        w.publish(0, 1);
        assert_eq!(w.close(0, Phase::Draining), Ok(Closed::Stamp));
        assert_eq!(w.close(0, Phase::Aborting), Ok(Closed::Held));
        assert_eq!(w.drop_hold(0, Hold::Stamp), Ok(Step::Held));
        assert_eq!(
            w.drop_hold(0, Hold::Writers),
            Ok(Step::Released(Reason::Aborted))
        );
    }

    /// One grow hold at a time, and it is not a transfer.
    #[test]
    fn the_grow_hold_is_single() {
        let w = RoomWord::new();
        w.publish(0, 0);
        w.begin_grow(0).unwrap();
        assert_eq!(w.begin_grow(0), Err(Refusal::HoldsFull));
        assert_eq!(w.load(Ordering::Relaxed).transfers(), 0);
        assert_eq!(w.drop_hold(0, Hold::Grow), Ok(Step::Held));
        w.begin_grow(0).unwrap();
    }

    #[test]
    fn generation_wraps() {
        let w = RoomWord::new();
        w.0.store(State::new(Phase::Free, 0, 0, u32::MAX).0, Ordering::Relaxed);
        w.publish(u32::MAX, 0);
        assert_eq!(
            w.close(u32::MAX, Phase::Draining),
            Ok(Closed::Released(Reason::Finished))
        );
        assert_eq!(w.load(Ordering::Relaxed).gen(), 0);
    }

    /// Regression (found in review): an abort of a *draining* room must not decide a
    /// release that the last hold's `fetch_sub` already decided (the word is then
    /// `DRAINING`, no hold, until that thread stores `FREE`).
    #[test]
    fn abort_in_the_release_gap_of_a_draining_room_decides_nothing() {
        let w = RoomWord::new();
        w.publish(0, 1);
        assert_eq!(w.close(0, Phase::Draining), Ok(Closed::Stamp));
        assert_eq!(w.drop_hold(0, Hold::Stamp), Ok(Step::Held));
        // The last hold's decrement, before its thread stores FREE.
        let old = State(w.0.fetch_sub(Hold::Writers.one(), Ordering::AcqRel));
        assert_eq!((old.phase(), old.holds()), (Phase::Draining, 1));
        assert_eq!(w.close(0, Phase::Aborting), Err(Refusal::Stale));
        assert_eq!(
            w.load(Ordering::Relaxed),
            State::new(Phase::Draining, 0, 0, 0)
        );
    }

    /// Issue 18, item 2: a quarantine in the release gap is refused and changes nothing,
    /// so the release decided before it says `Finished`, never `Quarantined`.
    #[test]
    fn quarantine_in_the_release_gap_changes_nothing() {
        let w = RoomWord::new();
        w.publish(0, 0);
        w.begin_transfer(0).unwrap();
        assert_eq!(w.close(0, Phase::Draining), Ok(Closed::Stamp));
        assert_eq!(w.drop_hold(0, Hold::Stamp), Ok(Step::Held));
        let old = State(w.0.fetch_sub(Hold::Transfer.one(), Ordering::AcqRel));
        assert_eq!(old.reason(), Reason::Finished);
        assert_eq!(w.quarantine(0), Err(Refusal::Stale));
        assert!(!w.load(Ordering::Relaxed).quarantined());
    }

    const UNIT: u64 = TRANSFERS.set(0, 1);

    /// Issue 42: a transient unit that arrives between the last hold's `fetch_sub` and its
    /// release CAS makes that CAS give up; the unit's take-back performs the release, once.
    #[test]
    fn a_transient_unit_in_the_release_gap_takes_the_release_over() {
        let w = RoomWord::new();
        w.publish(0, 0);
        w.begin_transfer(0).unwrap();
        assert_eq!(w.close(0, Phase::Draining), Ok(Closed::Stamp));
        assert_eq!(w.drop_hold(0, Hold::Stamp), Ok(Step::Held));
        // The last hold's decrement, before its release CAS.
        let old = State(w.0.fetch_sub(UNIT, Ordering::AcqRel));
        assert_eq!((old.phase(), old.holds()), (Phase::Draining, 1));
        // A refused begin in the gap: its unit is the hold now, and its take-back releases.
        assert_eq!(
            w.begin_transfer(0),
            Err(Refused {
                refusal: Refusal::Phase(Phase::Draining),
                released: Some((0, Reason::Finished)),
            })
        );
        assert_eq!(w.load(Ordering::Relaxed), State::new(Phase::Free, 0, 0, 1));
        // The first decrement's CAS now finds another lifecycle: it releases nothing.
        assert_eq!(w.release_if_last(old, Hold::Transfer), None);
        assert_eq!(w.load(Ordering::Relaxed), State::new(Phase::Free, 0, 0, 1));
    }

    /// Issue 42 (found by cargo-mutants): the release CAS after the last drop gives up when
    /// a transient unit is in the word, and never releases a *later* lifecycle that happens
    /// to be in its own release gap.
    #[test]
    fn the_release_cas_needs_this_lifecycle_and_no_hold() {
        let w = RoomWord::new();
        w.publish(0, 0);
        w.begin_transfer(0).unwrap();
        assert_eq!(w.close(0, Phase::Draining), Ok(Closed::Stamp));
        assert_eq!(w.drop_hold(0, Hold::Stamp), Ok(Step::Held));
        // The last hold's decrement, then a unit comes in before the release CAS.
        let old = State(w.0.fetch_sub(UNIT, Ordering::AcqRel));
        w.add_transient_unit();
        let held = State::new(Phase::Draining, 1, 0, 0);
        assert_eq!(w.load(Ordering::Relaxed), held);
        assert_eq!(w.release_if_last(old, Hold::Transfer), None);
        assert_eq!(w.load(Ordering::Relaxed), held);
        assert_eq!(w.back_out(), Some((0, Reason::Finished)));
        // Generation 1 opens, closes and reaches its own release gap (no hold, not FREE
        // yet): the stale CAS of generation 0 must leave it alone.
        w.publish(1, 1);
        assert_eq!(w.close(1, Phase::Aborting), Ok(Closed::Stamp));
        assert_eq!(w.drop_hold(1, Hold::Stamp), Ok(Step::Held));
        let gap = State(w.0.fetch_sub(Hold::Writers.one(), Ordering::AcqRel));
        let dead = State::new(Phase::Aborting, 0, 0, 1);
        assert_eq!(w.load(Ordering::Relaxed), dead);
        assert_eq!(w.release_if_last(old, Hold::Transfer), None);
        assert_eq!(w.load(Ordering::Relaxed), dead);
        assert_eq!(w.release_if_last(gap, Hold::Writers), Some(Reason::Aborted));
        assert_eq!(w.load(Ordering::Relaxed), State::new(Phase::Free, 0, 0, 2));
    }

    /// Issue 42: the last real hold's drop that sees a transient unit leaves the room held;
    /// the unit's take-back releases it, with the reason of the value its CAS replaced.
    #[test]
    fn the_last_drop_beside_a_transient_unit_leaves_the_release_to_it() {
        let w = RoomWord::new();
        w.publish(0, 0);
        w.begin_transfer(0).unwrap();
        assert_eq!(w.close(0, Phase::Draining), Ok(Closed::Stamp));
        assert_eq!(w.drop_hold(0, Hold::Stamp), Ok(Step::Held));
        w.0.fetch_add(UNIT, Ordering::AcqRel); // a refused begin's unit, not yet taken back
        assert_eq!(w.drop_hold(0, Hold::Transfer), Ok(Step::Held));
        // While the unit is in, the room is held: a quarantine still takes part.
        assert_eq!(w.quarantine(0), Ok(Closed::Held));
        assert_eq!(w.back_out(), Some((0, Reason::Quarantined)));
        assert_eq!(w.load(Ordering::Relaxed), State::new(Phase::Free, 0, 0, 1));
    }

    /// Issue 42: a stale call's unit in a `FREE` word survives `publish` (a store would
    /// erase it and its take-back would then steal a unit the new lifecycle never had), and
    /// its take-back may be that lifecycle's release.
    #[test]
    fn publish_keeps_a_stale_transient_unit() {
        let w = RoomWord::new();
        w.publish(0, 0);
        assert_eq!(
            w.close(0, Phase::Aborting),
            Ok(Closed::Released(Reason::Aborted))
        );
        // A stale begin (generation 0) adds its unit to the FREE word of generation 1.
        let old = State(w.0.fetch_add(UNIT, Ordering::AcqRel));
        assert_eq!((old.phase(), old.gen()), (Phase::Free, 1));
        w.publish(1, 1);
        assert_eq!(w.load(Ordering::Relaxed), State::new(Phase::Owned, 1, 1, 1));
        // Generation 1 is closed, and its writer word drops: the unit still holds it.
        assert_eq!(w.close(1, Phase::Aborting), Ok(Closed::Stamp));
        assert_eq!(w.drop_hold(1, Hold::Stamp), Ok(Step::Held));
        assert_eq!(w.drop_hold(1, Hold::Writers), Ok(Step::Held));
        // The stale call's take-back releases generation 1 (not its own 0).
        assert_eq!(w.back_out(), Some((1, Reason::Aborted)));
        assert_eq!(w.load(Ordering::Relaxed), State::new(Phase::Free, 0, 0, 2));
        // A take-back from an owned or FREE word releases nothing and leaves it exact.
        w.0.fetch_add(UNIT, Ordering::AcqRel);
        assert_eq!(w.back_out(), None);
        assert_eq!(w.load(Ordering::Relaxed), State::new(Phase::Free, 0, 0, 2));
        w.publish(2, 0);
        assert_eq!(
            w.begin_transfer(1),
            Err(Refused {
                refusal: Refusal::Stale,
                released: None
            })
        );
        assert_eq!(w.load(Ordering::Relaxed), State::new(Phase::Owned, 0, 0, 2));
    }

    /// A full room refuses a transfer and is left exactly as it was; one below full takes
    /// it; the field has room above `MAX_TRANSFERS` for transient units.
    #[test]
    fn a_full_room_refuses_and_is_unchanged() {
        let w = RoomWord::new();
        w.0.store(
            State::new(Phase::Owned, MAX_TRANSFERS - 1, 0, 5).0,
            Ordering::Relaxed,
        );
        w.begin_transfer(5).unwrap();
        let full = State::new(Phase::Owned, MAX_TRANSFERS, 0, 5);
        assert_eq!(w.load(Ordering::Relaxed), full);
        assert_eq!(
            w.begin_transfer(5),
            Err(Refused {
                refusal: Refusal::HoldsFull,
                released: None
            })
        );
        assert_eq!(w.load(Ordering::Relaxed), full);
        assert_eq!(MAX_TRANSFERS, 1 << 24);
    }

    /// A quarantine that wins is part of the deciding value.
    #[test]
    fn quarantine_decides_with_the_close() {
        let w = RoomWord::new();
        w.publish(0, 0);
        assert_eq!(w.quarantine(0), Ok(Closed::Released(Reason::Quarantined)));
        let w = RoomWord::new();
        w.publish(0, 1);
        w.begin_transfer(0).unwrap();
        assert_eq!(w.close(0, Phase::Draining), Ok(Closed::Stamp));
        assert_eq!(w.quarantine(0), Ok(Closed::Held));
        assert_eq!(w.quarantine(0), Ok(Closed::Held)); // idempotent
        assert_eq!(w.drop_hold(0, Hold::Stamp), Ok(Step::Held));
        assert_eq!(w.drop_hold(0, Hold::Writers), Ok(Step::Held));
        assert_eq!(
            w.drop_hold(0, Hold::Transfer),
            Ok(Step::Released(Reason::Quarantined))
        );
    }
}
