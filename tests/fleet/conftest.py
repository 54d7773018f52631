"""Fixtures for the fleet tests: a network lab, an origin (S3 + publish), a fleet driver.

The fleet tests drive :class:`swarm.lab.fleet.Fleet` (one code path for the benchmark
and its tests) on a small setup. They need root and ``ip netns``; elsewhere they are
skipped with the reason. The S3 server is moto (``moto_server``, in the venv), so a
clean clone needs no Go build; ``SWARM_FLEET_S3=minio`` switches to MinIO.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarm.lab.coordinator import Coordinator
from swarm.lab.fleet import Fleet, started_fleet
from swarm.lab.fleetdata import FleetConfig
from swarm.lab.netlab import Host, Lab, lab_unavailable
from swarm.lab.s3 import S3Server, publish
from tests.conftest import CREDENTIALS, make_artifact

REPO = Path(__file__).resolve().parents[2]
STACK_SIZE = 8 << 20


@pytest.fixture(scope="session")
def lab_reason() -> str | None:
    return lab_unavailable()


@pytest.fixture
def lab(lab_reason: str | None) -> Iterator[Lab]:
    if lab_reason:
        pytest.skip(lab_reason)
    with Lab("ft") as instance:
        yield instance


@pytest.fixture
def stack(
    lab: Lab, tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[Host, dict[str, str], Path]:
    """Origin host with an S3 server and a coordinator; ``index.db`` (``STACK_SIZE``, or
    the test's ``stack_size`` marker) published in ``s3://fleet/catalog/``. The origin's
    rates are 1000/1000 Mbit unless the test reshapes them."""
    marker = request.node.get_closest_marker("stack_size")
    size = marker.args[0] if marker else STACK_SIZE
    origin = lab.host("origin", 1000, 1000)
    env = {**os.environ, **CREDENTIALS, "SWARM_CONFIG": str(tmp_path / "none.toml")}
    env.pop("SWARM_SECRET", None)
    s3 = S3Server(origin, "moto", 5000, tmp_path, env)
    s3.start()
    Coordinator(origin, env, tmp_path / "coordinator.log").start(wait=False)
    env["AWS_ENDPOINT_URL"] = s3.url
    src = make_artifact(tmp_path / "index.db", size, seed=9)
    s3.create_bucket("fleet")  # waits for the S3 server
    origin.wait_http(f"http://{origin.ip}:7070/healthz", 30, "the coordinator")
    publish(origin, env, src, "s3://fleet/builds/index.db", name="index.db",
            catalog="s3://fleet/catalog/")  # fmt: skip
    return origin, env, src


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    """4 new nodes and an origin (S3 server, the 16 MiB artifact published), origin-bound
    rates: origin up 100 Mbit, nodes 200/200 Mbit. Tests may reshape the origin."""
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    config = FleetConfig(
        nodes=4,
        size=16 << 20,
        piece_size=1 << 20,
        origin_up=100,
        node_up=200,
        node_down=200,
        s3=os.environ.get("SWARM_FLEET_S3", "moto"),
        system_timeout=90,
        scenario="origin-bound",
    )
    with started_fleet(config, lab_name="ft") as instance:
        yield instance
