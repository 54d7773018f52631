"""The demo's S3 server: moto's (the ``[demo]`` extra), with two things in front of it.

1. **Ranged GETs from the object's buffer.** moto builds every GET's response from the
   whole object, then slices the range: on this project's machine a 4 MiB GET of a
   256 MiB object took 0.25 s, and the demo spent most of its time waiting on it. A GET
   of one byte range of an existing object is answered here from the object's own
   buffer (under its lock, as moto's reads are). Anything else, errors included, is
   moto's answer.
2. **An origin link.** Object bodies leave at ``--rate`` bytes/s at most, shared by every
   connection: the link a fleet shares to its origin (a NAT gateway, a VPC endpoint, a
   prefix's throughput), so that "every node reads S3 itself" costs in the demo what it
   costs on a fleet rather than what loopback costs.

``GET /_demo/stats`` answers ``{"bytes_out": N}``: object bytes sent so far, which the
demo reads before and after each run to say how much S3 sent.

    python -m swarm.demo_s3 --host 127.0.0.1 --port 5000 --rate 64M

Loopback only: no authentication is checked (moto's default).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import unquote

CHUNK = 256 << 10
"""Bytes paced at a time (small against a second of any useful rate)."""

BURST_SECONDS = 0.05
"""How far ahead of the rate a sender may run: a 50 ms burst, as a router's queue."""

KEY_BUFFER = 2 << 30
"""moto keeps an object in memory up to this size (else in a temporary file); reads of
ranges are then copies in memory."""

STATS_PATH = "/_demo/stats"

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]


class Pacer:
    """A token bucket shared by threads: ``take(n)`` returns once ``n`` more bytes fit
    in ``rate`` bytes/s (with a burst of :data:`BURST_SECONDS`). ``rate`` 0: no limit."""

    def __init__(
        self,
        rate: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate < 0:
            raise ValueError(f"rate must be >= 0 bytes/s, got {rate}")
        self.rate = rate
        self.sent = 0
        self._clock = clock
        self._sleep = sleep
        self._free_at = 0.0
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        with self._lock:
            self.sent += n
            if not self.rate:
                return
            now = self._clock()
            self._free_at = max(self._free_at, now) + n / self.rate
            wait = self._free_at - now - BURST_SECONDS
        if wait > 0:
            self._sleep(wait)


def parse_range(header: str) -> tuple[int, int | None] | None:
    """``bytes=A-B`` or ``bytes=A-`` -> ``(A, B or None)``; None for anything else
    (suffix ranges, several ranges: left to moto)."""
    unit, _, spec = header.partition("=")
    first, sep, last = spec.strip().partition("-")
    if unit.strip() != "bytes" or not sep or "," in spec or not first.isdigit():
        return None
    if last and not last.isdigit():
        return None
    start, end = int(first), int(last) if last else None
    return None if end is not None and end < start else (start, end)


class DemoS3:
    """WSGI middleware around moto's app (see the module docstring)."""

    def __init__(self, app: WSGIApp, pacer: Pacer) -> None:
        self.app = app
        self.pacer = pacer

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        if environ["PATH_INFO"] == STATS_PATH:
            body = json.dumps({"bytes_out": self.pacer.sent}).encode()
            start_response("200 OK", [("Content-Type", "application/json")])
            return [body]
        if environ["REQUEST_METHOD"] == "GET":
            fast = self._ranged_get(environ, start_response)
            if fast is not None:
                return fast
            return self._paced(self.app(environ, start_response))
        return self.app(environ, start_response)

    def _ranged_get(
        self, environ: Environ, start_response: StartResponse
    ) -> Iterator[bytes] | None:
        wanted = parse_range(environ.get("HTTP_RANGE", ""))
        if wanted is None or environ.get("QUERY_STRING"):
            return None
        if any(k.startswith("HTTP_X_AMZ_SERVER_SIDE_ENCRYPTION") for k in environ):
            return None  # SSE-C needs moto's checks
        bucket, _, name = environ["PATH_INFO"].lstrip("/").partition("/")
        key = _find_key(bucket, unquote(name)) if bucket and name else None
        if key is None or not key.size:
            return None
        start, end = wanted
        if start >= key.size:
            return None  # moto answers 416
        end = key.size - 1 if end is None else min(end, key.size - 1)
        headers = [
            ("Content-Type", key.metadata.get("Content-Type", "binary/octet-stream")),
            ("Content-Length", str(end - start + 1)),
            ("Content-Range", f"bytes {start}-{end}/{key.size}"),
            ("Accept-Ranges", "bytes"),
            ("ETag", key.etag),
            ("Last-Modified", key.last_modified_RFC1123),
        ]
        start_response("206 Partial Content", headers)
        return self._slices(key, start, end + 1)

    def _slices(self, key: Any, start: int, stop: int) -> Iterator[bytes]:
        position = start
        while position < stop:
            with key.lock:  # moto's own reads hold it: the buffer has one file position
                key._value_buffer.seek(position)
                chunk = key._value_buffer.read(min(CHUNK, stop - position))
            if not chunk:
                return
            position += len(chunk)
            self.pacer.take(len(chunk))
            yield chunk

    def _paced(self, body: Iterable[bytes]) -> Iterator[bytes]:
        try:
            for block in body:
                for offset in range(0, len(block), CHUNK):
                    chunk = block[offset : offset + CHUNK]
                    self.pacer.take(len(chunk))
                    yield chunk
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()


def _find_key(bucket: str, name: str) -> Any:
    """moto's object, or None (then moto answers, with its errors)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    try:
        return s3_backends[DEFAULT_ACCOUNT_ID]["aws"].get_object(bucket, name)
    except Exception:  # no such bucket, or a key moto would refuse: moto says why
        return None


def serve(host: str, port: int, rate: float) -> None:
    os.environ.setdefault("MOTO_S3_DEFAULT_KEY_BUFFER_SIZE", str(KEY_BUFFER))
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    app = DemoS3(DomainDispatcherApplication(create_backend_app), Pacer(rate))
    server = make_server(host, port, app, threaded=True, request_handler=MotoRequestHandler)
    server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    from swarm.pieces import parse_size

    parser = argparse.ArgumentParser(prog="python -m swarm.demo_s3", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--rate", default="0", help="bytes/s of object data (64M; 0: no limit)")
    args = parser.parse_args(argv)
    serve(args.host, args.port, float(parse_size(args.rate)))


if __name__ == "__main__":
    main()
