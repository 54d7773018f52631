"""A node's daemon through S3 outages and denials, and with its disk at 1.3x the artifact
(issue "Node data path"). Real daemons, real libtorrent, moto behind a fault proxy."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from swarm.agent.client import DaemonClient
from swarm.errors import SwarmError
from tests.conftest import SIZE
from tests.servers import FaultProxy, Faults, wait_until
from tests.swarmnet import Swarm, done_event, running

OUTAGE = 90.0
"""Seconds S3 refuses every body read with 503 SlowDown (throttling during a large
scale-out lasts about a minute; botocore's own retries cover ~25 s)."""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def lone_node(swarm: Swarm, endpoint: str, index: int = 0):
    """A node with no coordinator (and so no peers): S3 is its only way to the bytes."""
    node = swarm.node(index)
    node.env.pop("SWARM_COORDINATOR", None)
    node.env["AWS_ENDPOINT_URL"] = endpoint
    return node


def test_daemon_fetch_survives_a_90s_s3_outage_and_serves_a_second_dest(env, artifact, tmp_path):
    faults = Faults(fail_ranged_status=503)
    with FaultProxy(env["AWS_ENDPOINT_URL"], faults) as proxy, Swarm(tmp_path / "s", env) as swarm:
        (tmp_path / "s").mkdir()
        node = lone_node(swarm, proxy.url)
        started = time.monotonic()
        first = node.fetch("index.db", tmp_path / "first.db")
        # The outage is seen: the daemon says what S3 answers instead of sitting at 0.
        wait_until(
            lambda: any("503" in str(a.get("waiting", {}).get("s3", "")) for a in node.artifacts()),
            OUTAGE,
            "the daemon to report S3's 503s",
        )
        assert first.poll() is None  # still fetching, not failed
        wait_until(lambda: time.monotonic() - started >= OUTAGE, OUTAGE + 5, "the outage")
        faults.fail_ranged_status = 0  # S3 recovers; the same daemon must finish
        pid = node.daemon_pid()
        done = done_event(first, 120)
        assert node.daemon_pid() == pid  # no restart
        assert done["bytes_by_source"]["s3"] == SIZE
        assert sha256(tmp_path / "first.db") == sha256(artifact)
        second = done_event(node.fetch("index.db", tmp_path / "second.db"), 60)
        assert sha256(tmp_path / "second.db") == second["sha256"] == sha256(artifact)
        assert faults.failed > 0


def test_403_on_the_object_and_no_peers_exits_4_within_90s(env, artifact, tmp_path):
    faults = Faults(fail_ranged_status=403)
    with FaultProxy(env["AWS_ENDPOINT_URL"], faults) as proxy, Swarm(tmp_path / "s", env) as swarm:
        (tmp_path / "s").mkdir()
        node = lone_node(swarm, proxy.url)
        started = time.monotonic()
        process = node.fetch("index.db", tmp_path / "denied.db")
        _out, err = process.communicate(timeout=90)
        assert time.monotonic() - started < 90
        assert process.returncode == 4, err
        assert "s3:GetObject" in err and "no source can complete" in err
        assert not (tmp_path / "denied.db").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tmpfs")
def test_one_copy_on_disk_fetch_and_seed_from_a_tmpfs_of_1_3x(fleet, artifact, tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    size = int(SIZE * 1.3)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], check=True)
    try:
        node = fleet.node(0)
        node.home = mnt / "home"
        node.env["SWARM_HOME"] = str(node.home)
        dest = mnt / "index.db"
        done_event(node.fetch("index.db", dest), 120)
        assert sha256(dest) == sha256(artifact)
        assert dest.stat().st_mode & 0o777 == 0o444  # read-only: the daemon serves it
        used = sum(f.stat().st_blocks * 512 for f in mnt.rglob("*") if f.is_file())
        assert used < size
        assert not any(p.name.endswith(".swarm-part") for p in mnt.iterdir())
        status = node.artifacts()[0]
        assert status["path"] == str(dest) and status["state"] == "seeding"

        # Another node that may use peers only gets every byte from DEST.
        other = fleet.node(1)
        done = done_event(other.fetch("index.db", tmp_path / "other.db", "--source", "peers"), 120)
        assert done["bytes_by_source"]["peers"] >= SIZE and done["bytes_by_source"]["s3"] == 0
        assert sha256(tmp_path / "other.db") == sha256(artifact)
    finally:
        fleet.stop()  # the daemon holds files on the tmpfs
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_deleted_dest_is_no_longer_seeded(fleet, artifact, tmp_path):
    node = fleet.node(0)
    dest = tmp_path / "seeded.db"
    done = done_event(node.fetch("index.db", dest), 120)
    dest.unlink()
    wait_until(lambda: node.artifacts() == [], 15, "the daemon to stop seeding a deleted DEST")
    log = (node.home / "daemon.log").read_text()
    assert "stopped seeding index.db" in log and "was deleted" in log
    # A fetch still following it (its status path) is told why, with DEST busy's code.
    with pytest.raises(SwarmError) as dropped:
        DaemonClient(node.home).call("GET", f"/v1/artifacts/{done['info_hash']}")
    assert dropped.value.exit_code == 8
    assert f"stopped serving index.db before this fetch returned: {dest} was deleted" in str(
        dropped.value
    )
    # The node fetches it again on request.
    done_event(node.fetch("index.db", dest), 120)
    assert sha256(dest) == sha256(artifact)


def test_dest_rewritten_in_place_is_not_reported_complete(fleet, artifact, tmp_path):
    """Same inode, other bytes (``cp other DEST`` writes into the file; a deleted file's
    inode number is also reused for the next file created): not the file verified."""
    node = fleet.node(62)
    dest = tmp_path / "rewritten.db"
    done_event(node.fetch("index.db", dest), 120)
    before = dest.stat()
    with dest.open("r+b") as f:  # root writes through DEST's read-only mode
        head = f.read(1 << 20)
        f.seek(0)
        f.write(bytes(255 - byte for byte in head))  # same size, other bytes
    assert (dest.stat().st_ino, dest.stat().st_size) == (before.st_ino, before.st_size)
    done = done_event(node.fetch("index.db", dest), 120)
    assert done["bytes_by_source"]["s3"] + done["bytes_by_source"]["peers"] > 0  # fetched again
    assert sha256(dest) == sha256(artifact)
    assert "was replaced by another file" in (node.home / "daemon.log").read_text()


def test_copy_gives_a_private_writable_dest_and_a_second_dest_is_a_copy(fleet, artifact, tmp_path):
    node = fleet.node(60)
    first, second = tmp_path / "private.db", tmp_path / "second.db"
    done_event(node.fetch("index.db", first, "--copy"), 120)
    assert first.stat().st_mode & 0o777 == 0o644  # the application may write to it
    (status,) = node.artifacts()
    assert Path(status["path"]) != first and status["state"] == "seeding"  # its own copy
    with first.open("r+b") as f:  # writing the private copy does not touch what is seeded
        f.write(b"\0" * 16)
    done_event(node.fetch("index.db", second), 60)
    assert sha256(second) == sha256(artifact) == sha256(Path(status["path"]))


def test_dest_replaced_while_the_daemon_was_stopped_is_not_seeded(fleet, artifact, tmp_path):
    node = fleet.node(61)
    dest = tmp_path / "held.db"
    done_event(node.fetch("index.db", dest), 120)
    pid = node.daemon_pid()
    assert pid
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not running(pid), 15, "the daemon to stop")
    dest.unlink()
    dest.write_bytes(b"the application's own file")  # another file at DEST meanwhile
    fleet.start_daemon(node)
    assert node.artifacts() == []  # restored before the API answered: nothing to seed
    assert (
        "was replaced while the daemon was stopped"
        in (node.home / "daemon-started.log").read_text()
    )
    assert dest.read_bytes() == b"the application's own file"  # and left alone
