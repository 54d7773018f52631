"""One TCP flow between two lab hosts, measured (:mod:`swarm.lab.netlab`): the receiver's
MB/s, and the lab's self-check that tbf holds (``python -m swarm.lab.tcpmeasure``). Each
runs small Python programs in the hosts' namespaces, bounded in time.

    with Lab("fl") as lab:
        a = lab.host("a", up_mbit=100, down_mbit=100)
        b = lab.host("b", up_mbit=100, down_mbit=100)
        print(measure_tcp(a, b, 20 << 20))   # ~12 MB/s: tbf holds
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence

from swarm.lab.netlab import Host, Lab, LabError, lab_unavailable
from swarm.lab.procs import kill_group

# -- self-check: does tbf hold? -----------------------------------------------------------

RECEIVER = """\
import socket, sys, time
srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
srv.settimeout(float(sys.argv[4]))
print("listening", flush=True)
conn, _ = srv.accept()
conn.settimeout(float(sys.argv[4]))
want, got, first = int(sys.argv[3]), 0, None
while got < want:
    data = conn.recv(1 << 20)
    if not data:
        break
    if first is None:
        first = time.monotonic()
    got += len(data)
print(got, time.monotonic() - (first or time.monotonic()), flush=True)
"""

SENDER = """\
import socket, sys
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[4]))
block, left = bytes(1 << 20), int(sys.argv[3])
while left:
    n = min(left, len(block))
    conn.sendall(block[:n])
    left -= n
conn.shutdown(socket.SHUT_WR)
conn.recv(1)
"""


def listen_then_send(
    receiver: Host,
    receive: Sequence[str],
    sender: Host,
    send: Sequence[str],
    send_timeout: float,
    receive_timeout: float,
    what: str,
) -> tuple[str, str]:
    """Run the Python program ``receive`` (source, then its arguments) on ``receiver``;
    once it prints ``listening``, run ``send`` on ``sender``. Returns both outputs
    (receiver's, sender's); the receiver is stopped whatever happens. ``what`` names the
    receiver in the error if it does not start."""
    recv = receiver.popen([sys.executable, "-c", *receive], stdout=subprocess.PIPE, text=True)
    try:
        assert recv.stdout is not None
        if recv.stdout.readline().strip() != "listening":
            raise LabError(f"the {what} did not start")
        sent = sender.run([sys.executable, "-c", *send], timeout=send_timeout)
        out, _ = recv.communicate(timeout=receive_timeout)
    finally:
        kill_group(recv)
    return out, sent.stdout


def measure_tcp(
    sender: Host, receiver: Host, size: int = 20 << 20, port: int = 5999, timeout: float = 60.0
) -> float:
    """Send ``size`` bytes over one TCP connection; return the receiver's MB/s (1e6 B/s)."""
    args = [receiver.ip, str(port), str(size), str(timeout)]
    out, _ = listen_then_send(
        receiver, [RECEIVER, *args], sender, [SENDER, *args], timeout, timeout, "TCP receiver"
    )
    got, seconds = out.split()
    if int(got) != size:
        raise LabError(f"the receiver got {got} of {size} bytes")
    return size / max(float(seconds), 1e-9) / 1e6


def self_check(mbit: float = 100.0, size: int = 20 << 20) -> dict[str, float]:
    """Measure both directions of a ``mbit`` link pair and an unshaped-ish 10x link:
    returns MB/s per case with the expectation (``mbit / 8``, less ~5% TCP/IP headers)."""
    with Lab("chk") as lab:
        a = lab.host("a", up_mbit=mbit, down_mbit=10 * mbit)
        b = lab.host("b", up_mbit=10 * mbit, down_mbit=mbit)
        c = lab.host("c", up_mbit=10 * mbit, down_mbit=10 * mbit)
        return {
            "expected_mb_s": mbit / 8,
            "a->c (a's upload)": measure_tcp(a, c, size),
            "c->b (b's download)": measure_tcp(c, b, size),
            "c->a (10x link)": measure_tcp(c, a, size),
        }


if __name__ == "__main__":
    reason = lab_unavailable()
    if reason:
        sys.exit(f"tcpmeasure: {reason}")
    print(json.dumps(self_check(), indent=2))
