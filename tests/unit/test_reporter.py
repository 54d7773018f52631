"""The daemon's report loop against a real HTTP server on loopback."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from swarm.agent import reporter
from swarm.agent.reporter import report_loop
from swarm.netconnect import DUPLICATE_SYNS


class _Daemon:
    """What report_loop reads of a daemon: its coordinators, token and snapshot."""

    token = None
    report_interval = 1.0

    def __init__(self, url: str) -> None:
        self.coordinators = [url]
        self.snapshots = 0

    def snapshot(self) -> dict[str, Any]:
        self.snapshots += 1
        return {"n": self.snapshots}

    def take_plans(self, plans: dict[str, Any], interval: float) -> None:
        pass

    def take_members(self, ips: list[str]) -> None:
        pass


def _reply(handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
    """A coordinator's JSON answer to a report."""
    raw = json.dumps(body).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(raw)))
    handler.end_headers()
    handler.wfile.write(raw)


def test_a_wake_during_a_post_sends_the_next_report_at_once() -> None:
    """A fetch that asks for its first plan while a report is on its way (the daemon's
    first one, sent as it starts) must not wait the coordinator's interval: that report
    does not hold the fetch. Before, the wake was cleared after the post and lost."""
    arrived: list[float] = []
    first_in = threading.Event()
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            arrived.append(time.monotonic())
            if len(arrived) == 1:
                first_in.set()
                release.wait(5)
            _reply(self, {"interval": 30})  # a long interval: only a wake

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    daemon = _Daemon(f"http://127.0.0.1:{server.server_address[1]}")

    async def run() -> None:
        wake = asyncio.Event()
        loop_task = asyncio.create_task(report_loop(daemon, wake))  # type: ignore[arg-type]
        try:
            await asyncio.to_thread(first_in.wait, 5)
            wake.set()  # while the first report waits for its answer
            release.set()
            deadline = time.monotonic() + 3
            while len(arrived) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            loop_task.cancel()
            await asyncio.gather(loop_task, return_exceptions=True)

    try:
        asyncio.run(run())
    finally:
        release.set()
        server.shutdown()
        server.server_close()
    assert len(arrived) >= 2, "the wake during the first post was lost (next report in 30 s)"
    assert arrived[1] - arrived[0] < 1.0


def test_the_first_report_waits_for_a_fetch_on_a_connection_already_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A daemon started by ``swarm fetch`` gets the fetch 0.1 s after it listens: its
    first report goes out with it, on a connection opened meanwhile (a report at once
    held the fetch's behind a round trip), and without one after FIRST_REPORT_HOLD (a
    second here: wide margins on a loaded machine)."""
    hold = 1.0
    monkeypatch.setattr(reporter, "FIRST_REPORT_HOLD", hold)
    connected: list[float] = []
    posted: list[tuple[float, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the coordinator's aiohttp

        def setup(self) -> None:
            connected.append(time.monotonic())
            super().setup()

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            posted.append((time.monotonic(), body))
            _reply(self, {"interval": 30})

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    daemon = _Daemon(f"http://127.0.0.1:{server.server_address[1]}")

    async def run(wake_after: float | None) -> float:
        wake = asyncio.Event()
        started = time.monotonic()
        task = asyncio.create_task(report_loop(daemon, wake))  # type: ignore[arg-type]
        try:
            if wake_after is not None:
                await asyncio.sleep(wake_after)
                wake.set()  # the fetch's request
            while not posted and time.monotonic() - started < 3:
                await asyncio.sleep(0.01)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return started

    try:
        started = asyncio.run(run(0.3))
        # open before the fetch (two SYNs raced: swarm.netconnect; the loser closes unused)
        assert 1 <= len(connected) <= DUPLICATE_SYNS and connected[0] - started < 0.3
        assert 0.3 <= posted[0][0] - started < hold
        posted.clear()
        started = asyncio.run(run(None))
        assert hold <= posted[0][0] - started < 2 * hold
    finally:
        server.shutdown()
        server.server_close()


def test_the_first_report_takes_the_connection_opened_as_the_daemon_started() -> None:
    """``preconnect`` (called first thing in the process ``swarm fetch`` forks) opens the
    coordinator's connection; the reporter's ``open`` takes it and posts on it."""
    peers: list[tuple[str, int]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            peers.append(self.client_address)
            _reply(self, {"interval": 30})

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        reporter.preconnect(url)
        opened = reporter._PRECONNECTED[f"127.0.0.1:{server.server_address[1]}"].result(5)
        poster = reporter.ReportPoster({})
        assert poster.open(f"{url}/v1/report")
        assert reporter._PRECONNECTED == {}  # taken once
        status, reply = poster.post(f"{url}/v1/report", {"node": "n"})
        assert status == 200 and reply == {"interval": 30}
        assert peers == [opened.getsockname()]  # on the connection opened ahead
        # and without Nagle, as http.client's own connect leaves its sockets: a request's
        # headers and body are two writes, and the body would wait for an ACK
        assert opened.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        poster.close()
        reporter.preconnect("https://127.0.0.1:1")  # TLS: the reporter connects itself
        assert reporter._PRECONNECTED == {}
    finally:
        server.shutdown()
        server.server_close()


def test_a_reply_the_daemon_fails_on_is_logged_and_reporting_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An error taking a reply (a bug in a plan's handling) must not end the loop's task:
    the node would leave its fleet without a word until the daemon stopped."""
    arrived: list[float] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            arrived.append(time.monotonic())
            _reply(self, {"interval": 0.2, "plans": {}})

        def log_message(self, *args: object) -> None:
            pass

    class Failing(_Daemon):
        def take_plans(self, plans: dict[str, Any], interval: float) -> None:
            raise AttributeError("'str' object has no attribute 'value'")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    daemon = Failing(f"http://127.0.0.1:{server.server_address[1]}")

    async def run() -> None:
        task = asyncio.create_task(report_loop(daemon, asyncio.Event()))  # type: ignore[arg-type]
        deadline = time.monotonic() + 5
        while len(arrived) < 3 and time.monotonic() < deadline and not task.done():
            await asyncio.sleep(0.05)
        assert not task.done()
        task.cancel()

    try:
        asyncio.run(run())
        assert len(arrived) >= 3
        assert "unexpected error" in caplog.text and "has no attribute" in caplog.text
    finally:
        server.shutdown()
        server.server_close()
