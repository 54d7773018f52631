"""The kernel's TCP table over netlink (swarm.agent.tcpdiag): what ``ss -t -i`` shows."""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess

import pytest

from swarm.agent import tcpdiag


def _connected(family: int, host: str) -> tuple[socket.socket, socket.socket, socket.socket]:
    listener = socket.socket(family)
    listener.bind((host, 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname()[:2])
    server, _ = listener.accept()
    client.sendall(b"x" * 4096)
    assert server.recv(4096)
    server.sendall(b"y")
    assert client.recv(1) == b"y"
    return listener, client, server


def test_reads_the_least_round_trip_of_ipv4_and_ipv6_connections() -> None:
    opened = [*_connected(socket.AF_INET, "127.0.0.1"), *_connected(socket.AF_INET6, "::1")]
    try:
        rtts = tcpdiag.tcp_min_rtts()
    finally:
        for sock in opened:
            sock.close()
    assert 0 < rtts["127.0.0.1"] < 0.01
    assert 0 < rtts["::1"] < 0.01


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs iproute2's ss")
def test_agrees_with_ss() -> None:
    """The same peers and least round trips as ``ss -t -i`` (its minrtt, in ms)."""
    opened = list(_connected(socket.AF_INET, "127.0.0.1"))
    try:
        ours = tcpdiag.tcp_min_rtts()
        text = subprocess.run(["ss", "-H", "-t", "-i", "-n"], capture_output=True, text=True,
                              check=True).stdout  # fmt: skip
    finally:
        for sock in opened:
            sock.close()
    theirs = [
        float(part.split(":")[1]) / 1e3 for part in text.split() if part.startswith("minrtt:")
    ]
    assert theirs and min(theirs) == pytest.approx(min(ours.values()), abs=1e-6)


def test_an_ipv4_mapped_peer_is_named_as_ipv4() -> None:
    mapped = socket.inet_pton(socket.AF_INET6, "::ffff:10.1.2.3")
    assert tcpdiag._peer(socket.AF_INET6, mapped) == "10.1.2.3"
    assert tcpdiag._peer(socket.AF_INET, socket.inet_aton("10.9.8.7") + bytes(12)) == "10.9.8.7"
    # the one name for an address, here and for S3's resolved ones (rtt.endpoint_addresses)
    assert tcpdiag.plain_address("::ffff:10.1.2.3") == "10.1.2.3"
    assert tcpdiag.plain_address("fe80::1%eth0") == "fe80::1"
    assert tcpdiag.plain_address("2001:db8::1") == "2001:db8::1"
    assert tcpdiag.plain_address("10.0.0.1") == "10.0.0.1"


def test_a_message_without_tcp_info_or_a_measured_rtt_gives_none() -> None:
    def attribute(kind: int, body: bytes) -> bytes:
        return struct.pack("=HH", 4 + len(body), kind) + body

    info = bytearray(160)
    struct.pack_into("=I", info, 148, 2500)  # tcpi_min_rtt: 2.5 ms
    assert (
        tcpdiag._min_rtt(memoryview(attribute(1, b"\0" * 4) + attribute(2, bytes(info)))) == 0.0025
    )
    assert tcpdiag._min_rtt(memoryview(attribute(2, bytes(160)))) is None  # not measured yet
    struct.pack_into("=I", info, 148, 0xFFFFFFFF)  # the kernel's ~0U: no sample yet either
    assert tcpdiag._min_rtt(memoryview(attribute(2, bytes(info)))) is None
    assert tcpdiag._min_rtt(memoryview(attribute(2, bytes(100)))) is None  # an old kernel's
    assert tcpdiag._min_rtt(memoryview(b"")) is None
