"""The interface counter a node reports as its uplink measure (swarm.agent.linkcount):
found by the node's address in its namespace, and counting what left it."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarm.agent.linkcount import link_interface, sent_bytes

ROOT = Path(__file__).resolve().parents[2]

SEND = """\
import socket, sys, time
from swarm.agent.linkcount import link_interface, sent_bytes
name = link_interface(sys.argv[1])
before = sent_bytes(name)
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as out:
    for _ in range(100):
        out.sendto(bytes(1000), (sys.argv[2], 9))
    time.sleep(0.3)  # the link's queue (tbf) drains: what it holds has not left yet
print(name, sent_bytes(name) - before)
"""


@pytest.fixture
def lab() -> Iterator[object]:
    from swarm.lab.netlab import Lab, lab_unavailable

    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    with Lab("swlnk") as lab:
        yield lab


def test_no_counter_for_loopback_unheld_or_unspecified_addresses() -> None:
    assert link_interface("127.0.0.1") is None  # nodes on one machine share it
    assert link_interface("0.0.0.0") is None
    assert link_interface("198.51.100.254") is None  # TEST-NET-2: held by no interface
    assert link_interface("not an address") is None
    assert sent_bytes("no-such-interface0") is None


@pytest.mark.fleet
def test_a_hosts_interface_counts_what_it_sent(lab: object) -> None:
    a = lab.host("a", up_mbit=100, down_mbit=100)  # type: ignore[attr-defined]
    b = lab.host("b", up_mbit=100, down_mbit=100)  # type: ignore[attr-defined]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = a.run([sys.executable, "-c", SEND, a.ip, b.ip], env=env, timeout=30)
    name, sent = done.stdout.split()
    assert name == "eth0"
    assert 100 * 1000 <= int(sent) < 2 * 100 * 1042  # payload and headers, little else
