"""A node behind its fleet holds its uploads back (swarm.agent.catchup): the rule, and its
limit on a real libtorrent torrent."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import libtorrent as lt

from swarm.agent.catchup import (
    BEHIND,
    CATCH_UP_SETTINGS,
    CAUGHT_UP,
    EARLY_BEHIND,
    GROWING,
    GROWTH_SECONDS,
    MIN_LIMIT,
    QUEUE_SECONDS,
    UPLOAD_SHARE,
    CatchUp,
    lag,
)
from swarm.manifest import Manifest
from swarm.sources.ltsettings import AMONG_SEEDERS_SETTINGS
from swarm.sources.peers import TorrentSession


@dataclass
class Peer:
    """What the rule reads of libtorrent's ``peer_info``."""

    progress: float


class Torrent:
    """A real torrent handle whose peers the test names (a lone session has none)."""

    def __init__(self, handle: lt.torrent_handle) -> None:
        self.handle = handle
        self.peers: list[Peer] = []

    def get_peer_info(self) -> list[Peer]:
        return self.peers

    def set_upload_limit(self, limit: int) -> None:
        self.handle.set_upload_limit(limit)

    def upload_limit(self) -> int:
        return int(self.handle.upload_limit())


def torrent(tmp_path: Path) -> Torrent:
    data = tmp_path / "a.bin"
    data.write_bytes(b"x" * (64 << 10))
    manifest = Manifest.from_file(
        data, name="a.bin", piece_size=16 << 10, bucket="b", key="k", web_seed=None
    )
    session = lt.session({"listen_interfaces": "127.0.0.1:0", "enable_dht": False})
    params = lt.add_torrent_params()
    params.ti = lt.torrent_info(manifest.torrent)
    params.save_path = str(tmp_path / "empty")
    found = Torrent(session.add_torrent(params))
    found.session = session  # type: ignore[attr-defined]  # kept alive with the handle
    return found


def test_lag_is_against_the_fetching_peers_median() -> None:
    assert lag(0.2, [Peer(0.5), Peer(0.4), Peer(1.0), Peer(0.3)]) == 0.2
    assert lag(0.2, [Peer(1.0)]) is None  # only seeders: nothing to trail
    assert lag(0.2, []) is None


def test_a_node_behind_holds_its_uploads_until_it_has_caught_up(tmp_path: Path) -> None:
    t = torrent(tmp_path)
    rule = CatchUp("a.bin")
    t.peers = [Peer(0.5), Peer(0.6), Peer(1.0)]  # the fetching peers' median: 0.55
    rule.step(t, 0.55 - BEHIND / 2, 4e6)
    assert rule.limit == 0 and t.upload_limit() <= 0
    rule.step(t, 0.55 - BEHIND - 0.01, 4e6)
    assert rule.limit == int(UPLOAD_SHARE * 4e6) == t.upload_limit()
    rule.step(t, 0.55 - CAUGHT_UP - 0.01, 1e6)  # closer, not caught up: the limit stands
    assert t.upload_limit() == int(UPLOAD_SHARE * 4e6)
    rule.step(t, 0.55 - CAUGHT_UP + 0.01, 1e6)
    assert rule.limit == 0 and t.upload_limit() <= 0


def test_a_node_falling_behind_holds_its_uploads_before_it_is_far_behind(
    tmp_path: Path,
) -> None:
    """Existing seeders at a quarter: a node received 3.7-5.0 MB/s of its 6.25 for 11 s
    while the others had 6.0, and was 10% behind only at the end of it. A lag that grows
    by GROWING over GROWTH_SECONDS engages the hold from EARLY_BEHIND; it is lifted at
    half the lag it engaged at."""
    t = torrent(tmp_path)
    rule = CatchUp("a.bin")
    t.peers = [Peer(0.5)]
    start = EARLY_BEHIND + 0.001
    rule.step(t, 0.5 - start, 4e6, now=0.0)  # behind, not (yet) falling behind
    rule.step(t, 0.5 - start - GROWING / 2, 4e6, now=GROWTH_SECONDS)
    assert rule.limit == 0  # grew, but by less than GROWING
    rule.step(t, 0.5 - start - GROWING - 0.001, 4e6, now=GROWTH_SECONDS + 0.5)
    assert rule.limit == int(UPLOAD_SHARE * 4e6) == t.upload_limit()
    engaged = start + GROWING + 0.001
    rule.step(t, 0.5 - engaged / 2 - 0.001, 4e6, now=GROWTH_SECONDS + 1.5)
    assert rule.limit  # closer, not caught up
    rule.step(t, 0.5 - engaged / 2 + 0.001, 4e6, now=GROWTH_SECONDS + 2.5)
    assert rule.limit == 0 and t.upload_limit() <= 0
    # a jump within a second (peers' progress moves a piece at a time) is no trend yet
    jump = CatchUp("a.bin")
    jump.step(t, 0.5 - start, 4e6, now=0.0)
    jump.step(t, 0.5 - start - 2 * GROWING, 4e6, now=1.0)
    assert jump.limit == 0
    # a steady lag under BEHIND, however long, is not falling behind
    steady = CatchUp("a.bin")
    for second in range(20):
        steady.step(t, 0.5 - BEHIND + 0.01, 4e6, now=float(second))
    assert steady.limit == 0


def test_no_limit_on_an_upload_too_slow_to_queue_anything(tmp_path: Path) -> None:
    t = torrent(tmp_path)
    rule = CatchUp("a.bin")
    t.peers = [Peer(0.9)]
    rule.step(t, 0.1, 1.9 * MIN_LIMIT)
    assert rule.limit == 0 and t.upload_limit() <= 0


def test_a_node_behind_lets_its_request_queues_grow_until_it_has_caught_up(
    tmp_path: Path,
) -> None:
    # the queue time is the session's (libtorrent's request_queue_time), over the tuning
    # a fetch beside seeders holds, and back to that tuning's once caught up
    t = torrent(tmp_path)
    session = TorrentSession("127.0.0.1", 0, tmp_path / "resume")
    try:

        def queue_time() -> int:
            return int(session.session.get_settings()["request_queue_time"])

        tunings: list[int] = []  # one entry per tuning the rule took

        def tuned() -> AbstractContextManager[object]:
            tunings.append(1)
            return session.tuned(CATCH_UP_SETTINGS)

        with session.tuned(AMONG_SEEDERS_SETTINGS):
            before = queue_time()
            assert before != QUEUE_SECONDS
            rule = CatchUp("a.bin", tuned)
            t.peers = [Peer(0.6)]
            rule.step(t, 0.6 - BEHIND - 0.01, 4e6)
            assert rule.limit and queue_time() == QUEUE_SECONDS
            rule.step(t, 0.6 - BEHIND - 0.01, 4e6)  # still behind: held once, not twice
            assert len(tunings) == 1
            rule.step(t, 0.6 - CAUGHT_UP + 0.01, 4e6)
            assert rule.limit == 0 and queue_time() == before
            rule.step(t, 0.6 - BEHIND - 0.01, 4e6)  # behind again
            assert queue_time() == QUEUE_SECONDS
            rule.end()  # the fetch ended (failed, say) while behind
            assert queue_time() == before
            rule.lift(t)
            rule.step(t, 0.6 - BEHIND - 0.01, 4e6)  # a late look after the end: no tuning
            assert queue_time() == before
    finally:
        session.close()
