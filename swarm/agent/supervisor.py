"""Each source of each wanted artifact runs as a supervised task.

A transient failure (5xx, SlowDown, a reset, a timeout, a refused connection: anything
that is not a final answer) is retried with capped, jittered backoff for as long as the
artifact is wanted; S3 throttling during a large scale-out lasts minutes, and a reader
that gave up after its retries left the node at 0 bytes for good. A permanent failure
(403, 404, the object changed under its manifest) is recorded with its exit code and
the task ends; a later request for the artifact starts it again. A task never stops its
siblings: each has its own thread, and only the artifact's cancel event stops them all.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from enum import StrEnum

from swarm.errors import (
    AccessDeniedError,
    IntegrityError,
    NoSpaceError,
    NotFoundError,
    SwarmError,
    UsageError,
)
from swarm.sources import Cancelled

log = logging.getLogger(__name__)

PERMANENT_ERRORS: tuple[type[SwarmError], ...] = (
    AccessDeniedError,
    NotFoundError,
    IntegrityError,
    NoSpaceError,
    UsageError,
)
"""Final answers: retrying cannot help until something outside changes (a later request
starts the source again). Every other error is transient."""

BACKOFF_BASE = 1.0
BACKOFF_CAP = 30.0
"""Seconds: full-jitter backoff between tries of a failing source, 1 s doubling to 30 s
(AWS's advice for throttling; a minute-long SlowDown costs at most ~30 s after it ends)."""


class TaskState(StrEnum):
    RUNNING = "running"
    BACKOFF = "backoff"
    FAILED = "failed"
    DONE = "done"
    STOPPED = "stopped"


class SourceTask:
    """One source of one artifact (``name``: ``s3`` or ``udp://HOST:PORT``).

    ``body`` does the work and returns when the artifact is complete (or its part is
    done); it raises :class:`Cancelled` when the artifact's ``cancel`` is set.
    ``progress`` returns a counter that grows with the bytes this source delivered: a
    try that moved bytes resets the backoff.
    """

    def __init__(
        self,
        name: str,
        body: Callable[[], None],
        cancel: threading.Event,
        progress: Callable[[], int],
        rng: random.Random | None = None,
    ) -> None:
        self.name = name
        self.body = body
        self.cancel = cancel
        self.progress = progress
        self.rng = rng or random.Random()
        self.state = TaskState.RUNNING
        self.detail: str | None = None
        """Why the source is not moving bytes (the last transient error), or None."""
        self.failure: SwarmError | None = None
        self.failed_at: float | None = None
        self.attempts = 0
        self._thread = threading.Thread(target=self._run, name=f"source-{name}", daemon=True)

    @property
    def alive(self) -> bool:
        return self.state in (TaskState.RUNNING, TaskState.BACKOFF)

    def start(self) -> SourceTask:
        self._thread.start()
        return self

    def _run(self) -> None:
        failures = 0
        while not self.cancel.is_set():
            self.state = TaskState.RUNNING
            before = self.progress()
            self.attempts += 1
            try:
                self.body()
                self.state, self.detail = TaskState.DONE, None
                return
            except Cancelled:
                break
            except PERMANENT_ERRORS as error:
                self.state, self.failure, self.failed_at = TaskState.FAILED, error, time.monotonic()
                self.detail = str(error)
                log.error("source %s stopped: %s", self.name, error)
                return
            except Exception as error:  # transient, or a bug in one round: try again
                failures = 1 if self.progress() > before else failures + 1
                delay = self.rng.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2**failures))
                reason = str(error) if isinstance(error, SwarmError) else repr(error)
                self.state = TaskState.BACKOFF
                self.detail = f"{reason} (try {failures + 1} in {delay:.0f}s)"
                log.warning("source %s failed, retrying in %.1fs: %s", self.name, delay, reason)
                if self.cancel.wait(delay):
                    break
        self.state = TaskState.STOPPED
