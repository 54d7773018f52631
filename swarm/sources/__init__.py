"""Sources of pieces. Each pulls pieces it is given and offers them to a :class:`PieceSink`.

A source never decides what is valid: the sink checks every piece against the manifest's
hash, so a bad byte from any source is caught in one place.
"""

from __future__ import annotations

import threading
from typing import Protocol


class PieceSink(Protocol):
    """What a source writes into: the in-process ``PieceFile`` or the daemon's torrent."""

    def missing(self) -> list[int]: ...

    def have(self, index: int) -> bool: ...

    def offer(self, index: int, data: bytes | memoryview, source: str) -> bool:
        """Verify and keep piece ``index``; False if its hash does not match."""
        ...


class Cancelled(Exception):
    """Raised inside a source when its fetch was cancelled (deadline, Ctrl-C, shutdown)."""


def check_cancel(event: threading.Event) -> None:
    if event.is_set():
        raise Cancelled
