"""The swarm on loopback: coordinator, S3 server, origin seeder, node daemons (real libtorrent)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import boto3
import fastbencode
import pytest

from tests.conftest import SIZE
from tests.servers import FaultProxy, Faults, wait_until
from tests.swarmnet import SWARM, Swarm, done_event, get_json, running

MiB = 1 << 20
FETCH_TIMEOUT = 120


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def swarm(env, tmp_path, artifact):
    with Swarm(tmp_path / "swarm", {**env}) as swarm:
        (tmp_path / "swarm").mkdir()
        swarm.start_coordinator()
        yield swarm


def test_four_nodes_and_an_origin_seeder_all_complete(swarm, artifact, tmp_path):
    seeder = swarm.start_origin_seeder(swarm.env["SWARM_CATALOG"], "index.db")
    nodes = [swarm.node(i) for i in range(4)]
    fetches = [(n, n.fetch("index.db", tmp_path / f"{n.name}.db")) for n in nodes]
    for node, process in fetches:
        done = done_event(process, FETCH_TIMEOUT)
        assert sha256(tmp_path / f"{node.name}.db") == sha256(artifact)
        assert sum(done["bytes_by_source"].values()) >= SIZE
    # the seeder holds and seeds it too
    wait_until(lambda: seeder.daemon_pid() is not None, 30, "the seeder's pid file")
    fleet = get_json(swarm.coordinator_url + "/v1/fleet")
    (entry,) = [a for a in fleet["artifacts"] if a["name"] == "index.db"]
    # per-piece availability from the nodes' bitfields: every piece is held somewhere
    assert len(entry["availability"]) == SIZE // (1 << 20) and min(entry["availability"]) >= 1
    # `swarm status` sees the whole fleet: 4 nodes and the seeder complete
    wait_until(lambda: _status(swarm)["artifacts"][0]["nodes_complete"] >= 5, 15, "status")
    view = _status(swarm)
    (art,) = view["artifacts"]
    assert art["completed_total"] >= 4 and art["median_seconds"] is not None
    assert art["s3_bytes_saved"] > 0
    assert {n["state"] for n in view["nodes"]} == {"complete"}


def test_late_node_takes_most_bytes_from_peers(swarm, artifact, tmp_path):
    first = [swarm.node(i) for i in range(2)]
    for node in first:
        done_event(node.fetch("index.db", tmp_path / f"{node.name}.db"), FETCH_TIMEOUT)
    late = swarm.node(5)
    done = done_event(late.fetch("index.db", tmp_path / "late.db"), FETCH_TIMEOUT)
    assert sha256(tmp_path / "late.db") == sha256(artifact)
    by = done["bytes_by_source"]
    why = f"{by}; the late node's log:\n{(late.home / 'daemon.log').read_text()[-3000:]}"
    assert by["peers"] >= 0.8 * SIZE, why
    assert by["s3"] <= 0.2 * SIZE, why
    # the daemons keep seeding after their fetch returned
    status = first[0].status()
    assert status["artifacts"][0]["state"] == "seeding"
    assert (
        status["artifacts"][0]["uploaded"] > 0 or first[1].status()["artifacts"][0]["uploaded"] > 0
    )


def test_coordinator_killed_and_restarted_mid_fetch(swarm, artifact, env, tmp_path):
    # Slow the origin down so the fetch is surely in flight when the coordinator dies.
    with FaultProxy(env["AWS_ENDPOINT_URL"], Faults(throttle_bps=6 * MiB)) as proxy:
        nodes = [swarm.node(i) for i in range(3)]
        for node in nodes:
            node.env["AWS_ENDPOINT_URL"] = proxy.url
        fetches = [(n, n.fetch("index.db", tmp_path / f"{n.name}.db")) for n in nodes]
        wait_until(
            lambda: (
                all(n.daemon_pid() for n in nodes)
                and all(a["have_bytes"] > 0 for n in nodes for a in n.status()["artifacts"])
            ),
            60,
            "every node to make progress",
        )
        swarm.kill_coordinator()
        swarm.start_coordinator()
        for node, process in fetches:
            done_event(process, FETCH_TIMEOUT)
            assert sha256(tmp_path / f"{node.name}.db") == sha256(artifact)
    # Completed fetches survive another restart (SQLite history): durations are kept.
    wait_until(lambda: _status(swarm)["artifacts"][0]["completed_total"] >= 3, 15, "history")
    swarm.kill_coordinator()
    swarm.start_coordinator()
    art = _status(swarm)["artifacts"]
    assert art and art[0]["completed_total"] >= 3 and art[0]["median_seconds"] is not None


def test_aria2c_downloads_from_swarm_seeders_through_swarm_tracker(
    swarm, artifact, env, bucket, tmp_path
):
    seeders = [swarm.node(i) for i in range(2)]
    for node in seeders:
        done_event(node.fetch("index.db", tmp_path / f"{node.name}.db"), FETCH_TIMEOUT)
    # The published torrent, minus its S3 web seed: every byte must come from swarm's peers.
    torrent = boto3.client("s3").get_object(Bucket=bucket, Key="b/index.db.torrent")["Body"].read()
    meta = fastbencode.bdecode(torrent)
    meta.pop(b"url-list", None)
    path = tmp_path / "index.db.torrent"
    path.write_bytes(fastbencode.bencode(meta))
    out = tmp_path / "aria2"
    subprocess.run(
        [
            "aria2c",
            "--bt-tracker",
            swarm.coordinator_url + "/announce",
            "--enable-dht=false",
            "--bt-enable-lpd=false",
            "--enable-peer-exchange=false",
            "--seed-time=0",
            "--listen-port=16881-16889",
            "--check-integrity=true",
            "--summary-interval=0",
            "--console-log-level=warn",
            "--bt-stop-timeout=60",
            "-d",
            str(out),
            str(path),
        ],
        check=True,
        timeout=FETCH_TIMEOUT,
        capture_output=True,
    )
    assert sha256(out / "index.db") == sha256(artifact)
    uploaded = sum(n.status()["artifacts"][0]["uploaded"] for n in seeders)
    assert uploaded >= SIZE


def test_restarted_daemon_seeds_again_without_downloading(swarm, artifact, tmp_path):
    first = swarm.node(0)
    done_event(first.fetch("index.db", tmp_path / "first.db"), FETCH_TIMEOUT)
    pid = first.daemon_pid()
    assert pid
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not running(pid), 30, "daemon exit")
    assert list((first.home / "resume").glob("*.resume"))

    swarm.start_daemon(first)
    assert first.artifacts()  # restored before the API answered
    wait_until(lambda: first.artifacts()[0]["state"] == "seeding", 30, "seeding from resume")
    again = first.artifacts()[0]
    assert again["bytes_by_source"] == {"peers": 0, "s3": 0, "udp": 0}  # nothing downloaded

    # A new node that may use peers only gets everything from the restarted daemon.
    late = swarm.node(1)
    done = done_event(
        late.fetch("index.db", tmp_path / "late.db", "--source", "peers"), FETCH_TIMEOUT
    )
    assert done["bytes_by_source"]["peers"] >= SIZE and done["bytes_by_source"]["s3"] == 0
    assert sha256(tmp_path / "late.db") == sha256(artifact)


def _status(swarm) -> dict:
    out = subprocess.run(
        [SWARM, "status", "--coordinator", swarm.coordinator_url, "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return json.loads(out)


def test_status_with_unreachable_coordinator_exits_1(env):
    proc = subprocess.run(
        [SWARM, "status", "--coordinator", "http://127.0.0.1:9", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert proc.returncode == 1 and "cannot reach the coordinator" in proc.stderr


RECEIVED = re.compile(r"verified at .*: S3 ([0-9.]+), peers ([0-9.]+), UDP")


def test_unlimited_origin_every_node_reads_all_from_s3_then_seeds(env, artifact, tmp_path):
    """``--origin-rate unlimited`` (a bucket in the fleet's region): the coordinator tells
    every node ALL from its first plan, so each reads the whole artifact from S3 and takes
    nothing from peers (libtorrent in upload mode); each then seeds. A late node whose S3
    is down completes from them: its reader fails, and peers fill the file meanwhile."""
    with Swarm(tmp_path / "swarm", {**env}) as swarm:
        (tmp_path / "swarm").mkdir()
        swarm.start_coordinator("--origin-rate", "unlimited")
        nodes = [swarm.node(i) for i in range(3)]
        # Their daemons up first: a daemon's start under CI's load took long enough that
        # another node had the file and fed it from peers before its first plan came
        for node in nodes:
            swarm.start_daemon(node, verbose=True)
        fetches = [(n, n.fetch("index.db", tmp_path / f"{n.name}.db")) for n in nodes]
        from_s3 = []
        for node, process in fetches:
            done = done_event(process, FETCH_TIMEOUT)
            assert sha256(tmp_path / f"{node.name}.db") == sha256(artifact)
            by = done["bytes_by_source"]
            assert by["s3"] + by["peers"] >= SIZE, by  # every byte counted
            from_s3.append(by["s3"])
            # and so does the daemon's log line, peers' bytes before the verified file was
            # handed to libtorrent in seed mode included (it once read a fresh handle's 0)
            (received,) = RECEIVED.findall((node.home / "daemon-started.log").read_text())
            s3_mb, peers_mb = float(received[0]), float(received[1])
            # (each rounded to 0.1 MB: together they may lose up to 0.1)
            assert s3_mb + peers_mb >= SIZE / 1e6 - 0.1, (received, by)
            assert peers_mb >= by["peers"] / 1e6 - 0.05, (received, by)
        # Most of it from S3, over the fleet: peers may give a node pieces before its
        # first plan arrives, on a loaded machine (libtorrent is not in upload mode until
        # then, and a node that finished first seeds). With each fetch starting its own
        # daemon, per node that happened in about one run in six with up to 20% from
        # peers, and under CI's load 54%, 92% and 100% (a daemon that started seconds
        # after the others: its first plan came after libtorrent had taken the file on
        # loopback); hence the daemons started before the fetches.
        assert sum(from_s3) >= 0.4 * len(nodes) * SIZE, from_s3
        fleet = get_json(swarm.coordinator_url + "/v1/fleet")
        (entry,) = [a for a in fleet["artifacts"] if a["name"] == "index.db"]
        assert entry["allocation"] is None or entry["allocation"]["mode"] == "all"
        late = swarm.node(7)
        with FaultProxy(env["AWS_ENDPOINT_URL"], Faults(fail_ranged_status=503)) as proxy:
            late.env["AWS_ENDPOINT_URL"] = proxy.url  # manifests answer, body reads do not
            done = done_event(late.fetch("index.db", tmp_path / "late.db"), FETCH_TIMEOUT)
        assert sha256(tmp_path / "late.db") == sha256(artifact)
        assert done["bytes_by_source"]["peers"] >= SIZE, done  # (endgame may repeat a block)
