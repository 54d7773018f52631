"""Held pieces over TCP (swarm/agent/pieceserver.py) and a new node's pull of its share
from a seeder (swarm/agent/seedershare.py, ``SharePuller``): real daemons, real files,
real sockets on loopback."""

from __future__ import annotations

import contextlib
import http.client
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarm.agent import seedershare
from swarm.agent.daemon import Daemon
from swarm.agent.held import HeldArtifacts
from swarm.agent.pieceserver import PieceClient, PieceServer, pieces_port, start_server
from swarm.agent.registry import Artifact
from swarm.agent.seedershare import PieceAccess, SharePuller
from swarm.config import Settings
from swarm.manifest import Manifest
from swarm.s3http import S3Client
from tests.servers import free_port, wait_until

MiB = 1 << 20
PIECES = 4
TOKEN = "fleet-token-for-the-test"
SEEDER = "127.0.0.2"


def _daemon(home: Path, address: str) -> Daemon:
    return Daemon(Settings(home=home), address, free_port(address))


def _manifest(source: Path) -> Manifest:
    source.write_bytes(b"".join(bytes([i]) * MiB for i in range(PIECES)))
    return Manifest.from_file(
        source, name="a.bin", piece_size=MiB, bucket="b", key="k", web_seed=None
    )


def _holding(daemon: Daemon, manifest: Manifest, data: Path) -> Artifact:
    """The daemon's artifact for ``data`` (complete on disk), once libtorrent checked it."""
    artifact = daemon._add(manifest, data, None, {"peers"})
    wait_until(lambda: all(artifact.sink.have(i) for i in range(PIECES)), 20, "the check")
    return artifact


def _serve(daemon: Daemon) -> tuple[PieceServer, int]:
    port = free_port(SEEDER)
    server = start_server(SEEDER, port, TOKEN, HeldArtifacts(daemon))
    assert server is not None
    return server, port


def test_a_held_piece_is_served_to_the_fleet_only(tmp_path: Path) -> None:
    source = tmp_path / "a.bin"
    manifest = _manifest(source)
    seeder = _daemon(tmp_path / "seeder", SEEDER)
    server = None
    try:
        _holding(seeder, manifest, source)
        server, port = _serve(seeder)
        client = PieceClient(SEEDER, port, TOKEN)
        assert client.get(manifest.info_hash, 2) == bytes([2]) * MiB
        assert client.get(manifest.info_hash, 3) == bytes([3]) * MiB  # same connection
        assert client.get(manifest.info_hash, PIECES) is None  # no such piece
        assert client.get("00" * 20, 0) is None  # no such artifact
        client.close()
        stranger = PieceClient(SEEDER, port, "not-the-token")
        with pytest.raises(http.client.HTTPException, match="403"):
            stranger.get(manifest.info_hash, 0)
    finally:
        if server is not None:
            server.stop()
        seeder.close()


def test_a_piece_not_held_yet_is_not_served(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path / "a.bin")
    node = _daemon(tmp_path / "node", SEEDER)
    server = None
    try:
        artifact = node._add(manifest, tmp_path / "empty" / "a.bin", None, {"peers"})
        server, port = _serve(node)
        assert not artifact.sink.have(0)
        assert PieceClient(SEEDER, port, TOKEN).get(manifest.info_hash, 0) is None
    finally:
        if server is not None:
            server.stop()
        node.close()


NODE = "127.0.0.3"


@contextlib.contextmanager
def _beside_a_seeder(tmp_path: Path) -> Iterator[tuple[Daemon, Artifact, SharePuller]]:
    """A serving seeder, and a new node (its daemon, its artifact, which it lacks, and a
    puller with no seeders added yet) for the same artifact."""
    source = tmp_path / "a.bin"
    manifest = _manifest(source)
    seeder = _daemon(tmp_path / "seeder", SEEDER)
    node = _daemon(tmp_path / "node", NODE)
    server = None
    try:
        _holding(seeder, manifest, source)
        server, port = _serve(seeder)
        artifact = node._add(manifest, tmp_path / "node-data" / "a.bin", None, {"peers"})
        yield node, artifact, SharePuller(artifact, PieceAccess(port, TOKEN))
    finally:
        if server is not None:
            server.stop()
        node.close()
        seeder.close()


def test_a_new_node_pulls_its_share_once_each(tmp_path: Path) -> None:
    with _beside_a_seeder(tmp_path) as (_, artifact, puller):
        puller.want([1, 3])
        puller.add_seeders([SEEDER])
        wait_until(lambda: artifact.sink.have(1) and artifact.sink.have(3), 20, "the share")
        assert not artifact.sink.have(0) and not artifact.sink.have(2)
        assert set(puller.taken) == {1, 3} and not puller.failed
        assert artifact.sink.bytes_by_source.get("peers") == 2 * MiB  # each piece once


def test_a_seeder_without_a_piece_server_leaves_the_share_to_libtorrent(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path / "a.bin")
    node = _daemon(tmp_path / "node", NODE)
    try:
        artifact = node._add(manifest, tmp_path / "node-data" / "a.bin", None, {"peers"})
        puller = SharePuller(artifact, PieceAccess(free_port(SEEDER), TOKEN))  # nobody there
        puller.want([0])
        puller.add_seeders([SEEDER])
        wait_until(lambda: puller.failed, 20, "the puller to give up")
        assert not artifact.sink.have(0)
    finally:
        node.close()


def test_piece_servers_listen_only_beside_default_udp_servers() -> None:
    assert pieces_port(7881) == 7882
    assert pieces_port(0) == 0  # no UDP
    assert pieces_port(9000) == 0  # a UDP port of its own: 9001 may be another node's


def test_a_seeder_that_does_not_serve_leaves_its_pieces_to_the_others(tmp_path: Path) -> None:
    with _beside_a_seeder(tmp_path) as (_, artifact, puller):
        puller.want([0, 1, 2, 3])
        puller.add_seeders(["127.0.0.4", SEEDER])  # nothing listens on the first
        wait_until(lambda: all(artifact.sink.have(i) for i in range(PIECES)), 20, "the share")
        assert puller.gone == {"127.0.0.4"} and not puller.failed


def _pulled_beside_a_seeder(tmp_path: Path, s3_near: bool) -> list[int]:
    """The pieces a new node pulled from a seeder in its first ~second beside it, before
    it saw any other new node. Its S3 endpoint: a listener on loopback (near), or a
    port nobody listens on (no round trip: taken as far)."""
    with (
        contextlib.closing(socket.create_server((NODE, 0))) as s3,
        _beside_a_seeder(tmp_path) as (node, artifact, puller),
    ):
        s3_port = s3.getsockname()[1] if s3_near else free_port(NODE)
        artifact.client = S3Client(f"http://{NODE}:{s3_port}")
        artifact.seeders = (SEEDER,)  # as the first plan naming them sets it
        seedershare.start(node.session, artifact, NODE, puller.access)
        if s3_near:
            first = seedershare.first_pull(range(PIECES), [SEEDER], NODE, PIECES)
            assert first is not None
            wait_until(lambda: artifact.sink.have(first[1]), 20, "the first pull")
        time.sleep(4 * seedershare.SHARE_INTERVAL)  # the loop's next looks pull no more
        return [i for i in range(PIECES) if artifact.sink.have(i)]


def test_before_it_sees_another_new_node_a_node_pulls_one_piece(tmp_path: Path) -> None:
    """A new node beside seeders pulls from their piece servers from the plan that names
    them, not only once its connections show it the other new nodes (a share needs
    them): one piece of its own order, and nothing more meanwhile."""
    pulled = _pulled_beside_a_seeder(tmp_path, s3_near=True)
    first = seedershare.first_pull(range(PIECES), [SEEDER], NODE, PIECES)
    assert first is not None and pulled == [first[1]]


def test_where_s3_is_not_known_near_a_node_waits_for_its_share(tmp_path: Path) -> None:
    """Where S3 is far (or does not answer) the seeders may be far too, where UDP
    carries the WAN: no pull before a share is dealt."""
    assert _pulled_beside_a_seeder(tmp_path, s3_near=False) == []
