"""The daemon's UDP source for one artifact: missing pieces from a holder's UDP server.

Runs under a :class:`~swarm.agent.supervisor.SourceTask` like the S3 reader; libtorrent
checks every piece it hands over (``TorrentSink.offer``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from swarm.agent.registry import Artifact
from swarm.errors import SwarmError
from swarm.sources.peers import TorrentSession
from swarm.udp.api import CONNECT_TIMEOUT, DEFAULT_RATE_BPS, FetchStats

SOURCE = "udp"
"""The name UDP bytes go under in ``bytes_by_source``."""

NOTHING_HELD_RETRY = 5.0
"""Seconds before asking a holder again that holds none of the missing pieces."""


def pull_pieces(
    artifact: Artifact,
    host: str,
    port: int,
    secret: bytes,
    pieces: Sequence[int] | Future[Sequence[int]],
    cancel: threading.Event,
    offer: Callable[[int, bytes | memoryview], bool] | None = None,
    rate_bps: int = DEFAULT_RATE_BPS,
    connect_timeout: float = CONNECT_TIMEOUT,
    skip: Callable[[int], bool] | None = None,
) -> FetchStats:
    """``pieces`` of ``artifact`` from the UDP server at ``host:port`` into its sink (or
    through ``offer``, which hands them to the sink itself), asking the sender for at
    most ``rate_bps``. Pieces the sink gets from another source meanwhile (peers, S3),
    or that ``skip`` says come otherwise, are skipped: the sender stops sending them.
    ``pieces`` may come later, as a future (:func:`swarm.udp.client.fetch_pieces`)."""
    from swarm.udp.client import fetch_pieces_sync  # loads on the first UDP fetch (swarm.udp.api)

    manifest, sink = artifact.manifest, artifact.sink
    return fetch_pieces_sync(
        host,
        port,
        secret,
        manifest.info_hash,
        pieces,
        offer or (lambda index, data: sink.offer(index, data, SOURCE)),
        piece_size=manifest.piece_size,
        piece_count=manifest.layout.count,
        cancel=cancel,
        rate_bps=rate_bps,
        held=sink.have if skip is None else lambda i: sink.have(i) or skip(i),
        connect_timeout=connect_timeout,
    )


def read_udp(
    session: TorrentSession, artifact: Artifact, host: str, port: int, secret: bytes
) -> None:
    """Pull the missing pieces from ``udp://host:port`` until the artifact is complete."""
    sink = artifact.sink
    state = session.torrents[artifact.manifest.info_hash]
    while not sink.complete() and not artifact.cancel.is_set():
        missing = sink.missing()
        if not missing:
            state.finished.wait(0.25)  # all held: libtorrent is flushing
            continue
        stats = pull_pieces(artifact, host, port, secret, missing, artifact.cancel)
        if stats.unavailable and not stats.kept:
            if artifact.cancel.wait(NOTHING_HELD_RETRY):
                return
            raise SwarmError(f"udp://{host}:{port} holds none of the missing pieces")
