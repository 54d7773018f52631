"""The daemon's UDP source for one artifact: missing pieces from a holder's UDP server.

Runs under a :class:`~swarm.agent.supervisor.SourceTask` like the S3 reader; libtorrent
checks every piece it hands over (``TorrentSink.offer``).
"""

from __future__ import annotations

from swarm.agent.registry import Artifact
from swarm.errors import SwarmError
from swarm.sources.peers import TorrentSession
from swarm.udp import fetch_pieces_sync

NOTHING_HELD_RETRY = 5.0
"""Seconds before asking a holder again that holds none of the missing pieces."""


def read_udp(
    session: TorrentSession, artifact: Artifact, host: str, port: int, secret: bytes
) -> None:
    """Pull the missing pieces from ``udp://host:port`` until the artifact is complete."""
    manifest, sink = artifact.manifest, artifact.sink
    state = session.torrents[manifest.info_hash]
    while not sink.complete() and not artifact.cancel.is_set():
        missing = sink.missing()
        if not missing:
            state.finished.wait(0.25)  # all held: libtorrent is flushing
            continue
        stats = fetch_pieces_sync(
            host,
            port,
            secret,
            manifest.info_hash,
            missing,
            lambda index, data: sink.offer(index, data, "udp"),
            piece_size=manifest.piece_size,
            piece_count=manifest.layout.count,
            cancel=artifact.cancel,
        )
        if stats.unavailable and not stats.kept:
            if artifact.cancel.wait(NOTHING_HELD_RETRY):
                return
            raise SwarmError(f"udp://{host}:{port} holds none of the missing pieces")
