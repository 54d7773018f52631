"""Fixtures for the fleet tests: a network lab, an origin (S3 + publish), a fleet driver.

The fleet tests drive ``bench/fleet.py``'s :class:`Fleet` (one code path for the
benchmark and its tests) on a small setup. They need root and ``ip netns``; elsewhere
they are skipped with the reason. The S3 server is moto (``moto_server``, in the venv),
so a clean clone needs no Go build; ``SWARM_FLEET_S3=minio`` switches to MinIO.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.netlab import Lab, lab_unavailable

REPO = Path(__file__).resolve().parents[2]


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
