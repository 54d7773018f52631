"""Progress for long work: a rich bar on a TTY, JSON lines otherwise (one event a line).

rich is imported only where a bar is drawn: a fetch from user-data or a script (JSON
lines) skips its ~0.1 CPU-s import, paid by every node of a scale-out at once.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

    from swarm.manifest import Manifest


def _progress_bar(console: Console | None, *, sources: bool) -> Progress:
    """A rich bar on stderr: bytes, rate, and either the time left or (``sources``) the
    task's ``sources`` field. rich is imported here, on first use (see the module doc)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    last = TextColumn("{task.fields[sources]}") if sources else TimeRemainingColumn()
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        last,
        console=console or Console(stderr=True),
    )


class FetchProgress:
    """Progress callbacks of an in-process fetch; the CLI supplies a bar or JSON lines."""

    def start(self, manifest: Manifest, dest: Path, done_bytes: int) -> None: ...

    def advance(self, nbytes: int) -> None: ...

    def verifying(self) -> None: ...


JSON_INTERVAL = 1.0
"""Seconds between JSON progress events (a log line a second is plenty for a machine)."""


def emit(event: str, stream: TextIO | None = None, **fields: Any) -> None:
    stream = stream or sys.stdout  # looked up per call: tests swap sys.stdout
    stream.write(json.dumps({"event": event, "ts": round(time.time(), 3), **fields}) + "\n")
    stream.flush()


class JsonProgress(FetchProgress):
    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self.total = 0
        self.done = 0
        self._last = 0.0
        self._lock = threading.Lock()

    def start(self, manifest: Manifest, dest: Path, done_bytes: int) -> None:
        self.total, self.done = manifest.size, done_bytes
        emit(
            "start",
            self.stream,
            name=manifest.name,
            dest=str(dest),
            size=manifest.size,
            resumed_bytes=done_bytes,
            info_hash=manifest.info_hash,
        )

    def advance(self, nbytes: int) -> None:
        with self._lock:
            self.done += nbytes
            now = time.monotonic()
            if now - self._last < JSON_INTERVAL and self.done < self.total:
                return
            self._last = now
            emit("progress", self.stream, bytes=self.done, total=self.total)

    def verifying(self) -> None:
        emit("verifying", self.stream)


class RichProgress(FetchProgress):
    def __init__(self, console: Console | None = None) -> None:
        self.bar = _progress_bar(console, sources=False)
        self.task: Any = None

    def start(self, manifest: Manifest, dest: Path, done_bytes: int) -> None:
        self.bar.start()
        self.task = self.bar.add_task(manifest.name, total=manifest.size, completed=done_bytes)

    def advance(self, nbytes: int) -> None:
        self.bar.advance(self.task, nbytes)

    def verifying(self) -> None:
        if self.task is not None:
            self.bar.update(self.task, description="verifying")

    def stop(self) -> None:
        self.bar.stop()


class DaemonProgress:
    """Progress of a daemon fetch, from its status snapshots (bytes per source shown)."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.bar: Progress | None = None
        self.task: Any = None
        self._last = 0.0
        self._started = False

    def update(self, status: dict[str, Any]) -> None:
        by = status["bytes_by_source"]
        if self.as_json:
            if not self._started:
                self._started = True
                emit(
                    "start", name=status["name"], size=status["size"], info_hash=status["info_hash"]
                )
            now = time.monotonic()
            if now - self._last >= JSON_INTERVAL or status["complete"]:
                self._last = now
                emit(
                    "progress",
                    bytes=status["have_bytes"],
                    total=status["size"],
                    bytes_by_source=by,
                    peers=status["peers"],
                    waiting=status.get("waiting") or {},
                )
            return
        if self.bar is None:
            self.bar = _progress_bar(None, sources=True)
            self.bar.start()
            self.task = self.bar.add_task(status["name"], total=status["size"], sources="")
        sources = " ".join(f"{k} {v / 2**20:.0f}M" for k, v in by.items() if v)
        waiting = "; ".join(f"{k}: {v}" for k, v in (status.get("waiting") or {}).items())
        self.bar.update(
            self.task,
            completed=status["have_bytes"],
            sources=f"{sources} ({status['peers']} peers)"
            + (f" waiting: {waiting}" if waiting else ""),
        )

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
