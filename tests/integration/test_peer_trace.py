"""The peers trace (swarm.sources.peertrace) of a real session: a node beside a seeder on
loopback logs, once a second, the seeder's connection as it is, and what libtorrent
counted of the payload it received for nothing."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import pytest

from swarm.manifest import Manifest
from swarm.sources import peertrace
from swarm.sources.peers import TorrentSession
from tests.conftest import make_artifact

PIECE = 256 << 10
PIECES = 8


def test_a_node_traces_a_seeder_it_lacks_every_piece_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = make_artifact(tmp_path / "a.bin", PIECES * PIECE)
    manifest = Manifest.from_file(
        src, name="a.bin", piece_size=PIECE, bucket="b", key="a.bin", web_seed=None
    )
    seeder = TorrentSession("127.0.0.61", 0, tmp_path / "seeder-resume")
    node = TorrentSession("127.0.0.62", 0, tmp_path / "node-resume", trace_peers=True)
    try:
        seeder.add(manifest, src, [], seed_mode=True)
        node.add(manifest, tmp_path / "node" / "a.bin", [])
        # every piece held back (as for S3): the node keeps lacking them all while it
        # stays connected, so the line's counts are known
        node.hold_back(manifest.info_hash, list(range(PIECES)), True)
        caplog.set_level(logging.INFO, logger="swarm.trace.peers")
        node.dial(manifest.info_hash, (("127.0.0.61", seeder.listen_port),))
        pattern = re.compile(
            rf"trace {manifest.info_hash[:8]}: held 0/{PIECES} down \d+ up \d+ kB/s"
            r" peers' payload 0\.0 MB, 0 pieces asked \(0 blocks in\)"
            rf" \| 127\.0\.0\.61:{seeder.listen_port} seed useful {PIECES} down \d+ up \d+"
            r" reqs \d+ asked \d+ [I-][C-][i-][c-]"
        )
        deadline = time.monotonic() + 15
        while not any(pattern.search(r.getMessage()) for r in caplog.records):
            assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
            time.sleep(0.1)
        # and the session's waste line: nothing received, nothing for nothing
        waste = re.compile(
            r"session: waste redundant 0 unknown 0 end_game 0 seed 0 timed_out 0"
            r" cancelled 0 closing 0$"
        )
        while not any(waste.search(r.getMessage()) for r in caplog.records):
            assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
            time.sleep(0.1)
        lines = [r for r in caplog.records if r.name == "swarm.trace.peers"]
        assert all(r.levelno == logging.INFO for r in lines)
    finally:
        node.close()
        seeder.close()


def test_the_trace_is_off_unless_the_environment_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(peertrace.TRACE_ENV, raising=False)
    assert not peertrace.enabled()
    for value, on in (("1", True), ("yes", True), ("0", False), ("", False), (" ", False)):
        monkeypatch.setenv(peertrace.TRACE_ENV, value)
        assert peertrace.enabled() is on, value
