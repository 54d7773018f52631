"""Held pieces over plain TCP, for the new nodes beside existing seeders.

Beside nodes that hold the whole artifact, a piece first enters the new fleet through the
seeders' uplinks, and libtorrent spends them badly: a new node asks a seeder for whatever
its piece picker chooses, mostly pieces another new node already holds. In existing
seeders at a quarter of the rates (a log line a second, one run) 46 of 128 pieces were
still at the seeders only 12 s into a 30-s fetch, and the last entered the fleet in its
final seconds, while the seeders' uplinks ran full from start to end (2.6 F sent between
them) and the new nodes' downlinks ran at 3-4.5 of their 6 MB/s from 20 s on.
:mod:`swarm.agent.seedershare` therefore pulls each new node's share of those pieces from
the seeders itself, over this server (one TCP flow per seeder: TCP shares each seeder's
uplink among the new nodes, which the UDP sessions' rate rule did not), with libtorrent
held off the seeders meanwhile.

    GET /v1/pieces/INFO_HASH/INDEX    Authorization: Bearer FLEET_TOKEN

answers 200 with the piece's bytes (read as the UDP server reads them:
:class:`swarm.agent.held.HeldPieces`), 404 for an artifact or piece this node does not
hold, 403 without the fleet token. The receiver checks every piece's SHA-1 (libtorrent's
``add_piece``). The server listens on the node's address at :data:`PIECES_PORT`, a
fleet-wide number as the UDP port is, and only where the UDP server has its default port
(:func:`pieces_port`): a daemon given another UDP port (several nodes on one address,
each with its own) could otherwise take the port another node's UDP server is about to
bind. A daemon without UDP (no secret, ``--udp-port 0``) serves no pieces either.
"""

from __future__ import annotations

import http.client
import logging
import re
import socketserver
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING

from swarm.fleetauth import bearer, token_matches
from swarm.udp.wire import DEFAULT_PORT as UDP_DEFAULT_PORT

if TYPE_CHECKING:
    from swarm.udp.pieces import PieceProvider

log = logging.getLogger(__name__)

PATH = re.compile(r"^/v1/pieces/([0-9a-f]{40})/(\d{1,9})$")

PIECE_TIMEOUT = 30.0
"""Seconds either end of a piece connection waits on its socket (a puller's connect,
headers and reads; the server's reads and sends)."""


PIECES_PORT = UDP_DEFAULT_PORT + 1
"""The TCP port of every node's piece server (7882)."""


def pieces_port(udp_port: int) -> int:
    """The piece servers' TCP port in a fleet whose UDP servers listen on ``udp_port``
    (0: none; see the module docstring)."""
    return PIECES_PORT if udp_port == UDP_DEFAULT_PORT else 0


class PieceServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    """Serves held pieces to fleet members (a thread per connection, kept alive)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], token: str, provider: PieceProvider) -> None:
        self.token = token
        self.provider = provider
        super().__init__(address, _Handler)

    def start(self) -> None:
        threading.Thread(target=self.serve_forever, daemon=True, name="piece-server").start()
        log.info("serving held pieces over TCP on %s:%d", *self.server_address[:2])

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = PIECE_TIMEOUT  # a connection that sends nothing does not hold a thread
    server: PieceServer

    def log_message(self, format: str, *args: object) -> None:
        log.debug("pieces: " + format, *args)

    def _refuse(self, status: HTTPStatus) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        if not token_matches(bearer(self.headers.get("Authorization")), self.server.token):
            self._refuse(HTTPStatus.FORBIDDEN)
            return
        match = PATH.match(self.path)
        pieces = self.server.provider.lookup(match[1]) if match else None
        index = int(match[2]) if match else -1
        if pieces is None or not 0 <= index < pieces.piece_count or not pieces.has(index):
            self._refuse(HTTPStatus.NOT_FOUND)
            return
        try:
            data = pieces.read(index)
        except OSError:  # moved away meanwhile (a finished fetch's rename): ask again
            self._refuse(HTTPStatus.NOT_FOUND)
            return
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except OSError as error:  # the puller went (its fetch ended, or it gave up)
            log.debug("pieces: %s gone: %s", self.client_address[0], error)
            self.close_connection = True


class PieceClient:
    """One keep-alive connection to a fleet member's piece server."""

    def __init__(self, host: str, port: int, token: str) -> None:
        self.host, self.port, self.token = host, port, token
        self._conn: http.client.HTTPConnection | None = None

    def get(self, info_hash: str, index: int) -> bytes | None:
        """The piece's bytes, or None if the server does not hold it. Raises OSError or
        ``http.client.HTTPException`` when the server cannot be reached or refuses us."""
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=PIECE_TIMEOUT)
        try:
            self._conn.request(
                "GET",
                f"/v1/pieces/{info_hash}/{index}",
                headers={"Authorization": f"Bearer {self.token}"},
            )
            response = self._conn.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        if response.status == HTTPStatus.NOT_FOUND:
            return None
        if response.status != HTTPStatus.OK:
            self.close()
            raise http.client.HTTPException(f"piece server {self.host}: {response.status}")
        return body

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def start_server(host: str, port: int, token: str, provider: PieceProvider) -> PieceServer | None:
    """The node's piece server on ``port`` for ``provider``'s pieces (the daemon's: the
    UDP server's :class:`~swarm.agent.held.HeldArtifacts`), serving; None (logged) if it
    cannot bind the port."""
    try:
        server = PieceServer((host, port), token, provider)
    except OSError as error:
        log.warning("cannot serve held pieces on %s:%d over TCP (%s): seeders' pieces go "
                    "through libtorrent only", host, port, error.strerror)  # fmt: skip
        return None
    server.start()
    return server
