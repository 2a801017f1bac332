//! The C ABI of kvfence: `libkvfence.a`, `libkvfence.so` and `include/kvfence.h`
//! (generated from this file by cbindgen; `ffi/check-header.sh` fails when it is stale).
//!
//! Every exported symbol starts with `kvfence_`. The header is the reference for C and C++
//! callers; this module documents the same items for Rust readers.
//!
//! # Conventions (the same for every function)
//!
//! * **Status.** Every fallible function returns a [`kvfence_status`]: `KVFENCE_OK`, one
//!   value per `kvfence::Error` variant, or a boundary refusal (`KVFENCE_NULL_POINTER`,
//!   `KVFENCE_MISALIGNED_POINTER`, `KVFENCE_BAD_LENGTH`, `KVFENCE_BAD_ARGUMENT`), or
//!   `KVFENCE_PANIC` / `KVFENCE_INTERNAL_ERROR` (a bug in kvfence: report it). On any
//!   status but `KVFENCE_OK` the table is unchanged and no output was written, unless the
//!   function says otherwise. `kvfence_last_error` gives the details of the last failure on
//!   the calling thread (the rank, the index, the reason).
//! * **No panic crosses the boundary.** Every function runs its body under
//!   `catch_unwind`; a panic is reported as `KVFENCE_PANIC`, never unwinds into C and never
//!   aborts the host.
//! * **Pointers.** Null and misaligned pointers are refused with a status before anything
//!   is read or written. A `(pointer, length)` pair with length 0 may have a null pointer.
//!   Beyond that, a pointer must point to memory the caller owns, valid for the stated
//!   length: that cannot be checked, and breaking it is undefined behaviour as in any C API.
//! * **Threads.** A `kvfence_table *` may be used from any number of threads at once, with
//!   every function except `kvfence_table_free` (which must be the last use). Handles,
//!   tokens and releases are plain values, sent anywhere.
//! * **Releases.** A function that can release a room takes a `kvfence_release *` (never
//!   null): its `reason` is `KVFENCE_REASON_NONE` when nothing was released, and otherwise it
//!   carries the release, whose page array the caller owns and frees with
//!   `kvfence_release_free` (once). No release is ever dropped: what cannot be handed to the
//!   caller (a full caller buffer, a guard's destructor) goes to the release queue that
//!   `kvfence_drain_released` empties, queued before waiters are woken (so "wait, then
//!   drain" finds it).
//! * **Memory.** Running out of memory is `KVFENCE_OUT_OF_MEMORY`, never an abort, in
//!   every call whose allocation grows with its input: `kvfence_table_new` (the table),
//!   `kvfence_open` / `kvfence_open_gate` / `kvfence_grow` / `kvfence_grow_gate` /
//!   `kvfence_pages_of` (page lists), `kvfence_get_stats` (its snapshot),
//!   `kvfence_release_requeue`; `kvfence_fence_rank`
//!   queues the releases its list cannot take; `kvfence_last_error` formats into the
//!   caller's buffer. A few small allocations still abort the process if the allocator
//!   fails (Rust's default, which a library cannot change): registering a failed transfer
//!   (`kvfence_end` / `kvfence_end_queued` with `KVFENCE_FAILED`: a few bytes, amortised),
//!   and the list of failed transfers a fence or quarantine ends.
//! * **Structs are not versioned unless they say so.** `kvfence_config` and
//!   `kvfence_stats` carry `struct_size`; `kvfence_release`, `kvfence_room_status`,
//!   `kvfence_fenced`, `kvfence_usage`, `kvfence_handle` and `kvfence_token` do not: a field
//!   added to any of them changes the soname (`libkvfence.so.1`, `KVFENCE_ABI_VERSION` 2).
//! * **Use after free is not detected.** A handle of a freed table, a C++ `TransferGuard`
//!   that outlives its `Table`: the access is inside this (uninstrumented) library, where
//!   AddressSanitizer does not see it; run such a test under valgrind (memcheck), which
//!   does.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
// The exported types carry their C names (`kvfence_table`, `KVFENCE_OK`): cbindgen copies
// Rust names into the header verbatim.
#![allow(non_camel_case_types)]

use core::ffi::c_char;
use core::mem::{align_of, size_of};
use core::num::NonZeroU32;
use core::ptr;
use core_kvfence::{
    Config, Error, Outcome, Phase, Quiesced, Reason, Released, RoomHandle, RoomStatus, RoomTable,
    TransferToken,
};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// The version of this C ABI (the soname's major version is `KVFENCE_ABI_VERSION - 1`).
pub const KVFENCE_ABI_VERSION: u32 = 1;
/// The most writer ranks a room can name (`kvfence::MAX_WRITERS`); a fan-out buffer of this
/// many `uint32_t` always suffices.
pub const KVFENCE_MAX_WRITERS: usize = 64;
/// `peer` value of `kvfence_begin` for a transfer with no known peer rank.
pub const KVFENCE_NO_PEER: u32 = u32::MAX;
/// `timeout_ms` value of the wait functions: wait without a deadline.
pub const KVFENCE_WAIT_FOREVER: u64 = u64::MAX;

/// What a call returned. Values are stable: new ones are only ever added.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvfence_status {
    /// Success.
    KVFENCE_OK = 0,
    /// The config cannot make a table (a size out of range; details: `kvfence_last_error`).
    KVFENCE_INVALID_CONFIG = 1,
    /// The handle's room index is outside this table (a corrupted handle whose check still
    /// matched: practically unreachable; `kvfence_last_error` names the index).
    KVFENCE_UNKNOWN_ROOM = 2,
    /// The handle was not made by this table (another table's, forged, corrupted, zero).
    KVFENCE_INVALID_HANDLE = 3,
    /// The handle's lifecycle is over (released, maybe reused) or never began: a late ACK,
    /// a queued intent of an earlier request. Expected and harmless.
    KVFENCE_STALE_HANDLE = 4,
    /// No transfer may begin (or pages be added): the room is aborting or draining.
    KVFENCE_ROOM_CLOSED = 5,
    /// `abort`/`finish` of a room already aborted.
    KVFENCE_ALREADY_ABORTED = 6,
    /// `abort`/`finish` of a room already finished.
    KVFENCE_ALREADY_FINISHED = 7,
    /// `UINT32_MAX` is not a rank id.
    KVFENCE_INVALID_RANK = 8,
    /// A writer list longer than `KVFENCE_MAX_WRITERS`.
    KVFENCE_TOO_MANY_WRITERS = 9,
    /// A writer list names a rank twice.
    KVFENCE_DUPLICATE_WRITER = 10,
    /// `quiesce` of a rank that is not one of the room's writers.
    KVFENCE_RANK_NOT_IN_ROOM = 11,
    /// `open` names a fenced rank that was not re-admitted.
    KVFENCE_RANK_FENCED = 12,
    /// `fence_rank` with `max_fenced` ranks fenced already.
    KVFENCE_TOO_MANY_FENCED = 13,
    /// The call needs the other mode (`open`/`grow`: pool; `open_gate`/`grow_gate`: gate).
    KVFENCE_WRONG_MODE = 14,
    /// A gate-mode room's page list would be longer than 2^31 ids.
    KVFENCE_TOO_MANY_PAGES_IN_ROOM = 15,
    /// The transfer token was not issued by this table, or was already ended.
    KVFENCE_INVALID_TOKEN = 16,
    /// `max_tokens` token transfers are in flight.
    KVFENCE_TOO_MANY_TOKENS = 17,
    /// `open` asked for more pages than the whole pool has.
    KVFENCE_TOO_MANY_PAGES = 18,
    /// Every room is in use.
    KVFENCE_ROOM_TABLE_FULL = 19,
    /// Not enough free pages right now (nothing was claimed).
    KVFENCE_POOL_EXHAUSTED = 20,
    /// The room carries the maximum number of concurrent transfers (2^30 - 1).
    KVFENCE_TOO_MANY_TRANSFERS = 21,
    /// The table's memory could not be allocated (the process goes on).
    KVFENCE_OUT_OF_MEMORY = 22,
    /// A wait's timeout ran out first (nothing changed: time never releases a room).
    KVFENCE_TIMED_OUT = 100,
    /// A required pointer was null.
    KVFENCE_NULL_POINTER = 101,
    /// A pointer was not aligned for its type.
    KVFENCE_MISALIGNED_POINTER = 102,
    /// A length is wrong: a caller buffer too small for the result, a byte string that is
    /// not 16 bytes, a `struct_size` this library cannot read, a length that overflows.
    KVFENCE_BAD_LENGTH = 103,
    /// An argument value is out of range (an outcome that is not a `kvfence_outcome`, a
    /// flag that is not 0 or 1, a non-zero reserved field).
    KVFENCE_BAD_ARGUMENT = 104,
    /// kvfence panicked (a bug: please report it). The panic was caught at the boundary;
    /// the table should not be used further.
    KVFENCE_PANIC = 105,
    /// kvfence returned an error this ABI version does not know (a newer core under an
    /// older ABI: a build mismatch).
    KVFENCE_INTERNAL_ERROR = 106,
}

use kvfence_status::*;

/// How a transfer ended (the `outcome` argument of `kvfence_end`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvfence_outcome {
    /// Every byte landed: the transfer's hold is dropped.
    KVFENCE_COMPLETED = 0,
    /// The transfer engine reported an error or a timeout: bytes may still land. The room
    /// stays held until the peer rank is fenced, or the room is quarantined.
    KVFENCE_FAILED = 1,
}

/// Why a room was released (`kvfence_release.reason`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvfence_reason {
    /// No release: the `kvfence_release` holds nothing.
    KVFENCE_REASON_NONE = 0,
    /// Finished normally, and everything in flight drained.
    KVFENCE_REASON_FINISHED = 1,
    /// Aborted, and every writer acknowledged (or was fenced) and every transfer ended.
    KVFENCE_REASON_ABORTED = 2,
    /// Quarantined: the room index is back, but the pages must NEVER be freed or reused.
    KVFENCE_REASON_QUARANTINED = 3,
}

/// Where a room is in its lifecycle.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvfence_phase {
    /// Not in use (for a handle: its lifecycle is over, or never began).
    KVFENCE_PHASE_FREE = 0,
    /// Live: transfers may begin.
    KVFENCE_PHASE_OWNED = 1,
    /// Aborted: waits for writers' ACKs and in-flight transfers.
    KVFENCE_PHASE_ABORTING = 2,
    /// Finished: waits for what is still in flight.
    KVFENCE_PHASE_DRAINING = 3,
}

/// What `kvfence_quiesce` did.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvfence_quiesced {
    /// The rank is marked done; the room still waits on others (or is live).
    KVFENCE_QUIESCE_RECORDED = 0,
    /// The rank had already quiesced in this lifecycle: nothing changed.
    KVFENCE_QUIESCE_DUPLICATE = 1,
    /// This released the room: the release is in `*release`.
    KVFENCE_QUIESCE_RELEASED = 2,
    /// This released the room into the release queue (`kvfence_drain_released`).
    KVFENCE_QUIESCE_QUEUED = 3,
}

/// Names one lifecycle of one room of one table: a 16-byte value, copied freely and sent to
/// the other side as `kvfence_handle_to_bytes` (or as the two words). A handle the table
/// did not make, or of an earlier lifecycle, is refused on use, never mistaken for another
/// room. The all-zero value is never a valid handle.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct kvfence_handle {
    /// Low 64 bits of the wire form (`index << 32 | generation`).
    pub lo: u64,
    /// High 64 bits of the wire form (the table-keyed check).
    pub hi: u64,
}

/// A transfer begun with `kvfence_begin`: a 16-byte value, ended exactly once with
/// `kvfence_end` (a second end is refused with `KVFENCE_INVALID_TOKEN`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct kvfence_token {
    /// Low 64 bits of the token's wire form.
    pub lo: u64,
    /// High 64 bits of the token's wire form.
    pub hi: u64,
}

/// A room's release: its lifecycle is over and nothing can write its pages any more
/// (unless `reason` is `KVFENCE_REASON_QUARANTINED`: then the pages must never be reused).
/// Delivered exactly once.
///
/// Ownership: `pages` is allocated by kvfence and owned by the caller once returned; free
/// it with `kvfence_release_free` (exactly once; never with `free()`). `pages_cap` is
/// kvfence's bookkeeping for that free: do not change it. The struct is a plain C value:
/// a copy of it names the same `pages` array, so free exactly one of the copies
/// (`kvfence_release_free` of both is a double free; it resets only the struct it is
/// given). Not versioned: a field added is a new soname.
#[repr(C)]
#[derive(Debug)]
pub struct kvfence_release {
    /// The lifecycle that ended (stale from now on).
    pub handle: kvfence_handle,
    /// The token the room was opened with (gate mode; 0 in pool mode).
    pub token: u64,
    /// The room's page ids (NULL when `pages_len` is 0). Pool mode: already back in the
    /// pool (or out of it for good, if quarantined). Gate mode: the engine's to free now
    /// (never, if quarantined).
    pub pages: *mut u32,
    /// How many page ids `pages` holds.
    pub pages_len: usize,
    /// Private to kvfence (the allocation's capacity, for `kvfence_release_free`).
    pub pages_cap: usize,
    /// A `kvfence_reason`; `KVFENCE_REASON_NONE` when this holds no release (then the other
    /// fields are unspecified: a function that released nothing writes only this one).
    pub reason: kvfence_reason,
}

/// How a table is made. Initialise it with `kvfence_config_gate` or `kvfence_config_pool`
/// (which set `struct_size` and the defaults), then change fields.
///
/// Versioning: `struct_size` is `sizeof(kvfence_config)` of the caller's header. A library
/// reads the fields it knows; fields a newer header adds must be zero for an older library
/// to accept them (else `KVFENCE_BAD_ARGUMENT`), and a `struct_size` smaller than version
/// 1's is refused with `KVFENCE_BAD_LENGTH`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct kvfence_config {
    /// `sizeof(kvfence_config)`.
    pub struct_size: u32,
    /// 1: every release goes to the release queue (`kvfence_drain_released`), for an engine
    /// whose scheduler thread must act on them; 0: releases are returned by the call that
    /// performs them. Other values: `KVFENCE_BAD_ARGUMENT`.
    pub release_queue: u32,
    /// Rooms (concurrent requests), `1..=2^24`.
    pub rooms: u64,
    /// 0: gate mode (the engine owns its pages). Otherwise: a pool of this many pages
    /// (`1..=2^31`) owned by kvfence.
    pub pages: u64,
    /// How many ranks can be fenced at once (`1..=65536`; default 256).
    pub max_fenced: u64,
    /// Token transfers in flight at once (`1..=2^24`; default 4 per room).
    pub max_tokens: u64,
}

/// Room or page occupancy (see `kvfence_get_stats`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct kvfence_usage {
    /// Free (pages: in the pool; always 0 in gate mode).
    pub free: u64,
    /// In an owned (live) room.
    pub owned: u64,
    /// In an aborting or draining room: not reusable until it drains.
    pub held: u64,
    /// Released, waiting in the release queue.
    pub queued: u64,
}

/// One live room's status (`kvfence_get_room_status`, and each closing room of
/// `kvfence_get_stats`). Not versioned (no `struct_size`): a field added is a new soname.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvfence_room_status {
    /// The room's lifecycle.
    pub handle: kvfence_handle,
    /// A `kvfence_phase`: owned, aborting or draining.
    pub phase: kvfence_phase,
    /// How many of `waiting_on` are set.
    pub waiting_on_len: u32,
    /// Writer ranks that have not quiesced (ACKed) yet.
    pub waiting_on: [u32; KVFENCE_MAX_WRITERS],
    /// Transfers holding the room: in flight, and failed ones.
    pub transfers: u32,
    /// Of `transfers`, the failed ones (ended by fencing their peer, or quarantine).
    pub failed: u32,
    /// Pages it holds.
    pub pages: u64,
    /// Milliseconds since `abort`/`finish` (0 while owned): how overdue its drain is.
    pub closing_for_ms: u64,
    /// 1 if quarantined (its release will say `KVFENCE_REASON_QUARANTINED`), else 0.
    pub quarantined: u32,
    /// Reserved, 0.
    pub reserved: u32,
}

/// A snapshot of a table (`kvfence_get_stats`). Versioned like `kvfence_config`: set
/// `struct_size` to `sizeof(kvfence_stats)` before the call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct kvfence_stats {
    /// In: `sizeof(kvfence_stats)`. The library writes at most this many bytes.
    pub struct_size: u32,
    /// Reserved, 0.
    pub reserved: u32,
    /// Room occupancy.
    pub rooms: kvfence_usage,
    /// Page occupancy (gate mode: the page ids the rooms hold; `free` is 0).
    pub pages: kvfence_usage,
    /// Closing rooms in the snapshot (may exceed what the caller's buffer took).
    pub closing_len: u64,
    /// Fenced ranks in the snapshot (may exceed what the caller's buffer took).
    pub fenced_len: u64,
    /// Releases delivered since construction (quarantines included).
    pub releases: u64,
    /// Calls refused because their handle was stale.
    pub stale_refused: u64,
    /// Duplicate ACKs (`quiesce` of a rank already quiesced).
    pub duplicate_acks: u64,
    /// Transfers ended as failed.
    pub failed_transfers: u64,
    /// Rooms released as quarantined.
    pub quarantined_rooms: u64,
    /// Pages of quarantined rooms: never to be reused.
    pub quarantined_pages: u64,
    /// Releases given back unread with `kvfence_release_requeue` and not drained yet (a
    /// C++ `Release` destroyed unread); also counted by `kvfence_queued_releases` and
    /// delivered by `kvfence_drain_released`. (Releases that `kvfence_end_queued` and
    /// `kvfence_fence_rank` beyond its buffer queue are in the core's queue: counted in
    /// `rooms.queued`, not here.)
    pub overflow_releases: u64,
}

/// What `kvfence_fence_rank` did. Not versioned (no `struct_size`): a field added is a new
/// soname.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct kvfence_fenced {
    /// Live rooms in which the rank was pending and is now quiesced.
    pub quiesced: u64,
    /// Failed transfers to the rank that were holding their rooms and are now ended.
    pub failed_ended: u64,
    /// Releases written to the caller's buffer.
    pub released: u64,
    /// Releases that went to the release queue (the table's queue mode, or the caller's
    /// buffer was full): `kvfence_drain_released` delivers them.
    pub queued: u64,
}

/// A kvfence room table (opaque). Made by `kvfence_table_new`, freed by
/// `kvfence_table_free`; shared by any number of threads in between.
pub struct kvfence_table {
    inner: RoomTable,
    /// Releases a caller gave back unread (`kvfence_release_requeue`: the C++ `Release`
    /// destroyed without its pages being read): handed out by `kvfence_drain_released`
    /// before the core's queue. (Releases no caller can take when they are performed, a
    /// destructor's transfer end, a fence's beyond the caller's buffer, go to the core's
    /// own queue, before waiters are woken: issue 40.)
    overflow: Mutex<Vec<Released>>,
    /// `overflow.len()`, readable without the lock (the drain's fast path).
    overflow_len: AtomicUsize,
}

// ---------------------------------------------------------------------------------------
// The boundary: errors, the last error, panics, pointers.

/// Why the last failing call on this thread failed.
#[derive(Clone, Copy)]
enum Last {
    None,
    Core(Error),
    Boundary(&'static str),
}

thread_local! {
    static LAST: Cell<Last> = const { Cell::new(Last::None) };
    /// `kvfence_last_error_id`: this thread's failure count, in the low 32 bits, under a
    /// number of its own in the high 32 (taken at its first failure), so that ids of
    /// different threads never compare equal.
    static LAST_ID: Cell<u64> = const { Cell::new(0) };
}

/// The next thread number of `LAST_ID`.
static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

/// Records why this thread's current call fails (and gives the failure a new id).
fn set_last(l: Last) {
    LAST.with(|c| c.set(l));
    LAST_ID.with(|c| {
        let mut id = c.get();
        if id == 0 {
            id = NEXT_THREAD.fetch_add(1, Ordering::Relaxed) << 32;
        }
        c.set(id.wrapping_add(1));
    });
}

#[cfg(test)]
thread_local! {
    /// Test-only: the next boundary call panics inside its body.
    static INJECT_PANIC: Cell<bool> = const { Cell::new(false) };
}

/// A failed call: its status, never `KVFENCE_OK` (the detail is already in `LAST`).
///
/// Held as a `NonZeroU32` so that `Result<(), Fail>` is one `u32` whose `Ok(())` is 0, i.e.
/// `KVFENCE_OK`: `call` returns a body's result without converting it (with a
/// `kvfence_status` inside, `Ok(())` took the enum's first unused value and every call
/// ended with a compare and a conditional move).
struct Fail(NonZeroU32);

impl Fail {
    /// The failure `status` (`KVFENCE_OK` is no failure: reported as an internal error).
    fn new(status: kvfence_status) -> Fail {
        Fail(NonZeroU32::new(status as u32).unwrap_or(NON_ZERO_INTERNAL_ERROR))
    }

    /// The status.
    fn status(&self) -> kvfence_status {
        // SAFETY: `Fail::new` is the only constructor: the value is a `kvfence_status`
        // discriminant (`#[repr(u32)]`), so it is a valid `kvfence_status`.
        unsafe { core::mem::transmute::<u32, kvfence_status>(self.0.get()) }
    }
}

/// `KVFENCE_INTERNAL_ERROR` as a `NonZeroU32`.
const NON_ZERO_INTERNAL_ERROR: NonZeroU32 = match NonZeroU32::new(KVFENCE_INTERNAL_ERROR as u32) {
    Some(v) => v,
    None => panic!("KVFENCE_INTERNAL_ERROR is not 0"),
};

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        set_last(Last::Core(e));
        Fail::new(status_of(e))
    }
}

/// `Fail::from` of a core error behind a reference, out of line: a hot function that
/// matches `Err(ref e) => return Err(failed(e))` does not load the error's payload on its
/// success path (a `?` there made LLVM copy it out of the result, unaligned, on every call).
#[cold]
#[inline(never)]
fn failed(e: &Error) -> Fail {
    Fail::from(*e)
}

/// `KVFENCE_OUT_OF_MEMORY` for an allocation of `bytes` this library failed to make.
#[cold]
#[inline(never)]
fn out_of_memory(bytes: usize) -> Fail {
    Fail::from(Error::OutOfMemory { bytes })
}

/// A boundary refusal with its explanation.
fn refuse(status: kvfence_status, why: &'static str) -> Fail {
    set_last(Last::Boundary(why));
    Fail::new(status)
}

/// The status of a core error: one per variant.
fn status_of(e: Error) -> kvfence_status {
    match e {
        Error::InvalidConfig { .. } => KVFENCE_INVALID_CONFIG,
        Error::UnknownRoom { .. } => KVFENCE_UNKNOWN_ROOM,
        Error::InvalidHandle => KVFENCE_INVALID_HANDLE,
        Error::StaleHandle => KVFENCE_STALE_HANDLE,
        Error::RoomClosed { .. } => KVFENCE_ROOM_CLOSED,
        Error::AlreadyAborted => KVFENCE_ALREADY_ABORTED,
        Error::AlreadyFinished => KVFENCE_ALREADY_FINISHED,
        Error::InvalidRank { .. } => KVFENCE_INVALID_RANK,
        Error::TooManyWriters { .. } => KVFENCE_TOO_MANY_WRITERS,
        Error::DuplicateWriter { .. } => KVFENCE_DUPLICATE_WRITER,
        Error::RankNotInRoom { .. } => KVFENCE_RANK_NOT_IN_ROOM,
        Error::RankFenced { .. } => KVFENCE_RANK_FENCED,
        Error::TooManyFenced { .. } => KVFENCE_TOO_MANY_FENCED,
        Error::WrongMode { .. } => KVFENCE_WRONG_MODE,
        Error::TooManyPagesInRoom => KVFENCE_TOO_MANY_PAGES_IN_ROOM,
        Error::InvalidToken => KVFENCE_INVALID_TOKEN,
        Error::TooManyTokens => KVFENCE_TOO_MANY_TOKENS,
        Error::TooManyPages { .. } => KVFENCE_TOO_MANY_PAGES,
        Error::RoomTableFull => KVFENCE_ROOM_TABLE_FULL,
        Error::PoolExhausted { .. } => KVFENCE_POOL_EXHAUSTED,
        Error::TooManyTransfers => KVFENCE_TOO_MANY_TRANSFERS,
        Error::OutOfMemory { .. } => KVFENCE_OUT_OF_MEMORY,
        // `Error` is #[non_exhaustive]: a variant added to the core after this ABI.
        _ => KVFENCE_INTERNAL_ERROR,
    }
}

/// Runs the body of an exported function: a panic becomes `KVFENCE_PANIC`.
fn call(body: impl FnOnce() -> Result<(), Fail>) -> kvfence_status {
    let run = AssertUnwindSafe(|| {
        injected_panic();
        body()
    });
    match catch_unwind(run) {
        Ok(Ok(())) => KVFENCE_OK,
        Ok(Err(fail)) => fail.status(),
        Err(_) => {
            set_last(Last::Boundary(
                "kvfence panicked (caught at the C boundary): a bug, please report it",
            ));
            KVFENCE_PANIC
        }
    }
}

/// Runs the body of an exported function that returns a value: `fallback` on a panic.
fn call_value<T>(fallback: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(|| {
        injected_panic();
        body()
    }))
    .unwrap_or(fallback)
}

/// Test-only: panics inside the boundary if the test armed `INJECT_PANIC` (one shot).
#[inline(always)]
fn injected_panic() {
    #[cfg(test)]
    if INJECT_PANIC.with(|p| p.replace(false)) {
        panic!("injected test panic");
    }
}

/// Checks a pointer that will be dereferenced.
fn check<T>(p: *const T) -> Result<(), Fail> {
    // MUTATION (test-only, `--cfg kvfence_ffi_no_null_check`): NULL goes through.
    if p.is_null() && !cfg!(kvfence_ffi_no_null_check) {
        return Err(refuse(KVFENCE_NULL_POINTER, "a required pointer is null"));
    }
    if (p as usize) % align_of::<T>() != 0 {
        return Err(refuse(
            KVFENCE_MISALIGNED_POINTER,
            "a pointer is not aligned for its type",
        ));
    }
    Ok(())
}

/// Whether `p` is null (what `check` refuses first).
#[inline(always)]
fn null<T>(p: *const T) -> bool {
    // MUTATION (test-only, `--cfg kvfence_ffi_no_null_check`): NULL goes through.
    p.is_null() && !cfg!(kvfence_ffi_no_null_check)
}

/// `p`'s misalignment for its type: 0 when aligned (what `check` refuses second).
#[inline(always)]
fn misalignment<T>(p: *const T) -> usize {
    (p as usize) & (align_of::<T>() - 1)
}

/// Never called: names every field of `Aborted`, so that a new one (which `kvfence_abort`'s
/// `mem::forget` could leak) is a compile error here.
#[allow(dead_code)]
fn aborted_fields(a: core_kvfence::Aborted) {
    let core_kvfence::Aborted {
        fanout: _,
        released: _,
    } = a;
}

/// The path of a refused pointer (kept out of the hot functions' straight line).
#[cold]
#[inline(never)]
fn refused_pointer() {}

/// `check(p)?` of each pointer, in order (the first failure is the one reported). On the
/// path where every pointer is valid: one test per pointer for null, and one test of all
/// their misalignments OR-ed together; nothing recorded.
macro_rules! checks {
    ($($p:expr),+ $(,)?) => {
        if false $(|| null($p))+ || (0 $(| misalignment($p))+) != 0 {
            refused_pointer();
            $(check($p)?;)+
        }
    };
}

/// Checks a `(pointer, length)` pair's length and pointer (length 0: any pointer).
fn check_slice<T>(p: *const T, len: usize) -> Result<(), Fail> {
    if len == 0 {
        return Ok(());
    }
    if len > isize::MAX as usize / size_of::<T>().max(1) {
        return Err(refuse(
            KVFENCE_BAD_LENGTH,
            "a length overflows the address space",
        ));
    }
    check(p)
}

/// A caller's input array.
///
/// # Safety
/// Checked with `check_slice` by the caller; `p` must then be valid for `len` reads.
unsafe fn input<'a, T>(p: *const T, len: usize) -> &'a [T] {
    if len == 0 {
        &[]
    } else {
        // SAFETY: non-null, aligned and in range (check_slice); valid for `len` elements by
        // this function's contract with its C caller.
        unsafe { core::slice::from_raw_parts(p, len) }
    }
}

/// Writes a value through a checked output pointer (the old value is not read or dropped:
/// a caller's output struct may be uninitialised).
///
/// # Safety
/// `p` was checked with `check` and is valid for a write of `T`.
unsafe fn put<T>(p: *mut T, v: T) {
    // SAFETY: by this function's contract.
    unsafe { p.write(v) }
}

/// Writes a 16-byte value (`kvfence_handle`, `kvfence_token`) as its two 8-byte words,
/// each with its own store: the core returns it in memory written as two 8-byte stores,
/// and the single 16-byte load LLVM otherwise merges the copy into cannot be forwarded
/// from them (x86 store-to-load forwarding needs the load inside one store): that stall
/// was most of `kvfence_begin`'s own time. Volatile only to keep the two stores apart.
///
/// # Safety
/// `lo` and `hi` were checked (through their struct's pointer) and are valid for writes.
#[inline(always)]
unsafe fn put_words(lo: *mut u64, hi: *mut u64, w: u128) {
    // SAFETY: by this function's contract.
    unsafe {
        lo.write_volatile(w as u64);
        hi.write_volatile((w >> 64) as u64);
    }
}

/// The table behind a pointer.
///
/// # Safety
/// `t` is null, misaligned, or a pointer returned by `kvfence_table_new` and not yet freed.
unsafe fn table<'a>(t: *const kvfence_table) -> Result<&'a kvfence_table, Fail> {
    check(t)?;
    // SAFETY: checked non-null and aligned; a live table by this function's contract.
    Ok(unsafe { &*t })
}

fn handle_of(h: kvfence_handle) -> RoomHandle {
    RoomHandle::from_wire(u128::from(h.hi) << 64 | u128::from(h.lo))
}

fn c_handle(h: RoomHandle) -> kvfence_handle {
    let w = h.to_wire();
    kvfence_handle {
        lo: w as u64,
        hi: (w >> 64) as u64,
    }
}

fn token_of(t: kvfence_token) -> TransferToken {
    TransferToken::from_wire(u128::from(t.hi) << 64 | u128::from(t.lo))
}

const NO_RELEASE: kvfence_release = kvfence_release {
    handle: kvfence_handle { lo: 0, hi: 0 },
    token: 0,
    pages: ptr::null_mut(),
    pages_len: 0,
    pages_cap: 0,
    reason: kvfence_reason::KVFENCE_REASON_NONE,
};

/// Hands a release's page list to C (no copy: the Vec's buffer itself).
fn c_release(r: Released) -> kvfence_release {
    let (ptr, len, cap) = if r.pages.is_empty() {
        drop(r.pages); // an empty list is handed out as NULL (its buffer, if any, freed)
        (ptr::null_mut(), 0, 0)
    } else {
        let mut pages = core::mem::ManuallyDrop::new(r.pages);
        (pages.as_mut_ptr(), pages.len(), pages.capacity())
    };
    kvfence_release {
        handle: c_handle(r.handle),
        token: r.token,
        pages: ptr,
        pages_len: len,
        pages_cap: cap,
        reason: match r.reason {
            Reason::Finished => kvfence_reason::KVFENCE_REASON_FINISHED,
            Reason::Aborted => kvfence_reason::KVFENCE_REASON_ABORTED,
            Reason::Quarantined => kvfence_reason::KVFENCE_REASON_QUARANTINED,
        },
    }
}

fn c_phase(p: Phase) -> kvfence_phase {
    match p {
        Phase::Free => kvfence_phase::KVFENCE_PHASE_FREE,
        Phase::Owned => kvfence_phase::KVFENCE_PHASE_OWNED,
        Phase::Aborting => kvfence_phase::KVFENCE_PHASE_ABORTING,
        Phase::Draining => kvfence_phase::KVFENCE_PHASE_DRAINING,
    }
}

fn outcome_of(outcome: u32) -> Result<Outcome, Fail> {
    match outcome {
        0 => Ok(Outcome::Completed),
        1 => Ok(Outcome::Failed),
        _ => Err(refuse(
            KVFENCE_BAD_ARGUMENT,
            "outcome must be KVFENCE_COMPLETED (0) or KVFENCE_FAILED (1)",
        )),
    }
}

fn c_status(s: &RoomStatus) -> kvfence_room_status {
    let mut waiting_on = [u32::MAX; KVFENCE_MAX_WRITERS];
    let n = s.waiting_on.len().min(KVFENCE_MAX_WRITERS);
    waiting_on[..n].copy_from_slice(&s.waiting_on[..n]);
    kvfence_room_status {
        handle: c_handle(s.handle),
        phase: c_phase(s.phase),
        waiting_on_len: n as u32,
        waiting_on,
        transfers: s.transfers,
        failed: s.failed,
        pages: s.pages as u64,
        closing_for_ms: u64::try_from(s.closing_for.as_millis()).unwrap_or(u64::MAX),
        quarantined: u32::from(s.quarantined),
        reserved: 0,
    }
}

fn timeout_of(ms: u64) -> Option<Duration> {
    (ms != KVFENCE_WAIT_FOREVER).then(|| Duration::from_millis(ms))
}

impl kvfence_table {
    /// Takes up to `max` overflowed releases.
    fn take_overflow(&self, max: usize, mut f: impl FnMut(Released)) -> usize {
        if max == 0 || self.overflow_len.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let mut q = self.overflow.lock().unwrap_or_else(|e| e.into_inner());
        let n = q.len().min(max);
        for r in q.drain(..n) {
            f(r);
        }
        self.overflow_len.store(q.len(), Ordering::Release);
        n
    }

    /// Puts a release into the caller's output (`*out` was checked).
    #[inline(always)]
    fn deliver(out: *mut kvfence_release, r: Option<Released>) {
        match r {
            Some(r) => Self::deliver_some(out, r),
            None => Self::deliver_none(out),
        }
    }

    /// Puts a release into the caller's output (`*out` was checked). Out of line: the
    /// callers' path that releases nothing (most ACKs and transfer ends) then needs fewer
    /// registers (a shorter prologue).
    #[inline(never)]
    fn deliver_some(out: *mut kvfence_release, r: Released) {
        // SAFETY: every caller checked `out` with `check` first.
        unsafe { put(out, c_release(r)) }
    }

    /// No release: only the reason is written (the other fields are unspecified; one store
    /// instead of seven on the hot path of every ACK and transfer end).
    #[inline(always)]
    fn deliver_none(out: *mut kvfence_release) {
        // SAFETY: every caller checked `out` with `check` first; `reason` is a u32-sized
        // field of `*out`.
        unsafe {
            put(
                ptr::addr_of_mut!((*out).reason).cast::<u32>(),
                kvfence_reason::KVFENCE_REASON_NONE as u32,
            )
        }
    }
}

// ---------------------------------------------------------------------------------------
// Statuses, versions, errors.

/// A static, NUL-terminated English description of a status (e.g. `"room handle is
/// stale"`), for any `uint32_t` (unknown values get `"unknown kvfence status"`). Never
/// NULL; the string must not be freed. Thread-safe.
#[no_mangle]
pub extern "C" fn kvfence_status_str(status: u32) -> *const c_char {
    const TEXTS: &[(u32, &str)] = &[
        (KVFENCE_OK as u32, "ok\0"),
        (KVFENCE_INVALID_CONFIG as u32, "invalid kvfence config\0"),
        (
            KVFENCE_UNKNOWN_ROOM as u32,
            "room index is outside the table\0",
        ),
        (
            KVFENCE_INVALID_HANDLE as u32,
            "room handle was not made by this table\0",
        ),
        (
            KVFENCE_STALE_HANDLE as u32,
            "room handle is stale: its lifecycle is over or never began\0",
        ),
        (
            KVFENCE_ROOM_CLOSED as u32,
            "room is closing: no new transfer may begin\0",
        ),
        (KVFENCE_ALREADY_ABORTED as u32, "room was already aborted\0"),
        (
            KVFENCE_ALREADY_FINISHED as u32,
            "room was already finished\0",
        ),
        (KVFENCE_INVALID_RANK as u32, "not a valid rank id\0"),
        (
            KVFENCE_TOO_MANY_WRITERS as u32,
            "too many writer ranks for one room\0",
        ),
        (
            KVFENCE_DUPLICATE_WRITER as u32,
            "a writer rank appears twice\0",
        ),
        (
            KVFENCE_RANK_NOT_IN_ROOM as u32,
            "rank is not in the room's writer set\0",
        ),
        (KVFENCE_RANK_FENCED as u32, "a writer rank is fenced\0"),
        (KVFENCE_TOO_MANY_FENCED as u32, "too many ranks fenced\0"),
        (
            KVFENCE_WRONG_MODE as u32,
            "wrong table mode for this call (gate vs pool)\0",
        ),
        (
            KVFENCE_TOO_MANY_PAGES_IN_ROOM as u32,
            "the room cannot take that many more pages\0",
        ),
        (
            KVFENCE_INVALID_TOKEN as u32,
            "transfer token was not issued by this table, or was already ended\0",
        ),
        (
            KVFENCE_TOO_MANY_TOKENS as u32,
            "too many token transfers in flight\0",
        ),
        (
            KVFENCE_TOO_MANY_PAGES as u32,
            "more pages than the pool has\0",
        ),
        (KVFENCE_ROOM_TABLE_FULL as u32, "every room is in use\0"),
        (
            KVFENCE_POOL_EXHAUSTED as u32,
            "not enough free pages (nothing was claimed)\0",
        ),
        (
            KVFENCE_TOO_MANY_TRANSFERS as u32,
            "room has the maximum number of transfers in flight\0",
        ),
        (KVFENCE_OUT_OF_MEMORY as u32, "out of memory\0"),
        (KVFENCE_TIMED_OUT as u32, "timed out (nothing changed)\0"),
        (KVFENCE_NULL_POINTER as u32, "a required pointer is null\0"),
        (
            KVFENCE_MISALIGNED_POINTER as u32,
            "a pointer is misaligned\0",
        ),
        (
            KVFENCE_BAD_LENGTH as u32,
            "bad length or buffer too small\0",
        ),
        (KVFENCE_BAD_ARGUMENT as u32, "argument out of range\0"),
        (
            KVFENCE_PANIC as u32,
            "kvfence panicked (caught at the boundary): a bug\0",
        ),
        (
            KVFENCE_INTERNAL_ERROR as u32,
            "internal error: unknown kvfence error\0",
        ),
    ];
    const UNKNOWN: &str = "unknown kvfence status\0";
    let text = call_value(UNKNOWN, || {
        TEXTS
            .iter()
            .find(|(s, _)| *s == status)
            .map_or(UNKNOWN, |(_, t)| t)
    });
    text.as_ptr().cast()
}

/// The library's version, a static NUL-terminated string such as `"0.1.0"` (never NULL,
/// never to be freed). Thread-safe.
#[no_mangle]
pub extern "C" fn kvfence_version() -> *const c_char {
    const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");
    call_value(VERSION, || VERSION).as_ptr().cast()
}

/// The ABI version this library implements (`KVFENCE_ABI_VERSION` of its header): compare
/// with the header's at start-up to catch a mismatched library. Thread-safe.
#[no_mangle]
pub extern "C" fn kvfence_abi_version() -> u32 {
    call_value(KVFENCE_ABI_VERSION, || KVFENCE_ABI_VERSION)
}

/// Copies a message describing the last failing call on the calling thread (with its
/// details: which rank, index, setting) into `buf` as a NUL-terminated string, truncated to
/// `cap` bytes; `*len` (if not NULL) gets the message's full length without the NUL. A
/// thread whose calls all succeeded gets `"no error"`. Formats straight into `buf`: no
/// allocation. Thread-safe (per-thread state).
///
/// Errors: `KVFENCE_NULL_POINTER` if `buf` is NULL while `cap > 0`; `KVFENCE_MISALIGNED_POINTER`
/// for a misaligned `len`.
///
/// # Safety
/// `buf` valid for `cap` bytes; `len` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn kvfence_last_error(
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> kvfence_status {
    // Read the last error before `call` (whose own refusals would overwrite it).
    let last = LAST.with(Cell::get);
    call(|| {
        check_slice(buf, cap)?;
        if !len.is_null() {
            check(len)?;
        }
        let mut w = Truncating {
            buf: buf.cast::<u8>(),
            cap: cap.saturating_sub(1),
            len: 0,
        };
        let _ = match last {
            Last::None => core::fmt::Write::write_str(&mut w, "no error"),
            Last::Core(e) => core::fmt::Write::write_fmt(&mut w, format_args!("{e}")),
            Last::Boundary(why) => core::fmt::Write::write_str(&mut w, why),
        };
        if cap > 0 {
            // SAFETY: `buf` checked non-null and valid for `cap` bytes by contract; the
            // writer wrote at most `cap - 1` of them.
            unsafe { *buf.add(w.len.min(cap - 1)) = 0 };
        }
        if !len.is_null() {
            // SAFETY: checked above.
            unsafe { put(len, w.len) };
        }
        Ok(())
    })
}

/// A `fmt::Write` into a caller's buffer of `cap` bytes: writes what fits, counts all.
struct Truncating {
    buf: *mut u8,
    cap: usize,
    len: usize,
}

impl core::fmt::Write for Truncating {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let room = self.cap.saturating_sub(self.len);
        let n = s.len().min(room);
        if n > 0 {
            // SAFETY: `buf` is valid for `cap` bytes (kvfence_last_error's contract) and
            // `len + n <= cap`.
            unsafe { ptr::copy_nonoverlapping(s.as_ptr(), self.buf.add(self.len), n) };
        }
        self.len += s.len();
        Ok(())
    }
}

/// An id of the last failing call on the calling thread: it changes with every failure on
/// this thread and never equals an id of another thread's failure (0: no failure yet).
/// Saved with a failure, it tells later whether `kvfence_last_error` still describes that
/// failure (the C++ wrapper's `Result` formats its message only when asked, this way).
/// Thread-safe (per-thread state); never fails.
#[no_mangle]
pub extern "C" fn kvfence_last_error_id() -> u64 {
    call_value(0, || LAST_ID.with(Cell::get))
}

// ---------------------------------------------------------------------------------------
// Handles and tokens.

/// Writes the handle's 16-byte little-endian wire form into `out` (`len` must be 16).
/// Thread-safe.
///
/// Errors: `KVFENCE_NULL_POINTER`, `KVFENCE_BAD_LENGTH` (`len != 16`).
///
/// # Safety
/// `out` valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn kvfence_handle_to_bytes(
    handle: kvfence_handle,
    out: *mut u8,
    len: usize,
) -> kvfence_status {
    call(|| {
        if len != 16 {
            return Err(refuse(
                KVFENCE_BAD_LENGTH,
                "a handle's byte form is 16 bytes",
            ));
        }
        check(out)?;
        let bytes = handle_of(handle).to_bytes();
        // SAFETY: `out` non-null and valid for 16 bytes by contract.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), out, 16) };
        Ok(())
    })
}

/// Decodes a handle's 16-byte wire form (`len` must be 16). Every 16-byte value decodes;
/// whether it names a live room is checked by the table on use. Thread-safe.
///
/// Errors: `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER` (`out`), `KVFENCE_BAD_LENGTH`.
///
/// # Safety
/// `bytes` valid for `len` bytes; `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn kvfence_handle_from_bytes(
    bytes: *const u8,
    len: usize,
    out: *mut kvfence_handle,
) -> kvfence_status {
    call(|| {
        if len != 16 {
            return Err(refuse(
                KVFENCE_BAD_LENGTH,
                "a handle's byte form is 16 bytes",
            ));
        }
        check(bytes)?;
        check(out)?;
        let mut b = [0u8; 16];
        // SAFETY: `bytes` non-null and valid for 16 bytes by contract.
        unsafe { ptr::copy_nonoverlapping(bytes, b.as_mut_ptr(), 16) };
        // SAFETY: checked.
        unsafe { put(out, c_handle(RoomHandle::from_bytes(b))) };
        Ok(())
    })
}

/// The room index a handle names (meaningful only for a handle the table accepts).
/// Thread-safe; never fails.
#[no_mangle]
pub extern "C" fn kvfence_handle_index(handle: kvfence_handle) -> u32 {
    call_value(0, || handle_of(handle).index() as u32)
}

/// The lifecycle (generation) a handle names. Thread-safe; never fails.
#[no_mangle]
pub extern "C" fn kvfence_handle_generation(handle: kvfence_handle) -> u32 {
    call_value(0, || handle_of(handle).generation())
}

/// Whether two handles are the same (all 16 bytes). Thread-safe; never fails.
#[no_mangle]
pub extern "C" fn kvfence_handle_eq(a: kvfence_handle, b: kvfence_handle) -> bool {
    call_value(false, || a == b)
}

// ---------------------------------------------------------------------------------------
// Tables.

/// A gate-mode config (the engine owns its pages) of `rooms` rooms with the defaults:
/// releases returned directly, 256 fenceable ranks, 4 token transfers per room. Pure,
/// thread-safe; a bad `rooms` is refused later by `kvfence_table_new`.
#[no_mangle]
pub extern "C" fn kvfence_config_gate(rooms: u64) -> kvfence_config {
    call_value(c_config(Config::gate(0)), || {
        c_config(Config::gate(usize::try_from(rooms).unwrap_or(usize::MAX)))
    })
}

/// A pool-mode config: `rooms` rooms and a pool of `pages` pages owned by kvfence (ids
/// `0..pages`), with the defaults of `kvfence_config_gate`. Pure, thread-safe.
#[no_mangle]
pub extern "C" fn kvfence_config_pool(rooms: u64, pages: u64) -> kvfence_config {
    call_value(c_config(Config::gate(0)), || {
        let mut c = c_config(Config::gate(usize::try_from(rooms).unwrap_or(usize::MAX)));
        c.pages = pages;
        c
    })
}

fn c_config(c: Config) -> kvfence_config {
    kvfence_config {
        struct_size: size_of::<kvfence_config>() as u32,
        release_queue: u32::from(c.release_queue),
        rooms: c.rooms as u64,
        pages: c.pages.map_or(0, |p| p as u64),
        max_fenced: c.max_fenced as u64,
        max_tokens: c.max_tokens as u64,
    }
}

/// Reads a caller's config of `struct_size` bytes.
///
/// # Safety
/// `p` checked, valid for `(*p).struct_size` bytes.
unsafe fn read_config(p: *const kvfence_config) -> Result<Config, Fail> {
    // SAFETY: the first field is readable in any version.
    let size = unsafe { ptr::addr_of!((*p).struct_size).read() } as usize;
    let known = size_of::<kvfence_config>();
    if size < known || size > 4096 {
        return Err(refuse(
            KVFENCE_BAD_LENGTH,
            "kvfence_config.struct_size is not sizeof(kvfence_config) of a known version",
        ));
    }
    // SAFETY: the caller's struct is `size >= known` bytes.
    let tail = unsafe { core::slice::from_raw_parts(p.cast::<u8>().add(known), size - known) };
    if tail.iter().any(|&b| b != 0) {
        return Err(refuse(
            KVFENCE_BAD_ARGUMENT,
            "kvfence_config has fields this library does not know set (not zero)",
        ));
    }
    // SAFETY: `known` bytes are readable and every bit pattern is a valid kvfence_config.
    let c = unsafe { p.read() };
    if c.release_queue > 1 {
        return Err(refuse(
            KVFENCE_BAD_ARGUMENT,
            "kvfence_config.release_queue must be 0 or 1",
        ));
    }
    let size = |v: u64, what: &'static str| {
        usize::try_from(v).map_err(|_| refuse(KVFENCE_BAD_ARGUMENT, what))
    };
    let rooms = size(c.rooms, "kvfence_config.rooms does not fit size_t")?;
    let pages = size(c.pages, "kvfence_config.pages does not fit size_t")?;
    let mut config = if pages == 0 {
        Config::gate(rooms)
    } else {
        Config::pool(rooms, pages)
    };
    config = config
        .release_queue(c.release_queue == 1)
        .max_fenced(size(
            c.max_fenced,
            "kvfence_config.max_fenced does not fit size_t",
        )?)
        .max_tokens(size(
            c.max_tokens,
            "kvfence_config.max_tokens does not fit size_t",
        )?);
    Ok(config)
}

/// Makes a table from `*config` and stores it in `*out`. Free it with `kvfence_table_free`.
/// Thread-safe.
///
/// Errors: `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER`, `KVFENCE_BAD_LENGTH` (bad
/// `struct_size`), `KVFENCE_BAD_ARGUMENT` (`release_queue` not 0/1, unknown fields set),
/// `KVFENCE_INVALID_CONFIG` (a size out of range: `kvfence_last_error` says which),
/// `KVFENCE_OUT_OF_MEMORY`. On error `*out` is untouched.
///
/// # Safety
/// `config` valid for `config->struct_size` bytes; `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn kvfence_table_new(
    config: *const kvfence_config,
    out: *mut *mut kvfence_table,
) -> kvfence_status {
    call(|| {
        check(config)?;
        check(out)?;
        // SAFETY: checked; valid for its struct_size by contract.
        let config = unsafe { read_config(config) }?;
        let table = kvfence_table {
            inner: RoomTable::new(config)?,
            overflow: Mutex::new(Vec::new()),
            overflow_len: AtomicUsize::new(0),
        };
        // The box by hand: `Box::new` aborts the process when memory runs out.
        let layout = std::alloc::Layout::new::<kvfence_table>();
        // SAFETY: `kvfence_table` is not zero-sized (it holds a RoomTable).
        let raw = unsafe { std::alloc::alloc(layout) }.cast::<kvfence_table>();
        if raw.is_null() {
            return Err(out_of_memory(layout.size()));
        }
        // SAFETY: `raw` is a fresh allocation of `kvfence_table`'s layout from the global
        // allocator, which is what `Box::from_raw` in `kvfence_table_free` expects.
        unsafe { raw.write(table) };
        // SAFETY: checked.
        unsafe { put(out, raw) };
        Ok(())
    })
}

/// Frees a table and everything it still holds (rooms not released and releases not yet
/// drained are simply dropped: free a table only once every transfer on it has ended and
/// its releases were drained). NULL (and a misaligned pointer, which no table has) is a
/// no-op. Not thread-safe with respect to the same table: it must be the table's last use.
/// A use after it (a C++ `TransferGuard` destroyed after its `Table`, a late ACK thread)
/// is undefined behaviour that AddressSanitizer does not report (the access is inside this
/// uninstrumented library): valgrind memcheck does. Shutdown: abort or finish every room,
/// `kvfence_wait_idle`, `kvfence_drain_released`, then join (or otherwise wait for the
/// return of) every thread that calls into the table, and only then free it: a thread
/// whose call performed the last release (a guard's destructor, an ACK) has queued it
/// before the wait ends, but may still be returning from that call.
///
/// # Safety
/// `table` NULL or returned by `kvfence_table_new` and not freed yet.
#[no_mangle]
pub unsafe extern "C" fn kvfence_table_free(table: *mut kvfence_table) {
    let _ = call(|| {
        if !table.is_null() && (table as usize) % align_of::<kvfence_table>() == 0 {
            // SAFETY: made by Box::into_raw in kvfence_table_new, freed once by contract.
            drop(unsafe { Box::from_raw(table) });
        }
        Ok(())
    });
}

/// Writes the table's settings to `*out` (with `struct_size` set). Thread-safe.
///
/// Errors: `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER`.
///
/// # Safety
/// `table` live; `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn kvfence_table_config(
    table: *const kvfence_table,
    out: *mut kvfence_config,
) -> kvfence_status {
    call(|| {
        // SAFETY: a live table by contract.
        let t = unsafe { self::table(table) }?;
        check(out)?;
        // SAFETY: checked.
        unsafe { put(out, c_config(t.inner.config())) };
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// Opening and growing rooms.

/// Pool mode: claims a room and `npages` pages, all or nothing, for a request written by
/// `writers[0..nwriters]` (rank ids, not `UINT32_MAX`, at most `KVFENCE_MAX_WRITERS`, no
/// repeats; may be empty). The claimed page ids are written to `pages_out[0..npages]`
/// (`pages_cap >= npages`, or `KVFENCE_BAD_LENGTH` before anything is claimed); the new
/// lifecycle's handle to `*handle`. The room starts owned and waits on every writer's
/// `kvfence_quiesce`. Thread-safe, lock-free.
///
/// Errors: `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER`, `KVFENCE_BAD_LENGTH`,
/// `KVFENCE_WRONG_MODE` (gate-mode table), `KVFENCE_TOO_MANY_PAGES`,
/// `KVFENCE_TOO_MANY_WRITERS`, `KVFENCE_DUPLICATE_WRITER`, `KVFENCE_INVALID_RANK`,
/// `KVFENCE_RANK_FENCED`, `KVFENCE_ROOM_TABLE_FULL`, `KVFENCE_POOL_EXHAUSTED`. On error
/// nothing was claimed.
///
/// # Safety
/// `table` live; `writers` valid for `nwriters` reads; `pages_out` for `pages_cap` writes;
/// `handle` for a write.
#[no_mangle]
pub unsafe extern "C" fn kvfence_open(
    table: *const kvfence_table,
    writers: *const u32,
    nwriters: usize,
    npages: usize,
    pages_out: *mut u32,
    pages_cap: usize,
    handle: *mut kvfence_handle,
) -> kvfence_status {
    call(|| {
        // SAFETY: a live table by contract.
        let t = unsafe { self::table(table) }?;
        check_slice(writers, nwriters)?;
        check_slice(pages_out, pages_cap)?;
        check(handle)?;
        if pages_cap < npages {
            return Err(refuse(
                KVFENCE_BAD_LENGTH,
                "pages_cap is smaller than npages",
            ));
        }
        // SAFETY: checked; valid for `nwriters` by contract.
        let writers = unsafe { input(writers, nwriters) };
        let opened = t.inner.open(writers, npages)?;
        if !opened.pages.is_empty() {
            // SAFETY: `pages_out` valid for `pages_cap >= npages == opened.pages.len()`.
            unsafe {
                ptr::copy_nonoverlapping(opened.pages.as_ptr(), pages_out, opened.pages.len())
            };
        }
        // SAFETY: checked.
        unsafe { put(handle, c_handle(opened.handle)) };
        Ok(())
    })
}

/// Gate mode: opens a room for the engine's request `token` (any 64-bit value: its request
/// slot, an id) whose pages the engine owns (`pages[0..npages]`, copied; any count, may be
/// empty), written by `writers[0..nwriters]` (as `kvfence_open`). kvfence allocates no
/// page: the room's release hands `token` and the page ids back, exactly once. Thread-safe,
/// lock-free (one allocation: the copy of the page list).
///
/// Errors: `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER`, `KVFENCE_BAD_LENGTH`,
/// `KVFENCE_WRONG_MODE` (pool-mode table), `KVFENCE_TOO_MANY_PAGES_IN_ROOM` (`npages` >
/// 2^31), and as `kvfence_open` but never `KVFENCE_POOL_EXHAUSTED`. On error the table
/// holds nothing of the request.
///
/// # Safety
/// `table` live; `writers` valid for `nwriters` reads, `pages` for `npages`; `handle` for a
/// write.
#[no_mangle]
pub unsafe extern "C" fn kvfence_open_gate(
    table: *const kvfence_table,
    writers: *const u32,
    nwriters: usize,
    token: u64,
    pages: *const u32,
    npages: usize,
    handle: *mut kvfence_handle,
) -> kvfence_status {
    call(|| {
        checks!(table);
        // SAFETY: checked non-null and aligned; a live table by contract.
        let t = unsafe { &*table };
        check_slice(writers, nwriters)?;
        checks!(handle);
        if npages > core_kvfence::MAX_PAGES {
            // Before the copy: a huge length is refused without reading the array.
            return Err(Error::TooManyPagesInRoom.into());
        }
        check_slice(pages, npages)?;
        if !t.inner.is_gate() {
            return Err(Error::WrongMode { table: "pool" }.into());
        }
        // SAFETY: checked; valid by contract.
        let (writers, pages) = unsafe { (input(writers, nwriters), input(pages, npages)) };
        // The copy is fallible: memory running out is a status, never an abort of the host.
        let mut list = Vec::new();
        if list.try_reserve_exact(pages.len()).is_err() {
            return Err(out_of_memory(core::mem::size_of_val(pages)));
        }
        list.extend_from_slice(pages);
        let h = match t.inner.__open_gate_inline(writers, token, list) {
            Ok(h) => h,
            Err(ref e) => return Err(failed(e)),
        };
        // SAFETY: checked: `handle` is valid for writes of its two fields.
        unsafe {
            put_words(
                ptr::addr_of_mut!((*handle).lo),
                ptr::addr_of_mut!((*handle).hi),
                h.to_wire(),
            )
        };
        Ok(())
    })
}

/// Pool mode: adds `npages` pool pages to an owned room; their ids go to
/// `pages_out[0..npages]` (`pages_cap >= npages`). Thread-safe (serialised per room).
///
/// Errors: `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER`, `KVFENCE_BAD_LENGTH`,
/// `KVFENCE_WRONG_MODE`, `KVFENCE_ROOM_CLOSED` (closing), `KVFENCE_STALE_HANDLE`,
/// `KVFENCE_INVALID_HANDLE`, `KVFENCE_UNKNOWN_ROOM`, `KVFENCE_TOO_MANY_PAGES` (more than the
/// whole pool), `KVFENCE_POOL_EXHAUSTED`,
/// `KVFENCE_TOO_MANY_TRANSFERS`. If the room was closed meanwhile and this call's hold was
/// its last, its release goes to the release queue.
///
/// # Safety
/// `table` live; `pages_out` valid for `pages_cap` writes.
#[no_mangle]
pub unsafe extern "C" fn kvfence_grow(
    table: *const kvfence_table,
    handle: kvfence_handle,
    npages: usize,
    pages_out: *mut u32,
    pages_cap: usize,
) -> kvfence_status {
    call(|| {
        // SAFETY: a live table by contract.
        let t = unsafe { self::table(table) }?;
        check_slice(pages_out, pages_cap)?;
        if pages_cap < npages {
            return Err(refuse(
                KVFENCE_BAD_LENGTH,
                "pages_cap is smaller than npages",
            ));
        }
        let added = t.inner.grow(handle_of(handle), npages)?;
        if !added.is_empty() {
            // SAFETY: valid for `pages_cap >= npages == added.len()` writes.
            unsafe { ptr::copy_nonoverlapping(added.as_ptr(), pages_out, added.len()) };
        }
        Ok(())
    })
}

/// Gate mode: adds the engine's page ids `pages[0..npages]` to an owned room.
/// Thread-safe (serialised per room).
///
/// Errors: as `kvfence_grow` (but not `KVFENCE_POOL_EXHAUSTED`), and
/// `KVFENCE_TOO_MANY_PAGES_IN_ROOM`.
///
/// # Safety
/// `table` live; `pages` valid for `npages` reads.
#[no_mangle]
pub unsafe extern "C" fn kvfence_grow_gate(
    table: *const kvfence_table,
    handle: kvfence_handle,
    pages: *const u32,
    npages: usize,
) -> kvfence_status {
    call(|| {
        // SAFETY: a live table by contract.
        let t = unsafe { self::table(table) }?;
        if npages > core_kvfence::MAX_PAGES {
            return Err(Error::TooManyPagesInRoom.into());
        }
        check_slice(pages, npages)?;
        // SAFETY: checked; valid by contract.
        let pages = unsafe { input(pages, npages) };
        t.inner.grow_gate(handle_of(handle), pages)?;
        Ok(())
    })
}

/// Copies the page ids of an owned room into `out[0..cap]`; `*len` gets their count. If
/// `cap < *len` nothing is copied and `KVFENCE_BAD_LENGTH` is returned (with `*len` set:
/// retry with a larger buffer). Thread-safe.
///
/// Errors: `KVFENCE_NULL_POINTER` (`len`), `KVFENCE_MISALIGNED_POINTER`,
/// `KVFENCE_BAD_LENGTH`, `KVFENCE_ROOM_CLOSED` (closing: its pages are the release's),
/// `KVFENCE_STALE_HANDLE`, `KVFENCE_INVALID_HANDLE`, `KVFENCE_UNKNOWN_ROOM`,
/// `KVFENCE_TOO_MANY_TRANSFERS`.
///
/// # Safety
/// `table` live; `out` valid for `cap` writes; `len` for a write.
#[no_mangle]
pub unsafe extern "C" fn kvfence_pages_of(
    table: *const kvfence_table,
    handle: kvfence_handle,
    out: *mut u32,
    cap: usize,
    len: *mut usize,
) -> kvfence_status {
    call(|| {
        // SAFETY: a live table by contract.
        let t = unsafe { self::table(table) }?;
        check_slice(out, cap)?;
        check(len)?;
        let pages = t.inner.pages_of(handle_of(handle))?;
        // SAFETY: checked.
        unsafe { put(len, pages.len()) };
        if pages.len() > cap {
            return Err(refuse(
                KVFENCE_BAD_LENGTH,
                "the buffer is smaller than the room's page list",
            ));
        }
        if !pages.is_empty() {
            // SAFETY: valid for `cap >= pages.len()` writes.
            unsafe { ptr::copy_nonoverlapping(pages.as_ptr(), out, pages.len()) };
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// Transfers.

/// Starts a transfer on the room's pages and writes its token to `*token`: the room cannot
/// be released until the token is ended with `kvfence_end`. `peer` is the rank whose
/// transport carries it (fencing it ends the transfer if it fails), or `KVFENCE_NO_PEER`
/// (then only `kvfence_quarantine` can end a failed one). This is the check a queued
/// transfer intent makes right before it touches the pages: after an abort it is refused.
/// Thread-safe, lock-free.
///
/// Errors: `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER`, `KVFENCE_ROOM_CLOSED`,
/// `KVFENCE_STALE_HANDLE`, `KVFENCE_INVALID_HANDLE`, `KVFENCE_UNKNOWN_ROOM`,
/// `KVFENCE_TOO_MANY_TRANSFERS`, `KVFENCE_TOO_MANY_TOKENS`.
///
/// # Safety
/// `table` live; `token` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn kvfence_begin(
    table: *const kvfence_table,
    handle: kvfence_handle,
    peer: u32,
    token: *mut kvfence_token,
) -> kvfence_status {
    call(|| {
        checks!(table, token);
        // SAFETY: checked non-null and aligned; a live table by contract.
        let t = unsafe { &*table };
        let peer = (peer != KVFENCE_NO_PEER).then_some(peer);
        let tok = match t.inner.__begin_inline(handle_of(handle), peer) {
            Ok(tok) => tok,
            Err(ref e) => return Err(failed(e)),
        };
        // SAFETY: checked: `token` is valid for writes of its two fields.
        unsafe {
            put_words(
                ptr::addr_of_mut!((*token).lo),
                ptr::addr_of_mut!((*token).hi),
                tok.to_wire(),
            )
        };
        Ok(())
    })
}

/// Ends a transfer with `outcome` (a `kvfence_outcome`: `KVFENCE_COMPLETED` or
/// `KVFENCE_FAILED`). If this was the last hold of a closing room, the release is written
/// to `*release` (else its reason is `KVFENCE_REASON_NONE`). A token is ended once; a
/// second end is refused and changes nothing. Thread-safe, lock-free (a failed transfer
/// takes a short lock to register itself).
///
/// Errors: `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER` (`release`),
/// `KVFENCE_BAD_ARGUMENT` (outcome), `KVFENCE_INVALID_TOKEN` (not this table's, or ended).
///
/// # Safety
/// `table` live; `release` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn kvfence_end(
    table: *const kvfence_table,
    token: kvfence_token,
    outcome: u32,
    release: *mut kvfence_release,
) -> kvfence_status {
    call(|| {
        checks!(table, release);
        // SAFETY: checked non-null and aligned; a live table by contract.
        let t = unsafe { &*table };
        let outcome = outcome_of(outcome)?;
        match t.inner.__end_inline(token_of(token), outcome) {
            Ok(None) => kvfence_table::deliver_none(release),
            Ok(Some(r)) => kvfence_table::deliver_some(release, r),
            Err(ref e) => return Err(failed(e)),
        }
        Ok(())
    })
}

/// `kvfence_end`, but a release it performs goes to the release queue
/// (`kvfence_drain_released`) instead of being returned: for destructors and callbacks
/// that cannot act on a release (the C++ `TransferGuard` uses it). Thread-safe.
///
/// Errors: `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER` (`table`),
/// `KVFENCE_BAD_ARGUMENT`, `KVFENCE_INVALID_TOKEN`.
///
/// # Safety
/// `table` live.
#[no_mangle]
pub unsafe extern "C" fn kvfence_end_queued(
    table: *const kvfence_table,
    token: kvfence_token,
    outcome: u32,
) -> kvfence_status {
    call(|| {
        // SAFETY: a live table by contract.
        let t = unsafe { self::table(table) }?;
        let outcome = outcome_of(outcome)?;
        // Queued by the core itself, before it wakes waiters: "wait, then drain" finds it
        // (issue 40: it was delivered first and pushed into a queue of this library's
        // after the wake-up).
        t.inner.end_queued(token_of(token), outcome)?;
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// ACKs, abort, finish, quarantine.

/// Marks writer `rank` done with the room (its writes are complete, or it drained after the
/// abort): its ACK. Idempotent. `*result` gets a `kvfence_quiesced`; if this released the
/// room the release is in `*release` (`KVFENCE_QUIESCE_RELEASED`), else `release->reason` is
/// `KVFENCE_REASON_NONE`. Thread-safe, lock-free.
///
/// Errors: `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER`, `KVFENCE_STALE_HANDLE` (a
/// late ACK of an earlier lifecycle: nothing is touched), `KVFENCE_RANK_NOT_IN_ROOM`,
/// `KVFENCE_INVALID_HANDLE`, `KVFENCE_UNKNOWN_ROOM`.
///
/// # Safety
/// `table` live; `result` and `release` valid for writes.
#[no_mangle]
pub unsafe extern "C" fn kvfence_quiesce(
    table: *const kvfence_table,
    handle: kvfence_handle,
    rank: u32,
    result: *mut kvfence_quiesced,
    release: *mut kvfence_release,
) -> kvfence_status {
    call(|| {
        checks!(table, result, release);
        // SAFETY: checked non-null and aligned; a live table by contract.
        let t = unsafe { &*table };
        let res = t.inner.__quiesce_inline(handle_of(handle), rank);
        // The common ACK first, as one compare (a `match` alone became a jump table).
        if matches!(res, Ok(Quiesced::Recorded)) {
            kvfence_table::deliver_none(release);
            // SAFETY: checked.
            unsafe { put(result, kvfence_quiesced::KVFENCE_QUIESCE_RECORDED) };
            return Ok(());
        }
        let what = match res {
            Ok(Quiesced::Recorded) => kvfence_quiesced::KVFENCE_QUIESCE_RECORDED,
            Ok(Quiesced::Duplicate) => kvfence_quiesced::KVFENCE_QUIESCE_DUPLICATE,
            Ok(Quiesced::Queued) => kvfence_quiesced::KVFENCE_QUIESCE_QUEUED,
            Err(ref e) => return Err(failed(e)),
            Ok(Quiesced::Released(r)) => {
                kvfence_table::deliver_some(release, r);
                // SAFETY: checked.
                unsafe { put(result, kvfence_quiesced::KVFENCE_QUIESCE_RELEASED) };
                return Ok(());
            }
        };
        kvfence_table::deliver_none(release);
        // SAFETY: checked.
        unsafe { put(result, what) };
        Ok(())
    })
}

/// Aborts the request: from now on no transfer can begin on the room, and it is released
/// once every writer has ACKed (`kvfence_quiesce`) or been fenced and every transfer has
/// ended. Never blocks. The writer ranks still to be told (send each an ABORT; each answers
/// with its ACK) are written to `fanout[0..*fanout_len]`: `fanout_cap` must be at least
/// `KVFENCE_MAX_WRITERS` (checked before anything changes), or `fanout` NULL and
/// `fanout_cap` 0 to skip the list (`kvfence_get_room_status` has it too). If nothing held the
/// room, it is released at once into `*release`. Thread-safe, lock-free.
///
/// Errors: `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER`, `KVFENCE_BAD_LENGTH`
/// (`0 < fanout_cap < KVFENCE_MAX_WRITERS`), `KVFENCE_ALREADY_ABORTED`,
/// `KVFENCE_STALE_HANDLE` (already released), `KVFENCE_INVALID_HANDLE`,
/// `KVFENCE_UNKNOWN_ROOM`.
///
/// # Safety
/// `table` live; `fanout` valid for `fanout_cap` writes; `fanout_len` and `release` for a
/// write.
#[no_mangle]
pub unsafe extern "C" fn kvfence_abort(
    table: *const kvfence_table,
    handle: kvfence_handle,
    fanout: *mut u32,
    fanout_cap: usize,
    fanout_len: *mut usize,
    release: *mut kvfence_release,
) -> kvfence_status {
    call(|| {
        checks!(table);
        // SAFETY: checked non-null and aligned; a live table by contract.
        let t = unsafe { &*table };
        check_slice(fanout, fanout_cap)?;
        checks!(fanout_len, release);
        if fanout_cap != 0 && fanout_cap < KVFENCE_MAX_WRITERS {
            return Err(refuse(
                KVFENCE_BAD_LENGTH,
                "fanout_cap must be 0 (no list) or at least KVFENCE_MAX_WRITERS",
            ));
        }
        // Matched in place: `Aborted` is ~300 bytes (the inline fan-out list), and moving it
        // out of the `Result` cost a 288-byte memcpy per call.
        let mut res = t.inner.__abort_inline(handle_of(handle));
        let aborted = match res {
            Ok(ref mut a) => a,
            Err(ref e) => return Err(failed(e)),
        };
        let n = if fanout_cap == 0 {
            0
        } else {
            aborted.fanout.len()
        };
        if n > 0 {
            // SAFETY: valid for `fanout_cap >= KVFENCE_MAX_WRITERS >= n` writes.
            unsafe { ptr::copy_nonoverlapping(aborted.fanout.as_ptr(), fanout, n) };
        }
        // SAFETY: checked.
        unsafe { put(fanout_len, n) };
        match aborted.released.take() {
            None => kvfence_table::deliver_none(release),
            Some(r) => kvfence_table::deliver_some(release, r),
        }
        // What is left of `res` owns nothing (the fan-out is an inline array of u32, the
        // release was taken): no out-of-line drop call for it. `aborted_fields` stops
        // compiling if `Aborted` gains a field (which might own memory this would leak).
        core::mem::forget(res);
        Ok(())
    })
}

/// The body of a call that closes a room and may release it (`kvfence_finish`,
/// `kvfence_finish_drained`, `kvfence_quarantine`): `op` on the table, its release (if any)
/// into `*release`, every failure a status.
///
/// # Safety
/// `table` live; `release` valid for a write.
unsafe fn closing(
    table: *const kvfence_table,
    handle: kvfence_handle,
    release: *mut kvfence_release,
    op: impl FnOnce(&RoomTable, RoomHandle) -> Result<Option<Released>, Error>,
) -> kvfence_status {
    call(|| {
        // SAFETY: a live table by contract.
        let t = unsafe { self::table(table) }?;
        check(release)?;
        let r = op(&t.inner, handle_of(handle))?;
        kvfence_table::deliver(release, r);
        Ok(())
    })
}

/// Finishes the request normally: no transfer can begin any more, and the room is released
/// once what is in flight (transfers, writers not yet done) drains; into `*release` if by
/// this call. Thread-safe, lock-free.
///
/// Errors: `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER`, `KVFENCE_ALREADY_ABORTED`,
/// `KVFENCE_ALREADY_FINISHED`, `KVFENCE_STALE_HANDLE`, `KVFENCE_INVALID_HANDLE`,
/// `KVFENCE_UNKNOWN_ROOM`.
///
/// # Safety
/// `table` live; `release` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn kvfence_finish(
    table: *const kvfence_table,
    handle: kvfence_handle,
    release: *mut kvfence_release,
) -> kvfence_status {
    // SAFETY: forwarded: `table` live, `release` valid for a write.
    unsafe { closing(table, handle, release, RoomTable::finish) }
}

/// The normal end of a request whose every writer rank reported its last write complete
/// (a successful transfer): `kvfence_finish`, then `kvfence_quiesce` of every writer still
/// pending, in one call. A release this call performs goes to `*release` **even in a
/// `release_queue` table** (the caller acts on it: a scheduler need not drain its own
/// successes); if a transfer still holds the room, its end releases it as the table is
/// configured. Only for rooms whose writers all reported success: on any other room it is
/// a false ACK of each of them. Thread-safe, lock-free.
///
/// Errors: as `kvfence_finish` (nothing is quiesced then).
///
/// # Safety
/// `table` live; `release` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn kvfence_finish_drained(
    table: *const kvfence_table,
    handle: kvfence_handle,
    release: *mut kvfence_release,
) -> kvfence_status {
    // SAFETY: forwarded: `table` live, `release` valid for a write.
    unsafe { closing(table, handle, release, RoomTable::finish_drained) }
}

/// Ends a room that can never be proven drained (a failed transfer whose peer's transport
/// cannot be torn down): gives up on its pending writers and failed transfers. The room
/// index returns to service once local transfers end; its pages NEVER do (the release says
/// `KVFENCE_REASON_QUARANTINED`). A release this call performs goes to `*release`.
/// Thread-safe.
///
/// Errors: `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER`, `KVFENCE_STALE_HANDLE`,
/// `KVFENCE_INVALID_HANDLE`, `KVFENCE_UNKNOWN_ROOM`.
///
/// # Safety
/// `table` live; `release` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn kvfence_quarantine(
    table: *const kvfence_table,
    handle: kvfence_handle,
    release: *mut kvfence_release,
) -> kvfence_status {
    // SAFETY: forwarded: `table` live, `release` valid for a write.
    unsafe { closing(table, handle, release, RoomTable::quarantine) }
}

// ---------------------------------------------------------------------------------------
// Fencing.

/// Fences `rank` (its transport is torn down: it can write nothing any more): quiesces it
/// in every live room, ends the failed transfers whose peer it is, and refuses new rooms
/// naming it until `kvfence_readmit_rank`. Rooms this releases are written to
/// `releases[0..cap]`; `*summary` says how many, and how many went to the release queue
/// (the table's queue mode, or more than `cap`: none is lost). Thread-safe (a scan of the
/// table, serialised with other fences and readmits; not a hot-path call).
///
/// Integrator's rules (see the Rust docs of `RoomTable::fence_rank`): stop sending to the
/// rank and tear down its transport before the fence; readmit before a new incarnation's
/// transport carries anything.
///
/// Errors: `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER`, `KVFENCE_BAD_LENGTH`,
/// `KVFENCE_INVALID_RANK`, `KVFENCE_TOO_MANY_FENCED`.
///
/// # Safety
/// `table` live; `releases` valid for `cap` writes; `summary` for a write.
#[no_mangle]
pub unsafe extern "C" fn kvfence_fence_rank(
    table: *const kvfence_table,
    rank: u32,
    summary: *mut kvfence_fenced,
    releases: *mut kvfence_release,
    cap: usize,
) -> kvfence_status {
    call(|| {
        // SAFETY: a live table by contract.
        let t = unsafe { self::table(table) }?;
        check(summary)?;
        check_slice(releases, cap)?;
        // At most `cap` releases come back; the core queues the others before it wakes
        // their waiters (and queues rather than aborting if its list cannot grow).
        // MUTATION (test-only, `--cfg kvfence_ffi_drop_overflow`): every release comes
        // back and those beyond `cap` are dropped, lost.
        let max = if cfg!(kvfence_ffi_drop_overflow) {
            usize::MAX
        } else {
            cap
        };
        let fenced = t.inner.fence_rank_max(rank, max)?;
        let mut out = kvfence_fenced {
            quiesced: fenced.quiesced as u64,
            failed_ended: fenced.failed_ended as u64,
            released: 0,
            queued: fenced.queued as u64,
        };
        for (i, r) in fenced.released.into_iter().enumerate() {
            if i < cap {
                // SAFETY: `i < cap`, valid for `cap` writes by contract.
                unsafe { put(releases.add(i), c_release(r)) };
                out.released += 1;
            }
        }
        // SAFETY: checked.
        unsafe { put(summary, out) };
        Ok(())
    })
}

/// Re-admits a fenced rank (it has a new transport), or forgets a fenced rank id never to
/// be used again; `*was_fenced` (if not NULL) says whether it was fenced. Waits for a fence
/// scan in progress. Thread-safe.
///
/// Errors: `KVFENCE_NULL_POINTER` (`table`), `KVFENCE_MISALIGNED_POINTER`,
/// `KVFENCE_INVALID_RANK`.
///
/// # Safety
/// `table` live; `was_fenced` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn kvfence_readmit_rank(
    table: *const kvfence_table,
    rank: u32,
    was_fenced: *mut bool,
) -> kvfence_status {
    call(|| {
        // SAFETY: a live table by contract.
        let t = unsafe { self::table(table) }?;
        if !was_fenced.is_null() {
            check(was_fenced)?;
        }
        let was = t.inner.readmit_rank(rank)?;
        if !was_fenced.is_null() {
            // SAFETY: checked above.
            unsafe { put(was_fenced, was) };
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// The release queue.

/// Takes one release from the release queue into `*release` (`reason` NONE if it is
/// empty). Thread-safe; each release goes to exactly one caller.
///
/// Errors: `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER`.
///
/// # Safety
/// `table` live; `release` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn kvfence_pop_released(
    table: *const kvfence_table,
    release: *mut kvfence_release,
) -> kvfence_status {
    call(|| {
        // SAFETY: a live table by contract.
        let t = unsafe { self::table(table) }?;
        check(release)?;
        let mut one = None;
        t.take_overflow(1, |r| one = Some(r));
        if one.is_none() {
            one = t.inner.pop_released();
        }
        kvfence_table::deliver(release, one);
        Ok(())
    })
}

/// Delivers up to `cap` queued releases into `out[0..*n]` (the rest stay queued: call again
/// while `*n == cap`), in one pass over the queue (releases given back with
/// `kvfence_release_requeue` first). Call it from the owner thread each loop; any thread
/// may, and each release goes to exactly one caller. Lock-free when no release was given
/// back; no allocation.
///
/// Errors: `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER`, `KVFENCE_BAD_LENGTH`.
///
/// # Safety
/// `table` live; `out` valid for `cap` writes; `n` for a write.
#[no_mangle]
pub unsafe extern "C" fn kvfence_drain_released(
    table: *const kvfence_table,
    out: *mut kvfence_release,
    cap: usize,
    n: *mut usize,
) -> kvfence_status {
    call(|| {
        // SAFETY: a live table by contract.
        let t = unsafe { self::table(table) }?;
        check_slice(out, cap)?;
        check(n)?;
        let mut i = 0;
        t.take_overflow(cap, |r| {
            // SAFETY: `take_overflow` hands at most `cap` releases: `i < cap`.
            unsafe { put(out.add(i), c_release(r)) };
            i += 1;
        });
        if i < cap {
            // One pass over the queue for up to `cap - i` releases, each written straight
            // into the caller's array (no intermediate buffer; `c_release` cannot panic).
            t.inner.drain_released_with(cap - i, |r| {
                // SAFETY: drain_released_with hands at most `cap - i` releases: `i < cap`.
                unsafe { put(out.add(i), c_release(r)) };
                i += 1;
            });
        }
        // SAFETY: checked.
        unsafe { put(n, i) };
        Ok(())
    })
}

/// Releases waiting to be drained right now (the core's queue and the releases given back
/// with `kvfence_release_requeue`). Thread-safe.
///
/// Errors: `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER`.
///
/// # Safety
/// `table` live; `n` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn kvfence_queued_releases(
    table: *const kvfence_table,
    n: *mut usize,
) -> kvfence_status {
    call(|| {
        // SAFETY: a live table by contract.
        let t = unsafe { self::table(table) }?;
        check(n)?;
        let count = t.inner.queued_releases() + t.overflow_len.load(Ordering::Acquire);
        // SAFETY: checked.
        unsafe { put(n, count) };
        Ok(())
    })
}

/// Frees the page array of a release (`pages`) and resets it to the empty release (reason
/// NONE), so a second call is harmless; a release whose reason is NONE is left as it is.
/// Does not touch the table: the room was released already. Thread-safe for distinct
/// releases.
///
/// Errors: `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER`.
///
/// # Safety
/// `release` written by a kvfence function (or zero-filled) and not changed since.
#[no_mangle]
pub unsafe extern "C" fn kvfence_release_free(release: *mut kvfence_release) -> kvfence_status {
    call(|| {
        check(release)?;
        // Read field by field through the raw pointer: a C caller's struct may hold any
        // bits (a `reason` that is no kvfence_reason must not become a Rust enum).
        // SAFETY: checked non-null and aligned; valid for reads and writes by contract.
        let (reason, pages, len, cap) = unsafe {
            (
                ptr::addr_of!((*release).reason).cast::<u32>().read(),
                ptr::addr_of!((*release).pages).read(),
                ptr::addr_of!((*release).pages_len).read(),
                ptr::addr_of!((*release).pages_cap).read(),
            )
        };
        if reason == kvfence_reason::KVFENCE_REASON_NONE as u32 {
            return Ok(()); // nothing to free (its other fields are unspecified)
        }
        if !pages.is_null() && cap != 0 {
            // SAFETY: `pages`/`len`/`cap` are a Vec<u32>'s raw parts, handed out by
            // `c_release` (by this function's contract) and reset below: freed once.
            drop(unsafe { Vec::from_raw_parts(pages, len, cap) });
        }
        // SAFETY: `release` is valid for writes.
        unsafe { put(release, NO_RELEASE) };
        Ok(())
    })
}

/// Gives a release back to the table, unread: it goes to the release queue, and the next
/// `kvfence_drain_released` / `kvfence_pop_released` hands it out again (before the releases
/// the core queued). `*release` is reset to the empty release (reason NONE); one whose
/// reason is NONE is left as it is. For a caller that received a release it cannot act on
/// (the C++ `Release` destroyed without its pages read uses it: a gate-mode release is
/// never dropped silently). The release was delivered already: its room index may be in
/// use again and `kvfence_wait_released` for it has returned; only the drain delivers it
/// again. Counted by `kvfence_queued_releases` and `kvfence_stats.overflow_releases`.
/// Thread-safe (one short lock).
///
/// Errors: `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER`, `KVFENCE_BAD_ARGUMENT` (a
/// `reason` that is no `kvfence_reason`), `KVFENCE_OUT_OF_MEMORY` (the queue could not grow:
/// the release stays the caller's, unchanged).
///
/// # Safety
/// `table` live; `release` written by a kvfence function of this table (or zero-filled)
/// and not changed or freed since.
#[no_mangle]
pub unsafe extern "C" fn kvfence_release_requeue(
    table: *const kvfence_table,
    release: *mut kvfence_release,
) -> kvfence_status {
    call(|| {
        // SAFETY: a live table by contract.
        let t = unsafe { self::table(table) }?;
        check(release)?;
        // Field by field, as `kvfence_release_free` (a C struct may hold any bits).
        // SAFETY: checked non-null and aligned; valid for reads by contract.
        let (handle, token, reason, pages, len, cap) = unsafe {
            (
                ptr::addr_of!((*release).handle).read(),
                ptr::addr_of!((*release).token).read(),
                ptr::addr_of!((*release).reason).cast::<u32>().read(),
                ptr::addr_of!((*release).pages).read(),
                ptr::addr_of!((*release).pages_len).read(),
                ptr::addr_of!((*release).pages_cap).read(),
            )
        };
        let reason = match reason {
            0 => return Ok(()), // nothing to give back
            1 => Reason::Finished,
            2 => Reason::Aborted,
            3 => Reason::Quarantined,
            _ => {
                return Err(refuse(
                    KVFENCE_BAD_ARGUMENT,
                    "kvfence_release.reason is not a kvfence_reason",
                ))
            }
        };
        let mut q = t.overflow.lock().unwrap_or_else(|e| e.into_inner());
        if q.try_reserve(1).is_err() {
            return Err(out_of_memory(size_of::<Released>()));
        }
        let pages = if pages.is_null() || cap == 0 {
            Vec::new()
        } else {
            // SAFETY: `pages`/`len`/`cap` are a Vec<u32>'s raw parts, handed out by
            // `c_release` (by this function's contract); the struct is reset below, so the
            // caller no longer frees them.
            unsafe { Vec::from_raw_parts(pages, len, cap) }
        };
        q.push(Released {
            handle: handle_of(handle),
            token,
            pages,
            reason,
        });
        t.overflow_len.store(q.len(), Ordering::Release);
        drop(q);
        // SAFETY: `release` is valid for writes.
        unsafe { put(release, NO_RELEASE) };
        Ok(())
    })
}

/// `kvfence_release_free` of `releases[0..n]`. Thread-safe for distinct releases.
///
/// Errors: `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER`, `KVFENCE_BAD_LENGTH`.
///
/// # Safety
/// As `kvfence_release_free`, for each of the `n`.
#[no_mangle]
pub unsafe extern "C" fn kvfence_releases_free(
    releases: *mut kvfence_release,
    n: usize,
) -> kvfence_status {
    call(|| {
        check_slice(releases, n)?;
        for i in 0..n {
            // SAFETY: `i < n`, valid by contract.
            let st = unsafe { kvfence_release_free(releases.add(i)) };
            if st != KVFENCE_OK {
                return Err(Fail::new(st));
            }
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// Waiting and observing.

/// Blocks until the handle's lifecycle is released (returns at once if it already is), for
/// at most `timeout_ms` milliseconds (`KVFENCE_WAIT_FOREVER`: no deadline). With direct
/// delivery its pages and room index are then back; a release that went to the release
/// queue (every release of a `release_queue` table) is delivered by the next
/// `kvfence_drain_released`, which the waiting thread may call itself: wait, then drain.
/// Waiting changes nothing (time never releases a room). Parks the thread; no polling.
/// Thread-safe.
///
/// Errors: `KVFENCE_TIMED_OUT`, `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER`,
/// `KVFENCE_INVALID_HANDLE`, `KVFENCE_UNKNOWN_ROOM`.
///
/// # Safety
/// `table` live.
#[no_mangle]
pub unsafe extern "C" fn kvfence_wait_released(
    table: *const kvfence_table,
    handle: kvfence_handle,
    timeout_ms: u64,
) -> kvfence_status {
    call(|| {
        // SAFETY: a live table by contract.
        let t = unsafe { self::table(table) }?;
        let h = handle_of(handle);
        let done = match timeout_of(timeout_ms) {
            None => t.inner.wait_released(h).map(|()| true)?,
            Some(d) => t.inner.wait_released_timeout(h, d)?,
        };
        if done {
            Ok(())
        } else {
            Err(refuse(
                KVFENCE_TIMED_OUT,
                "the wait's timeout ran out first",
            ))
        }
    })
}

/// Blocks until no room is owned or closing, every release having been delivered or put in
/// the release queue (shutdown: abort or finish every room, wait here, then
/// `kvfence_drain_released`, which finds every queued release), for at most `timeout_ms`
/// (`KVFENCE_WAIT_FOREVER`: no deadline). A room whose open is mid-way does not count. The
/// thread whose call released the last room may still be returning from it: join the
/// threads that use the table before `kvfence_table_free`. Thread-safe.
///
/// Errors: `KVFENCE_TIMED_OUT`, `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER`.
///
/// # Safety
/// `table` live.
#[no_mangle]
pub unsafe extern "C" fn kvfence_wait_idle(
    table: *const kvfence_table,
    timeout_ms: u64,
) -> kvfence_status {
    call(|| {
        // SAFETY: a live table by contract.
        let t = unsafe { self::table(table) }?;
        let idle = match timeout_of(timeout_ms) {
            None => {
                t.inner.wait_idle();
                true
            }
            Some(d) => t.inner.wait_idle_timeout(d),
        };
        if idle {
            Ok(())
        } else {
            Err(refuse(
                KVFENCE_TIMED_OUT,
                "the wait's timeout ran out first",
            ))
        }
    })
}

/// The phase of the handle's lifecycle into `*phase` (`KVFENCE_PHASE_FREE` once released, or
/// if it never began). Thread-safe, lock-free.
///
/// Errors: `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER`, `KVFENCE_INVALID_HANDLE`,
/// `KVFENCE_UNKNOWN_ROOM`.
///
/// # Safety
/// `table` live; `phase` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn kvfence_get_phase(
    table: *const kvfence_table,
    handle: kvfence_handle,
    phase: *mut kvfence_phase,
) -> kvfence_status {
    call(|| {
        // SAFETY: a live table by contract.
        let t = unsafe { self::table(table) }?;
        check(phase)?;
        let p = t.inner.phase(handle_of(handle))?;
        // SAFETY: checked.
        unsafe { put(phase, c_phase(p)) };
        Ok(())
    })
}

/// The status of one live room into `*out`, without a scan: phase, the writers not yet
/// ACKed, transfers in flight and failed, pages, time closing, quarantine. Thread-safe.
///
/// Errors: `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER`, `KVFENCE_STALE_HANDLE`
/// (released, or never began), `KVFENCE_INVALID_HANDLE`, `KVFENCE_UNKNOWN_ROOM`.
///
/// # Safety
/// `table` live; `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn kvfence_get_room_status(
    table: *const kvfence_table,
    handle: kvfence_handle,
    out: *mut kvfence_room_status,
) -> kvfence_status {
    call(|| {
        // SAFETY: a live table by contract.
        let t = unsafe { self::table(table) }?;
        check(out)?;
        let s = t.inner.room_status(handle_of(handle))?;
        // SAFETY: checked.
        unsafe { put(out, c_status(&s)) };
        Ok(())
    })
}

/// A snapshot of the table into `*out` (set `out->struct_size` first): occupancy, event
/// counts, and the closing rooms and fenced ranks, of which the first `closing_cap` /
/// `fenced_cap` are written to `closing` / `fenced` (`out->closing_len` / `fenced_len` say
/// how many there are; NULL with cap 0 skips a list). Scans the table and allocates (about
/// 300 bytes per closing room; `KVFENCE_OUT_OF_MEMORY` if that fails): not a hot-path call. Thread-safe (taken without stopping anyone: a snapshot of a busy table
/// mixes moments).
///
/// Errors: `KVFENCE_NULL_POINTER`, `KVFENCE_MISALIGNED_POINTER`, `KVFENCE_BAD_LENGTH`
/// (`struct_size` smaller than version 1's `kvfence_stats`, or a list length overflows),
/// `KVFENCE_OUT_OF_MEMORY`.
///
/// # Safety
/// `table` live; `out` valid for `out->struct_size` bytes; `closing` for `closing_cap`
/// writes, `fenced` for `fenced_cap`.
#[no_mangle]
pub unsafe extern "C" fn kvfence_get_stats(
    table: *const kvfence_table,
    out: *mut kvfence_stats,
    closing: *mut kvfence_room_status,
    closing_cap: usize,
    fenced: *mut u32,
    fenced_cap: usize,
) -> kvfence_status {
    call(|| {
        // SAFETY: a live table by contract.
        let t = unsafe { self::table(table) }?;
        check(out)?;
        check_slice(closing, closing_cap)?;
        check_slice(fenced, fenced_cap)?;
        // SAFETY: checked; the first field is readable in any version.
        let size = unsafe { ptr::addr_of!((*out).struct_size).read() } as usize;
        let known = size_of::<kvfence_stats>();
        if size < known {
            return Err(refuse(
                KVFENCE_BAD_LENGTH,
                "kvfence_stats.struct_size is smaller than sizeof(kvfence_stats) of version 1",
            ));
        }
        // Fallible: memory running out for the snapshot's lists is a status.
        let s = t.inner.try_stats()?;
        let usage = |u: core_kvfence::Usage| kvfence_usage {
            free: u.free as u64,
            owned: u.owned as u64,
            held: u.held as u64,
            queued: u.queued as u64,
        };
        let c = kvfence_stats {
            struct_size: known as u32,
            reserved: 0,
            rooms: usage(s.rooms),
            pages: usage(s.pages),
            closing_len: s.closing.len() as u64,
            fenced_len: s.fenced.len() as u64,
            releases: s.releases,
            stale_refused: s.stale_refused,
            duplicate_acks: s.duplicate_acks,
            failed_transfers: s.failed_transfers,
            quarantined_rooms: s.quarantined_rooms,
            quarantined_pages: s.quarantined_pages,
            overflow_releases: t.overflow_len.load(Ordering::Acquire) as u64,
        };
        for (i, room) in s.closing.iter().take(closing_cap).enumerate() {
            // SAFETY: `i < closing_cap`, valid by contract.
            unsafe { put(closing.add(i), c_status(room)) };
        }
        let nf = s.fenced.len().min(fenced_cap);
        if nf > 0 {
            // SAFETY: valid for `fenced_cap >= nf` writes.
            unsafe { ptr::copy_nonoverlapping(s.fenced.as_ptr(), fenced, nf) };
        }
        // SAFETY: checked; a newer caller's larger struct keeps its tail.
        unsafe { put(out, c) };
        Ok(())
    })
}

#[cfg(test)]
mod tests;
