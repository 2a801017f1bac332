//! Every way a call can be refused.

use crate::room_word::Phase;

/// Why a call was refused. Every variant is a clean refusal: the table is unchanged.
///
/// Stale operations are the expected, harmless case in a running system (a late ACK, a
/// queued intent of an aborted request); the others are usually integration bugs.
///
/// ```
/// use kvfence::{Config, Error, RoomTable};
/// let table = RoomTable::new(Config::pool(4, 16))?;
/// let room = table.open(&[0], 2)?;
/// match table.quiesce(room.handle, 9) {
///     Err(Error::RankNotInRoom { rank }) => assert_eq!(rank, 9),
///     other => panic!("{other:?}"),
/// }
/// let _ = table.abort(room.handle)?;
/// assert_eq!(table.abort(room.handle), Err(Error::AlreadyAborted));
/// println!("{}", Error::AlreadyAborted); // "room was already aborted"
/// # Ok::<(), kvfence::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Error {
    /// The [`Config`](crate::Config) cannot make a table.
    InvalidConfig {
        /// Which setting is wrong and why.
        reason: &'static str,
    },
    /// The handle's room index is outside this table (forged or corrupted handle).
    UnknownRoom {
        /// The index the handle named.
        index: usize,
        /// Rooms in this table.
        rooms: usize,
    },
    /// The handle was not made by this table: it is another table's (another process's),
    /// or it was forged, corrupted or zero-filled on the way (its check does not match,
    /// see [`RoomHandle`](crate::RoomHandle)).
    InvalidHandle,
    /// The handle's lifecycle is over (the room was released, possibly reused) or never
    /// began: a late ACK, a queued intent from an earlier request, a forged handle.
    StaleHandle,
    /// No transfer may begin: the room is aborting or draining.
    RoomClosed {
        /// The phase the room is in.
        phase: Phase,
    },
    /// `abort` or `finish` on a room that was already aborted (double abort, finish after
    /// abort). Once the room is released the same call gets [`Error::StaleHandle`].
    AlreadyAborted,
    /// `abort` or `finish` on a room that was already finished.
    AlreadyFinished,
    /// `u32::MAX` is not a rank id (it marks an empty writer slot).
    InvalidRank {
        /// The rank given.
        rank: u32,
    },
    /// A room names more writer ranks than [`MAX_WRITERS`](crate::MAX_WRITERS).
    TooManyWriters {
        /// Writers given.
        writers: usize,
        /// The limit.
        max: usize,
    },
    /// A room's writer list names the same rank twice.
    DuplicateWriter {
        /// The repeated rank.
        rank: u32,
    },
    /// `quiesce` of a rank that is not in the room's writer set.
    RankNotInRoom {
        /// The rank given.
        rank: u32,
    },
    /// `open` named a rank that is fenced (its transport is torn down) and not re-admitted.
    RankFenced {
        /// The first fenced rank of the writer list.
        rank: u32,
    },
    /// `fence_rank` with [`Config::max_fenced`](crate::Config::max_fenced) ranks already
    /// fenced: re-admit (or forget) one first.
    TooManyFenced {
        /// The limit.
        max: usize,
    },
    /// The call needs the other mode: `open` is for pool mode, `open_gate` for gate mode.
    WrongMode {
        /// What this table is: `"gate"` or `"pool"`.
        table: &'static str,
    },
    /// A gate-mode room's page list would be longer than 2^31 ids (`open_gate`,
    /// `grow_gate`).
    TooManyPagesInRoom,
    /// The transfer token was not issued by this table, or was already ended (a second
    /// `end` of one token is refused: it never decrements twice).
    InvalidToken,
    /// [`Config::max_tokens`](crate::Config::max_tokens) token-form transfers are in
    /// flight.
    TooManyTokens,
    /// `open` or `grow` asked for more pages than the whole pool has.
    TooManyPages {
        /// Pages asked for.
        requested: usize,
        /// The pool's capacity.
        capacity: usize,
    },
    /// Every room index is in use.
    RoomTableFull,
    /// Not enough free pages right now (nothing was claimed).
    PoolExhausted {
        /// Pages asked for.
        requested: usize,
    },
    /// The room already carries the maximum number of concurrent transfers (2^25 - 1, in
    /// flight or failed).
    TooManyTransfers,
    /// Memory could not be allocated: for the table (`RoomTable::new`), or for a page list
    /// (`open`, `grow`, `grow_gate`, `pages_of`). Nothing changed; the process goes on.
    OutOfMemory {
        /// The size of the allocation that failed.
        bytes: usize,
    },
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Error::InvalidConfig { reason } => write!(f, "invalid kvfence config: {reason}"),
            Error::UnknownRoom { index, rooms } => {
                write!(f, "room index {index} is outside the table ({rooms} rooms)")
            }
            Error::InvalidHandle => f.write_str(
                "room handle was not made by this table (another table's, forged or corrupted)",
            ),
            Error::StaleHandle => {
                f.write_str("room handle is stale: its lifecycle is over or never began")
            }
            Error::RoomClosed { phase } => {
                write!(f, "room is {phase}: no new transfer may begin")
            }
            Error::AlreadyAborted => f.write_str("room was already aborted"),
            Error::AlreadyFinished => f.write_str("room was already finished"),
            Error::InvalidRank { rank } => write!(f, "{rank} is not a valid rank id"),
            Error::TooManyWriters { writers, max } => {
                write!(f, "a room names {writers} writer ranks; at most {max} are allowed")
            }
            Error::DuplicateWriter { rank } => {
                write!(f, "writer rank {rank} appears twice in the room's writer list")
            }
            Error::RankNotInRoom { rank } => {
                write!(f, "writer rank {rank} is not in this room's writer set")
            }
            Error::RankFenced { rank } => write!(
                f,
                "writer rank {rank} is fenced (transport torn down); re-admit it before opening a room that names it"
            ),
            Error::TooManyFenced { max } => write!(
                f,
                "{max} ranks are fenced already; re-admit one before fencing another"
            ),
            Error::WrongMode { table } => write!(
                f,
                "this is a {table}-mode table: use {}",
                if table == "gate" {
                    "open_gate / grow_gate (the engine passes its page ids)"
                } else {
                    "open / grow (the table's pool hands out pages)"
                }
            ),
            Error::TooManyPagesInRoom => f.write_str("the room cannot take that many more pages"),
            Error::InvalidToken => f.write_str(
                "transfer token was not issued by this table, or was already ended",
            ),
            Error::TooManyTokens => f.write_str("too many token-form transfers in flight"),
            Error::TooManyPages { requested, capacity } => write!(
                f,
                "room asks for {requested} pages but the pool only has {capacity}"
            ),
            Error::RoomTableFull => f.write_str("every room is in use"),
            Error::PoolExhausted { requested } => {
                write!(f, "not enough free pages for {requested} (nothing was claimed)")
            }
            Error::TooManyTransfers => f.write_str("room has the maximum number of transfers in flight"),
            Error::OutOfMemory { bytes } => {
                write!(f, "out of memory: could not allocate {bytes} bytes")
            }
        }
    }
}

impl std::error::Error for Error {}

/// Builds a boxed slice of `n` values without aborting the process when memory runs out.
pub(crate) fn try_boxed<T>(n: usize, mut f: impl FnMut(usize) -> T) -> Result<Box<[T]>, Error> {
    let mut v = Vec::new();
    if v.try_reserve_exact(n).is_err() {
        return Err(Error::OutOfMemory {
            bytes: n.saturating_mul(core::mem::size_of::<T>()),
        });
    }
    v.extend((0..n).map(&mut f));
    Ok(v.into_boxed_slice())
}
