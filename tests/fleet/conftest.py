"""Fixtures for the fleet tests: a network lab, an origin (S3 + publish), a fleet driver.

The fleet tests drive ``bench/fleet.py``'s :class:`Fleet` (one code path for the
benchmark and its tests) on a small setup. They need root and ``ip netns``; elsewhere
they are skipped with the reason. The S3 server is moto (``moto_server``, in the venv),
so a clean clone needs no Go build; ``SWARM_FLEET_S3=minio`` switches to MinIO.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import CREDENTIALS, make_artifact
from tests.netlab import Host, Lab, lab_unavailable, wait_for
from tests.servers import BIN

REPO = Path(__file__).resolve().parents[2]
STACK_SIZE = 8 << 20


def _load_bench_fleet() -> ModuleType:
    """Import bench/fleet.py (bench/ is scripts, not a package)."""
    name = "swarm_bench_fleet"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / "fleet.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


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
    origin.popen(
        [BIN / "moto_server", "-H", origin.ip, "-p", "5000"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    origin.popen(
        [BIN / "swarm", "coordinator", "--listen", f"{origin.ip}:7070"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    s3 = f"http://{origin.ip}:5000"
    env["AWS_ENDPOINT_URL"] = s3
    wait_for(
        lambda: (
            origin.run(["curl", "-sf", f"http://{origin.ip}:7070/healthz"], check=False).returncode
            == 0
        ),
        30,
        "coordinator",
    )
    wait_for(
        lambda: origin.run(["curl", "-s", "-o", "/dev/null", s3], check=False).returncode == 0,
        30,
        "S3 server",
    )
    src = make_artifact(tmp_path / "index.db", size, seed=9)
    origin.run(
        [sys.executable, "-c", "import boto3; boto3.client('s3').create_bucket(Bucket='fleet')"],
        env=env,
    )
    origin.run(
        [
            BIN / "swarm",
            "publish",
            src,
            "s3://fleet/builds/index.db",
            "--name",
            "index.db",
            "--catalog",
            "s3://fleet/catalog/",
        ],
        env=env,
    )
    return origin, env, src


@pytest.fixture(scope="module")
def bench_fleet() -> ModuleType:
    return _load_bench_fleet()


@pytest.fixture(scope="module")
def fleet(bench_fleet: ModuleType) -> Iterator[object]:
    """4 new nodes and an origin (S3 server, the 16 MiB artifact published), origin-bound
    rates: origin up 100 Mbit, nodes 200/200 Mbit. Tests may reshape the origin."""
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    config = bench_fleet.FleetConfig(
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
    with tempfile.TemporaryDirectory(prefix="swarm-fleet-test-") as work, Lab("ft") as lab:
        instance = bench_fleet.Fleet(config, lab, Path(work))
        instance.start_origin()
        yield instance
