"""Redundant SYNs: the first of two connects is kept, the other closed unused."""

from __future__ import annotations

import socket
import threading

import pytest

from swarm.netconnect import DUPLICATE_SYNS, race_connect


def test_the_first_connection_is_kept_and_carries_the_bytes() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[bytes] = []

    def serve() -> None:
        listener.settimeout(2.0)
        for _ in range(DUPLICATE_SYNS):
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                return
            with conn:
                conn.settimeout(2.0)
                accepted.append(conn.recv(16))  # b"" from the loser: closed unused

    thread = threading.Thread(target=serve)
    thread.start()
    with race_connect(listener.getsockname(), timeout=2.0) as sock:
        assert sock.getblocking() and sock.gettimeout() == 2.0
        sock.sendall(b"hello")
    thread.join()
    listener.close()
    assert b"hello" in accepted
    assert [data for data in accepted if data] == [b"hello"]


def test_a_refused_connect_raises_as_create_connection_does() -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]  # closed on leaving: nothing listens there
    with pytest.raises(ConnectionRefusedError):
        race_connect(("127.0.0.1", port), timeout=2.0)


def test_without_a_timeout_the_socket_blocks() -> None:
    with (
        socket.create_server(("127.0.0.1", 0)) as listener,
        race_connect(listener.getsockname()) as sock,
    ):
        assert sock.getblocking() and sock.gettimeout() is None
