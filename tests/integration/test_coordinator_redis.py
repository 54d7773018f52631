"""Coordinators sharing one real ``redis-server`` (issue 12): the Redis stores keep the
same contracts as the in-memory ones, and two coordinator apps on one Redis serve one
fleet. The server is started on a free loopback port and killed by pid."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings

from swarm.coordinator.app import make_app
from swarm.coordinator.origin import StripePlanner
from swarm.coordinator.planstate import MemoryPlanState
from swarm.coordinator.reports import parse_report
from swarm.coordinator.tracker import decode_compact_peers
from swarm.lab.loadcoordinators import REDIS_SERVER, redis_server
from tests.integration.test_coordinator import FakeClock, Server, pid, report, serve
from tests.servers import FaultProxy, Faults, free_port, wait_until
from tests.swarmnet import SWARM, Swarm, done_event, get_json
from tests.unit.test_coordinator_scale import (
    HASH,
    MiB,
    flowing_bytes_are_progress,
    plan,
    readers_are_counted_once,
    steps,
    stops_listing_leaves_the_union,
)

FETCH_TIMEOUT = 120

redis = pytest.importorskip("redis")
from swarm.coordinator.redisplan import RedisPlanState  # noqa: E402
from swarm.coordinator.redisstore import RedisPeerStore  # noqa: E402

if REDIS_SERVER is None and not os.environ.get("CI"):
    pytest.skip(
        "redis-server is not installed (apt-get install redis-server)", allow_module_level=True
    )


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    assert REDIS_SERVER, "CI needs redis-server (apt-get install redis-server)"
    with redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(redis_url)
    connection.flushdb()
    yield connection
    connection.close()


# -- the plan state: the same algorithm as in memory ---------------------------------------------


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(steps=steps)
def test_redis_plan_state_matches_memory(redis_url: str, steps) -> None:
    connection = redis.Redis.from_url(redis_url)
    connection.flushdb()
    memory = StripePlanner(stripe_bytes=4 * MiB, max_readers=3, state=MemoryPlanState())
    shared = StripePlanner(stripe_bytes=4 * MiB, max_readers=3, state=RedisPlanState(connection))
    now = 0.0
    for index, value, departs in steps:
        node = f"n{index}"
        now += 0.5
        if departs:
            memory.forget([node])
            shared.forget([node])
            continue
        complete = value == (1 << 40) - 1
        a = plan(memory, node, value, now, count=40, complete=complete)
        b = plan(shared, node, value, now, count=40, complete=complete)
        assert (a.stripe, a.mode, a.fill) == (b.stripe, b.mode, b.fill)
        assert a.s3_estimate == pytest.approx(b.s3_estimate)
        assert memory.availability(HASH) == shared.availability(HASH)
    connection.close()


def test_redis_an_artifact_a_node_stops_listing_leaves_the_union(client: redis.Redis) -> None:
    stops_listing_leaves_the_union(RedisPlanState(client))


def test_redis_readers_are_counted_once(client: redis.Redis) -> None:
    readers_are_counted_once(RedisPlanState(client))


def test_redis_flowing_bytes_are_progress(client: redis.Redis) -> None:
    flowing_bytes_are_progress(RedisPlanState(client))


def test_two_planners_on_one_redis_hand_out_disjoint_stripes(client: redis.Redis) -> None:
    a = StripePlanner(stripe_bytes=8 * MiB, state=RedisPlanState(client))
    b = StripePlanner(stripe_bytes=8 * MiB, state=RedisPlanState(client))
    stripes = [plan(a if i % 2 else b, f"n{i}", 0, 0.0).stripe for i in range(8)]
    taken = [p for s in stripes for p in s]
    assert len(taken) == 64 and sorted(taken) == list(range(64))
    # n0 got the whole artifact from n1..n7's stripes: every stripe is released
    plan(b, "n0", (1 << 64) - 1, 1.0, complete=True)
    assert all(plan(a, f"n{i}", 0, 1.5).stripe == [] for i in range(1, 8))
    a.forget([f"n{i}" for i in range(8)])
    assert client.get("swarm:planbytes") in (b"0", None)
    assert not client.exists("swarm:art:" + HASH)


# -- the peer store ------------------------------------------------------------------------------


def test_redis_peer_store_keeps_the_tracker_contract(client: redis.Redis) -> None:
    from tests.unit.test_coordinator_scale import announce

    store = RedisPeerStore(client, peer_ttl=90)
    assert store.announce(announce(1, left=5), "10.0.0.1", 100.0) == []
    got = store.announce(announce(2, left=0), "10.0.0.2", 101.0)
    assert [p.ip for p in got] == ["10.0.0.1"]
    assert store.counts(b"\x01" * 20, 101.0) == (1, 1)
    assert store.counts(b"\x01" * 20, 190.5) == (1, 0)  # 1 stale, dropped on the way
    assert store.expire(190.5) == (1, 0)
    store.announce(announce(2, left=0), "10.0.0.2", 192.0)
    assert store.announce(announce(3, numwant=5), "10.0.0.3", 192.0)[0].ip == "10.0.0.2"
    store.announce(dataclasses.replace(announce(2), event="stopped"), "10.0.0.2", 193.0)
    assert [p.ip for p in store.peers(b"\x01" * 20, 193.0)] == ["10.0.0.3"]
    # a large swarm is served from the ranking, seeders first
    for n in range(10, 400):
        store.announce(announce(n, left=0 if n < 100 else n), f"10.1.{n >> 8}.{n & 255}", 200.0)
    got = store.announce(announce(999, left=10**9), "10.2.0.1", 200.5)
    assert len(got) == 50 and all(int.from_bytes(p.peer_id[8:], "big") < 100 for p in got)


def test_redis_nodes_membership_and_caps(client: redis.Redis) -> None:
    from tests.unit.test_coordinator_scale import report_body

    store = RedisPeerStore(client, max_nodes=2, generation="g")
    first = store.members(None, 0.0)
    assert (first.epoch, first.members) == ("g.0", "[]")
    store.report(parse_report(report_body("a")), 0.0, ttl=10)
    body = report_body("b")
    body["addr"] = "10.0.0.2:6881"
    store.report(parse_report(body), 0.0, ttl=30)
    with pytest.raises(Exception, match="maximum"):
        store.report(parse_report(report_body("c")), 0.0)
    delta = store.members("g.0", 1.0)
    assert delta.delta == '["+10.0.0.1","+10.0.0.2"]' and delta.epoch == "g.2"
    assert store.members("g.2", 1.0).members is None
    (a,) = [s for s in store.nodes(5.0) if s.report.node == "a"]
    assert a.report.artifacts[0].pieces is None and a.expires_at == 10
    assert store.expire(20.0) == (0, 1) and store.departed() == ["a"]
    assert store.members("g.2", 21.0).delta == '["-10.0.0.1"]'
    assert store.node_count(100.0) == 1
    # a new node's whole list holds the nodes that joined just before it (a short list is
    # rebuilt when stale: swarm.coordinator.fleet.full_list_period)
    late = report_body("d")
    late["addr"] = "10.0.0.4:6881"
    store.report(parse_report(late), 100.0, ttl=30)
    joined = store.members(None, 100.01)
    assert joined.members is not None and "10.0.0.4" in json.loads(joined.members)


# -- two coordinators, one fleet -----------------------------------------------------------------


def shared_app(client: redis.Redis, clock: FakeClock, name: str, tmp_path: Path):
    store = RedisPeerStore(client, name=name)
    planner = StripePlanner(state=RedisPlanState(client))
    return make_app(store, clock=clock, planner=planner, db_path=tmp_path / f"{name}.db", workers=4)


def test_two_coordinators_on_one_redis_serve_one_fleet(client: redis.Redis, tmp_path: Path) -> None:
    clock = FakeClock()
    with (
        serve(shared_app(client, clock, "a", tmp_path)) as url_a,
        serve(shared_app(client, clock, "b", tmp_path)) as url_b,
    ):
        a, b = Server(url_a, clock), Server(url_b, clock)
        a.announce(peer_id=pid(1), port=7001, left=0, event="started")
        reply = b.announce(peer_id=pid(2), port=7002)
        assert decode_compact_peers(reply[b"peers"]) == [("127.0.0.1", 7001)]  # type: ignore[arg-type]

        bitfield = base64.b64encode(bytes(8)).decode()
        geometry = {"size": 64 * MiB, "piece_size": MiB, "piece_count": 64, "pieces": bitfield}
        one = a.post_json(
            "/v1/report", {**report("n1", "10.0.0.1:1", **geometry), "members_epoch": None}
        )[1]
        two = b.post_json(
            "/v1/report", {**report("n2", "10.0.0.2:1", **geometry), "members_epoch": None}
        )[1]
        s1 = one["plans"]["0123456789abcdef0123456789abcdef01234567"]["stripe"]
        s2 = two["plans"]["0123456789abcdef0123456789abcdef01234567"]["stripe"]
        assert s1 == list(range(8)) and s2 == list(range(8, 16))
        # n1 fails over to b with the epoch a gave it: b knows it, and sends what changed
        again = b.post_json(
            "/v1/report",
            {**report("n1", "10.0.0.1:1", **geometry), "members_epoch": one["members_epoch"]},
        )[1]
        assert again["members_delta"] == ["+10.0.0.2"]
        assert again["plans"]["0123456789abcdef0123456789abcdef01234567"]["stripe"] == s1
        # each coordinator's fleet view shows both nodes
        assert sorted(n["node"] for n in a.fleet()["nodes"]) == ["n1", "n2"]
        assert sorted(n["node"] for n in b.fleet()["nodes"]) == ["n1", "n2"]


# -- real daemons, two coordinators, one killed ----------------------------------------------------


def test_two_coordinators_on_redis_one_killed_mid_fetch(
    redis_url: str, env: dict[str, str], artifact: Path, tmp_path: Path
) -> None:
    """Daemons given both coordinators (SWARM_COORDINATOR=A,B) fetch through a slow
    origin; A is killed mid-fetch: every fetch completes and verifies, and B, which
    shares A's state, has the whole fleet in its view."""
    redis.Redis.from_url(redis_url).flushdb()
    root = tmp_path / "fleet"
    root.mkdir()
    with Swarm(root, env) as fleet:
        urls = []
        for index in range(2):
            port = free_port()
            log = (root / f"coordinator{index}.log").open("ab")
            fleet.processes.append(
                subprocess.Popen(
                    [SWARM, "coordinator", "--listen", f"127.0.0.1:{port}", "--store", redis_url],
                    env=env,
                    stdout=log,
                    stderr=log,
                )
            )
            log.close()
            urls.append(f"http://127.0.0.1:{port}")
        for url in urls:
            wait_until(lambda url=url: _healthy(url), 30, f"the coordinator at {url}")
        first, survivor = fleet.processes[0], urls[1]
        fleet.coordinator_url = ",".join(urls)  # what fleet.node() gives each node
        with FaultProxy(env["AWS_ENDPOINT_URL"], Faults(throttle_bps=6 * MiB)) as proxy:
            nodes = [fleet.node(i) for i in range(3)]
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
            first.kill()
            first.wait(10)
            for node, process in fetches:
                done_event(process, FETCH_TIMEOUT)
                assert _sha256(tmp_path / f"{node.name}.db") == _sha256(artifact)

        def all_complete_at_survivor() -> bool:
            view = get_json(survivor + "/v1/fleet")
            names = {n["node"] for n in view["nodes"] if n["artifacts"][0]["complete"]}
            return len(names) >= 3

        wait_until(all_complete_at_survivor, 30, "the surviving coordinator to see every node")


def _healthy(url: str) -> bool:
    try:
        return bool(get_json(url + "/healthz")["ok"])
    except OSError:
        return False


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
