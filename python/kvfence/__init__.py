"""kvfence: decides when a KV-cache page may be reused in disaggregated prefill/decode
LLM serving, so that a stale write can never land in another request's KV cache.

A thin binding over the Rust core (``kvfence`` crate): an aborted request's pages are
released only once every writer rank has acknowledged (``quiesce``) or been fenced, and
every transfer on them has ended; every release is delivered exactly once, through
``RoomTable.drain_released()``. Time never releases a page.

Every method is safe to call from any Python thread; calls that block (the waits,
``fence_rank``, ``readmit_rank``, ``stats``) release the GIL while they do.
"""

from __future__ import annotations

from . import _errors, _kvfence
# The native module's classes and limits (RoomTable, Transfer, Released, MAX_WRITERS,
# MAX_ROOMS, MAX_PAGES, __version__: its `__all__`), and one exception class per
# kvfence::Error (`_errors.__all__`).
from ._errors import *  # noqa: F401,F403
from ._kvfence import *  # noqa: F401,F403

__all__ = [*_kvfence.__all__, *_errors.__all__]
