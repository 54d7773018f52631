"""Churn: kill -9 two of eight nodes, or the origin seeder, at 10%, 50% and 90% of the
fleet's progress; every surviving node completes with the right SHA-256."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from swarm.agent.client import DaemonClient
from swarm.lab.netlab import Host, Lab, wait_for
from tests.servers import BIN

NODES = 8
SIZE = 16 << 20
VICTIMS = (1, 5)


def progress(homes: list[Path]) -> float:
    """Mean share of the artifact the given nodes hold (0 for a node not yet up)."""
    total = 0.0
    for home in homes:
        try:
            (art,) = DaemonClient(home).call("GET", "/v1/artifacts", timeout=2)["artifacts"]
            total += art["have_bytes"] / art["size"]
        except (OSError, ValueError):
            pass
    return total / len(homes)


def kill9(lab: Lab, host: Host) -> None:
    for pid in lab.netns_pids(host.netns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.stack_size(SIZE)
@pytest.mark.parametrize("at", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("victim", ["two-nodes", "origin-seeder"])
def test_survivors_complete(lab: Lab, stack, tmp_path: Path, at: float, victim: str):
    origin, env, src = stack
    origin.set_rates(80, 1000)  # a slower origin than the swarm: peers carry the fleet
    coordinator = f"http://{origin.ip}:7070"
    base = {**env, "SWARM_COORDINATOR": coordinator, "SWARM_CATALOG": "s3://fleet/catalog/"}

    seeder = lab.host("seeder", 100, 100)
    seeder_home = tmp_path / "seeder"
    seeder.popen(
        [
            BIN / "swarm-seeder",
            "origin",
            "--catalog",
            "s3://fleet/catalog/",
            "--artifact",
            "index.db",
            "--listen",
            seeder.ip,
        ],
        env={**base, "SWARM_HOME": str(seeder_home)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: progress([seeder_home]) >= 1.0, 60, "the origin seeder to pre-heat")

    hosts, homes, fetches = [], [], []
    for i in range(NODES):
        host = lab.host(f"n{i}", 50, 100)
        home = tmp_path / f"n{i}"
        fetches.append(
            host.popen(
                [
                    BIN / "swarm",
                    "fetch",
                    "index.db",
                    tmp_path / f"n{i}.db",
                    "--listen",
                    host.ip,
                    "--json",
                ],
                env={**base, "SWARM_HOME": str(home)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
        hosts.append(host)
        homes.append(home)

    wait_for(lambda: progress(homes) >= at, 90, f"{at:.0%} fleet progress", step=0.05)
    if victim == "two-nodes":
        for i in VICTIMS:
            kill9(lab, hosts[i])
        survivors = [i for i in range(NODES) if i not in VICTIMS]
    else:
        kill9(lab, seeder)
        survivors = list(range(NODES))

    expected = hashlib.sha256(src.read_bytes()).hexdigest()
    for i in survivors:
        out, err = fetches[i].communicate(timeout=120)
        assert fetches[i].returncode == 0, err[-2000:]
        done = json.loads(out.splitlines()[-1])
        assert done["event"] == "done" and done["sha256"] == expected
        assert hashlib.sha256((tmp_path / f"n{i}.db").read_bytes()).hexdigest() == expected
