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
//! Every transition is one atomic read-modify-write of this word (a CAS, or for dropping
//! an owned hold a `fetch_sub`), so "no hold of any kind" is *observed* and *acted on* in
//! one RMW: the release (`ABORTING|DRAINING` with no hold -> `FREE`, generation + 1) cannot
//! be performed twice, and cannot be performed while anyone can still add a hold, because
//! adding a hold ([`RoomWord::begin`]) requires `OWNED` and the same generation. The
//! release's [`Reason`] is a function of the value that RMW observed (the closing phase
//! and `Q`), never of a separate store.
//!
//! Who writes the word:
//! * the opener, once, with [`RoomWord::publish`] (a plain `Release` store: it owns the
//!   room through the room bitmap, and nothing else writes a `FREE` word);
//! * everyone else by CAS, and only while the phase is not `FREE` and the generation
//!   matches their handle; except that a hold its owner drops is one `fetch_sub`, and the
//!   owner whose `fetch_sub` took a closing room to no hold then stores the released
//!   state (nothing else can change the word in between: see [`RoomWord::drop_hold`]).
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

/// The most transfers one room can carry at once.
pub(crate) const MAX_TRANSFERS: u32 = TRANSFERS.max() as u32;

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
    #[inline] // inlined into kvfence-ffi (see lib.rs)
    pub(crate) fn publish(&self, gen: u32, words: u32) {
        debug_assert_eq!(
            self.load(Ordering::Relaxed),
            State::new(Phase::Free, 0, 0, gen)
        );
        self.0
            .store(State::new(Phase::Owned, 0, words, gen).0, Ordering::Release);
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

    /// Adds a hold of `kind` (`Transfer` or `Grow`): only to an `OWNED` room of
    /// generation `gen`. The grow hold is taken under the room's grow lock, so it is never
    /// taken twice.
    #[inline]
    pub(crate) fn begin(&self, gen: u32, kind: Hold) -> Result<(), Refusal> {
        debug_assert!(matches!(kind, Hold::Transfer | Hold::Grow));
        self.transition(|s| {
            if s.gen() != gen || s.phase() == Phase::Free {
                return Err(Refusal::Stale);
            }
            if s.phase() != Phase::Owned {
                return Err(Refusal::Phase(s.phase()));
            }
            let full = match kind {
                Hold::Grow => s.growing(),
                _ => s.transfers() == MAX_TRANSFERS,
            };
            if full {
                return Err(Refusal::HoldsFull);
            }
            Ok(State(s.0 + kind.one()))
        })
        .map(|_| ())
    }

    /// Drops one hold of kind `kind` the caller owns; the call that drops the last hold of
    /// a closing room releases it.
    ///
    /// One `fetch_sub`, not a CAS loop: the caller *owns* the hold, so the word cannot be
    /// in another generation or `FREE` (a held room is never released), and no check is
    /// needed before the decrement. The decrement that takes a closing room from one hold
    /// to none is the deciding RMW: it observes "closing, nothing holds it" and the
    /// reason (phase, quarantine bit) in the value it returns, and from that moment the
    /// word is frozen (`begin` needs `OWNED`, `close` and `quarantine` refuse a closing
    /// room with no hold, every other decrement needs a hold, and none is left), so the
    /// same thread completes the release with a plain store of `FREE`, generation + 1.
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
        if old.holds() == 1 && old.phase().is_closing() {
            self.0.store(old.released().0, Ordering::Release);
            Ok(Step::Released(old.reason()))
        } else {
            Ok(Step::Held)
        }
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
            // A closing room with no hold is being released: the `fetch_sub` of
            // `drop_hold` decided it and its thread is about to store `FREE`. Nothing may
            // decide it again.
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
        w.begin(0, Hold::Transfer).unwrap();
        assert_eq!(w.drop_hold(0, Hold::Transfer), Ok(Step::Held));
        assert_eq!(w.close(0, Phase::Aborting), Ok(Closed::Stamp));
        assert_eq!(
            w.begin(0, Hold::Transfer),
            Err(Refusal::Phase(Phase::Aborting))
        );
        assert_eq!(w.drop_hold(0, Hold::Stamp), Ok(Step::Held));
        assert_eq!(
            w.drop_hold(0, Hold::Writers),
            Ok(Step::Released(Reason::Aborted))
        );
        assert_eq!(w.load(Ordering::Relaxed), State::new(Phase::Free, 0, 0, 1));
        assert_eq!(w.drop_hold_checked(0, Hold::Transfer), Err(Refusal::Stale));
        assert_eq!(w.begin(0, Hold::Transfer), Err(Refusal::Stale));
    }

    /// The stamp hold alone keeps a room: its drop may be the release.
    #[test]
    fn the_stamp_hold_can_be_the_last() {
        let w = RoomWord::new();
        w.publish(0, 0);
        w.begin(0, Hold::Transfer).unwrap();
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
        w.begin(0, Hold::Grow).unwrap();
        assert_eq!(w.begin(0, Hold::Grow), Err(Refusal::HoldsFull));
        assert_eq!(w.load(Ordering::Relaxed).transfers(), 0);
        assert_eq!(w.drop_hold(0, Hold::Grow), Ok(Step::Held));
        w.begin(0, Hold::Grow).unwrap();
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
        w.begin(0, Hold::Transfer).unwrap();
        assert_eq!(w.close(0, Phase::Draining), Ok(Closed::Stamp));
        assert_eq!(w.drop_hold(0, Hold::Stamp), Ok(Step::Held));
        let old = State(w.0.fetch_sub(Hold::Transfer.one(), Ordering::AcqRel));
        assert_eq!(old.reason(), Reason::Finished);
        assert_eq!(w.quarantine(0), Err(Refusal::Stale));
        assert!(!w.load(Ordering::Relaxed).quarantined());
    }

    /// A quarantine that wins is part of the deciding value.
    #[test]
    fn quarantine_decides_with_the_close() {
        let w = RoomWord::new();
        w.publish(0, 0);
        assert_eq!(w.quarantine(0), Ok(Closed::Released(Reason::Quarantined)));
        let w = RoomWord::new();
        w.publish(0, 1);
        w.begin(0, Hold::Transfer).unwrap();
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
