"""S3's round trip, as a fetch measures it (``Artifact.s3_round_trip``): once, before the
S3 reader's first GET. Timed after it, a node's connects waited behind the GET's bytes in
its own downlink queue, and a LAN S3 looked far (the S3 reader then left it to UDP)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from swarm.agent import registry
from swarm.agent.daemon import Daemon
from swarm.agent.origin import read_origin
from swarm.agent.rtt import RTT_PROBES
from swarm.agent.udpchoice import s3_far
from swarm.config import Settings
from swarm.s3http import S3Client
from tests.conftest import put_artifact
from tests.servers import free_port, wait_until

PIECE = 256 << 10
PIECES = 8


ADDRESS = "127.0.0.2"
"""A loopback address nothing else in the test process is connected to: the kernel's
table of round trips has none for it, so each measurement makes timed connects."""


class _Listener:
    """A loopback TCP server that counts the connections it accepts."""

    def __init__(self, port: int = 0) -> None:
        self.sock = socket.create_server((ADDRESS, port))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


def test_s3_s_round_trip_is_measured_once_per_endpoint(
    env: dict[str, str], bucket: str, tmp_path: Path
) -> None:
    manifest = put_artifact(env, bucket, tmp_path, PIECES * PIECE, PIECE)
    daemon = Daemon(Settings(home=tmp_path / "home"), "127.0.0.1", free_port())
    first, second = _Listener(), _Listener()
    refused_port = free_port(ADDRESS)

    def probed(listener: _Listener) -> None:
        wait_until(lambda: listener.accepted >= RTT_PROBES, 5, "the timed connects")
        assert listener.accepted == RTT_PROBES

    try:
        artifact = daemon._add(manifest, tmp_path / "data" / "a.bin", None, {"peers", "s3"})
        artifact.client = S3Client(f"http://{ADDRESS}:{first.port}")
        rtt = artifact.s3_round_trip()
        assert rtt is not None and rtt < 0.02
        probed(first)
        assert artifact.s3_round_trip() == rtt
        probed(first)  # no more: the second answer was the first's
        artifact.client = S3Client(f"http://{ADDRESS}:{second.port}")  # a later request's
        assert artifact.s3_round_trip() is not None
        probed(second)
        # nothing answers: None, and asked again (S3 may be back)
        artifact.client = S3Client(f"http://{ADDRESS}:{refused_port}")
        assert artifact.s3_round_trip() is None
        back = _Listener(refused_port)
        try:
            assert artifact.s3_round_trip() is not None
            probed(back)
        finally:
            back.close()
    finally:
        first.close()
        second.close()
        daemon.close()


def test_the_s3_reader_knows_s3_s_round_trip_before_its_first_get(
    env: dict[str, str], bucket: str, tmp_path: Path
) -> None:
    """A node alone (no coordinator, no peer) reads everything at once: the round trip was
    measured before that first GET, not by the UDP source beside it after."""
    manifest = put_artifact(env, bucket, tmp_path, PIECES * PIECE, PIECE)
    daemon = Daemon(Settings(home=tmp_path / "home"), "127.0.0.1", free_port())
    try:
        artifact = daemon._add(manifest, tmp_path / "data" / "a.bin", None, {"peers", "s3"})
        client = S3Client(env["AWS_ENDPOINT_URL"])
        known_at_gets: list[bool] = []
        real_get_object = client.get_object

        def get_object(**kwargs: object) -> object:  # the real GET, its moment noted
            known_at_gets.append(artifact._s3_rtt is not None)
            return real_get_object(**kwargs)

        client.get_object = get_object  # type: ignore[method-assign]
        artifact.client = client
        reader = threading.Thread(
            target=read_origin,
            args=(daemon.session, artifact, daemon.node_id, False, lambda: None),
            kwargs={"expect_peers": False},
            daemon=True,
        )
        reader.start()
        reader.join(60)
        assert not reader.is_alive()
        assert artifact.complete_on_disk()
        assert known_at_gets and all(known_at_gets)
    finally:
        daemon.close()


def test_a_far_round_trip_is_revised_by_what_the_kernel_saw_since(
    env: dict[str, str], bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CLI that timed S3 behind a full queue hands its daemon a far figure; once one of
    the node's connections to S3 has seen the path drained (the kernel's least round
    trip), the fetch takes S3 for near. A far S3 with no connection stays far (an address
    of its own: the kernel's table is by address, and the test above connects to
    ``ADDRESS``)."""
    monkeypatch.setattr(registry, "S3_RTT_RELOOK", 0.05)
    address = "127.0.0.87"
    manifest = put_artifact(env, bucket, tmp_path, PIECES * PIECE, PIECE)
    daemon = Daemon(Settings(home=tmp_path / "home"), "127.0.0.1", free_port())
    server = socket.create_server((address, 0))
    port = server.getsockname()[1]
    try:
        artifact = daemon._add(manifest, tmp_path / "data" / "a.bin", None, {"peers", "s3"})
        artifact.client = S3Client(f"http://{address}:{port}")
        artifact.know_s3_round_trip(0.027)  # the CLI's figure, through the queue
        assert artifact.s3_round_trip() == 0.027  # not looked at again yet
        time.sleep(0.1)
        assert artifact.s3_round_trip() == 0.027  # the kernel has no connection to S3
        # a table a caller has just read revises it too; one without S3 in it does not
        assert artifact.s3_round_trip({"10.0.0.9": 0.001}) == 0.027
        with socket.create_connection((address, port)) as get, server.accept()[0] as answer:
            get.sendall(b"GET")  # a round trip the kernel measures: sent, acknowledged
            answer.sendall(b"200")
            assert get.recv(3)
            time.sleep(0.1)
            rtt = artifact.s3_round_trip()
        assert rtt is not None and not s3_far(rtt), rtt
        assert artifact.s3_round_trip() == rtt  # kept: never revised upward
    finally:
        server.close()
        daemon.close()


def test_a_far_round_trip_is_revised_by_a_table_the_caller_read(
    env: dict[str, str], bucket: str, tmp_path: Path
) -> None:
    """The UDP source reads the kernel's table for its holders anyway: handed to the
    artifact, it revises a far figure at once (no wait, no second read); a table
    without S3's address in it leaves the figure as it was."""
    manifest = put_artifact(env, bucket, tmp_path, PIECES * PIECE, PIECE)
    daemon = Daemon(Settings(home=tmp_path / "home"), "127.0.0.1", free_port())
    try:
        artifact = daemon._add(manifest, tmp_path / "data" / "a.bin", None, {"peers", "s3"})
        artifact.client = S3Client("http://127.0.0.88:9")
        artifact.know_s3_round_trip(0.027)
        assert artifact.s3_round_trip({"10.0.0.9": 0.001}) == 0.027
        assert artifact.s3_round_trip({"127.0.0.88": 0.05}) == 0.027  # a queue: not up
        assert artifact.s3_round_trip({"127.0.0.88": 0.0005}) == 0.0005
        assert artifact.s3_round_trip({"127.0.0.88": 0.05}) == 0.0005  # never up
    finally:
        daemon.close()
