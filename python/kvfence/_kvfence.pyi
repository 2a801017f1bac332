"""Type stubs of the native module ``kvfence._kvfence`` (import :mod:`kvfence`)."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Dict, Iterable, List, Literal, Optional, Tuple, Type, Union, final

__all__ = [
    "RoomTable",
    "Transfer",
    "Released",
    "TransferQueue",
    "MAX_WRITERS",
    "MAX_ROOMS",
    "MAX_PAGES",
    "__version__",
]

__version__: str
MAX_WRITERS: int
MAX_ROOMS: int
MAX_PAGES: int

# Stub-only aliases (not importable at runtime).
_PhaseName = Literal["owned", "aborting", "draining", "free"]
_ReasonName = Literal["finished", "aborted", "quarantined"]
_QuiesceResult = Literal["recorded", "duplicate", "released", "stale"]

@final
class Released:
    """A room's release, delivered exactly once by ``RoomTable.drain_released()``."""

    @property
    def handle(self) -> int:
        """The handle of the lifecycle that ended (stale from now on)."""
    @property
    def token(self) -> int:
        """The ``token`` given to ``open`` (gate mode; 0 in pool mode)."""
    @property
    def pages(self) -> List[int]:
        """The room's page ids (a new list on each access)."""
    @property
    def reason(self) -> _ReasonName:
        """``"finished"``, ``"aborted"`` or ``"quarantined"`` (never free those pages)."""

@final
class Transfer:
    """A transfer in flight: the room keeps its pages until it ends (exactly once)."""

    @property
    def token(self) -> int:
        """The transfer's token (its 16-byte wire form, an int)."""
    @property
    def handle(self) -> int:
        """The room's handle."""
    @property
    def peer(self) -> Optional[int]:
        """The peer rank given to ``begin_transfer``."""
    @property
    def ended(self) -> bool:
        """Whether ``complete()`` or ``fail()`` ended it."""
    def complete(self) -> None:
        """Every byte landed: drop the hold. Raises ``InvalidToken`` if already ended."""
    def fail(self) -> None:
        """Outcome unknown: the room stays held until ``peer`` is fenced or the room is
        quarantined. Raises ``InvalidToken`` if already ended."""
    def __enter__(self) -> Transfer: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> bool:
        """Completes on a normal exit, fails on an exception (which propagates)."""

@final
class TransferQueue:
    """A work queue whose every item holds a kvfence transfer on its room from the
    ``get`` that returns it until the next ``get`` (see ``help(TransferQueue)``)."""

    def __new__(cls, queue: Any, key: str = "room") -> TransferQueue:
        """Wraps ``queue`` (``get()``, optionally ``put(item)``); ``key``: the item
        attribute that names its room in ``bind``'s ``handles``."""
    @property
    def queue(self) -> Any:
        """The wrapped queue."""
    @property
    def current(self) -> Any:
        """The key of the item whose transfer is open, or ``None``."""
    @property
    def refused(self) -> int:
        """Items returned with no transfer: their room was aborted or released."""
    @property
    def failed(self) -> int:
        """Transfers ended by ``fail``."""
    def bind(
        self,
        table: RoomTable,
        handles: Dict[Any, int],
        on_release: Optional[Any] = None,
    ) -> None:
        """Each item's room is ``handles[getattr(item, key)]`` from now on;
        ``on_release()`` is called after a transfer's end left releases to drain. Raises
        ``RuntimeError`` if bound already."""
    def get(self) -> Any:
        """Ends the previous item's transfer (completed), takes the next item (blocking
        as the wrapped ``get`` does) and begins a transfer on its room."""
    def fail(self, key: Any) -> bool:
        """Fails the open transfer if its item's key equals ``key``; whether it did."""
    def put(self, item: Any) -> None:
        """``queue.put(item)``."""
    def __getattr__(self, name: str) -> Any: ...

@final
class RoomTable:
    """The kvfence room table (see the module docs and ``help(RoomTable)``).

    Every id (rank, page id, token, handle) and count is an ``int`` but never a ``bool``,
    and every sequence of ids is an iterable but never a ``str``, ``bytes`` or
    ``bytearray``: those raise ``TypeError`` (the types below cannot say so: ``bool`` is an
    ``int`` and ``bytes`` an ``Iterable[int]``)."""

    def __new__(
        cls,
        rooms: int,
        pages: Optional[int] = None,
        *,
        release_queue: bool = True,
        max_fenced: int = 256,
        max_tokens: Optional[int] = None,
    ) -> RoomTable:
        """``pages=None``: gate mode (the engine owns its pages); ``pages=N``: kvfence
        owns a pool of ``N`` pages."""
    @property
    def rooms(self) -> int: ...
    @property
    def pages(self) -> Optional[int]: ...
    @property
    def is_gate(self) -> bool: ...
    @property
    def release_queue(self) -> bool: ...
    @property
    def max_fenced(self) -> int: ...
    @property
    def max_tokens(self) -> int: ...
    def open(
        self,
        writers: Iterable[int],
        pages: Union[Iterable[int], int, None] = None,
        token: int = 0,
    ) -> int:
        """Opens a room; returns its handle. Gate mode: ``pages`` is the engine's page
        ids; pool mode: a count (larger than the pool: ``TooManyPages``). On
        ``MemoryError`` nothing is held: a room already made is undone, its release
        (``"finished"``) delivered by ``drain_released()``."""
    def pages_of(self, h: int) -> List[int]:
        """The page ids of an owned room."""
    def grow(self, h: int, pages: Union[Iterable[int], int]) -> Optional[List[int]]:
        """Pool mode: adds ``pages`` (a count; larger than the pool: ``TooManyPages``,
        before anything is claimed) and returns the new ids. Gate mode: adds the engine's
        page ids and returns ``None``."""
    def begin_transfer(self, h: int, peer: Optional[int] = None) -> Transfer:
        """Begins a transfer on the room's pages (refused once it is closing)."""
    def abort(self, h: int) -> List[int]:
        """Aborts the request; returns the ranks still to be told (``[]`` if already
        aborting). On ``MemoryError`` the room is aborted all the same:
        ``room_status(h)["waiting_on"]`` names the ranks to tell."""
    def finish(self, h: int) -> None:
        """Finishes the request normally."""
    def finish_drained(self, h: int) -> bool:
        """A successful transfer's end: ``finish`` and ``quiesce`` of every writer in one
        call; ``True`` if this call released the room (not queued, nothing to act on)."""
    def quiesce(self, h: int, rank: int) -> _QuiesceResult:
        """Records ``rank``'s ACK."""
    def fence_rank(self, rank: int) -> int:
        """Gives up on ``rank`` (transport torn down); returns rooms it released."""
    def readmit_rank(self, rank: int) -> bool:
        """Re-admits a fenced rank; returns whether it was fenced."""
    def quarantine(self, h: int) -> None:
        """Ends a room that can never be proven drained; its pages are never reused."""
    def drain_released(self) -> List[Released]:
        """Every undelivered release, each exactly once. If it raises ``MemoryError`` it
        delivered none and lost none: the next call returns them."""
    def drain_reasons(self) -> List[Tuple[int, _ReasonName]]:
        """Every undelivered release as a ``(handle, reason)`` pair, each exactly once
        (no ``Released`` object each), for gate-mode rooms opened with ``pages=None``.
        Raises ``ValueError`` (gate mode: a release carries page ids) or
        ``MemoryError``, delivering none and losing none."""
    def pop_released(self) -> Optional[Released]:
        """One undelivered release, or ``None``. If it raises ``MemoryError`` the release
        stays for the next call."""
    def queued_releases(self) -> int:
        """How many releases wait for ``drain_released()``."""
    def phase(self, h: int) -> _PhaseName:
        """The phase of the handle's lifecycle (``"free"`` once released)."""
    def room_status(self, h: int) -> Dict[str, Any]:
        """A live room's status."""
    def wait_released(self, h: int, timeout: Optional[float] = None) -> bool:
        """Blocks (GIL released) until the lifecycle is released, or ``timeout``."""
    def wait_idle(self, timeout: Optional[float] = None) -> bool:
        """Blocks (GIL released) until no room is owned or closing, or ``timeout``."""
    def stats(self) -> Dict[str, Any]:
        """A snapshot of occupancy, closing rooms and event counts."""
