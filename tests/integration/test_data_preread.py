"""``swarm fetch`` reads the artifact's pieces from S3 while the daemon it starts comes up,
into a staging file in the node's home, and the daemon takes them (checked) with the
fetch request (swarm.agent.preread): against a real S3 server (moto) and real daemons."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from swarm.agent.client import DaemonClient
from swarm.agent.preread import DataPreread, ManifestPreread, staging_dir, sweep
from swarm.errors import SwarmError, UsageError
from swarm.manifest import Manifest
from swarm.messages import FetchRequest
from tests.conftest import SIZE
from tests.servers import wait_until
from tests.swarmnet import Swarm, done_event

PIECE = 1 << 20


def _manifest(artifact: Path, catalog: str, endpoint: str) -> Manifest:
    text = ManifestPreread("index.db", catalog, endpoint, None).result(10)
    assert text is not None
    return Manifest.loads(text.encode())


def test_pieces_read_ahead_land_at_their_offsets(
    env: dict[str, str], artifact: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    endpoint = env["AWS_ENDPOINT_URL"]
    manifest = ManifestPreread("index.db", env["SWARM_CATALOG"], endpoint, None)
    preread = DataPreread(manifest, home, endpoint, None)
    wait_until(lambda: len(preread.done) == SIZE // PIECE, 30, "every piece read ahead")
    staged = preread.finish()
    assert staged is not None
    path, pieces = staged
    assert pieces == tuple(range(SIZE // PIECE))
    assert Path(path).parent == staging_dir(home)
    assert Path(path).read_bytes() == artifact.read_bytes()
    preread.discard()
    assert not Path(path).exists()


def test_nothing_is_read_ahead_for_an_artifact_the_home_records(
    env: dict[str, str], artifact: Path, tmp_path: Path
) -> None:
    """The daemon resumes what its home records; reading it ahead would be for nothing."""
    home = tmp_path / "home"
    endpoint, catalog = env["AWS_ENDPOINT_URL"], env["SWARM_CATALOG"]
    info_hash = _manifest(artifact, catalog, endpoint).info_hash
    (home / "artifacts").mkdir(parents=True)
    (home / "artifacts" / f"{info_hash}.swarm").write_text("{}")
    manifest = ManifestPreread("index.db", catalog, endpoint, None)
    preread = DataPreread(manifest, home, endpoint, None)
    assert preread.finish(wait=10) is None
    assert not staging_dir(home).exists()


def test_the_daemon_keeps_the_staged_pieces_that_pass_their_check(
    fleet: Swarm, artifact: Path, tmp_path: Path
) -> None:
    node = fleet.node(0)
    fleet.start_daemon(node)
    manifest = _manifest(artifact, fleet.env["SWARM_CATALOG"], fleet.env["AWS_ENDPOINT_URL"])
    staging_dir(node.home).mkdir()
    staged = staging_dir(node.home) / f"{manifest.info_hash}.{os.getpid()}"
    original = artifact.read_bytes()
    with staged.open("wb") as out:
        out.write(original[: 2 * PIECE])  # pieces 0 and 1 as published
        out.write(bytes(PIECE))  # piece 2: zeros, not the artifact's
    dest = tmp_path / "out.db"
    client = DaemonClient(node.home)
    # peers only: nothing reads S3 but the staging file, so its count is exact
    request = FetchRequest(
        source="index.db",
        dest=str(dest),
        sources=("peers",),
        preread=str(staged),
        preread_pieces=(0, 1, 2),
    )
    status = client.call("POST", "/v1/fetch", request.to_json(), timeout=30)
    assert status["bytes_by_source"].get("s3") == 2 * PIECE, status
    log = (node.home / "daemon-started.log").read_text()
    assert "piece 2 failed its hash check" in log, log[-2000:]
    # the rest from S3: DEST is the published artifact, the staged pieces in it
    done_event(node.fetch("index.db", dest, "--source", "s3"), timeout=60)
    assert hashlib.sha256(dest.read_bytes()).digest() == hashlib.sha256(original).digest()


def test_the_daemon_reads_no_staging_file_outside_its_home(
    fleet: Swarm, artifact: Path, tmp_path: Path
) -> None:
    node = fleet.node(0)
    fleet.start_daemon(node)
    manifest = _manifest(artifact, fleet.env["SWARM_CATALOG"], fleet.env["AWS_ENDPOINT_URL"])
    elsewhere = tmp_path / f"{manifest.info_hash}.{os.getpid()}"
    elsewhere.write_bytes(artifact.read_bytes())
    request = FetchRequest(
        source="index.db",
        dest=str(tmp_path / "out.db"),
        sources=("peers",),
        preread=str(elsewhere),
        preread_pieces=(0,),
    )
    with pytest.raises(SwarmError) as refused:
        DaemonClient(node.home).call("POST", "/v1/fetch", request.to_json(), timeout=30)
    assert refused.value.exit_code == UsageError.exit_code
    assert "not a staging file" in str(refused.value)


def test_a_fresh_node_leaves_no_staging_file_behind(
    fleet: Swarm, artifact: Path, tmp_path: Path
) -> None:
    node = fleet.node(0)
    dest = tmp_path / "out.db"
    done_event(node.fetch("index.db", dest), timeout=60)
    assert dest.read_bytes() == artifact.read_bytes()
    assert list(staging_dir(node.home).iterdir()) == []


def test_sweep_removes_the_staging_files_of_fetches_that_are_gone(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])  # a pid that has ended
    dead.wait()
    folder = tmp_path / "preread"
    folder.mkdir()
    live = folder / f"{'a' * 40}.{os.getpid()}"
    stale = folder / f"{'b' * 40}.{dead.pid}"
    other = folder / "notes.txt"
    for path in (live, stale, other):
        path.write_text("x")
    sweep(folder)
    assert live.exists() and other.exists() and not stale.exists()


def test_a_request_with_bad_preread_pieces_is_refused() -> None:
    body = json.loads(json.dumps(FetchRequest(source="index.db").to_json()))
    body["preread_pieces"] = ["0"]
    with pytest.raises(UsageError, match="preread_pieces must be integers"):
        FetchRequest.from_json(body)
    body["preread_pieces"] = [3, 1]
    assert FetchRequest.from_json(body).preread_pieces == (3, 1)
