"""Real servers on loopback for the tests: an S3 server (moto's server mode) and a
fault-injecting HTTP proxy to put in front of it."""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def wait_until(
    predicate: Callable[[], bool], timeout: float, what: str, step: float = 0.05
) -> None:
    """Poll ``predicate`` until true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=1).close()
        return True
    except OSError as error:
        return getattr(error, "code", None) is not None  # an HTTP error is an answer


@contextlib.contextmanager
def moto_server(host: str = "127.0.0.1", env: dict[str, str] | None = None) -> Iterator[str]:
    """Run ``moto_server`` as a child process; yield its endpoint URL."""
    port = free_port(host)
    proc = subprocess.Popen(
        [str(BIN / "moto_server"), "-H", host, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    url = f"http://{host}:{port}"
    try:
        wait_until(lambda: _answers(url + "/moto-api/"), 30, "moto_server to start")
        yield url
    finally:
        proc.kill()
        proc.wait(10)


@dataclass
class Faults:
    """What the proxy does to the requests it forwards. Counters are for assertions."""

    corrupt_ranged_gets: int = 0
    """Flip one byte in the body of this many ranged GETs (then pass through)."""
    fail_every: int = 0
    """Answer every Nth request with ``fail_status`` instead of forwarding (0 = never)."""
    fail_status: int = 503
    fail_ranged_status: int = 0
    """Answer every ranged GET (a body read; manifests are read whole) with this status
    while it is set: an outage of S3 reads, switched on and off by the test (0 = off)."""
    reset_every: int = 0
    """Close the connection mid-body on every Nth ranged GET (0 = never)."""
    throttle_bps: int = 0
    """Pace response bodies, all connections together, to this many bytes per second: a
    slow origin, however many GETs a client keeps in flight (0 = unlimited)."""
    paced_until: float = 0.0
    requests: int = 0
    corrupted: int = 0
    failed: int = 0
    resets: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


S3_ERRORS = {
    503: ("SlowDown", "Please reduce your request rate."),
    500: ("InternalError", "We encountered an internal error. Please try again."),
    403: ("AccessDenied", "Access Denied"),
}


class FaultProxy:
    """A forwarding HTTP proxy that injects S3-style faults into real traffic."""

    def __init__(
        self, upstream: str, faults: Faults | None = None, bind: tuple[str, int] = ("127.0.0.1", 0)
    ) -> None:
        self.upstream = upstream.removeprefix("http://")
        self.faults = faults or Faults()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                proxy._forward(self)

            do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

        self.server = ThreadingHTTPServer(bind, Handler)
        self.server.daemon_threads = True
        self.url = f"http://{bind[0]}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FaultProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _forward(self, handler: BaseHTTPRequestHandler) -> None:
        f = self.faults
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else None
        ranged = handler.command == "GET" and "Range" in handler.headers
        with f.lock:
            f.requests += 1
            n = f.requests
            fail = bool(f.fail_every) and n % f.fail_every == 0
            status = f.fail_status
            if ranged and f.fail_ranged_status:
                fail, status = True, f.fail_ranged_status
            corrupt = ranged and f.corrupted < f.corrupt_ranged_gets
            reset = ranged and bool(f.reset_every) and n % f.reset_every == 0
            if fail:
                f.failed += 1
            if corrupt:
                f.corrupted += 1
            if reset:
                f.resets += 1
        if fail:
            code, message = S3_ERRORS.get(status, ("Error", "injected"))
            payload = (
                f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>{message}"
                "</Message></Error>"
            ).encode()
            handler.send_response(status)
            handler.send_header("Content-Type", "application/xml")
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
            return
        conn = http.client.HTTPConnection(self.upstream, timeout=60)
        headers = {k: v for k, v in handler.headers.items() if k.lower() != "connection"}
        conn.request(handler.command, handler.path, body=body, headers=headers)
        resp = conn.getresponse()
        handler.send_response(resp.status)
        for key, value in resp.getheaders():
            if key.lower() not in {"connection", "transfer-encoding", "server", "date"}:
                handler.send_header(key, value)
        handler.end_headers()
        if handler.command == "HEAD":
            conn.close()
            return
        sent = 0
        while chunk := resp.read(64 * 1024):
            if corrupt and sent == 0:
                chunk = bytes([chunk[0] ^ 0xFF]) + chunk[1:]
            if reset and sent > 0:
                handler.connection.shutdown(socket.SHUT_RDWR)
                handler.close_connection = True
                conn.close()
                return
            handler.wfile.write(chunk)
            sent += len(chunk)
            if f.throttle_bps:
                with f.lock:
                    now = time.monotonic()
                    f.paced_until = max(f.paced_until, now) + len(chunk) / f.throttle_bps
                    ahead = f.paced_until - now
                if ahead > 0:
                    time.sleep(ahead)  # pacing, not synchronisation
        conn.close()
