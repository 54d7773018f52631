"""Fleet correctness: real namespaces, tbf-shaped links, real S3 server, coordinator, swarm.

Each test runs ``swarm fetch`` on every node at once (bench/fleet.py's driver); the driver
fails the run if any node's file does not match the artifact's SHA-256.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import Any

import pytest

from swarm.lab.netlab import Lab, pid_alive
from swarm.lab.tcpmeasure import measure_tcp

pytestmark = pytest.mark.fleet

MiB = 1 << 20


def test_tbf_holds_the_configured_rates(lab: Lab) -> None:
    slow = lab.host("slow", up_mbit=100, down_mbit=1000)
    fast = lab.host("fast", up_mbit=1000, down_mbit=1000)
    upload = measure_tcp(slow, fast, 8 * MiB)
    download = measure_tcp(fast, slow, 8 * MiB)
    # 100 Mbit = 12.5 MB/s of IP; TCP payload is ~95% of it
    assert 10.5 < upload < 13.0, upload
    assert download > 30, download  # the 1000 Mbit side is not capped at 100


def test_lab_cleans_up_its_processes_and_namespaces(lab_reason: str | None) -> None:
    if lab_reason:
        pytest.skip(lab_reason)
    with Lab("ftc") as lab:
        host = lab.host("h", up_mbit=10, down_mbit=10)
        sleeper = host.popen(["sleep", "300"])
        # a process that left our process group, like a daemon does
        detached = host.run(
            [sys.executable, "-c",
             "import subprocess as s; print(s.Popen(['sleep', '300'], start_new_session=True,"
             " stdout=s.DEVNULL, stderr=s.DEVNULL).pid)"],
        ).stdout  # fmt: skip
        namespaces = [host.netns, lab.switch]
        assert len(host.pids()) >= 2
    assert sleeper.poll() is not None
    assert not pid_alive(int(detached))
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listed.split() for name in namespaces), listed


def _run_swarm(fleet: Any) -> Any:
    result = fleet.run_system("swarm")
    assert len(result.nodes) == fleet.config.nodes
    assert all(n.sha256_ok for n in result.nodes)
    return result


def test_origin_bound_every_node_gets_the_artifact_origin_sends_it_about_once(
    fleet: Any,
) -> None:
    fleet.origin.set_rates(100, 1000)
    fleet.config = dataclasses.replace(fleet.config, origin_up=100, scenario="origin-bound")
    result = _run_swarm(fleet)
    size = fleet.config.size
    # the origin is the bottleneck: the swarm must spread its bytes, not have every node
    # read the object (that would be N x F = 4 x F)
    assert result.origin_tx_bytes <= 1.5 * size, (
        f"the origin sent {result.origin_tx_bytes / size:.2f} x F",
        [n.bytes_by_source for n in result.nodes],
    )


def test_swarm_bound_every_node_gets_the_artifact(fleet: Any) -> None:
    fleet.origin.set_rates(1000, 1000)
    fleet.config = dataclasses.replace(fleet.config, origin_up=1000, scenario="swarm-bound")
    result = _run_swarm(fleet)
    for node in result.nodes:
        got = sum((node.bytes_by_source or {}).values())
        assert got >= fleet.config.size, (node.node, node.bytes_by_source)
    # no node reads the object more than about once from the origin
    assert result.origin_tx_bytes <= 1.1 * fleet.config.nodes * fleet.config.size
    # the bench's link summary (swarm.lab.linkuse) saw the run as the origin's port did
    use = result.links
    assert use is not None and use.first_bytes is not None, fleet.config
    sent = use.origin * result.all_done * 1000e6 / 8
    assert sent == pytest.approx(result.origin_tx_bytes, rel=0.15)
    assert 0 < use.down <= 1.05 and 0 <= use.up <= 1.05
