"""A lab link given a new rate mid-flow keeps carrying its flow (swarm.lab.netlab.reshape).

A tbf changed in place to a smaller bucket kept the packets it had queued under the larger
one, and a GSO packet at its head larger than the new bucket never left: the link
stalled for good (the s3-slows bench's origin, 100 Mbit to 12.5, lost every node's route)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from swarm.lab.netlab import Lab

pytestmark = pytest.mark.fleet

SINK = """
import socket, sys, time
server = socket.create_server((sys.argv[1], 5001))
conn, _ = server.accept()
total, deadline, out = 0, time.monotonic() + 30, sys.argv[2]
while time.monotonic() < deadline:
    data = conn.recv(1 << 20)
    if not data:
        break
    total += len(data)
    with open(out + ".tmp", "w") as f:
        f.write(str(total))
    __import__("os").replace(out + ".tmp", out)
"""

SOURCE = """
import socket, sys, time
for _ in range(100):
    try:
        conn = socket.create_connection((sys.argv[1], 5001), timeout=1)
        break
    except OSError:
        time.sleep(0.05)
conn.settimeout(None)  # the connect's timeout is not the sends': a slowed link blocks them
block, deadline = b"x" * (1 << 20), time.monotonic() + 30
while time.monotonic() < deadline:
    conn.sendall(block)
"""


def _received(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def test_a_link_slowed_mid_flow_keeps_carrying_it(lab: Lab, tmp_path: Path) -> None:
    sender = lab.host("tx", 1000, 1000)
    receiver = lab.host("rx", 1000, 1000)
    count = tmp_path / "received"
    receiver.popen([sys.executable, "-c", SINK, receiver.ip, count])
    time.sleep(0.3)
    sender.popen([sys.executable, "-c", SOURCE, receiver.ip])
    deadline = time.monotonic() + 10
    while _received(count) < 8 << 20 and time.monotonic() < deadline:  # the queue has filled
        time.sleep(0.1)
    assert _received(count) >= 8 << 20, "the flow never filled the link"
    # each slowing from 1000 Mbit finds the queue holding the flow's GSO packets (TCP
    # sizes them to a millisecond of its rate, up to 64 KiB of payload: ~68 KB with
    # headers, within 1000 Mbit's bucket, not within 12.5's 64 KiB); the test slows the
    # link four times
    for _ in range(4):
        sender.set_rates(1000, 1000)
        time.sleep(1.0)
        sender.set_rates(12.5, 1000)
        time.sleep(0.5)
        before = _received(count)
        time.sleep(1.5)
        carried = _received(count) - before
        # 1.5 s at 12.5 Mbit is 2.3 MB: at least a third of it
        assert carried >= 12.5e6 / 8 * 1.5 / 3, carried
