//! **kvfence** decides when a KV-cache page may be reused in disaggregated
//! (prefill/decode) LLM serving, so that a stale write can never land in another request's
//! KV cache.
//!
//! # The race
//!
//! ```text
//! T0  request A owns decode page S; prefill rank r has a write to S queued or in flight
//! T1  decode aborts A and frees S
//! T2  request B is given S
//! T3  the stale write for A lands in S   -> B's KV is silently corrupted
//! ```
//!
//! kvfence closes it: an aborted request's pages are released only once every writer rank
//! has acknowledged (`quiesce`) or been fenced, and every transfer on them has ended
//! (a *failed* transfer ends only when its peer is fenced); a stale operation (a queued
//! intent, a late ACK) names an earlier lifecycle through its generation-tagged handle and
//! is refused. Time never releases a page.
//!
//! # Example: an engine's decode side, gate mode
//!
//! The engine owns its pages; kvfence gates their free. Releases are decided on the ACK
//! thread and acted on by the scheduler, through the release queue.
//!
//! ```
//! use kvfence::{Config, Quiesced, Reason, RoomTable};
//!
//! let table = RoomTable::new(Config::gate(4096).release_queue(true))?;
//!
//! // Pre-allocation: request slot 17, engine pages 100..116, prefill ranks 0..4.
//! let pages: Vec<u32> = (100..116).collect();
//! let h = table.open_gate(&[0, 1, 2, 3], 17, pages)?;
//! // ... send h.to_wire() with the page ids to the prefill ranks ...
//!
//! // The client disconnects: abort. The request fails at once; the pages stay held.
//! let aborted = table.abort(h)?;
//! assert_eq!(&aborted.fanout[..], &[0, 1, 2, 3]);   // send ABORT to these ranks
//!
//! // The ACK thread: each rank drains its queue and in-flight writes, then ACKs.
//! for rank in 0..3 {
//!     assert_eq!(table.quiesce(h, rank)?, Quiesced::Recorded);
//! }
//! assert_eq!(table.quiesce(h, 0)?, Quiesced::Duplicate);  // counts once
//! assert_eq!(table.quiesce(h, 3)?, Quiesced::Queued);     // the last one releases
//!
//! // The scheduler loop: drain, then free with the engine's own allocator.
//! let mut released = Vec::new();
//! table.drain_released(&mut released);
//! for r in released {
//!     assert_eq!((r.token, r.reason, r.pages.len()), (17, Reason::Aborted, 16));
//!     // engine.free(r.pages); engine.free_slot(r.token);
//! }
//!
//! // A late ACK of this lifecycle, after the index was reused, changes nothing.
//! let next = table.open_gate(&[0], 18, vec![100])?;
//! assert!(table.quiesce(h, 2).is_err());
//! # let _ = next;
//! # Ok::<(), kvfence::Error>(())
//! ```
//!
//! # Guarantees
//!
//! * **No reuse before proof of drain**: a room is released only after every writer rank
//!   quiesced (or was fenced with [`RoomTable::fence_rank`]) and every transfer ended
//!   (completed, or failed and its peer fenced), or it was quarantined (then its pages are
//!   never to be reused).
//! * **Exactly once**: one atomic read-modify-write of the room word decides each release;
//!   it is delivered once, by the call that performed it or through the release queue
//!   ([`RoomTable::drain_released`]).
//! * **Stale is harmless**: every call names a lifecycle by [`RoomHandle`]; one from an
//!   earlier lifecycle changes nothing and gets [`Error::StaleHandle`]; one the table never
//!   issued gets [`Error::InvalidHandle`].
//! * **Fail fast**: [`RoomTable::abort`] never blocks; no transfer can begin after it.
//! * **Lock-free, allocation-free hot path**: `begin_transfer`/`complete`, token
//!   `begin`/`end`, `quiesce`, `abort`, `finish` and the release push are a bounded number
//!   of atomic operations (a CAS loop retries only when another thread changed the same
//!   word), no lock, no heap.
//! * **Bad input is an [`Error`]**, never a panic.
//!
//! # Modules (implementation)
//!
//! Data and calls flow one way, from the top of this list to the bottom; a module uses
//! only modules below it (`lib.rs` re-exports):
//!
//! * `table`: the lifecycle API (open, grow, `quiesce`, abort, finish, phase); composes
//!   everything below, and nothing imports from it.
//! * `wait` (waiting for releases), `stats` (snapshot and per-room status): read only.
//! * `quarantine`, then `fence` (fence and readmit), then `transfer` (guards, tokens,
//!   outcomes, the failed-transfer registry), then `release` (the steps that may decide a
//!   release; delivering it; the release queue's drain).
//! * `state`: the table's state, [`RoomTable`]'s fields and the per-room `Slot`, with the
//!   helpers every concern uses (generation tags, marks, the lock helper, the clock).
//! * self-contained pieces: `room_word` (the lifecycle word), `writers` (inline writer
//!   lists and their generation-tagged masks), `fenced` (the fenced-rank set), `queue`
//!   (the release queue's bitmap), `park` (per-room parking), `counters` (striped event
//!   counters), `bitmap` (free lists), `handle` (keyed handles and their wire form),
//!   `config`, `error` (and fallible boxing), `pack` (bit fields), `sync` (the std / loom /
//!   shuttle shim).
//!
//! Each opens with an "Implementation details" section; the design is in
//! `docs/DESIGN.md`.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

/// Whether the test-only protocol mutation `$name` (a `kvfence_*` cfg) is on: compiled in
/// with `--cfg $name`, or chosen at run time in a `--cfg kvfence_mutants` build (see
/// `mutants`). `false` in a normal build, folded away at compile time.
macro_rules! mutant {
    ($name:ident) => {
        (cfg!($name) || $crate::mutant_chosen(stringify!($name)))
    };
}

#[cfg(kvfence_mutants)]
mod mutants;
#[cfg(kvfence_mutants)]
use mutants::on as mutant_chosen;
/// No run-time mutations in this build.
#[cfg(not(kvfence_mutants))]
#[inline(always)]
const fn mutant_chosen(_: &str) -> bool {
    false
}

// Inlined entry points (for kvfence-ffi, the C ABI). The hot operations have a hidden
// `#[inline(always)]` twin (`__open_gate_inline`, `__begin_inline`, `__end_inline`,
// `__abort_inline`, `__quiesce_inline`) that holds the body; the public method only calls
// it, so Rust callers get the same code as before. `kvfence_*` calls the twin: its body is
// compiled into the C shim, and a C call makes one call level, as a Rust call does, not two
// (the shim's, then the core's). `drain_released_with` is generic, so it is compiled into
// its caller's crate anyway. Two kinds of helper are `#[inline]` because of this:
// * those the core inlines into these bodies (comment "inlined into kvfence-ffi"): without
//   the attribute the other crate cannot inline them, and an out-of-line call from it costs
//   more than the level saved;
// * the hot-path callees below those (`clear_position`, `close`, `end_hold`, `claim_one`,
//   `check_writers`; comment "a local copy per crate"): a function that an inlinable body
//   names becomes an exported symbol, and rustc calls exported functions of a PIC rlib
//   through the GOT (`R_X86_64_GOTPCREL`, which the linker does not relax), the core's own
//   calls included: without the attribute the Rust callers got slower (1-5% CPU time
//   on the boundary benchmark). `#[inline]` gives each codegen unit its own copy, called
//   directly or inlined.
// `clear_position` is `#[inline(always)]`: LLVM inlined it into `kvfence_quiesce` (its one
// caller in that codegen unit) but not into the core's `quiesce` (one of three callers), so
// the C program ran ~135 instructions per lifecycle fewer than the Rust one for a reason
// that is no boundary. Forced, both sides run the same code (and every ACK is cheaper).
// The measurements: ffi/bench/RESULTS.md.

// Below the concerns: primitives and data, each self-contained.
mod bitmap;
mod config;
mod counters;
mod error;
mod fenced;
mod handle;
mod pack;
mod park;
mod queue;
mod room_word;
mod sync;
mod writers;
// The table's state (fields, per-room slot, shared helpers).
mod state;
// The concerns, in the order they build on each other.
mod fence;
mod quarantine;
mod release;
mod stats;
mod transfer;
mod wait;
// The lifecycle API (open, grow, quiesce, abort, finish), composing the above.
mod table;

pub use config::{Config, MAX_PAGES};
pub use error::Error;
pub use fence::Fenced;
pub use handle::{RoomHandle, MAX_ROOMS};
pub use release::{Quiesced, Reason, Released};
pub use room_word::Phase;
pub use state::RoomTable;
pub use stats::{ClosingRoom, RoomStatus, Stats, Usage};
pub use table::{Aborted, Opened};
pub use transfer::{Outcome, OwnedTransferGuard, TransferGuard, TransferToken};
pub use writers::{Fanout, MAX_WRITERS};

/// The README's examples are compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
