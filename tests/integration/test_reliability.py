"""Reliability on loopback: corrupt peers, kill -9 of the daemon, untrusted resume data,
a full disk. Real daemons, real libtorrent, a real S3 server."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import SIZE
from tests.integration.test_swarm import FETCH_TIMEOUT
from tests.servers import FaultProxy, Faults, wait_until
from tests.swarmnet import Node, done_event, running

MiB = 1 << 20
PIECE = 1 * MiB  # the default piece size for SIZE


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stop_daemon(node: Node, sig: int = signal.SIGTERM) -> None:
    pid = node.daemon_pid()
    assert pid
    os.kill(pid, sig)
    wait_until(lambda: not running(pid), 30, f"daemon {pid} to exit")


def data_file(node: Node) -> Path:
    """The file the node's daemon seeds (its record under artifacts/: DEST, one copy)."""
    (record,) = (node.home / "artifacts").glob("*.json")
    return Path(json.loads(record.read_text())["path"])


def corrupt(path: Path, pieces: list[int]) -> None:
    """Flip a byte in each of ``pieces`` as a failing disk would: silently, the file's
    mtime unchanged (a file visibly rewritten is not seeded at all after a restart)."""
    before = path.stat()
    with path.open("r+b") as f:
        for index in pieces:
            f.seek(index * PIECE + 100)
            byte = f.read(1)
            f.seek(index * PIECE + 100)
            f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_corrupt_peer_is_banned_and_no_corrupt_byte_reaches_dest(fleet, artifact, tmp_path):
    good, bad = fleet.node(0), fleet.node(1)
    for node in (good, bad):
        done_event(node.fetch("index.db", tmp_path / f"{node.name}.db"), FETCH_TIMEOUT)
    stop_daemon(good)
    stop_daemon(bad)  # a clean stop: its resume data will be trusted, so it claims all
    corrupt(data_file(bad), list(range(0, SIZE // PIECE, 2)))
    fleet.start_daemon(bad)  # now a peer that serves wrong data for half the pieces

    new = fleet.node(2)
    process = new.fetch("index.db", tmp_path / "new.db", "--source", "peers")
    wait_until(
        lambda: new.artifacts() and new.artifacts()[0]["peers_banned"] >= 1,
        60,
        "the corrupt peer to be banned",
    )
    fleet.start_daemon(good)  # an honest seeder comes back: the fetch can finish
    done = done_event(process, FETCH_TIMEOUT)
    status = new.artifacts()[0]
    assert status["peer_hash_failures"] >= 1 and status["peers_banned"] >= 1
    assert status["peer_hash_failures"] <= SIZE // PIECE  # bounded: banned, not retried
    assert done["bytes_by_source"]["s3"] == 0
    assert sha256(tmp_path / "new.db") == sha256(artifact)


def test_kill_9_daemon_20_times_then_the_fetch_finishes(fleet, artifact, env, tmp_path):
    rng = random.Random(20)
    kills = 0
    # A slow origin (3 MiB/s): the fetch lasts long enough for 20 kills at random points.
    with FaultProxy(env["AWS_ENDPOINT_URL"], Faults(throttle_bps=3 * MiB)) as proxy:
        node = fleet.node(0)
        node.env["AWS_ENDPOINT_URL"] = proxy.url
        dest = tmp_path / "dest.db"
        while kills < 20:
            process = node.fetch("index.db", dest)
            wait_until(lambda: node.daemon_pid() is not None and node.artifacts(), 30, "daemon")
            delay = rng.uniform(0.05, 0.8)
            with pytest.raises(subprocess.TimeoutExpired):
                process.wait(delay)  # the fetch must still be running when we strike
            pid = node.daemon_pid()
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            kills += 1
            wait_until(lambda pid=pid: not running(pid), 30, "daemon death")
            process.kill()
            process.wait(10)
            (node.home / "daemon.pid").unlink(missing_ok=True)
            assert not dest.exists()  # never half-written
        done_event(node.fetch("index.db", dest), FETCH_TIMEOUT)
    assert sha256(dest) == sha256(artifact)


def test_resume_data_is_not_trusted_after_an_unclean_stop(fleet, artifact, tmp_path):
    node = fleet.node(0)
    done_event(node.fetch("index.db", tmp_path / "first.db"), FETCH_TIMEOUT)
    stop_daemon(node)  # clean: resume data says "all pieces"
    fleet.start_daemon(node)
    stop_daemon(node, signal.SIGKILL)  # unclean
    corrupt(data_file(node), [3, 7])  # the disk lost two pieces' writes
    (node.home / "daemon.pid").unlink(missing_ok=True)
    dest = tmp_path / "again.db"
    done = done_event(node.fetch("index.db", dest), FETCH_TIMEOUT)
    assert sha256(dest) == sha256(artifact)
    assert done["bytes_by_source"]["s3"] >= 2 * PIECE  # the two pieces were fetched again


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tmpfs")
def test_full_dest_fails_fast_with_exit_6_and_resumes_after_space_is_freed(
    fleet,
    artifact,
    tmp_path,
):
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE // 2}", "tmpfs", str(mnt)], check=True
    )
    try:
        node = fleet.node(0)
        process = node.fetch("index.db", mnt / "index.db")
        _, err = process.communicate(timeout=60)
        assert process.returncode == 6, err
        assert "ENOSPC" in err
        assert not (mnt / "index.db").exists()
        subprocess.run(["mount", "-o", f"remount,size={SIZE * 2}", str(mnt)], check=True)
        done_event(node.fetch("index.db", mnt / "index.db"), FETCH_TIMEOUT)
        assert sha256(mnt / "index.db") == sha256(artifact)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
