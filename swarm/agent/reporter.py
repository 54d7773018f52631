"""The daemon's reports to its coordinator: counters out, origin plans and members in."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import socket
import ssl
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from swarm.netconnect import race_connect

if TYPE_CHECKING:
    from swarm.agent.daemon import Daemon

log = logging.getLogger(__name__)

REPORT_INTERVAL = 1.0
"""Seconds between reports unless the coordinator's reply names another ``interval``."""

FAILOVER_WAIT = 0.25
"""Seconds before a failed report goes to the next coordinator of the list."""

REPORT_TIMEOUT = 2.0
"""Seconds a report may take (connect, send, answer) before the next coordinator."""

FIRST_REPORT_HOLD = 0.3
"""Seconds the daemon's first report waits for a fetch while its connection to the
coordinator opens. A daemon is most often started by ``swarm fetch``, whose request
follows 0.1 s after it listens: a first report sent at once held the fetch's report (the
one the coordinator answers with a plan) behind its round trip, and opened its connection
on the way, 0.2-0.3 s of each far-region node's start (100 ms to the coordinator)."""

MIN_INTERVAL, MAX_INTERVAL = 0.2, 30.0
"""Bounds on the interval a coordinator may ask for (a bad reply cannot silence a node
or make it flood)."""


class Membership:
    """The fleet's members as this node last heard them, and the coordinator's epoch of
    that list: a reply carries nothing when it is current, a delta when it is behind
    (``"+ip"`` / ``"-ip"`` in order) or the whole list (see swarm.coordinator.app)."""

    def __init__(self) -> None:
        self.epoch: str | None = None
        self.ips: set[str] = set()

    def apply(self, reply: dict[str, object]) -> bool:
        """Take a reply's membership; True if the list changed."""
        whole, delta = reply.get("members"), reply.get("members_delta")
        changed = False
        if isinstance(whole, list):
            self.ips, changed = {str(ip) for ip in whole}, True
        elif isinstance(delta, list):
            for change in delta:
                if isinstance(change, str) and change[:1] in "+-" and len(change) > 1:
                    (self.ips.add if change[0] == "+" else self.ips.discard)(change[1:])
                    changed = True
        epoch = reply.get("members_epoch")
        if isinstance(epoch, str):
            self.epoch = epoch
        return changed


_PRECONNECTED: dict[str, Future[socket.socket]] = {}
"""Connections to coordinators opened as the daemon's process started, by netloc."""


def preconnect(url: str) -> None:
    """Open a connection to the coordinator at ``url`` (plain HTTP) in the background, for
    the daemon's first report to take (:meth:`ReportPoster.open`). Called first thing in
    the process ``swarm fetch`` forks: the connect's round trip then goes by while the
    daemon imports and starts. Since the catalog entry holds the manifest, far-region's
    fetch requests come 0.01-0.05 s after their daemons listen, and the first report,
    which brings the plan, waited for its connection to open (0.1 s across the WAN)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.netloc in _PRECONNECTED:
        return
    opened: Future[socket.socket] = Future()
    address = (parts.hostname, parts.port or 80)

    def connect() -> None:
        try:
            opened.set_result(race_connect(address, REPORT_TIMEOUT))
        except Exception as error:  # the first report connects itself, and says why
            opened.set_exception(error)

    _PRECONNECTED[parts.netloc] = opened
    threading.Thread(target=connect, name="coordinator-preconnect", daemon=True).start()


class ReportPoster:
    """POSTs a JSON report to a coordinator URL over a kept-alive ``http.client``
    connection, blocking (run it in an executor). The standard library's client rather
    than aiohttp's: see :mod:`swarm.agent.api` for what aiohttp's import cost each node.
    A TLS context is made only for an ``https://`` coordinator."""

    def __init__(self, headers: dict[str, str], timeout: float = REPORT_TIMEOUT) -> None:
        self.headers = {"Content-Type": "application/json", **headers}
        self.timeout = timeout
        self._conns: dict[str, http.client.HTTPConnection] = {}
        self._tls: ssl.SSLContext | None = None

    def _connection(self, url: str) -> http.client.HTTPConnection:
        parts = urlsplit(url)
        conn = self._conns.get(parts.netloc)
        if conn is None:
            if parts.scheme == "https":
                self._tls = self._tls or ssl.create_default_context()
                conn = http.client.HTTPSConnection(
                    parts.netloc, timeout=self.timeout, context=self._tls
                )
            else:
                conn = http.client.HTTPConnection(parts.netloc, timeout=self.timeout)
            # a far node's first report (its first plan) is not held up by a lost SYN
            conn._create_connection = race_connect  # type: ignore[attr-defined]
            self._conns[parts.netloc] = conn
        return conn

    def open(self, url: str) -> bool:
        """Connect to ``url``'s coordinator before the first report; False if that failed
        (quietly: the report loop goes on to the next coordinator, or :meth:`post` tries
        again and says why)."""
        early = _PRECONNECTED.pop(urlsplit(url).netloc, None)
        if early is not None:
            with contextlib.suppress(Exception):  # else connect as if none had been opened
                sock = early.result(timeout=self.timeout)
                sock.settimeout(self.timeout)
                # as http.client's own connect does: it sends a request's headers and
                # body in two writes, and under Nagle the body waited for the headers'
                # ACK, a round trip (far-region's first plans came 0.2 s after their
                # report across the 100 ms WAN, 0.1 s with this)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._connection(url).sock = sock
                return True
        try:
            self._connection(url).connect()
        except Exception as error:  # OSError, a bad port, a name IDNA refuses (UnicodeError)
            log.debug("connecting to %s failed: %s", url, error)
            conn = self._conns.pop(urlsplit(url).netloc, None)
            if conn is not None:
                conn.close()
            return False
        return True

    def post(self, url: str, report: dict[str, Any]) -> tuple[int, Any]:
        """(status, JSON reply or None); OSError or HTTPException when the exchange fails."""
        parts = urlsplit(url)
        conn = self._connection(url)
        try:
            conn.request("POST", parts.path, json.dumps(report).encode(), self.headers)
            response = conn.getresponse()
            raw = response.read()
        except BaseException:
            conn.close()  # the next report reconnects
            del self._conns[parts.netloc]
            raise
        return response.status, json.loads(raw) if response.status == 200 else None

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()


async def report_loop(daemon: Daemon, wake: asyncio.Event) -> None:
    """Post this node's counters to the coordinator (soft state) at the interval it asks
    for, and take the origin plans of its reply. ``wake`` sends a report at once."""
    urls = [f"{url}/v1/report" for url in daemon.coordinators]
    current = 0
    headers = {"Authorization": f"Bearer {daemon.token}"} if daemon.token else {}
    interval = REPORT_INTERVAL
    members = Membership()
    poster = ReportPoster(headers)
    loop = asyncio.get_running_loop()
    try:
        opening = loop.run_in_executor(None, poster.open, urls[current])
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(wake.wait(), FIRST_REPORT_HOLD)
        if not await opening and len(urls) > 1:  # (the first post uses the connection)
            current = 1  # the first coordinator did not answer: the next one, at once
        while True:
            url = urls[current]
            # Cleared before the snapshot, not after the post: a wake during the post (a
            # fetch asking for its first plan while the daemon's first report is on its
            # way) is for state this report does not hold, and sends the next one at once.
            wake.clear()
            report = daemon.snapshot()
            if daemon.token:  # members filter peer connections: keep the list current
                report["members_epoch"] = members.epoch
            else:
                report["want_members"] = False  # an open fleet filters no peers
            try:
                status, reply = await loop.run_in_executor(None, poster.post, url, report)
                if status >= 500:  # overloaded or failing: try the next one
                    raise OSError(f"HTTP {status}")
                if isinstance(reply, dict):
                    asked = reply.get("interval")
                    if isinstance(asked, int | float) and asked > 0:
                        interval = min(MAX_INTERVAL, max(MIN_INTERVAL, float(asked)))
                        daemon.report_interval = interval
                    # members first: the peers a plan names are dialled through the
                    # peer filter that the members set
                    if members.apply(reply):
                        daemon.take_members(sorted(members.ips))
                    daemon.take_plans(reply.get("plans") or {}, interval)
                    link = reply.get("link")
                    if isinstance(link, int | float) and link > 0:
                        daemon.on_link(float(link))
                wait = interval
            except (OSError, ValueError, http.client.HTTPException) as error:
                log.debug("report to %s failed: %s", url, error)
                current = (current + 1) % len(urls)  # the next coordinator, soon
                wait = min(interval, FAILOVER_WAIT) if len(urls) > 1 else interval
            except Exception:  # a bug in handling a reply: log it, go on reporting
                # (the loop's task ending would have dropped the node from its fleet
                # without a word until the daemon stopped)
                log.exception("report to %s: unexpected error; next report in %.1f s",
                              url, interval)  # fmt: skip
                wait = interval
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wake.wait(), wait)
    finally:
        poster.close()
