"""``swarm fetch`` reads pieces from S3 while the daemon it started comes up and hands them
over (:mod:`swarm.agent.earlyread`): against a real S3 server (moto) and a real daemon,
through its API as ``swarm fetch`` drives it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from swarm.agent import earlyread
from swarm.agent.client import DaemonClient, fetch_via_daemon
from swarm.agent.earlyread import EarlyRead
from swarm.agent.preread import ManifestPreread
from swarm.errors import SwarmError
from swarm.manifest import Manifest
from swarm.messages import FetchRequest, S3Read
from tests.conftest import SIZE
from tests.swarmnet import Swarm

PIECE = 1 << 20
HANDED_OVER = "read by swarm fetch while this daemon started, kept"


def manifest_text(env: dict[str, str]) -> str:
    text = ManifestPreread("index.db", env["SWARM_CATALOG"], env["AWS_ENDPOINT_URL"], None).result(
        10
    )
    assert text is not None
    return text


def request(env: dict[str, str], dest: Path, text: str, **fields: object) -> FetchRequest:
    return FetchRequest(
        source="index.db",
        dest=str(dest),
        catalog=env["SWARM_CATALOG"],
        endpoint_url=env["AWS_ENDPOINT_URL"],
        manifest=text,
        **fields,  # type: ignore[arg-type]
    )


def fetch(
    client: DaemonClient, request: FetchRequest, dest: Path, early: EarlyRead | None = None
) -> dict[str, Any]:
    """``request`` asked of the daemon and followed until DEST is verified, as ``swarm
    fetch`` does."""
    return fetch_via_daemon(
        client, request, dest, deadline=60, on_status=lambda _: None, early=early
    )


def assert_the_range(pieces: list[int]) -> None:
    """The early GET's range: an eighth of the 24 pieces (MAX_EARLY_SHARE), in a row, in
    the upper half."""
    assert len(pieces) == 3 and pieces[0] >= 12 and pieces == list(range(pieces[0], pieces[-1] + 1))


@pytest.fixture
def daemon(fleet: Swarm, env: dict[str, str], artifact: Path) -> tuple[Path, DaemonClient, str]:
    """A node's daemon (its info lines logged): its home, its client, and the artifact's
    manifest as ``swarm fetch`` reads it."""
    node = fleet.node(0)
    fleet.start_daemon(node, verbose=True)
    return node.home, DaemonClient(node.home), manifest_text(env)


def test_the_daemon_takes_the_pieces_read_while_it_started(
    daemon: tuple[Path, DaemonClient, str],
    env: dict[str, str],
    artifact: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    home, client, text = daemon
    monkeypatch.setattr(earlyread, "MIN_EARLY_SIZE", SIZE)  # (the artifact is a small one)
    early = EarlyRead(lambda: text, env["AWS_ENDPOINT_URL"], None)
    assert early.wait(60)
    pieces = early.claim()
    assert_the_range(pieces)
    assert early.s3_rtt is not None and early.s3_rtt < 0.02  # measured, and near
    dest = tmp_path / "out" / "index.db"
    dest.parent.mkdir()
    status = fetch(
        client, request(env, dest, text, early=tuple(pieces), s3_rtt=early.s3_rtt), dest, early
    )
    assert dest.read_bytes() == artifact.read_bytes()
    assert status["bytes_by_source"]["s3"] == SIZE
    log = (home / "daemon-started.log").read_text()
    assert f"index.db: {3 * PIECE / 1e6:.1f} MB {HANDED_OVER}" in log, log[-3000:]
    # its own reader read the rest, not those (they were named early and handed over)
    assert "S3 reads: stripe batches (plan), first of 8 pieces with 21 missing" in log, log


def test_the_read_goes_on_until_the_daemon_answers(
    daemon: tuple[Path, DaemonClient, str],
    env: dict[str, str],
    artifact: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The request names the GET's whole range while the GET is under way; once the
    daemon has answered, the piece in progress is the last, and the daemon reads the
    rest of the range itself. The GET is held (a gate in front of the real reads) after
    its first part, until the request is answered."""
    home, client, text = daemon
    monkeypatch.setattr(earlyread, "MIN_EARLY_SIZE", SIZE)
    real_read, gate, first = earlyread.read_exactly, threading.Event(), threading.Event()

    def gated_read(body: Any, view: memoryview, water: Any = None) -> memoryview:
        if first.is_set():
            assert gate.wait(30)
        got = real_read(body, view, water)
        first.set()
        return got

    monkeypatch.setattr(earlyread, "read_exactly", gated_read)
    early = EarlyRead(lambda: text, env["AWS_ENDPOINT_URL"], None)
    assert first.wait(30)
    pieces = early.claim()
    assert_the_range(pieces)  # the whole of it, its first piece still in progress
    assert early.s3_read is not None and 0 < early.s3_read.bytes < PIECE
    finish = early.finish

    def finish_then_go_on() -> None:  # the GET goes on once told the piece in progress is the last
        finish()
        gate.set()

    early.finish = finish_then_go_on  # type: ignore[method-assign]
    dest = tmp_path / "index.db"
    status = fetch(client, request(env, dest, text, early=tuple(pieces)), dest, early)
    assert dest.read_bytes() == artifact.read_bytes()
    assert status["bytes_by_source"]["s3"] == SIZE
    log = (home / "daemon-started.log").read_text()
    # the piece in progress at the answer came from the CLI, the other two from the daemon
    assert f"index.db: {PIECE / 1e6:.1f} MB {HANDED_OVER}" in log, log[-3000:]


def test_the_answer_to_a_request_naming_early_pieces_waits_for_the_plan(
    daemon: tuple[Path, DaemonClient, str], env: dict[str, str], tmp_path: Path
) -> None:
    """The CLI reads S3 until the daemon answers: answered at once, the downlink idled
    until the daemon's first GET."""
    _, client, text = daemon
    fields = {"early": (20, 21, 22)}
    status = client.call(
        "POST", "/v1/fetch", request(env, tmp_path / "index.db", text, **fields).to_json()
    )
    assert status["mode"] is not None or (status["s3_busy"] or 0) > 0, status
    client.call("POST", f"/v1/artifacts/{status['info_hash']}/early", {"bytes": 0, "seconds": 0})


def test_a_held_artifact_is_answered_at_once(
    fleet: Swarm, env: dict[str, str], artifact: Path, tmp_path: Path
) -> None:
    """A request naming early pieces for an artifact the daemon holds verified: no plan
    or S3 GET comes for it (here no coordinator), and the answer does not wait for one."""
    node = fleet.node(0)
    fleet.start_daemon(node, coordinator=False)
    client, text = DaemonClient(node.home), manifest_text(env)
    dest = tmp_path / "index.db"
    fetch(client, request(env, dest, text), dest)
    started = time.monotonic()
    status = client.call("POST", "/v1/fetch", request(env, dest, text, early=(20,)).to_json())
    assert status["complete"] and time.monotonic() - started < earlyread.ANSWER_WAIT / 2


@pytest.mark.usefixtures("fleet")  # (the catalog it publishes to)
def test_no_early_read_of_a_small_artifact(env: dict[str, str]) -> None:
    """Under ``MIN_EARLY_SIZE`` the fleet's first stripes cover the pieces it would read."""
    assert SIZE < earlyread.MIN_EARLY_SIZE
    text = manifest_text(env)
    early = EarlyRead(lambda: text, env["AWS_ENDPOINT_URL"], None)
    assert early.wait(10)
    assert early.claim() == [] and early.s3_rtt is None and early.s3_read is None


def test_a_bad_piece_is_refused_and_read_again(
    daemon: tuple[Path, DaemonClient, str], env: dict[str, str], artifact: Path, tmp_path: Path
) -> None:
    home, client, text = daemon
    info_hash = Manifest.loads(text.encode()).info_hash
    dest = tmp_path / "index.db"
    status = client.call("POST", "/v1/fetch", request(env, dest, text, early=(5,)).to_json())
    path = f"/v1/artifacts/{status['info_hash']}"
    assert status["info_hash"] == info_hash
    # the right length, the wrong bytes: libtorrent's SHA-1 check refuses it
    assert client.call("PUT", f"{path}/pieces/5", data=bytes(PIECE)) == {"kept": False}
    with pytest.raises(SwarmError, match=r"piece 6 of index\.db is 1048576 bytes, not 3"):
        client.call("PUT", f"{path}/pieces/6", data=b"abc")
    with pytest.raises(SwarmError, match=r"no piece '24' in index\.db"):
        client.call("PUT", f"{path}/pieces/24", data=bytes(PIECE))
    with pytest.raises(SwarmError, match="holds no such artifact"):
        client.call("PUT", f"/v1/artifacts/{'0' * 40}/pieces/0", data=bytes(PIECE))
    with pytest.raises(SwarmError, match="an S3 read is"):
        client.call("POST", f"{path}/early", {"bytes": -1, "seconds": 0.1})
    client.call("POST", f"{path}/early", {"bytes": 0, "seconds": 0.0})
    status = client.call("GET", f"{path}?wait=5", timeout=30)
    for _ in range(10):
        if status["complete"]:
            break
        status = client.call("GET", f"{path}?wait=5", timeout=30)
    assert status["complete"] and status["hash_failures"] == 1
    assert dest.read_bytes() == artifact.read_bytes()
    assert "index.db: 0.0 MB " + HANDED_OVER in (home / "daemon-started.log").read_text()


def test_pieces_never_handed_over_are_read_by_the_daemon(
    daemon: tuple[Path, DaemonClient, str], env: dict[str, str], artifact: Path, tmp_path: Path
) -> None:
    """A CLI that names pieces and dies: the daemon reads them itself once the wait ends.
    The round trip it was told (500 ms) is the one it goes by, and the fetch began with
    the CLI's GET (its seconds count in the fetch's: the coordinator's cohort start), and
    its bytes are reported as the early read's."""
    home, client, text = daemon
    dest = tmp_path / "index.db"
    every = tuple(range(SIZE // PIECE))
    read = S3Read(2 * PIECE, 30.0)
    status = fetch(client, request(env, dest, text, early=every, s3_rtt=0.5, s3_read=read), dest)
    assert dest.read_bytes() == artifact.read_bytes()
    assert status["seconds"] < 30  # this command's own wait
    held = client.call("GET", f"/v1/artifacts/{status['info_hash']}")
    assert held["seconds"] >= 30  # the daemon's: from the CLI's GET
    assert held["s3_early"] == 2 * PIECE  # reported: S3 bytes that were no stripe
    # and counted as the S3 reader's: its bytes and seconds (the coordinator's S3 rate)
    assert held["s3_streamed"] >= SIZE + 2 * PIECE and held["s3_busy"] >= 30
    log = (home / "daemon-started.log").read_text()
    assert "S3 is 500 ms away" in log, log[-3000:]
    assert HANDED_OVER not in log


def test_the_early_read_is_in_s3_counters_before_the_s3_reader_runs(
    daemon: tuple[Path, DaemonClient, str], env: dict[str, str], tmp_path: Path
) -> None:
    """What the CLI's GET streamed is in the status (the node's report) from the first
    one on, whether or not the daemon's S3 reader has started: here it never does (the
    fetch names peers alone). Left out until that reader's task, the GET's bytes came
    within one report interval and the coordinator took S3 for faster than the links."""
    _, client, text = daemon
    read = S3Read(2 * PIECE, 1.5)
    fields = {"sources": ("peers",), "s3_read": read}
    status = client.call(
        "POST", "/v1/fetch", request(env, tmp_path / "x", text, **fields).to_json()
    )
    assert status["s3_streamed"] == 2 * PIECE and status["s3_busy"] == 1.5
    assert status["s3_early"] == 2 * PIECE
