"""The daemon's S3 reader keeps peers off the pieces it is reading (swarm.agent.origin):
each GET's pieces, for as long as the GET runs, in a batch not held back as a whole,
except the coordinator's WIDE, whose pieces are those peers hold; and under ALL it
leaves peers the pieces they had partly sent only while it has others to read."""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import libtorrent as lt
import pytest

from swarm.agent import origin
from swarm.agent.daemon import Daemon
from swarm.agent.origin import read_origin
from swarm.agent.registry import Artifact
from swarm.config import Settings
from swarm.manifest import Manifest
from swarm.s3http import S3Client
from swarm.sources.peers import TorrentSession
from swarm.sources.priorities import DEFAULT_PIECE_PRIORITY
from tests.conftest import put_artifact
from tests.servers import FaultProxy, Faults, free_port

PIECE = 256 << 10
PIECES = 16


def start_reader(daemon: Daemon, artifact: Artifact) -> threading.Thread:
    """The daemon's S3 reader on ``artifact``, on a thread of its own, as the daemon runs it."""
    reader = threading.Thread(
        target=read_origin,
        args=(daemon.session, artifact, daemon.node_id, True, lambda: None),
        daemon=True,
    )
    reader.start()
    return reader


def read_to_the_end(
    daemon: Daemon,
    manifest: Manifest,
    env: dict[str, str],
    tmp_path: Path,
    plan: dict[str, object],
    interval: float = 1.0,
    timeout: float = 60.0,
    prepare: Callable[[Artifact], object] | None = None,
) -> None:
    """Run the daemon's S3 reader on the artifact under ``plan`` (a coordinator's, fresh
    for three ``interval``) on a thread, as the daemon does, until it ends; check the
    file it wrote. ``prepare``: called with the artifact before the reader starts."""
    dest = tmp_path / "data" / "a.bin"
    artifact = daemon._add(manifest, dest, None, {"peers", "s3"})
    artifact.client = S3Client(env["AWS_ENDPOINT_URL"])
    if prepare is not None:
        prepare(artifact)
    daemon.take_plans({manifest.info_hash: plan}, interval=interval)
    reader = start_reader(daemon, artifact)
    reader.join(timeout)
    assert not reader.is_alive(), f"the S3 reader had not finished after {timeout} s"
    assert artifact.complete_on_disk()
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == manifest.sha256


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
        # a stripe (every piece, no direct share: nothing held back as a batch), or the
        # coordinator's WIDE (everything missing from S3)
        stripe = list(range(PIECES)) if mode == "stripe" else []
        read_to_the_end(daemon, manifest, env, tmp_path, {"stripe": stripe, "mode": mode})
        held = [(pieces, at_zero) for pieces, on, at_zero in calls if on and pieces]
        if mode == "wide":
            assert not held  # a WIDE batch reads the pieces peers hold: they may send them
        else:
            assert held and all(at_zero for _, at_zero in held)  # while the GET ran
        released = [pieces for pieces, on, _ in calls if not on and pieces]
        assert sorted(map(sorted, released)) == sorted(sorted(p) for p, _ in held)
        state = session.torrents[manifest.info_hash]
        assert not state.priorities.held_for_s3
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


def reader_under_all(
    env: dict[str, str], bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Manifest, Daemon]:
    """An artifact in S3 and a daemon to read it under ALL, whose pieces left to peers
    stay theirs for longer than the fetch takes (``PEERS_FINISH_SECONDS``)."""
    monkeypatch.setattr(origin, "PEERS_FINISH_SECONDS", 60.0)
    manifest = put_artifact(env, bucket, tmp_path, PIECES * PIECE, PIECE)
    return manifest, Daemon(Settings(home=tmp_path / "home"), "127.0.0.1", free_port())


@contextlib.contextmanager
def on_a_slow_s3_beside_a_holder(
    env: dict[str, str], bucket: str, tmp_path: Path
) -> Iterator[tuple[Manifest, Daemon, Artifact, TorrentSession]]:
    """An artifact added to a daemon whose S3 gives 128 KB/s (the origin throttled: 2 s a
    piece), its file at ``tmp_path/data/a.bin``, and a peer that holds all of it (see
    :func:`dial`)."""
    manifest = put_artifact(env, bucket, tmp_path, PIECES * PIECE, PIECE)
    holder = TorrentSession("127.0.0.2", 0, tmp_path / "holder")
    daemon = Daemon(Settings(home=tmp_path / "home"), "127.0.0.1", free_port())
    try:
        holder.add(manifest, tmp_path / "a.bin", [], seed_mode=True)
        with FaultProxy(env["AWS_ENDPOINT_URL"], Faults(throttle_bps=128 << 10)) as proxy:
            artifact = daemon._add(manifest, tmp_path / "data" / "a.bin", None, {"peers", "s3"})
            artifact.client = S3Client(proxy.url)
            yield manifest, daemon, artifact, holder
    finally:
        daemon.close()
        holder.close()


def dial(daemon: Daemon, info_hash: str, holder: TorrentSession, deadline: float) -> None:
    """Have the daemon connect to ``holder`` (by ``deadline``, a monotonic time)."""
    state = daemon.session.torrents[info_hash]
    while not state.handle.get_peer_info() and time.monotonic() < deadline:
        daemon.session.dial(info_hash, (("127.0.0.2", holder.listen_port),))
        time.sleep(0.1)
    assert state.handle.get_peer_info(), "the holder never connected"


def test_under_all_the_pieces_left_to_peers_are_read_once_nothing_else_is(
    env: dict[str, str], bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # At the switch to ALL the pieces peers had partly sent are theirs to finish for
    # PEERS_FINISH_SECONDS, while S3 reads the rest. Once S3 has nothing else to read it
    # takes them too, rather than idle: slow uploads' last node waited 2 s on seven
    # pieces from peers sending 0.6 MB/s each. Here no peer sends them at all, and the
    # window is long: the fetch ends well inside it, or waited for it.
    manifest, daemon = reader_under_all(env, bucket, tmp_path, monkeypatch)
    session = daemon.session
    real_upload_only = session.upload_only
    left: list[set[int]] = []

    def upload_only(info_hash: str, on: bool, finishing: object = ()) -> None:
        partly = {3, 9} if on else set()  # as if peers had sent a block of each
        left.append(partly)
        real_upload_only(info_hash, on, partly)

    session.upload_only = upload_only  # type: ignore[method-assign]
    try:
        # the plan stays fresh for the fetch (no coordinator here to renew it); the
        # reader waits on peers that send nothing, or finishes well inside the window
        read_to_the_end(daemon, manifest, env, tmp_path, {"stripe": [], "mode": "all"}, 60, 30)
        assert left and left[0] == {3, 9}  # they were left to peers at the switch
    finally:
        daemon.close()


class QueueOf:
    """A torrent handle whose download queue is made up (every other call goes to the
    real one): ``before`` until ``switched`` is set, then ``after``."""

    def __init__(self, handle: object, before: dict[int, list[int]], after: dict[int, list[int]]):
        self._handle, self._before, self._after = handle, before, after
        self.switched = False

    def get_download_queue(self) -> list[dict[str, object]]:
        queue = self._after if self.switched else self._before
        return [
            {"piece_index": index, "blocks": [{"state": state} for state in states]}
            for index, states in queue.items()
        ]

    def __getattr__(self, name: str) -> object:
        return getattr(self._handle, name)


def test_under_all_the_pieces_asked_of_peers_that_get_blocks_after_the_cancel_are_theirs(
    env: dict[str, str], bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # libtorrent's cancels at the switch to ALL do not stop the blocks already on their
    # way, and it keeps them: the pieces it had asked peers for (3, 9) are left alone
    # LANDING_SECONDS, then those that got a block (3) are libtorrent's to finish, as the
    # one partly sent at the switch (5); S3 reads the rest. Read from S3, such a piece
    # came whole past libtorrent and the blocks peers had sent of it went for nothing.
    manifest, daemon = reader_under_all(env, bucket, tmp_path, monkeypatch)
    session = daemon.session
    real_upload_only, real_finish = session.upload_only, session.finish_from_peers
    left: list[set[int]] = []
    queue: QueueOf | None = None

    def upload_only(info_hash: str, on: bool, finishing: Collection[int] = ()) -> None:
        if on:
            left.append(set(finishing))
            assert queue is not None
            queue.switched = True  # the cancels: blocks on their way land after them
        real_upload_only(info_hash, on, finishing)

    def finish_from_peers(info_hash: str, pieces: Collection[int]) -> None:
        left.append(set(pieces))
        real_finish(info_hash, pieces)

    session.upload_only = upload_only  # type: ignore[method-assign]
    session.finish_from_peers = finish_from_peers  # type: ignore[method-assign]

    def made_up_queue(artifact: Artifact) -> None:
        nonlocal queue
        state = session.torrents[artifact.info_hash]
        requested, received = 1, 3  # libtorrent's block states
        queue = QueueOf(
            state.handle,
            before={5: [received, requested], 3: [requested], 9: [requested]},
            after={5: [received, requested], 3: [received, requested], 9: []},
        )
        state.handle = queue

    try:
        # no peer sends them: S3 reads them once it has nothing else to
        plan = {"stripe": [], "mode": "all"}
        read_to_the_end(daemon, manifest, env, tmp_path, plan, 60, 30, made_up_queue)
        assert left == [{5}, {3}]
    finally:
        daemon.close()


def test_a_direct_share_held_for_a_slow_s3_is_given_back_to_peers(
    env: dict[str, str], bucket: str, tmp_path: Path
) -> None:
    # A plan's direct share is kept from peers as a whole while S3 reads it, planned on
    # the S3 rate the coordinator measured (s3_estimate, 20 MB/s here). S3 then gives
    # 128 KB/s (the origin throttled): read from it alone the 4 MiB take 32 s, while a
    # peer holding all of it is connected. The reader gives the pieces back to peers
    # once S3 falls behind the plan (swarm.agent.holdwatch); before that change it read
    # every piece from the throttled S3.
    with on_a_slow_s3_beside_a_holder(env, bucket, tmp_path) as setup:
        manifest, daemon, artifact, holder = setup
        plan = {"stripe": [], "mode": "stripe", "direct": 1.0, "s3_estimate": 20e6}
        daemon.take_plans({manifest.info_hash: plan}, interval=60)
        started = time.monotonic()
        reader = start_reader(daemon, artifact)
        state = daemon.session.torrents[manifest.info_hash]
        deadline = time.monotonic() + 10
        while not state.priorities.held_for_s3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert state.priorities.held_for_s3, "the reader held nothing back"  # its direct share
        dial(daemon, manifest.info_hash, holder, deadline)
        reader.join(20)
        took = time.monotonic() - started
        assert not reader.is_alive(), "the pieces waited on the throttled S3"
        assert artifact.complete_on_disk()
        assert hashlib.sha256(artifact.data_path.read_bytes()).hexdigest() == manifest.sha256
        from_s3 = artifact.sink.bytes_by_source.get("s3", 0)
        assert from_s3 <= PIECES * PIECE // 2, (took, from_s3)  # the rest came from the peer


def test_a_direct_share_is_held_a_few_seconds_of_s3_at_a_time(
    env: dict[str, str], bucket: str, tmp_path: Path
) -> None:
    # A direct share is kept from peers batch by batch, each no more than S3 brings in
    # DIRECT_BATCH_SECONDS at the plan's rate: here 300 kB/s, four pieces of 256 KiB a
    # batch. Read 32 pieces at a time, a slowed origin held them for minutes.
    manifest = put_artifact(env, bucket, tmp_path, PIECES * PIECE, PIECE)
    daemon = Daemon(Settings(home=tmp_path / "home"), "127.0.0.1", free_port())
    session = daemon.session
    held: list[int] = []  # the size of each batch held as a whole
    real_hold_back = session.hold_back

    def hold_back(info_hash: str, pieces: list[int], on: bool) -> None:
        real_hold_back(info_hash, pieces, on)
        if on and pieces:
            held.append(len(pieces))

    session.hold_back = hold_back  # type: ignore[method-assign]
    try:
        most = int(300e3 * origin.DIRECT_BATCH_SECONDS) // PIECE
        plan = {"stripe": [], "mode": "stripe", "direct": 1.0, "s3_estimate": 300e3}
        read_to_the_end(daemon, manifest, env, tmp_path, plan, interval=60)
        assert held and max(held) <= most < PIECES, held
        assert sum(held) == PIECES, held  # every piece was held while S3 read it
    finally:
        daemon.close()


def test_a_wide_batch_stops_once_the_plan_narrows_after_s3_fell_behind(
    env: dict[str, str], bucket: str, tmp_path: Path
) -> None:
    # A WIDE batch reads pieces peers hold; read to its end on a throttled origin it
    # took the origin from pieces nobody held (the s3-slows bench: 44 s). Once S3 has
    # fallen behind the plan's rate, a narrowed plan stops it at its next piece: S3's
    # byte counter then stands still. Before the change it went on at the throttle.
    manifest = put_artifact(env, bucket, tmp_path, PIECES * PIECE, PIECE)
    daemon = Daemon(Settings(home=tmp_path / "home"), "127.0.0.1", free_port())
    try:
        with FaultProxy(env["AWS_ENDPOINT_URL"], Faults(throttle_bps=128 << 10)) as proxy:
            artifact = daemon._add(manifest, tmp_path / "data" / "a.bin", None, {"peers", "s3"})
            artifact.client = S3Client(proxy.url)
            ih = manifest.info_hash
            daemon.take_plans({ih: {"stripe": [], "mode": "wide", "s3_estimate": 20e6}}, 60)
            reader = start_reader(daemon, artifact)
            time.sleep(3.0)  # the watch has judged 2 s of 128 KB/s against 20 MB/s
            assert artifact.s3_streamed.total > 0, "the WIDE batch read nothing"
            daemon.take_plans({ih: {"stripe": [], "mode": "stripe", "s3_estimate": 20e6}}, 60)
            time.sleep(3.0)  # the piece each GET was on (2 s at the throttle) ends
            before = artifact.s3_streamed.total
            time.sleep(2.0)
            after = artifact.s3_streamed.total
            artifact.cancel.set()
            reader.join(10)
        assert not reader.is_alive()
        assert after == before, (before, after)  # no S3 read since the batch stopped
        assert not artifact.complete_on_disk()  # it did stop, not finish
    finally:
        daemon.close()


def test_a_node_leaves_upload_only_when_all_is_taken_back_for_a_stripe_with_nothing_to_read(
    env: dict[str, str], bucket: str, tmp_path: Path
) -> None:
    # Under ALL a node reads from S3 past libtorrent, upload-only. The coordinator takes
    # ALL back for a stripe that gives this node nothing to read (every piece it lacks is
    # held by a peer): it must take from peers again and hand them what it read. It left
    # upload-only only with a batch to read, so it never did: the CI runs of
    # tests/fleet/test_s3_slows.py that timed out had all four nodes upload-only, every
    # piece held by one of them, and nobody reading anything for 200 s.
    with on_a_slow_s3_beside_a_holder(env, bucket, tmp_path) as setup:
        manifest, daemon, artifact, holder = setup
        ih = manifest.info_hash
        daemon.take_plans({ih: {"stripe": [], "mode": "all"}}, interval=60)
        reader = start_reader(daemon, artifact)
        state = daemon.session.torrents[ih]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (
            artifact.direct is None or len(artifact.direct.held()) < 2
        ):
            time.sleep(0.05)  # 2 s a piece at the throttle
        assert artifact.direct is not None and len(artifact.direct.held()) >= 2
        assert state.priorities.peers_finish is not None  # upload-only
        dial(daemon, ih, holder, deadline)
        read_under_all = set(artifact.direct.held())
        daemon.take_plans({ih: {"stripe": [], "mode": "stripe"}}, interval=60)
        reader.join(30)
        assert not reader.is_alive(), "the node stayed upload-only with nothing to read"
        assert artifact.complete_on_disk()
        assert hashlib.sha256(artifact.data_path.read_bytes()).hexdigest() == manifest.sha256
        assert state.priorities.peers_finish is None
        assert read_under_all <= state.held  # handed to libtorrent, not fetched again
        from_s3 = artifact.sink.bytes_by_source.get("s3", 0)
        assert from_s3 < PIECES * PIECE // 2, from_s3  # the rest came from the holder
