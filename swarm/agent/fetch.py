"""One fetch of one artifact: resolve, reserve, pull from sources, verify, place.

``fetch_in_process`` is ``swarm fetch --no-daemon``: S3 is the only source and the sink
is a :class:`PieceFile` beside DEST. The daemon (peers, UDP) reuses the same pieces:
:class:`swarm.sources.s3.S3Source` writing into a sink that checks every piece.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from swarm import catalog
from swarm.agent.store import PieceFile, check_dest
from swarm.errors import DeadlineError, SwarmError
from swarm.manifest import Manifest
from swarm.objectstore import make_client
from swarm.pieces import file_sha256
from swarm.progress import FetchProgress
from swarm.sources import Cancelled
from swarm.sources.s3 import S3Source, S3SourceConfig


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
    check_dest(dest)
    client = make_client(endpoint_url, max_connections=s3_config.concurrency + 2)
    url = catalog.resolve(client, source, catalog_url)
    manifest = catalog.load_manifest(client, url, secret)

    def result(**extra: object) -> FetchResult:
        return FetchResult(
            manifest.name,
            str(dest),
            manifest.size,
            manifest.sha256,
            round(time.monotonic() - started, 3),
            **extra,  # type: ignore[arg-type]
        )

    if dest_already_matches(dest, manifest):
        return result(already_present=True)

    store = PieceFile(manifest, dest)
    store.open()
    resumed = store.bytes_done
    progress.start(manifest, dest, resumed)
    store.on_piece = lambda _index, length: progress.advance(length)
    cancel = threading.Event()
    s3 = S3Source(client, manifest, store, cancel, s3_config)
    try:
        whole_file = store.start_prefix_hasher()
        run_with_deadline(deadline, cancel, lambda: s3.fetch(store.missing()))
        if not store.complete:
            raise SwarmError(f"swarm: {len(store.missing())} pieces still missing after S3 fetch")
        progress.verifying()
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
