"""The daemon's S3 reader keeps peers off the pieces it is reading (swarm.agent.origin):
each GET's pieces, for as long as the GET runs, in a batch not held back as a whole,
except the coordinator's WIDE, whose pieces are those peers hold."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import libtorrent as lt
import pytest

from swarm.agent.daemon import Daemon
from swarm.agent.origin import read_origin
from swarm.config import Settings
from swarm.s3http import S3Client
from swarm.sources.peers import DEFAULT_PIECE_PRIORITY
from tests.conftest import put_artifact
from tests.servers import free_port

PIECE = 256 << 10
PIECES = 16


@pytest.mark.parametrize("mode", ["stripe", "wide"])
def test_a_stripe_keeps_peers_off_each_get_s_pieces_while_it_runs_and_wide_does_not(
    env: dict[str, str], bucket: str, tmp_path: Path, mode: str
) -> None:
    manifest = put_artifact(env, bucket, tmp_path, PIECES * PIECE, PIECE)
    daemon = Daemon(Settings(home=tmp_path / "home"), "127.0.0.1", free_port())
    session = daemon.session
    calls: list[tuple[list[int], bool, bool]] = []  # pieces, on, every one of them at 0
    real_hold_back = session.hold_back

    def hold_back(info_hash: str, pieces: list[int], on: bool) -> None:
        real_hold_back(info_hash, pieces, on)
        handle = session.torrents[info_hash].handle
        calls.append((list(pieces), on, all(handle.piece_priority(i) == 0 for i in pieces)))

    session.hold_back = hold_back  # type: ignore[method-assign]
    try:
        artifact = daemon._add(manifest, tmp_path / "data" / "a.bin", None, {"peers", "s3"})
        artifact.client = S3Client(env["AWS_ENDPOINT_URL"])
        # a stripe (every piece, no direct share: nothing held back as a batch), or the
        # coordinator's WIDE (everything missing from S3)
        stripe = list(range(PIECES)) if mode == "stripe" else []
        daemon.take_plans({manifest.info_hash: {"stripe": stripe, "mode": mode}})
        reader = threading.Thread(
            target=read_origin,
            args=(session, artifact, daemon.node_id, True, lambda: None),
            daemon=True,
        )
        reader.start()
        reader.join(60)
        assert not reader.is_alive()
        assert artifact.complete_on_disk()
        got = (tmp_path / "data" / "a.bin").read_bytes()
        assert hashlib.sha256(got).hexdigest() == manifest.sha256
        held = [(pieces, at_zero) for pieces, on, at_zero in calls if on and pieces]
        if mode == "wide":
            assert not held  # a WIDE batch reads the pieces peers hold: they may send them
        else:
            assert held and all(at_zero for _, at_zero in held)  # while the GET ran
        released = [pieces for pieces, on, _ in calls if not on and pieces]
        assert sorted(map(sorted, released)) == sorted(sorted(p) for p, _ in held)
        state = session.torrents[manifest.info_hash]
        assert not state.held_for_s3
        # all let go, as libtorrent tells: priorities at the default, or the torrent a
        # seed. A torrent whose missing pieces were all held was "finished" (nothing
        # wanted) before they came, so the last one's pass does not end it again and
        # keeps its piece picker; libtorrent then ignores priorities of a seed
        # (torrent::prioritize_piece_list returns at is_seed()) and keeps the zeros.
        # CI met that twice, when the last release came after the last piece passed.
        handle = state.handle
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not handle.status().is_seeding:
            time.sleep(0.05)
        assert handle.status().is_seeding
        priorities = list(handle.get_piece_priorities())
        assert priorities == [DEFAULT_PIECE_PRIORITY] * PIECES or (
            priorities == [0] * PIECES and handle.status().state == lt.torrent_status.finished
        )
    finally:
        daemon.close()
