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
//! has acknowledged (`quiesce`) or been fenced, and every local transfer on them has
//! completed; a stale operation (a queued intent, a late ACK) names an earlier lifecycle
//! through its generation-tagged handle and is refused. Time never releases a page.
//!
//! # Example: the decode side of a push transfer
//!
//! ```
//! use kvfence::{Config, Quiesced, RankSet, RoomTable};
//!
//! let table = RoomTable::new(Config::new(1024, 65536, 64))?;
//!
//! // A request whose KV comes from prefill ranks 0..4 into 16 of our pages.
//! let room = table.open(16, &RankSet::first(4)?)?;
//! // ... send room.handle.to_wire() and room.pages to the prefill ranks ...
//!
//! // The client disconnects: abort. The request fails at once; the pages stay held.
//! let aborted = table.abort(room.handle)?;
//! assert_eq!(aborted.fanout.len(), 4);          // tell these ranks
//! assert!(aborted.released.is_none());
//!
//! // Each rank drains its queue and in-flight writes, then ACKs.
//! for rank in 0..3 {
//!     assert_eq!(table.quiesce(room.handle, rank)?, Quiesced::Recorded);
//! }
//! // A duplicate ACK counts once.
//! assert_eq!(table.quiesce(room.handle, 0)?, Quiesced::Duplicate);
//! // The last ACK releases the pages, in this call.
//! let Quiesced::Released(released) = table.quiesce(room.handle, 3)? else { unreachable!() };
//! assert_eq!(released.pages, 16);
//!
//! // A late ACK from this lifecycle, after the index was reused, changes nothing.
//! let next = table.open(16, &RankSet::first(4)?)?;
//! assert!(table.quiesce(room.handle, 2).is_err());
//! # let _ = next;
//! # Ok::<(), kvfence::Error>(())
//! ```
//!
//! # Guarantees
//!
//! * **No reuse before proof of drain**: pages return to the pool only after every writer
//!   rank quiesced (or was fenced with [`RoomTable::fence_rank`]) and every
//!   [`TransferGuard`] ended.
//! * **Exactly once**: one atomic read-modify-write of the room word decides each release; the call that made
//!   it returns it ([`Released`]), or, for a dropped guard, [`RoomTable::take_orphaned`]
//!   does. At quiescence `free + owned + held == capacity` for rooms and pages.
//! * **Stale is harmless**: every call names a lifecycle by [`RoomHandle`]; one from an
//!   earlier lifecycle changes nothing and gets [`Error::StaleHandle`].
//! * **Fail fast**: [`RoomTable::abort`] never blocks; no transfer can begin after it.
//! * **Lock-free, allocation-free hot path**: `begin_transfer`, `complete`, `quiesce`,
//!   `abort`, `finish` are a bounded number of atomic operations (a CAS loop retries only
//!   when another thread changed the same room word), no lock, no heap.
//! * **Bad input is an [`Error`]**, never a panic.
//!
//! # Modules (implementation)
//!
//! `sync` (std/loom shim), `pack` (bit fields), `room_word` (the lifecycle word),
//! `writers` (rank sets and generation-tagged mask words), `bitmap` (free lists),
//! `handle` (keyed handles and their wire form), `table` (open, transfers, ACKs, close,
//! release), `fence` (fence and readmit), `wait` (per-room parking), `guard`, `stats`,
//! `error`. Each opens with an
//! "Implementation details" section with the reasoning for its part, next to the code it
//! justifies; `docs/DESIGN.md` in the repository ties the parts together.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod bitmap;
mod error;
mod fence;
mod guard;
mod handle;
mod pack;
mod room_word;
mod stats;
mod sync;
mod table;
mod wait;
mod writers;

pub use error::Error;
pub use fence::Fenced;
pub use guard::TransferGuard;
pub use handle::{RoomHandle, MAX_ROOMS};
pub use room_word::Phase;
pub use stats::{ClosingRoom, Stats, Usage};
pub use table::{Aborted, Config, Opened, Quiesced, Released, RoomTable};
pub use writers::{RankSet, MAX_RANKS};

/// The README's examples are compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
