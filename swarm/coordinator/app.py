"""The coordinator's HTTP edge (aiohttp): tracker announces, node reports, fleet view.

Routes:
    GET  /announce    BitTorrent tracker (BEP 3/23); errors are a bencoded
                      ``failure reason`` with HTTP 200, as clients expect, never a 500
    POST /v1/report   a node's once-a-second JSON report -> {"ok": true, "interval": 1.0}
    GET  /v1/fleet    JSON view of nodes, artifacts, peers and history
    GET  /healthz     liveness: {"ok": true}
    GET  /metrics     Prometheus text format

All the logic is in ``tracker`` (codec), ``fleet`` (state) and ``history`` (SQLite);
this module only moves bytes, reads the clock and counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from swarm.coordinator import page
from swarm.coordinator.fleet import (
    ANNOUNCE_INTERVAL,
    PEER_TTL_INTERVALS,
    REPORT_INTERVAL,
    MemoryPeerStore,
    NodeReport,
    PeerStore,
    ReportError,
    parse_report,
)
from swarm.coordinator.history import History
from swarm.coordinator.origin import StripePlanner, bits
from swarm.coordinator.tracker import (
    RemoteProtocolError,
    encode_failure,
    encode_response,
    normalize_ip,
    parse_announce,
)
from swarm.errors import SwarmError, UsageError
from swarm.fleetauth import bearer, token_matches

log = logging.getLogger(__name__)

DEFAULT_LISTEN: Final = "0.0.0.0:7070"

EXPIRY_PERIOD: Final = 5.0
"""Seconds between sweeps of stale peers and nodes. Readers already hide stale entries,
so the sweep only reclaims memory and keeps the ``swarm_peers`` gauge honest."""

Clock = Callable[[], float]


class _Metrics:
    """Per-app counters on a private registry, so tests can run several apps at once."""

    def __init__(self, store: PeerStore, clock: Clock) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.announces = Counter(
            "swarm_announces",
            "Tracker announces accepted, by event ('none' for a regular re-announce).",
            ["event"],
            registry=self.registry,
        )
        self.announce_failures = Counter(
            "swarm_announce_failures",
            "Announces answered with a failure reason (malformed or internal error).",
            registry=self.registry,
        )
        self.reports = Counter("swarm_reports", "Node reports accepted.", registry=self.registry)
        self.unauthorized = Counter(
            "swarm_unauthorized",
            "Requests refused (403) for a missing or wrong fleet token.",
            registry=self.registry,
        )
        self.report_failures = Counter(
            "swarm_report_failures", "Node reports rejected as malformed.", registry=self.registry
        )
        self.completions = Counter(
            "swarm_completions",
            "Artifact completions recorded in history (first per node and artifact).",
            registry=self.registry,
        )
        self.expired = Counter(
            "swarm_expired",
            "Peers and nodes dropped for not announcing or reporting in time.",
            ["kind"],
            registry=self.registry,
        )
        self.registry.register(_StoreCollector(store, clock))


class _StoreCollector(Collector):
    """Gauges read from the store at scrape time, so an artifact whose last peer left
    disappears from the output instead of lingering at its last value."""

    def __init__(self, store: PeerStore, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        now = self._clock()
        peers = GaugeMetricFamily(
            "swarm_peers",
            "Live tracker peers per artifact, by role (seeder: left == 0).",
            labels=["info_hash", "role"],
        )
        for info_hash in self._store.info_hashes(now):
            seeders, leechers = self._store.counts(info_hash, now)
            peers.add_metric([info_hash.hex(), "seeder"], seeders)
            peers.add_metric([info_hash.hex(), "leecher"], leechers)
        yield peers
        yield GaugeMetricFamily(
            "swarm_nodes", "Nodes that reported recently.", value=len(self._store.nodes(now))
        )


STORE: Final = web.AppKey("store", PeerStore)
HISTORY: Final = web.AppKey("history", History)
METRICS: Final = web.AppKey("metrics", _Metrics)
CLOCK: Final = web.AppKey("clock", Clock)
INTERVAL: Final = web.AppKey("interval", int)
PLANNER: Final = web.AppKey("planner", StripePlanner)
TOKEN: Final = web.AppKey("token", str)

OPEN_PATHS: Final = frozenset({"/", "/healthz"})
"""Paths served without the fleet token: the status page shell (its data comes from the
protected /v1/fleet) and the health check for load balancers."""


@web.middleware
async def _require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
    """403 unless the request carries the fleet token: as ``token=`` in an announce's
    query (BitTorrent clients cannot send headers to a tracker), else as a Bearer header."""
    if request.path in OPEN_PATHS:
        return await handler(request)
    if request.path == "/announce":
        presented = request.query.get("token")
    else:
        presented = bearer(request.headers.get("Authorization"))
    if token_matches(presented, request.app[TOKEN]):
        return await handler(request)
    request.app[METRICS].unauthorized.inc()
    if request.path == "/announce":
        body = encode_failure("not a fleet member: this tracker needs the fleet token")
        return web.Response(status=403, body=body, content_type="text/plain")
    return web.json_response(
        {"ok": False, "error": "not a fleet member: send Authorization: Bearer <fleet token>"},
        status=403,
    )


def make_app(
    store: PeerStore | None = None,
    *,
    interval: int = ANNOUNCE_INTERVAL,
    db_path: str | Path | None = None,
    clock: Clock = time.time,
    expiry_period: float = EXPIRY_PERIOD,
    planner: StripePlanner | None = None,
    token: str | None = None,
) -> web.Application:
    """Build the coordinator application.

    Args:
        store: peer and node state; default an in-memory store whose peer TTL is
            ``PEER_TTL_INTERVALS`` x ``interval``.
        interval: seconds between announces that the tracker asks clients for.
        db_path: SQLite file for history; ``None`` keeps history in memory.
        clock: wall-clock seconds; tests pass a fake one.
        expiry_period: seconds between sweeps of stale state.
        planner: origin striping and source-mix decisions (default settings if None).
        token: the fleet token (:func:`swarm.fleetauth.fleet_token`); when set, announces,
            reports, the fleet view and metrics answer 403 without it.

    Raises:
        UsageError: ``interval`` or ``expiry_period`` is not positive.
        SwarmError: the history database cannot be opened.
    """
    if interval < 1:
        raise UsageError(f"announce interval must be >= 1 second, got {interval}")
    if expiry_period <= 0:
        raise UsageError(f"expiry period must be > 0 seconds, got {expiry_period}")
    if store is None:
        store = MemoryPeerStore(peer_ttl=PEER_TTL_INTERVALS * interval)
    app = web.Application(middlewares=[_require_token] if token else [])
    app[TOKEN] = token or ""
    app[STORE] = store
    app[HISTORY] = History(db_path)
    app[METRICS] = _Metrics(store, clock)
    app[CLOCK] = clock
    app[INTERVAL] = int(interval)
    app[PLANNER] = planner or StripePlanner()
    app.router.add_get("/announce", _announce)
    app.router.add_post("/v1/report", _report)
    app.router.add_get("/v1/fleet", _fleet)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/metrics", _metrics)
    page.add_routes(app)
    app.cleanup_ctx.append(_background(expiry_period))
    return app


def run(
    listen: str = DEFAULT_LISTEN, db_path: str | Path | None = None, token: str | None = None
) -> None:
    """Serve the coordinator until interrupted (``swarm coordinator``).

    Raises:
        UsageError: ``listen`` is not ``HOST:PORT``.
        SwarmError: the port cannot be bound or the history database cannot be opened.
    """
    host, port = parse_listen(listen)
    app = make_app(db_path=db_path, token=token)
    try:
        # No access log: a fleet of N nodes reports N times a second.
        web.run_app(app, host=host, port=port, access_log=None, print=None)
    except OSError as error:
        raise SwarmError(
            f"coordinator cannot listen on {listen} ({error.strerror or error}): "
            "another process may hold the port; pick another with --listen HOST:PORT"
        ) from error


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 as ``[::]:7070``) -> ``(host, port)``.

    Raises:
        UsageError: not in that form, or the port is out of range.
    """
    host, sep, port_text = listen.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise UsageError(
            f"--listen must be HOST:PORT such as 0.0.0.0:7070 or [::]:7070, got {listen!r}"
        )
    return host, int(port_text)


# -- handlers -------------------------------------------------------------------------------


def _bencoded(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="text/plain")


async def _announce(request: web.Request) -> web.Response:
    app = request.app
    metrics = app[METRICS]
    try:
        announce = parse_announce(request.rel_url.raw_query_string)
        ip = announce.ip or _remote_ip(request)
    except RemoteProtocolError as error:
        metrics.announce_failures.inc()
        return _bencoded(encode_failure(str(error)))
    try:
        now = app[CLOCK]()
        store = app[STORE]
        peers = store.announce(announce, ip, now, spare=_spare_upload(app, now))
        complete, incomplete = store.counts(announce.info_hash, now)
        body = encode_response(app[INTERVAL], peers, complete, incomplete, announce.compact)
    except Exception:
        # A tracker client treats a 500 as "tracker down" and backs off for minutes; a
        # failure reason is retried at the next interval and shows up in its logs.
        log.exception("announce from %s failed", request.remote)
        metrics.announce_failures.inc()
        return _bencoded(encode_failure("coordinator internal error; retry at the next interval"))
    metrics.announces.labels(event=announce.event or "none").inc()
    return _bencoded(body)


def _remote_ip(request: web.Request) -> str:
    try:
        return normalize_ip(request.remote or "")
    except ValueError:
        raise RemoteProtocolError(
            f"cannot tell your IP address from {request.remote!r}; pass it as ip="
        ) from None


async def _report(request: web.Request) -> web.Response:
    app = request.app
    metrics = app[METRICS]
    try:
        payload = json.loads(await request.read())
        report = parse_report(payload)
    except (ValueError, RecursionError) as error:  # bad JSON (or nested too deep), ReportError
        metrics.report_failures.inc()
        reason = str(error) if isinstance(error, ReportError) else f"body is not JSON: {error}"
        return web.json_response({"ok": False, "error": reason}, status=400)
    now = app[CLOCK]()
    if report.addr.rpartition(":")[0].strip("[]") in _UNSPECIFIED:
        # A daemon listening on 0.0.0.0 cannot tell its own address; we can.
        port = report.addr.rpartition(":")[2]
        report = replace(report, addr=f"{_remote_ip(request)}:{port}")
    completions = app[STORE].report(report, now)
    plans = _plan_origin(app, report, now)
    metrics.reports.inc()
    for completion in completions:
        try:
            if app[HISTORY].record(completion):
                metrics.completions.inc()
        except Exception:
            # History is a record, not a dependency: a full disk must not refuse reports.
            log.exception("cannot record completion of %s by %s", completion.name, completion.node)
    members = sorted({s.report.addr.rpartition(":")[0].strip("[]") for s in app[STORE].nodes(now)})
    return web.json_response(
        {"ok": True, "interval": REPORT_INTERVAL, "plans": plans, "members": members}
    )


_UNSPECIFIED: Final = {"0.0.0.0", "::"}


def _plan_origin(app: web.Application, report: NodeReport, now: float) -> dict[str, object]:
    """Stripes and modes for each artifact the node reported with its bitfield."""
    planner = app[PLANNER]
    planner.prune({state.report.node for state in app[STORE].nodes(now)})
    plans: dict[str, object] = {}
    for item in report.artifacts:
        if item.pieces is None or item.piece_count is None or item.piece_size is None:
            continue
        plan = planner.plan(
            report.node,
            item.info_hash,
            piece_size=item.piece_size,
            count=item.piece_count,
            held=bits(item.pieces, item.piece_count),
            complete=item.complete,
            counters=dict(item.bytes_by_source),
            up_rate=item.up_rate,
            now=now,
        )
        plans[item.info_hash] = plan.to_json()
    return plans


def _spare_upload(app: web.Application, now: float) -> dict[tuple[str, int], float]:
    """Upload headroom per peer address, from the nodes' reports (for peer ranking)."""
    rates = app[PLANNER].rates
    spare: dict[tuple[str, int], float] = {}
    for state in app[STORE].nodes(now):
        host, _, port = state.report.addr.rpartition(":")
        spare[(host.strip("[]"), int(port))] = rates.spare_upload(state.report.node)
    return spare


async def _fleet(request: web.Request) -> web.Response:
    app = request.app
    now = app[CLOCK]()
    snapshot = app[STORE].snapshot(now)
    history = app[HISTORY].counts()
    planner = app[PLANNER]
    for artifact in snapshot["artifacts"]:  # type: ignore[union-attr]
        artifact["history"] = history.get(artifact["info_hash"], _NO_HISTORY)
        # per piece, how many reporting nodes hold it (empty before any bitfield report)
        artifact["availability"] = planner.availability(artifact["info_hash"])
    for node in snapshot["nodes"]:  # type: ignore[union-attr]
        for item in node["artifacts"]:
            rates = planner.rates.get(node["node"], item["info_hash"])
            item["rates"] = {k: round(v, 1) for k, v in rates.down.items()} if rates else {}
            item["mode"] = planner.mode(node["node"], item["info_hash"])
    body = {
        "time": now,
        "interval": app[INTERVAL],
        "report_interval": REPORT_INTERVAL,
        **snapshot,
        "history": history,
    }
    return web.json_response(body)


_NO_HISTORY: Final = {
    "completed": 0,
    "mean_seconds": None,
    "median_seconds": None,
    "p99_seconds": None,
    "max_seconds": None,
    "last_completed_at": None,
    "bytes_by_source": {},
}


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def _metrics(request: web.Request) -> web.Response:
    registry = request.app[METRICS].registry
    return web.Response(
        body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


def _background(
    expiry_period: float,
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def context(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(_expire_forever(app, expiry_period))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            app[HISTORY].close()

    return context


async def _expire_forever(app: web.Application, period: float) -> None:
    metrics = app[METRICS]
    while True:
        await asyncio.sleep(period)
        try:
            peers, nodes = app[STORE].expire(app[CLOCK]())
        except Exception:
            log.exception("expiry sweep failed; retrying in %ss", period)
            continue
        if peers:
            metrics.expired.labels(kind="peer").inc(peers)
        if nodes:
            metrics.expired.labels(kind="node").inc(nodes)
