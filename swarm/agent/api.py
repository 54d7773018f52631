"""The daemon's local API: HTTP over ``$SWARM_HOME/daemon.sock`` (mode 0600).

    GET  /v1/health               {"node", "pid", "listen", "coordinator", "peers_from_asg"}
    POST /v1/fetch                a :class:`~swarm.messages.FetchRequest` -> status (one
                                  naming ``early`` pieces once the fetch has its plan
                                  or S3 GET: :data:`~swarm.agent.earlyread.ANSWER_WAIT`)
    GET  /v1/artifacts            every artifact held (the node's report)
    PUT  /v1/artifacts/IH/pieces/N  a piece ``swarm fetch`` read while this daemon
                                  started (:mod:`swarm.agent.earlyread`) -> {"kept"}
    POST /v1/artifacts/IH/early   no more such pieces come; {"bytes", "seconds"}: what
                                  that read streamed after the fetch request
    GET  /v1/artifacts/IH         one :class:`~swarm.messages.ArtifactStatus`; with
                                  ``?wait=S`` (at most 5) answered once the artifact is
                                  verified or failed, or after S seconds (a long poll:
                                  ``swarm fetch`` learns it is done at once, not at its
                                  next poll)

Errors are ``{"error", "exit_code"}`` with status 400 (403 without the fleet token).

Served by the standard library's ``http.server``, a thread per request: the API answers a
handful of requests per fetch from one local client, and aiohttp's import alone (its
connector builds TLS contexts, loading the CA bundle) cost every node ~0.2 CPU-s at start,
when a scale-out's nodes compete for their cores. Reads of the daemon's state run on its
event loop (:meth:`ApiServer.on_loop`), as the reporter's do; a fetch request runs in the request's
thread, as it ran in an executor before.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socketserver
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from swarm.agent.earlyread import ANSWER_WAIT, take_piece
from swarm.errors import AccessDeniedError, NotFoundError, SwarmError, UsageError
from swarm.fleetauth import bearer, token_matches
from swarm.messages import FetchRequest, S3Read
from swarm.pieces import MAX_PIECE_SIZE

if TYPE_CHECKING:
    from swarm.agent.daemon import Daemon
    from swarm.agent.registry import Artifact

log = logging.getLogger(__name__)

MAX_WAIT = 5.0
"""Longest ``?wait=`` a status request may ask for."""

WAIT_STEP = 0.02
"""How often a long poll looks at the artifact (an Event wait, no I/O)."""

MAX_BODY = 1 << 20
"""Largest request body taken (a fetch request is a few hundred bytes)."""

T = TypeVar("T")


class ApiServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """The API on a Unix socket; :meth:`start` serves it from a thread."""

    daemon_threads = True  # a stop does not wait for requests in flight (a long poll)

    def __init__(self, daemon: Daemon, path: Path, loop: asyncio.AbstractEventLoop) -> None:
        self.node = daemon
        self.loop = loop
        super().__init__(str(path), _Handler)
        os.chmod(path, 0o600)
        self._thread = threading.Thread(target=self.serve_forever, name="api", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop serving (blocks up to the poll interval; call it off the event loop)."""
        self.shutdown()
        self.server_close()

    def handle_error(self, request: object, client_address: object) -> None:
        log.exception("api: a request failed")  # into the daemon's log, not bare stderr

    def on_loop(self, call: Callable[[], T]) -> T:
        """``call()`` run on the daemon's event loop, its result returned here."""
        done: Future[T] = Future()

        def run() -> None:
            try:
                done.set_result(call())
            except BaseException as error:  # handed to the request's thread
                done.set_exception(error)

        self.loop.call_soon_threadsafe(run)
        return done.result()


class _Handler(BaseHTTPRequestHandler):
    server: ApiServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("api: " + format, *args)  # no access log (and no client address here)

    def _serve(self, method: str) -> None:
        daemon = self.server.node
        if daemon.token and not token_matches(
            bearer(self.headers.get("Authorization")), daemon.token
        ):
            self._json(
                {
                    "error": "swarm: the daemon API needs the fleet token (SWARM_SECRET)",
                    "exit_code": AccessDeniedError.exit_code,
                },
                HTTPStatus.FORBIDDEN,
            )
            return
        url = urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        try:
            if method == "GET" and url.path == "/v1/health":
                self._json(self.server.on_loop(lambda: _health(daemon)))
            elif method == "POST" and url.path == "/v1/fetch":
                self._fetch(daemon)
            elif method == "GET" and url.path == "/v1/artifacts":
                self._json(self.server.on_loop(daemon.snapshot))
            elif method == "GET" and len(parts) == 3 and parts[:2] == ["v1", "artifacts"]:
                self._artifact(daemon, parts[2], parse_qs(url.query).get("wait", ["0"])[-1])
            elif (
                method == "PUT"
                and len(parts) == 5
                and parts[:2] + parts[3:4] == ["v1", "artifacts", "pieces"]
            ):
                self._piece(daemon, parts[2], parts[4])
            elif (
                method == "POST"
                and len(parts) == 4
                and parts[:2] + parts[3:] == ["v1", "artifacts", "early"]
            ):
                self._early_done(daemon, parts[2])
            else:
                self._json({"error": f"swarm: no such API: {method} {url.path}"}, 404)
        except SwarmError as error:
            self._json({"error": str(error), "exit_code": error.exit_code}, HTTPStatus.BAD_REQUEST)
        except Exception as error:  # a bug: answered, logged, and the daemon goes on
            log.exception("api: %s %s failed", method, url.path)
            self._json({"error": f"swarm: the daemon failed: {error!r}", "exit_code": 1}, 500)

    def _body(self, what: str, parse: Callable[[object], T]) -> T:
        """The request's JSON body (at most :data:`MAX_BODY`), as ``parse`` takes it; a
        UsageError naming ``what`` where it is not one."""
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY:
            raise UsageError(f"swarm: bad {what}: a body of {length} bytes")
        try:
            return parse(json.loads(self.rfile.read(length)))
        except ValueError as error:
            raise UsageError(f"swarm: bad {what}: {error}") from error

    def _fetch(self, daemon: Daemon) -> None:
        request = self._body("fetch request", FetchRequest.from_json)
        artifact = daemon.fetch(request)
        if request.early:  # the CLI reads them meanwhile (swarm.agent.earlyread)
            artifact.await_s3_reads(ANSWER_WAIT)
        self._json(self.server.on_loop(lambda: daemon.describe(artifact).to_json()))

    def _held(self, daemon: Daemon, info_hash: str) -> Artifact:
        found = self.server.on_loop(lambda: daemon.lookup(info_hash))
        if found is None:
            raise NotFoundError("swarm: this daemon holds no such artifact")
        return found

    def _early_done(self, daemon: Daemon, info_hash: str) -> None:
        streamed = self._body("end of an early read", S3Read.from_json)
        artifact = self._held(daemon, info_hash)
        artifact.no_more_early()
        artifact.took_s3_read(streamed)
        log.info("%s: %.1f MB read by swarm fetch while this daemon started, kept",
                 artifact.manifest.name, artifact.early_bytes.total / 1e6)  # fmt: skip
        self._json({})

    def _piece(self, daemon: Daemon, info_hash: str, index_text: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_PIECE_SIZE:
            raise UsageError(f"swarm: a piece is 1 to {MAX_PIECE_SIZE} bytes, not {length}")
        data = self.rfile.read(length)  # read before any answer: the client sends it all
        artifact = self._held(daemon, info_hash)
        layout = artifact.manifest.layout
        if not index_text.isdigit() or int(index_text) >= layout.count:
            raise UsageError(f"swarm: no piece {index_text!r} in {artifact.manifest.name}")
        index = int(index_text)
        if length != layout.length(index):
            raise UsageError(
                f"swarm: piece {index} of {artifact.manifest.name} is {layout.length(index)} "
                f"bytes, not {length}"
            )
        self._json({"kept": take_piece(artifact, index, data)})

    def _artifact(self, daemon: Daemon, info_hash: str, wait_text: str) -> None:
        found = self.server.on_loop(lambda: daemon.lookup(info_hash))
        if not found:
            dropped = daemon.dropped.get(info_hash)
            if dropped is not None:  # the fetch following it says why
                error, message = dropped
                raise error(message)
            raise NotFoundError("swarm: this daemon holds no such artifact")
        try:
            wait = min(MAX_WAIT, max(0.0, float(wait_text)))
        except ValueError as error:
            raise UsageError("swarm: ?wait= takes seconds") from error
        until = time.monotonic() + wait
        while found.failure is None and time.monotonic() < until:
            if found.verified.wait(WAIT_STEP):
                break
        self._json(self.server.on_loop(lambda: daemon.describe(found).to_json()))

    def _json(self, body: object, status: int = HTTPStatus.OK) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


def _health(daemon: Daemon) -> dict[str, object]:
    return {
        "node": daemon.node_id,
        "pid": os.getpid(),
        "listen": daemon.listen_ip,
        "coordinator": daemon.settings.coordinator,
        "peers_from_asg": sorted(daemon.asg_groups),
    }
