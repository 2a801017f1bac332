"""Exceptions raised by kvfence: one class per way the Rust core refuses a call.

Every class derives from :class:`Error`. Refusals caused by a bad argument (a handle the
table never issued, a rank id out of range, a writer list with a repeat, a rank that is
not in the room) also derive from :class:`ValueError`, so ``except ValueError`` catches
them as usual.

A stale handle (a late ACK, a queued intent of an aborted request) is ordinary traffic:
``RoomTable.quiesce`` returns ``"stale"`` for it instead of raising; other calls raise
:class:`StaleHandle`.
"""

from __future__ import annotations

from typing import Optional

__all__ = [
    "Error",
    "InvalidConfig",
    "InvalidHandle",
    "StaleHandle",
    "RoomClosed",
    "AlreadyAborted",
    "AlreadyFinished",
    "InvalidRank",
    "TooManyWriters",
    "DuplicateWriter",
    "RankNotInRoom",
    "RankFenced",
    "TooManyFenced",
    "WrongMode",
    "TooManyPages",
    "InvalidToken",
    "TooManyTransfers",
    "TableFull",
    "PoolExhausted",
    "OutOfMemory",
]


class Error(Exception):
    """Base class of every kvfence refusal. The table is unchanged by a refused call."""


class InvalidConfig(Error, ValueError):
    """The ``RoomTable`` arguments cannot make a table (a size out of range)."""


class InvalidHandle(Error, ValueError):
    """The handle was not issued by this table: another table's, forged, corrupted, or
    not a 128-bit unsigned int."""


class StaleHandle(Error):
    """The handle's lifecycle is over (the room was released, maybe reused) or never
    began. Harmless: nothing was changed."""


class RoomClosed(Error):
    """The room is closing (``phase`` is ``"aborting"`` or ``"draining"``): no new transfer
    may begin, and it cannot grow."""

    phase: Optional[str] = None


class AlreadyAborted(RoomClosed):
    """``finish`` of a room that was already aborted."""


class AlreadyFinished(RoomClosed):
    """``finish`` of a room that was already finished. (``abort`` of a finishing room is
    allowed: the client left while the last chunks arrived.)"""


class InvalidRank(Error, ValueError):
    """Not a rank id: ranks are ints in ``0 .. 2**32 - 2``."""

    rank: Optional[int] = None


class TooManyWriters(Error, ValueError):
    """A room names more writer ranks than ``kvfence.MAX_WRITERS`` (64)."""


class DuplicateWriter(Error, ValueError):
    """A room's writer list names the same rank twice."""

    rank: Optional[int] = None


class RankNotInRoom(Error, ValueError):
    """``quiesce`` of a rank that is not one of the room's writers."""

    rank: Optional[int] = None


class RankFenced(Error):
    """``open`` named a rank that is fenced and not re-admitted."""

    rank: Optional[int] = None


class TooManyFenced(Error):
    """``max_fenced`` ranks are fenced already: re-admit one first."""


class WrongMode(Error, TypeError):
    """The call needs the other mode (gate mode vs. pool mode)."""


class TooManyPages(Error, ValueError):
    """A room asks for more pages than the pool has, or its page list would grow too long."""


class InvalidToken(Error, ValueError):
    """The transfer was already ended (ending twice is refused: it never counts twice), or
    its token was not issued by this table."""


class TooManyTransfers(Error):
    """Too many transfers in flight (``max_tokens`` for the table, or a room's limit)."""


class TableFull(Error):
    """Every room is in use."""


class PoolExhausted(Error):
    """Pool mode: not enough free pages right now (nothing was claimed)."""

    requested: Optional[int] = None


class OutOfMemory(Error, MemoryError):
    """The table's memory could not be allocated."""
