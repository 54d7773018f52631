"""One fetch of one artifact: resolve, reserve, pull from sources, verify, place.

``fetch_in_process`` is ``swarm fetch --no-daemon``: S3 is the only source and the sink
is a :class:`PieceFile` beside DEST. The daemon (peers, UDP) reuses the same pieces:
:class:`swarm.sources.s3.S3Source` writing into a sink that checks every piece.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from swarm import catalog
from swarm.agent.destlock import DestLock
from swarm.agent.destlock import describe as describe_owner
from swarm.agent.store import PieceFile, check_dest
from swarm.errors import DeadlineError, SwarmError
from swarm.manifest import Manifest
from swarm.pieces import file_sha256
from swarm.progress import FetchProgress
from swarm.s3http import S3Client
from swarm.sources import Cancelled
from swarm.sources.s3 import S3Source, S3SourceConfig

T = TypeVar("T")

LOCK_WAIT = 3600.0
"""Seconds a fetch without a deadline waits for another fetch of the same artifact to
the same DEST (then finds DEST complete and returns at once)."""


@dataclass
class FetchResult:
    """What a finished fetch reports (the CLI prints it; ``--json`` emits it)."""

    name: str
    dest: str
    size: int
    sha256: str
    seconds: float
    bytes_by_source: dict[str, int] = field(default_factory=dict)
    resumed_bytes: int = 0
    already_present: bool = False
    retries: int = 0
    hash_failures: int = 0

    @classmethod
    def of(cls, manifest: Manifest, dest: Path, started: float, **extra: Any) -> FetchResult:
        """The result for ``manifest`` at ``dest``, timed from ``started`` (monotonic)."""
        return cls(
            manifest.name,
            str(dest),
            manifest.size,
            manifest.sha256,
            round(time.monotonic() - started, 3),
            **extra,
        )


def dest_already_matches(dest: Path, manifest: Manifest) -> bool:
    """True if DEST already holds exactly this artifact (a rerun of a finished fetch)."""
    if not dest.is_file() or dest.stat().st_size != manifest.size:
        return False
    return file_sha256(dest) == manifest.sha256


def run_with_deadline(
    deadline: float | None, cancel: threading.Event, work: Callable[[], None]
) -> None:
    """Run ``work``; if ``deadline`` seconds pass first, cancel it and raise DeadlineError."""
    timer = threading.Timer(deadline, cancel.set) if deadline else None
    if timer:
        timer.daemon = True
        timer.start()
    try:
        work()
    except Cancelled:
        if deadline and cancel.is_set():
            raise DeadlineError(
                f"swarm: deadline of {deadline:g}s passed before the artifact was complete; "
                "rerun to resume, or raise --deadline"
            ) from None
        raise
    finally:
        if timer:
            timer.cancel()


def within_deadline(deadline: float | None, started: float, work: Callable[[], T]) -> T:
    """Run blocking ``work`` (a catalog or manifest read) within what is left of the
    deadline: an S3 endpoint that accepts connections and never answers would otherwise
    hold the fetch for the client's timeouts times its retries (minutes)."""
    if deadline is None:
        return work()
    left = deadline - (time.monotonic() - started)
    result: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as error:  # re-raised in the caller's thread
            failure.append(error)

    thread = threading.Thread(target=run, name="deadline-bound", daemon=True)
    thread.start()
    thread.join(max(left, 0))
    if thread.is_alive():
        raise DeadlineError(
            f"swarm: deadline of {deadline:g}s passed while reading the artifact's manifest "
            "(the S3 endpoint does not answer); check AWS_ENDPOINT_URL and the network"
        )
    if failure:
        raise failure[0]
    return result[0]


def fetch_in_process(
    source: str,
    dest: Path,
    *,
    endpoint_url: str | None = None,
    catalog_url: str | None = None,
    secret: str | None = None,
    deadline: float | None = None,
    s3_config: S3SourceConfig | None = None,
    progress: FetchProgress | None = None,
) -> FetchResult:
    """Fetch ``source`` (s3://BUCKET/KEY or a catalog name) to ``dest`` from S3 alone."""
    started = time.monotonic()
    progress = progress or FetchProgress()
    s3_config = s3_config or S3SourceConfig()
    dest = dest.absolute()
    check_dest(dest, directory_ok=True)  # a directory artifact replaces a directory
    client = S3Client(endpoint_url, max_connections=s3_config.concurrency + 2)
    manifest = within_deadline(
        deadline,
        started,
        lambda: catalog.manifest_for(client, source, catalog_url, secret),
    )
    lock = DestLock(
        dest, {"pid": os.getpid(), "name": manifest.name, "info_hash": manifest.info_hash}
    )
    if not lock.acquire(manifest.info_hash, timeout=deadline or LOCK_WAIT):
        raise DeadlineError(
            f"swarm: {dest} is still being fetched by another swarm fetch "
            f"({describe_owner(lock.current_owner())}); rerun once it is done"
        )
    try:
        return _fetch_locked(manifest, client, dest, started, deadline, s3_config, progress)
    finally:
        lock.release()


def _fetch_locked(
    manifest: Manifest,
    client: object,
    dest: Path,
    started: float,
    deadline: float | None,
    s3_config: S3SourceConfig,
    progress: FetchProgress,
) -> FetchResult:

    def result(**extra: object) -> FetchResult:
        return FetchResult.of(manifest, dest, started, **extra)

    if manifest.files is not None:
        from swarm.agent.treefs import fetch_tree

        return fetch_tree(manifest, client, dest, started, deadline, s3_config, progress)  # type: ignore[no-any-return]
    check_dest(dest)
    if dest_already_matches(dest, manifest):
        return result(already_present=True)

    store = PieceFile(manifest, dest, check_pieces=False)
    store.open()
    resumed = store.bytes_done
    progress.start(manifest, dest, resumed)
    store.on_piece = lambda _index, length: progress.advance(length)
    cancel = threading.Event()
    s3 = S3Source(client, manifest, store, cancel, s3_config)
    try:
        whole_file = store.start_prefix_hasher()
        left = None if deadline is None else max(deadline - (time.monotonic() - started), 0.001)
        run_with_deadline(left, cancel, lambda: s3.fetch(store.missing()))
        if not store.complete:
            raise SwarmError(f"swarm: {len(store.missing())} pieces still missing after S3 fetch")
        progress.verifying()
        if not store.whole_file_matches(whole_file) and store.drop_bad_pieces():
            # Bytes went bad on the way (each piece is checked from now on): read the
            # pieces that fail their SHA-1 again, then hash the whole file again.
            whole_file = store.start_prefix_hasher()
            left = None if deadline is None else max(deadline - (time.monotonic() - started), 0.001)
            run_with_deadline(left, cancel, lambda: s3.fetch(store.missing()))
        store.finalize(whole_file)
    except BaseException:
        cancel.set()
        store.close()  # keeps the partial file and its state: a rerun resumes
        raise
    return result(
        bytes_by_source=dict(store.bytes_by_source),
        resumed_bytes=resumed,
        retries=s3.retries,
        hash_failures=store.hash_failures,
    )
