"""An authenticated fleet: the fleet token on every announce, report and local API call;
peers admitted only if the coordinator lists them; no secret in logs or in `ps`."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import libtorrent as lt
import pytest

from swarm.agent.client import DaemonClient
from swarm.errors import SwarmError
from swarm.fleetauth import fleet_token
from tests.conftest import SIZE
from tests.integration.test_swarm import FETCH_TIMEOUT, sha256
from tests.servers import wait_until
from tests.swarmnet import SWARM, Swarm, done_event

SECRET = "correct horse battery staple"


@pytest.fixture
def secret(env) -> str:
    env["SWARM_SECRET"] = SECRET  # before `artifact`: it is published with a signature
    return SECRET


@pytest.fixture
def fleet(secret, env, tmp_path, artifact):
    with Swarm(tmp_path / "fleet", env) as swarm:
        (tmp_path / "fleet").mkdir()
        swarm.start_coordinator()
        yield swarm


def http(url: str, token: str | None = None, body: bytes | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_coordinator_refuses_strangers(fleet):
    url = fleet.coordinator_url
    query = "info_hash=" + "%01" * 20 + "&peer_id=" + "%02" * 20 + "&port=6881&left=0"
    status, body = http(f"{url}/announce?{query}")
    assert status == 403 and b"failure reason" in body
    status, _ = http(f"{url}/announce?{query}&token=wrong")
    assert status == 403
    assert http(f"{url}/announce?{query}&token={fleet_token(SECRET)}")[0] == 200
    assert http(f"{url}/v1/report", body=b"{}")[0] == 403
    assert http(f"{url}/v1/fleet")[0] == 403
    assert http(f"{url}/v1/fleet", fleet_token(SECRET))[0] == 200
    assert http(f"{url}/healthz")[0] == 200


def test_fleet_works_with_the_secret_and_a_stranger_gets_no_piece(fleet, artifact, tmp_path):
    nodes = [fleet.node(i) for i in range(2)]
    for node in nodes:
        done_event(node.fetch("index.db", tmp_path / f"{node.name}.db"), FETCH_TIMEOUT)
    late = fleet.node(2)
    done = done_event(
        late.fetch("index.db", tmp_path / "late.db", "--source", "peers"), FETCH_TIMEOUT
    )
    assert done["bytes_by_source"]["peers"] >= SIZE  # members do reach each other
    assert sha256(tmp_path / "late.db") == sha256(artifact)

    # The daemon's local API wants the token too.
    with pytest.raises(SwarmError) as refused:
        DaemonClient(nodes[0].home).call("GET", "/v1/artifacts")
    assert refused.value.exit_code == 4
    assert DaemonClient(nodes[0].home, fleet_token(SECRET)).call("GET", "/v1/artifacts")

    # A stranger with the torrent (not the secret) dials the seeders directly: no piece.
    assert stranger_bytes(nodes, _torrent_file(fleet, tmp_path), tmp_path, seconds=8) == 0

    # Neither the secret nor the token is in any log or on any command line.
    token = fleet_token(SECRET)
    for log in (fleet.root).rglob("*.log"):
        text = log.read_text(errors="replace")
        assert SECRET not in text and token not in text, log
    for node in nodes:
        cmdline = Path(f"/proc/{node.daemon_pid()}/cmdline").read_bytes().decode()
        assert SECRET not in cmdline and token not in cmdline


def test_control_without_a_secret_the_same_stranger_downloads(env, tmp_path, artifact):
    """The stranger above is a working client: in an open fleet it gets data at once."""
    with Swarm(tmp_path / "open", env) as fleet:
        (tmp_path / "open").mkdir()
        fleet.start_coordinator()
        node = fleet.node(0)
        done_event(node.fetch("index.db", tmp_path / "n.db"), FETCH_TIMEOUT)
        got = stranger_bytes([node], _torrent_file(fleet, tmp_path), tmp_path, seconds=20)
    assert got > 0


def stranger_bytes(nodes: list, torrent: Path, tmp_path: Path, seconds: float) -> int:
    """A plain libtorrent client that dials ``nodes`` directly; bytes it got in ``seconds``
    (returns early once it has any)."""
    session = lt.session(
        {
            "listen_interfaces": "127.0.0.99:0",
            "enable_dht": False,
            "enable_lsd": False,
            "enable_upnp": False,
            "enable_natpmp": False,
            "enable_outgoing_utp": False,
            "enable_incoming_utp": False,
        }
    )
    params = lt.add_torrent_params()
    params.ti = lt.torrent_info(str(torrent))
    params.save_path = str(tmp_path / "stranger")
    handle = session.add_torrent(params)
    for node in nodes:
        handle.connect_peer((node.ip, 6881))
    deadline = time.monotonic() + seconds
    got = 0
    while time.monotonic() < deadline and not got:  # bounded in time
        time.sleep(0.5)
        got = handle.status().total_wanted_done
    session.pause()
    return got


def _torrent_file(fleet: Swarm, tmp_path: Path) -> Path:
    import boto3
    import fastbencode

    catalog = fleet.env["SWARM_CATALOG"]
    bucket = catalog.removeprefix("s3://").split("/")[0]
    entry = json.loads(
        boto3.client("s3").get_object(Bucket=bucket, Key="catalog/index.db.json")["Body"].read()
    )
    key = entry["url"].removeprefix(f"s3://{bucket}/")
    meta = fastbencode.bdecode(
        boto3.client("s3").get_object(Bucket=bucket, Key=key + ".torrent")["Body"].read()
    )
    meta.pop(b"url-list", None)  # peers only
    path = tmp_path / "stranger.torrent"
    path.write_bytes(fastbencode.bencode(meta))
    return path


def test_fetch_over_udp_from_a_member(fleet, artifact, tmp_path):
    """`--source udp://HOST:PORT` forces the UDP source: every byte comes over UDP from the
    seeder's daemon, checked by libtorrent like any other piece."""
    seeder = fleet.node(0)
    done_event(seeder.fetch("index.db", tmp_path / "seeder.db"), FETCH_TIMEOUT)
    node = fleet.node(1)
    done = done_event(
        node.fetch("index.db", tmp_path / "udp.db", "--source", f"udp://{seeder.ip}:7881"),
        FETCH_TIMEOUT,
    )
    assert done["bytes_by_source"] == {"peers": 0, "s3": 0, "udp": SIZE}
    assert sha256(tmp_path / "udp.db") == sha256(artifact)


def test_udp_needs_the_secret(env, tmp_path, artifact):
    with Swarm(tmp_path / "open", env) as fleet:
        (tmp_path / "open").mkdir()
        node = fleet.node(0)
        process = node.fetch("index.db", tmp_path / "x.db", "--source", "udp://127.0.0.1:7881")
        _, err = process.communicate(timeout=60)
    assert process.returncode == 2 and "SWARM_SECRET" in err


def test_the_upload_limit_is_the_udp_servers_budget_too(fleet, tmp_path):
    """`--upload-limit` caps the UDP server's sends as well as BitTorrent's (shared among
    its sessions); one below the least rate a UDP session sends at is refused with what
    to do, exit code 2."""
    node = fleet.node(0)
    log = node.home / "daemon.out"
    with log.open("wb") as out:
        daemon = subprocess.Popen(
            [SWARM, "-v", "daemon", "--listen", node.ip, "--upload-limit", "10M"],
            env=node.env,
            stdout=out,
            stderr=out,
        )
    try:
        # a fresh daemon's UDP server starts a second after it listens (UDP_SERVE_DELAY)
        wait_until(lambda: "udp: serving on" in log.read_text(), 30, "the UDP server")
        text = log.read_text()
        assert re.search(r"udp: serving on \S+ \(cap 84 Mbit/s", text), text
    finally:
        daemon.terminate()
        daemon.wait(30)
    low = subprocess.run(
        [SWARM, "daemon", "--listen", "127.0.0.30", "--upload-limit", "100K"],
        env={**node.env, "SWARM_HOME": str(tmp_path / "low")},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert low.returncode == 2, low.stderr
    assert "--upload-limit 102400 bytes/s is below" in low.stderr
    assert "--udp-port 0" in low.stderr
    # the same limit where UDP is off (a secret too short for it) caps BitTorrent alone
    quiet = tmp_path / "quiet.out"
    with quiet.open("wb") as out:
        daemon = subprocess.Popen(
            [SWARM, "-v", "daemon", "--listen", "127.0.0.31", "--upload-limit", "100K"],
            env={**node.env, "SWARM_HOME": str(tmp_path / "quiet"), "SWARM_SECRET": "short"},
            stdout=out,
            stderr=out,
        )
    try:
        wait_until(lambda: "listening on" in quiet.read_text(), 30, "the daemon to listen")
        assert "UDP stays off" in quiet.read_text()
    finally:
        daemon.terminate()
        daemon.wait(30)
