"""A node's interface counter (swarm.agent.linkcount) in a lab namespace: found by the
node's address, and counting what left it (what a tbf still holds has not)."""

from __future__ import annotations

import os
import sys

import pytest

from swarm.lab.netlab import Lab
from tests.fleet.conftest import REPO

pytestmark = pytest.mark.fleet

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


def test_a_hosts_interface_counts_what_it_sent(lab: Lab) -> None:
    a = lab.host("a", up_mbit=100, down_mbit=100)
    b = lab.host("b", up_mbit=100, down_mbit=100)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = a.run([sys.executable, "-c", SEND, a.ip, b.ip], env=env, timeout=30)
    name, sent = done.stdout.split()
    assert name == "eth0"
    assert 100 * 1000 <= int(sent) < 2 * 100 * 1042  # payload and headers, little else
