"""The daemon's libtorrent session (swarm.sources.peers.TorrentSession) on its own: pieces
handed to it, pieces held back from peers while S3 reads them."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import libtorrent as lt
import pytest

from swarm.agent.downloadqueue import partly_received
from swarm.agent.hybrid import TorrentSink
from swarm.agent.origin import writing_directly
from swarm.agent.registry import Artifact
from swarm.manifest import Manifest
from swarm.sources.peers import TorrentSession
from swarm.sources.torrentstate import CHECKING, TorrentState
from tests.conftest import make_artifact

PIECE = 256 << 10
PIECES = 8


def _artifact(tmp_path: Path) -> tuple[Path, Manifest]:
    """A PIECES-piece file and its manifest."""
    src = make_artifact(tmp_path / "a.bin", PIECES * PIECE)
    return src, Manifest.from_file(
        src, name="a.bin", piece_size=PIECE, bucket="b", key="a.bin", web_seed=None
    )


def _settles(state: TorrentState, priorities: list[int], upload_mode: bool | None = None) -> None:
    """Wait until libtorrent's piece priorities (and upload mode, if given) are these."""
    deadline = time.monotonic() + 5
    while True:
        now = (
            list(state.handle.get_piece_priorities()),
            bool(state.handle.flags() & lt.torrent_flags.upload_mode),
        )
        if now[0] == priorities and upload_mode in (None, now[1]):
            return
        assert time.monotonic() < deadline, now
        time.sleep(0.02)


@pytest.fixture
def session(tmp_path: Path) -> Iterator[TorrentSession]:
    session = TorrentSession("127.0.0.1", 0, tmp_path / "resume")
    try:
        yield session
    finally:
        session.close()


def test_a_torrent_finishes_only_once_pieces_held_back_from_peers_are_in(
    session: TorrentSession, tmp_path: Path
) -> None:
    # libtorrent calls a torrent finished once it holds every piece it *wants*: a piece
    # held back (priority 0) while S3 reads it is not wanted. The file must not count as
    # complete (and be hashed) before that piece is in it.
    src, manifest = _artifact(tmp_path)
    data = src.read_bytes()
    piece = [data[i * PIECE : (i + 1) * PIECE] for i in range(PIECES)]
    state = session.add(manifest, tmp_path / "data.bin", [])
    info_hash = manifest.info_hash
    session.hold_back(info_hash, [0], True)
    for index in range(1, PIECES):
        # (30 s: a loaded CI machine once took more than 10 for one piece)
        assert session.add_piece_async(info_hash, index, piece[index]).result(30)
    deadline = time.monotonic() + 1.5  # libtorrent's finished alert comes within this
    while time.monotonic() < deadline:
        assert not state.finished.is_set(), "finished with piece 0 missing"
        time.sleep(0.05)
    assert session.add_piece_async(info_hash, 0, piece[0]).result(10)
    assert state.finished.wait(10)
    session.hold_back(info_hash, [0], False)  # as the reader does after its batch
    got = (tmp_path / "data.bin").read_bytes()
    assert hashlib.sha256(got).hexdigest() == manifest.sha256


def test_pieces_handed_over_while_libtorrent_checks_the_file_are_kept(
    session: TorrentSession, tmp_path: Path
) -> None:
    # libtorrent drops a piece handed to it while it checks the torrent's file (no alert,
    # no error): a loaded CI machine was still checking a new torrent when the first
    # pieces came, and the reader waited out its timeout. The session keeps them until
    # the check ends. A stale 256 MiB file at the data path makes the check last (~0.25 s
    # here).
    piece_size, count, handed = 1 << 20, 256, 8
    src = make_artifact(tmp_path / "big.bin", piece_size * count)
    manifest = Manifest.from_file(
        src, name="big.bin", piece_size=piece_size, bucket="b", key="big.bin", web_seed=None
    )
    with (tmp_path / "data.bin").open("wb") as stale:
        stale.truncate(piece_size * count)
    with src.open("rb") as source:
        pieces = [source.read(piece_size) for _ in range(handed)]
    state = session.add(manifest, tmp_path / "data.bin", [])
    futures = [
        session.add_piece_async(manifest.info_hash, index, pieces[index]) for index in range(handed)
    ]
    assert state.handle.status().state in CHECKING, "the check ended before the pieces came"
    assert all(future.result(30) for future in futures)
    assert all(state.has(index) for index in range(handed))


def test_pieces_held_back_at_a_restart_are_wanted_again(tmp_path: Path) -> None:
    # A daemon stopped while its S3 reader held pieces back saves their priority 0 in the
    # resume data; the next daemon must want them from peers again.
    _, manifest = _artifact(tmp_path)
    first = TorrentSession("127.0.0.1", 0, tmp_path / "resume")
    try:
        first.add(manifest, tmp_path / "data.bin", [])
        first.hold_back(manifest.info_hash, [0, 1], True)
        time.sleep(0.2)  # the priorities reach libtorrent's thread
    finally:
        first.close()  # saves resume data
    assert list((tmp_path / "resume").glob("*.resume"))
    second = TorrentSession("127.0.0.1", 0, tmp_path / "resume")
    try:
        state = second.add(manifest, tmp_path / "data.bin", [])
        assert list(state.handle.get_piece_priorities()) == [4] * PIECES
    finally:
        second.close()


def test_a_piece_kept_from_peers_for_two_reasons_comes_again_once_both_end(
    session: TorrentSession, tmp_path: Path
) -> None:
    # The S3 reader's hold and the other new nodes' share of the seeders' pieces
    # (swarm.agent.seedershare), both priority 0, each end on their own.
    _, manifest = _artifact(tmp_path)
    state = session.add(manifest, tmp_path / "data.bin", [])
    ih = manifest.info_hash

    session.hold_back(ih, [0, 1], True)
    session.leave_to_owners(ih, {1, 2})
    _settles(state, [0, 0, 0, 4, 4, 4, 4, 4])
    session.hold_back(ih, [0, 1], False)  # S3 brought them: the owners' 1 and 2 stay
    _settles(state, [4, 0, 0, 4, 4, 4, 4, 4])
    session.leave_to_owners(ih, {2, 3})  # 1 held by a new node now, 3 newly another's
    _settles(state, [4, 4, 0, 0, 4, 4, 4, 4])
    session.leave_to_owners(ih, set())
    _settles(state, [4] * PIECES)


def test_a_connection_the_member_filter_refuses_is_reported(tmp_path: Path) -> None:
    # A node that joined since this one's last report is refused by its peer filter; the
    # daemon reports at once on it (Membership.refused) to learn the new member.
    src, manifest = _artifact(tmp_path)
    holder = TorrentSession("127.0.0.1", 0, tmp_path / "holder")
    newcomer = TorrentSession("127.0.0.2", 0, tmp_path / "newcomer")
    refused: list[str] = []
    holder.on_blocked = refused.append
    try:
        holder.admit_only(["127.0.0.1"])  # the members it knows: itself
        holder.add(manifest, src, [], seed_mode=True)
        state = newcomer.add(manifest, tmp_path / "data.bin", [])
        deadline = time.monotonic() + 10
        while not refused and time.monotonic() < deadline:
            state.handle.connect_peer(("127.0.0.1", holder.listen_port))
            time.sleep(0.2)
        assert refused and set(refused) == {"127.0.0.2"}
    finally:
        newcomer.close()
        holder.close()


def test_the_peers_a_plan_names_are_dialled_without_the_tracker(tmp_path: Path) -> None:
    # A new node's first plan names the nodes fetching beside it (OriginPlan.peers): its
    # session connects to them at once, with no tracker configured at all here.
    _, manifest = _artifact(tmp_path)
    first = TorrentSession("127.0.0.1", 0, tmp_path / "first")
    second = TorrentSession("127.0.0.2", 0, tmp_path / "second")
    try:
        first.add(manifest, tmp_path / "first.bin", [])
        state = second.add(manifest, tmp_path / "second.bin", [])
        second.dial(manifest.info_hash, (("127.0.0.1", first.listen_port),))
        second.dial("00" * 20, (("127.0.0.1", first.listen_port),))  # no such torrent
        deadline = time.monotonic() + 5
        while not state.handle.get_peer_info() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [p.ip[0] for p in state.handle.get_peer_info()] == ["127.0.0.1"]
    finally:
        second.close()
        first.close()


def test_the_s3_reader_sees_the_check_end_without_waiting_for_a_status_alert(
    session: TorrentSession, tmp_path: Path
) -> None:
    # A lone node's S3 reader writes the file itself once libtorrent has looked at it.
    # The alert loop's first status after the add often left the torrent out, and the
    # next came STATUS_INTERVAL (0.5 s) later: the reader must ask the handle instead.
    _, manifest = _artifact(tmp_path)
    state = session.add(manifest, tmp_path / "data.bin", [])
    deadline = time.monotonic() + 10
    while state.handle.status().state in CHECKING and time.monotonic() < deadline:
        time.sleep(0.02)
    state.status = None  # no status from the alert loop yet
    artifact = Artifact(manifest, TorrentSink(session, manifest), tmp_path / "data.bin")
    direct = writing_directly(artifact, state)
    assert direct is not None and artifact.direct is direct
    direct.close()


def test_a_node_whose_missing_pieces_are_all_held_keeps_its_seeders(tmp_path: Path) -> None:
    # Every piece the newcomer lacks at priority 0 (held for S3, left to their owners):
    # libtorrent calls the torrent finished, and with its default settings
    # (close_redundant_connections) closed a seeder's connection as redundant, here as
    # soon as it was made. Once the pieces are wanted again they come over the same
    # connection, with no reconnect.
    src, manifest = _artifact(tmp_path)
    holder = TorrentSession("127.0.0.1", 0, tmp_path / "holder")
    newcomer = TorrentSession("127.0.0.2", 0, tmp_path / "newcomer")
    try:
        holder.add(manifest, src, [], seed_mode=True)
        state = newcomer.add(manifest, tmp_path / "data.bin", [])
        info_hash = manifest.info_hash
        newcomer.hold_back(info_hash, list(range(PIECES)), True)
        newcomer.dial(info_hash, (("127.0.0.1", holder.listen_port),))
        deadline = time.monotonic() + 10
        while not state.handle.get_peer_info() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert state.handle.get_peer_info(), "never connected to the seeder"
        deadline = time.monotonic() + 10
        while not state.handle.status().is_finished and time.monotonic() < deadline:
            time.sleep(0.02)
        assert state.handle.status().is_finished  # nothing wanted
        time.sleep(1.5)  # libtorrent closes redundant connections at once, if it does
        assert [p.ip[0] for p in state.handle.get_peer_info()] == ["127.0.0.1"]
        newcomer.hold_back(info_hash, list(range(PIECES)), False)
        assert state.finished.wait(10)
        assert state.handle.status().num_peers == 1
    finally:
        newcomer.close()
        holder.close()


def test_upload_only_lets_libtorrent_finish_only_the_pieces_peers_partly_sent(
    session: TorrentSession, tmp_path: Path
) -> None:
    # ALL: the S3 reader brings every missing piece; pieces peers had partly sent are
    # completed by libtorrent (upload mode alone cancels their remaining blocks, and the
    # reader fetches them whole), every other piece is priority 0.
    _, manifest = _artifact(tmp_path)
    state = session.add(manifest, tmp_path / "data.bin", [])
    ih = manifest.info_hash

    session.hold_back(ih, [5], True)  # a stripe's hold outlives the ALL
    session.upload_only(ih, True, {2, 3})
    _settles(state, [0, 0, 4, 4, 0, 0, 0, 0], upload_mode=False)
    session.upload_only(ih, False)
    _settles(state, [4, 4, 4, 4, 4, 0, 4, 4], upload_mode=False)
    session.upload_only(ih, True)  # nothing partly sent: upload mode alone
    _settles(state, [0] * PIECES, upload_mode=True)
    session.upload_only(ih, False)
    session.hold_back(ih, [5], False)
    _settles(state, [4] * PIECES, upload_mode=False)


def test_pieces_whose_blocks_landed_after_the_cancel_are_finished_by_libtorrent_too(
    session: TorrentSession, tmp_path: Path
) -> None:
    # ALL with nothing partly sent: upload mode; blocks that were on their way land
    # after its cancels, and those pieces are then libtorrent's to complete as well.
    _, manifest = _artifact(tmp_path)
    state = session.add(manifest, tmp_path / "data.bin", [])
    ih = manifest.info_hash

    session.upload_only(ih, True)
    _settles(state, [0] * PIECES, upload_mode=True)
    session.finish_from_peers(ih, {1, 6})
    _settles(state, [0, 4, 0, 0, 0, 0, 4, 0], upload_mode=False)
    session.upload_only(ih, False)
    _settles(state, [4] * PIECES, upload_mode=False)
    session.finish_from_peers(ih, {2})  # after ALL: nothing to do
    _settles(state, [4] * PIECES, upload_mode=False)


def test_partly_received_pieces_are_those_with_a_block_in() -> None:
    def piece(index: int, states: list[int]) -> dict[str, Any]:
        return {"piece_index": index, "blocks": [{"state": s} for s in states]}

    queue = [piece(0, [1, 1]), piece(1, [3, 1]), piece(2, [2, 0]), piece(3, [0, 0])]
    assert partly_received(queue) == {1, 2}
