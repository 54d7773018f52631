"""The real coordinator app on loopback, driven over real HTTP (urllib), with its event
loop in a background thread."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import sqlite3
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote_from_bytes

import fastbencode
import pytest
from aiohttp import web

from swarm.coordinator.app import make_app, parse_listen
from swarm.coordinator.load import MEMBERS_CHANGED_INTERVAL
from swarm.coordinator.memorystore import MemoryPeerStore
from swarm.coordinator.tracker import decode_compact_peers
from swarm.errors import UsageError
from tests.servers import wait_until

INFO_HASH = bytes.fromhex("0123456789abcdef0123456789abcdef01234567")


class FakeClock:
    """Wall clock the test moves by hand; read from the server's thread."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Server:
    url: str
    clock: FakeClock

    def get(self, path: str) -> tuple[int, str, bytes]:
        return self._open(urllib.request.Request(self.url + path))

    def post_json(self, path: str, body: object | bytes) -> tuple[int, dict[str, object]]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path, data=data, headers={"Content-Type": "application/json"}
        )
        status, _, raw = self._open(request)
        return status, json.loads(raw)

    def fleet(self) -> dict[str, object]:
        status, _, raw = self.get("/v1/fleet")
        assert status == 200
        return json.loads(raw)

    def announce(self, **params: bytes | str | int) -> dict[bytes, object]:
        status, content_type, raw = self.get("/announce?" + announce_query(**params))
        assert status == 200 and content_type.startswith("text/plain")
        return fastbencode.bdecode(raw)

    @staticmethod
    def _open(request: urllib.request.Request) -> tuple[int, str, bytes]:
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.headers["Content-Type"], response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.headers["Content-Type"], error.read()


def announce_query(**params: bytes | str | int) -> str:
    values: dict[str, bytes | str | int] = {
        "info_hash": INFO_HASH,
        "peer_id": b"-LT2110-" + b"\x00" * 12,
        "port": 6881,
        "uploaded": 0,
        "downloaded": 0,
        "left": 100,
        "compact": 1,
    }
    values.update(params)
    return "&".join(
        f"{key}={quote_from_bytes(v if isinstance(v, bytes) else str(v).encode(), safe='')}"
        for key, v in values.items()
    )


def pid(n: int) -> bytes:
    return b"-LT2110-" + n.to_bytes(12, "big")


@contextlib.contextmanager
def serve(app: web.Application) -> Iterator[str]:
    """Run ``app`` on 127.0.0.1, an ephemeral port, in a background event loop."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="coordinator", daemon=True)
    thread.start()
    runner: web.AppRunner | None = None

    async def start() -> int:
        nonlocal runner
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner.addresses[0][1]

    try:
        port = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
        yield f"http://127.0.0.1:{port}"
    finally:
        if runner is not None:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    clock = FakeClock()
    app = make_app(interval=30, db_path=tmp_path / "history.db", clock=clock, expiry_period=0.02)
    with serve(app) as url:
        yield Server(url, clock)


def report(node: str, addr: str, **artifact: object) -> dict[str, object]:
    item: dict[str, object] = {
        "info_hash": INFO_HASH.hex(),
        "name": "index.db",
        "size": 4096,
        "have_bytes": 1024,
        "complete": False,
        "bytes_by_source": {"peers": 512, "s3": 512, "udp": 0},
        "down_rate": 1000.0,
        "up_rate": 10.0,
    }
    item.update(artifact)
    return {"node": node, "addr": addr, "artifacts": [item]}


def metric(text: str, line_prefix: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_prefix + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {line_prefix!r} in:\n{text}")


# -- tests --------------------------------------------------------------------------------------


def test_announce_returns_compact_peers_seen_from_the_remote_address(server: Server) -> None:
    first = server.announce(peer_id=pid(1), port=7001, event="started")
    assert first == {b"interval": 30, b"complete": 0, b"incomplete": 1, b"peers": b""}

    second = server.announce(peer_id=pid(2), port=7002, left=0, event="started")
    assert (second[b"complete"], second[b"incomplete"]) == (1, 1)
    assert second[b"peers"] == bytes([127, 0, 0, 1]) + (7001).to_bytes(2, "big")

    third = server.announce(peer_id=pid(3), port=7003, numwant=10)
    assert decode_compact_peers(third[b"peers"]) == [  # type: ignore[arg-type]
        ("127.0.0.1", 7002),  # the seeder first
        ("127.0.0.1", 7001),
    ]


def test_announce_non_compact_and_ip_parameter(server: Server) -> None:
    server.announce(peer_id=pid(1), port=7001, ip="192.0.2.10")
    reply = server.announce(peer_id=pid(2), port=7002, compact=0)
    assert reply[b"peers"] == [{b"peer id": pid(1), b"ip": b"192.0.2.10", b"port": 7001}]


def test_stopped_announce_removes_the_peer(server: Server) -> None:
    server.announce(peer_id=pid(1), port=7001)
    assert server.announce(peer_id=pid(1), port=7001, event="stopped")[b"peers"] == b""
    reply = server.announce(peer_id=pid(2), port=7002)
    assert (reply[b"peers"], reply[b"incomplete"]) == (b"", 1)


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("", b"announce is missing info_hash"),
        (announce_query(info_hash=b"\x01" * 19), b"info_hash must be 20 bytes"),
        (announce_query(port=0), b"port must be 1..65535"),
        (announce_query(left=-5), b"left must be a non-negative decimal integer"),
        (announce_query(event="finished"), b"event must be one of"),
        (announce_query(ip="nowhere"), b"ip must be an IPv4 or IPv6 address"),
    ],
)
def test_bad_announce_is_a_failure_reason_with_200(
    server: Server, query: str, reason: bytes
) -> None:
    status, _, raw = server.get("/announce?" + query)
    assert status == 200
    reply = fastbencode.bdecode(raw)
    assert list(reply) == [b"failure reason"]
    assert reason in reply[b"failure reason"]


def test_report_shows_in_fleet_and_completion_goes_to_history(
    server: Server, tmp_path: Path
) -> None:
    server.announce(peer_id=pid(1), port=7001)
    status, body = server.post_json("/v1/report", report("node-a", "127.0.0.1:7001"))
    assert status == 200
    assert body == {
        "ok": True,
        "interval": 1.0,
        "plans": {},
        "members_epoch": body["members_epoch"],
        "members": ["127.0.0.1"],  # a node that sends no epoch gets the list every time
    }

    fleet = server.fleet()
    assert fleet["interval"] == 30 and fleet["report_interval"] == 1.0
    (node,) = fleet["nodes"]  # type: ignore[misc]
    assert node["node"] == "node-a" and node["addr"] == "127.0.0.1:7001"
    assert node["artifacts"][0]["progress"] == 0.25
    (art,) = fleet["artifacts"]  # type: ignore[misc]
    assert art["info_hash"] == INFO_HASH.hex() and art["name"] == "index.db"
    assert (art["nodes"], art["progress"], art["down_rate"]) == (1, 0.25, 1000.0)
    assert art["bytes_by_source"] == {"peers": 512, "s3": 512, "udp": 0}
    assert (art["complete"], art["incomplete"]) == (0, 1)
    assert art["peers"][0]["node"] == "node-a"
    assert art["history"]["completed"] == 0

    server.clock.now += 7.5  # within the report TTL, as a live node is
    done = report("node-a", "127.0.0.1:7001", have_bytes=4096, complete=True)
    assert server.post_json("/v1/report", done)[0] == 200
    assert server.post_json("/v1/report", done)[0] == 200  # repeated: recorded once
    fleet = server.fleet()
    (art,) = fleet["artifacts"]  # type: ignore[misc]
    assert art["nodes_complete"] == 1 and art["progress"] == 1.0
    assert art["history"]["completed"] == 1 and art["history"]["mean_seconds"] == 7.5
    assert fleet["history"] == {INFO_HASH.hex(): art["history"]}

    with sqlite3.connect(tmp_path / "history.db") as conn:
        rows = conn.execute("SELECT node, seconds, bytes_by_source FROM completions").fetchall()
    assert rows == [("node-a", 7.5, '{"peers": 512, "s3": 512, "udp": 0}')]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"{not json", "body is not JSON"),
        (b"\xff\xfe", "body is not JSON"),
        ({"node": "a"}, "report.addr must be a string"),
        (report("a", "127.0.0.1:1", size="big"), "size must be a non-negative integer"),
    ],
)
def test_bad_report_is_400_with_a_message(server: Server, body: object, error: str) -> None:
    status, reply = server.post_json("/v1/report", body)
    assert status == 400
    assert reply["ok"] is False and error in str(reply["error"])
    assert server.fleet()["nodes"] == []


def test_metrics_count_announces_reports_and_peers(server: Server) -> None:
    server.announce(peer_id=pid(1), port=7001, event="started")
    server.announce(peer_id=pid(1), port=7001)
    server.announce(peer_id=pid(2), port=7002, left=0, event="completed")
    server.get("/announce?junk=1")
    server.post_json("/v1/report", report("node-a", "127.0.0.1:7001"))
    server.post_json("/v1/report", b"nope")

    status, content_type, raw = server.get("/metrics")
    assert status == 200 and content_type.startswith("text/plain; version=")
    text = raw.decode()
    assert metric(text, 'swarm_announces_total{event="started"}') == 1
    assert metric(text, 'swarm_announces_total{event="none"}') == 1
    assert metric(text, 'swarm_announces_total{event="completed"}') == 1
    assert metric(text, "swarm_announce_failures_total") == 1
    assert metric(text, "swarm_reports_total") == 1
    assert metric(text, "swarm_report_failures_total") == 1
    labels = f'info_hash="{INFO_HASH.hex()}"'
    assert metric(text, f'swarm_peers{{{labels},role="seeder"}}') == 1
    assert metric(text, f'swarm_peers{{{labels},role="leecher"}}') == 1
    assert metric(text, "swarm_nodes") == 1


def test_expiry_task_drops_silent_peers_and_nodes(server: Server) -> None:
    server.announce(peer_id=pid(1), port=7001)
    server.post_json("/v1/report", report("node-a", "127.0.0.1:7001"))
    server.clock.now += 91  # past 3 x interval (30 s) and the report TTL

    def expired() -> bool:
        text = server.get("/metrics")[2].decode()
        return 'swarm_expired_total{kind="peer"} 1.0' in text

    wait_until(expired, timeout=10, what="the expiry sweep to drop the silent peer")
    text = server.get("/metrics")[2].decode()
    assert metric(text, 'swarm_expired_total{kind="node"}') == 1
    assert "swarm_peers{" not in text
    assert server.fleet()["artifacts"] == []


def test_healthz(server: Server) -> None:
    status, content_type, raw = server.get("/healthz")
    assert (status, content_type.split(";")[0], json.loads(raw)) == (
        200,
        "application/json",
        {"ok": True},
    )


def test_two_apps_have_separate_metrics(tmp_path: Path) -> None:
    with serve(make_app()) as one, serve(make_app()) as two:
        a, b = Server(one, FakeClock()), Server(two, FakeClock())
        a.announce(peer_id=pid(1), port=7001, event="started")
        assert 'swarm_announces_total{event="started"}' in a.get("/metrics")[2].decode()
        assert "swarm_announces_total{" not in b.get("/metrics")[2].decode()


def test_parse_listen() -> None:
    assert parse_listen("0.0.0.0:7070") == ("0.0.0.0", 7070)
    assert parse_listen("[::]:7070") == ("::", 7070)
    for bad in ("7070", "host:", ":7070", "host:99999", "host:http"):
        with pytest.raises(UsageError, match="--listen must be HOST:PORT"):
            parse_listen(bad)


# -- scale and bounds (issues 12 and 15) ---------------------------------------------------------


def test_membership_is_an_epoch_and_deltas(server: Server) -> None:
    """A node that keeps the member list gets it once, then only its changes."""
    first = report("node-a", "10.1.0.1:7001")
    status, body = server.post_json("/v1/report", {**first, "members_epoch": None})
    assert status == 200 and body["members"] == ["10.1.0.1"]
    # a node whose list a reply changed reports again sooner: more may be joining
    assert body["interval"] == MEMBERS_CHANGED_INTERVAL
    epoch = body["members_epoch"]
    # nothing changed: no list at all, and the fleet's interval
    body = server.post_json("/v1/report", {**first, "members_epoch": epoch})[1]
    assert body["members_epoch"] == epoch and "members" not in body
    assert "members_delta" not in body
    assert body["interval"] == 1.0
    # two nodes join, one on an address already a member: one change
    server.post_json("/v1/report", report("node-b", "10.1.0.2:7001"))
    server.post_json("/v1/report", report("node-c", "10.1.0.1:7002"))
    body = server.post_json("/v1/report", {**first, "members_epoch": epoch})[1]
    assert body["members_delta"] == ["+10.1.0.2"] and "members" not in body
    assert body["interval"] == MEMBERS_CHANGED_INTERVAL
    epoch = body["members_epoch"]
    # node-b falls silent past its TTL (10 s) and is swept: its address leaves. The
    # others report halfway, so no sweep (it runs on a real timer) ever finds them stale.
    server.clock.now += 6
    for node, addr in (("node-a", "10.1.0.1:7001"), ("node-c", "10.1.0.1:7002")):
        server.post_json("/v1/report", {**report(node, addr), "members_epoch": epoch})
    server.clock.now += 6

    def b_left() -> bool:
        body = server.post_json("/v1/report", {**first, "members_epoch": epoch})[1]
        return body.get("members_delta") == ["-10.1.0.2"]

    wait_until(b_left, timeout=10, what="the sweep to drop node-b's address")
    # an epoch this coordinator never issued (another process's): the whole list
    body = server.post_json("/v1/report", {**first, "members_epoch": "elsewhere.3"})[1]
    assert body["members"] == ["10.1.0.1"]
    # a node of an open fleet wants none
    body = server.post_json("/v1/report", {**first, "want_members": False})[1]
    assert not {"members", "members_delta", "members_epoch"} & set(body)


def test_report_interval_grows_with_the_fleet(tmp_path: Path) -> None:
    clock = FakeClock()
    app = make_app(clock=clock, report_budget=2.0, db_path=tmp_path / "h.db")
    with serve(app) as url:
        server = Server(url, clock)
        intervals = [
            server.post_json("/v1/report", report(f"n{i}", f"10.2.0.{i + 1}:7001"))[1]["interval"]
            for i in range(6)
        ]
        # budget 2 reports/s: 1 s up to 2 nodes, then nodes / 2 rounded up to 0.5 s
        assert intervals == [1.0, 1.0, 1.0, 1.5, 2.0, 2.5]
        assert server.fleet()["report_interval"] == 3.0
        # a node told 3 s lives 3 x 3 s = 9 s < REPORT_TTL (10 s): still there at 9.5 s
        clock.now += 9.5
        assert len(server.fleet()["nodes"]) == 6


def test_geometry_that_disagrees_with_the_known_artifact_is_refused(server: Server) -> None:
    bitfield = base64.b64encode(b"\x00").decode()
    geometry = {"size": 4 << 20, "piece_size": 1 << 20, "piece_count": 4, "pieces": bitfield}
    status, body = server.post_json("/v1/report", report("a", "10.3.0.1:1", **geometry))
    assert status == 200 and body["plans"][INFO_HASH.hex()]["stripe"] == [0, 1, 2, 3]
    # the same info-hash claimed with 16 KiB pieces: refused, the first one stands
    other = {"size": 4 << 20, "piece_size": 1 << 14, "piece_count": 256, "pieces": "A" * 43 + "="}
    status, body = server.post_json("/v1/report", report("b", "10.3.0.2:1", **other))
    assert status == 400 and "has 4 pieces of 1048576 bytes here" in str(body["error"])
    status, body = server.post_json("/v1/report", report("c", "10.3.0.3:1", **geometry))
    assert status == 200 and body["plans"][INFO_HASH.hex()]["stripe"] == []  # all a's


def test_a_node_that_holds_nothing_is_told_the_seeders(server: Server) -> None:
    """Its UDP source can start from them before libtorrent has announced and connected
    (OriginPlan.holders): seeders only, not the node itself, and only while it holds no
    piece (later reports need no store lookup)."""
    server.announce(peer_id=pid(1), port=7001, ip="192.0.2.10", left=0)
    server.announce(peer_id=pid(2), port=7002, ip="192.0.2.11", left=0)
    server.announce(peer_id=pid(3), port=7003, ip="192.0.2.12", left=4096)
    geometry = {"size": 4 << 20, "piece_size": 1 << 20, "piece_count": 4}
    empty = base64.b64encode(b"\x00").decode()
    status, body = server.post_json(
        "/v1/report", report("a", "10.3.0.1:1", pieces=empty, **geometry)
    )
    assert status == 200
    plan = body["plans"][INFO_HASH.hex()]
    assert sorted(plan["holders"]) == ["192.0.2.10", "192.0.2.11"]
    status, body = server.post_json(
        "/v1/report", report("s", "192.0.2.10:7001", pieces=empty, **geometry)
    )
    assert body["plans"][INFO_HASH.hex()]["holders"] == ["192.0.2.11"]
    one = base64.b64encode(b"\x80").decode()
    status, body = server.post_json("/v1/report", report("a", "10.3.0.1:1", pieces=one, **geometry))
    assert status == 200 and "holders" not in body["plans"][INFO_HASH.hex()]


def test_a_node_that_holds_nothing_is_told_who_fetches_beside_it(server: Server) -> None:
    """Its libtorrent dials them before its tracker announce returns (OriginPlan.peers):
    the nodes that reported the artifact incomplete before it, newest first, not itself,
    and not once they hold it whole (they are seeders then)."""
    geometry = {"size": 4 << 20, "piece_size": 1 << 20, "piece_count": 4}
    empty = base64.b64encode(b"\x00").decode()

    def peers_named(node: str, addr: str, **item: object) -> list[str]:
        status, body = server.post_json("/v1/report", report(node, addr, **geometry, **item))
        assert status == 200
        return list(body["plans"][INFO_HASH.hex()].get("peers", []))

    assert peers_named("a", "10.3.0.1:6881", pieces=empty) == []
    assert peers_named("b", "10.3.0.2:6881", pieces=empty) == ["10.3.0.1:6881"]
    assert peers_named("c", "10.3.0.3:6881", pieces=empty) == ["10.3.0.2:6881", "10.3.0.1:6881"]
    whole = base64.b64encode(b"\xf0").decode()
    peers_named("a", "10.3.0.1:6881", pieces=whole, complete=True, have_bytes=4 << 20)
    assert peers_named("c", "10.3.0.3:6881", pieces=empty) == ["10.3.0.2:6881"]


def test_a_node_is_told_its_link_as_the_artifacts_it_holds_showed_it(server: Server) -> None:
    """The UDP server's budget (``link`` in the reply): the most a node moved one way in
    an interval, from the artifacts it holds whole; nothing from a fetch under way (its
    first seconds understate the link)."""
    geometry = {"size": 64 << 20, "piece_size": 1 << 20, "piece_count": 64}
    none = base64.b64encode(bytes(8)).decode()
    every = base64.b64encode(b"\xff" * 8).decode()
    for got in (0, 20_000_000, 60_000_000):
        counters = {"peers": 0, "s3": got, "udp": 0}
        fetching = report("f", "10.3.0.1:1", pieces=none, bytes_by_source=counters, **geometry)
        status, body = server.post_json("/v1/report", fetching)
        assert status == 200 and "link" not in body
        held = report(
            "s", "10.3.0.2:1", pieces=every, complete=True, bytes_by_source=counters, **geometry
        )
        status, body = server.post_json("/v1/report", held)
        assert status == 200
        server.clock.now += 1.0
    assert body["link"] == pytest.approx(40_000_000, rel=0.05)  # its best second


def test_a_full_coordinator_refuses_with_503_and_keeps_serving(tmp_path: Path) -> None:
    clock = FakeClock()
    app = make_app(MemoryPeerStore(max_nodes=2, max_peers=1), clock=clock)
    with serve(app) as url:
        server = Server(url, clock)
        assert server.post_json("/v1/report", report("a", "10.4.0.1:1"))[0] == 200
        assert server.post_json("/v1/report", report("b", "10.4.0.2:1"))[0] == 200
        status, body = server.post_json("/v1/report", report("c", "10.4.0.3:1"))
        assert status == 503 and "coordinator is full" in str(body["error"])
        assert server.post_json("/v1/report", report("a", "10.4.0.1:1"))[0] == 200  # known
        assert server.announce(peer_id=pid(1), port=7001)[b"peers"] == b""
        refused = server.announce(peer_id=pid(2), port=7002)
        assert b"coordinator is full" in refused[b"failure reason"]  # type: ignore[operator]
        text = server.get("/metrics")[2].decode()
        assert metric(text, 'swarm_refused_total{kind="report"}') == 1
        assert metric(text, 'swarm_refused_total{kind="announce"}') == 1
