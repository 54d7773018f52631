"""Reading an HTTP body under a low-water mark, over a real socket on loopback: the
body's end comes in parts, so receives return less than was asked, and no read may then
wait for bytes that will not come (it would stall until the socket's timeout)."""

from __future__ import annotations

import http.client
import os
import socket
import threading
from collections.abc import Iterator

import pytest

from swarm.sources.s3 import OVERTAKEN_CHECK, LowWater, read_exactly

BODY = os.urandom((1 << 20) + 300_000)
TAIL_PARTS = (200_000, 60_000, 30_000, 10_000)
"""The body's last bytes, each sent a moment after the one before."""


@pytest.fixture
def body_server() -> Iterator[tuple[str, int]]:
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)  # the request
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(BODY)}\r\n\r\n".encode()
            split = len(BODY) - sum(TAIL_PARTS)
            conn.sendall(head + BODY[:split])
            for size in TAIL_PARTS:
                done.wait(0.1)  # lets the reader take what came
                conn.sendall(BODY[split : split + size])
                split += size
            done.wait(10)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()
    finally:
        done.set()
        listener.close()
        thread.join(5)


def test_a_body_whose_end_comes_in_parts_is_read_without_stalling(body_server):
    host, port = body_server
    conn = http.client.HTTPConnection(host, port, timeout=3)
    conn.request("GET", "/")
    response = conn.getresponse()
    water = LowWater(conn.sock)
    got = bytearray(len(BODY))
    view = memoryview(got)
    for start in range(0, len(BODY), OVERTAKEN_CHECK):
        part = view[start : start + OVERTAKEN_CHECK]
        read_exactly(response, part, water)  # TimeoutError if it stalls
    assert bytes(got) == BODY
    conn.close()


def test_a_body_shorter_than_its_range_ends_at_once_not_at_the_timeout(body_server):
    """The object is shorter than the manifest says (the reader wants 1 MiB more than
    the server sends): the marks follow what the response says is left, so the read
    ends in IncompleteRead as soon as the body does, not in the socket's timeout."""
    host, port = body_server
    conn = http.client.HTTPConnection(host, port, timeout=3)
    conn.request("GET", "/")
    response = conn.getresponse()
    water = LowWater(conn.sock)
    planned = len(BODY) + (1 << 20)
    view = memoryview(bytearray(planned))
    with pytest.raises(http.client.IncompleteRead):
        for start in range(0, planned, OVERTAKEN_CHECK):
            part = view[start : start + OVERTAKEN_CHECK]
            read_exactly(response, part, water)
    conn.close()
