"""The coordinator's HTTP edge (aiohttp): tracker announces, node reports, fleet view.

Routes:
    GET  /announce    BitTorrent tracker (BEP 3/23); errors are a bencoded
                      ``failure reason`` with HTTP 200, as clients expect, never a 500
    POST /v1/report   a node's report -> its plans, the interval of its next report,
                      and the fleet's membership (below)
    GET  /v1/fleet    JSON view of nodes, artifacts, peers and history
    GET  /healthz     liveness: {"ok": true}
    GET  /metrics     Prometheus text format

``POST /v1/report`` (body: :func:`swarm.coordinator.reports.parse_report`; at most 1 MiB)
replies 200 with::

    {"ok": true,
     "interval": 2.5,            # seconds until the node's next report: follow it
     "plans": {info_hash: {"stripe": [...], "mode": "stripe", "s3_estimate": ..., "fill": ...}},
     "members_epoch": "3f9a1c.1287",
     "members": ["10.0.0.1", ...]          # only when the node needs the whole list
     "members_delta": ["+10.0.0.7", "-10.0.0.2", ...]}   # or only the changes

- ``interval`` (:func:`swarm.coordinator.load.report_interval`) grows with the fleet so
  that the coordinators together receive at most ``report_budget`` reports a second (1 s
  up to 2,000 nodes at the default budget; 2.5 s at 5,000), between ``REPORT_INTERVAL`` and
  ``MAX_REPORT_INTERVAL``. A node may report sooner when something happened (a new fetch,
  a stripe finished); nodes that do not follow it are still answered.
- Membership (the IPs of the nodes that report, for the fleet's peer filter): a node
  sends ``members_epoch`` with the epoch it holds (``null`` at first) and gets nothing
  when its list is current, ``members_delta`` (``"+ip"`` / ``"-ip"`` to apply in order)
  when it is behind, or ``members`` (the whole list) when the delta is not kept or
  longer; after applying it holds ``members_epoch``. An epoch from another coordinator
  process (a restart, or another coordinator without a shared store) is never taken
  for current: the node gets the whole list. A node that sends no ``members_epoch``
  gets ``members`` in every reply, as before issue 12 (its cost grows with the fleet);
  a node that filters no peers (no fleet secret) sends ``"want_members": false`` and
  gets no membership at all. Learning every member once is inherent (N nodes x N
  addresses over a scale-out); what the epoch removes is sending them again.
- 400 ``{"ok": false, "error": ...}``: the report is malformed (the error names the
  field), including a geometry that disagrees with its size or with the artifact as
  the coordinator knows it; 503 (with ``Retry-After``): the coordinator is at a bound
  (too many nodes or too much node state); retry at the next interval.

The work per report and per announce does not grow with the fleet (issue 12): the store
and the planner keep indexes updated per request, stale state is swept on a timer, and
a reply holds one plan per reported artifact (at most :data:`.handlers.MAX_PLANS`) and stripes of at
most ``MAX_STRIPE_PIECES`` pieces; only membership changes are sent with it.

All the logic is in ``tracker`` (codec), ``fleet`` (state), ``origin`` (plans), ``load``
(the report interval), ``metrics`` (Prometheus) and
``history`` (SQLite); ``handlers`` only moves bytes, reads the clock and counts, and this
module builds the application and serves it.
"""

from __future__ import annotations

import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler

from swarm.coordinator import page
from swarm.coordinator.fleet import ANNOUNCE_INTERVAL, PEER_TTL_INTERVALS, PeerStore
from swarm.coordinator.handlers import (
    BUDGET,
    CLOCK,
    FETCHERS,
    HISTORY,
    INTERVAL,
    LOAD,
    METRICS,
    PLANNER,
    POOL,
    SEEDERS,
    STORE,
    TOKEN,
    background,
    on_announce,
    on_fleet,
    on_healthz,
    on_metrics,
    on_report,
)
from swarm.coordinator.history import History
from swarm.coordinator.holders import RecentFetchers, SeederCache
from swarm.coordinator.load import REDIS_REPORT_BUDGET, REPORT_BUDGET, Load
from swarm.coordinator.memorystore import MemoryPeerStore
from swarm.coordinator.metrics import Clock, Metrics
from swarm.coordinator.origin import StripePlanner
from swarm.coordinator.tracker import encode_failure
from swarm.errors import SwarmError, UsageError
from swarm.fleetauth import bearer, token_matches

DEFAULT_LISTEN: Final = "0.0.0.0:7070"

EXPIRY_PERIOD: Final = 1.0
"""Seconds between sweeps of stale peers and nodes. Readers already hide stale entries,
so the sweep reclaims memory, hands departed nodes' stripes back and updates the
membership; it pops only what expired, so it costs nothing in a quiet fleet."""

WORKERS: Final = 16
"""Worker threads for a store that does round trips (Redis): requests overlap their
waits; Redis runs each script atomically anyway."""

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
    report_budget: float = REPORT_BUDGET,
    load_control: bool = False,
    workers: int = 0,
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
        report_budget: reports per second this coordinator asks the fleet for
            (:func:`swarm.coordinator.load.report_interval`).
        workers: threads that run the store's and planner's work (0: on the event loop,
            right for the in-memory store; ``WORKERS`` for Redis, see
            :func:`.handlers._offload`).
        load_control: stretch the interval while the event loop lags
            (:func:`swarm.coordinator.load.govern`):
            the process gets less CPU than the budget assumes. ``run`` turns it on;
            off, the interval depends on the fleet's size alone (tests).

    Raises:
        UsageError: ``interval``, ``expiry_period`` or ``report_budget`` is not positive.
        SwarmError: the history database cannot be opened.
    """
    if interval < 1:
        raise UsageError(f"announce interval must be >= 1 second, got {interval}")
    if expiry_period <= 0:
        raise UsageError(f"expiry period must be > 0 seconds, got {expiry_period}")
    if not report_budget > 0:
        raise UsageError(f"report budget must be > 0 reports/s, got {report_budget}")
    if store is None:
        # a fresh generation per process: a node's epoch from an earlier coordinator
        # never passes for a current one
        store = MemoryPeerStore(
            peer_ttl=PEER_TTL_INTERVALS * interval, generation=secrets.token_hex(4)
        )
    app = web.Application(middlewares=[_require_token] if token else [])
    app[TOKEN] = token or ""
    app[STORE] = store
    app[HISTORY] = History(db_path)
    app[METRICS] = Metrics(store, clock)
    app[CLOCK] = clock
    app[INTERVAL] = int(interval)
    app[PLANNER] = planner or StripePlanner()
    app[SEEDERS] = SeederCache()
    app[FETCHERS] = RecentFetchers()
    app[BUDGET] = float(report_budget)
    app[LOAD] = Load()
    app[POOL] = ThreadPoolExecutor(workers, thread_name_prefix="store") if workers else None
    app.router.add_get("/announce", on_announce)
    app.router.add_post("/v1/report", on_report)
    app.router.add_get("/v1/fleet", on_fleet)
    app.router.add_get("/healthz", on_healthz)
    app.router.add_get("/metrics", on_metrics)
    page.add_routes(app)
    app.cleanup_ctx.append(background(expiry_period, load_control))
    return app


def run(
    listen: str = DEFAULT_LISTEN,
    db_path: str | Path | None = None,
    token: str | None = None,
    store_url: str | None = None,
    report_budget: float | None = None,
    origin_rate: float | None = None,
) -> None:
    """Serve the coordinator until interrupted (``swarm coordinator``).

    Args:
        store_url: ``redis://HOST:PORT/DB`` to keep peers, reports, stripes and plans in
            Redis, shared with every coordinator given the same URL; None keeps them in
            this process.
        report_budget: reports per second to ask of the fleet (default
            ``REPORT_BUDGET``, or ``REDIS_REPORT_BUDGET`` with a Redis store).
        origin_rate: S3's aggregate rate to the fleet, bytes/s, as the operator knows
            it (``math.inf``: unlimited); None measures it (:mod:`.capacity`).

    Raises:
        UsageError: ``listen`` is not ``HOST:PORT``, or ``store_url`` not a redis:// URL.
        SwarmError: the port cannot be bound, the history database cannot be opened, or
            Redis does not answer.
    """
    host, port = parse_listen(listen)
    store: PeerStore | None = None
    planner: StripePlanner | None = None
    budget = REPORT_BUDGET if report_budget is None else report_budget
    if store_url:
        from swarm.coordinator.redisplan import RedisPlanState
        from swarm.coordinator.redisstore import RedisPeerStore, connect

        client = connect(store_url)
        try:
            client.ping()
        except Exception as error:
            raise SwarmError(
                f"coordinator cannot reach its store {store_url} ({error}): start redis-server "
                "there, or leave out --store to keep the state in this process"
            ) from error
        store = RedisPeerStore(client, peer_ttl=PEER_TTL_INTERVALS * ANNOUNCE_INTERVAL)
        planner = StripePlanner(state=RedisPlanState(client), origin_rate=origin_rate)
        budget = REDIS_REPORT_BUDGET if report_budget is None else report_budget
    elif origin_rate is not None:
        planner = StripePlanner(origin_rate=origin_rate)
    app = make_app(
        store,
        db_path=db_path,
        token=token,
        planner=planner,
        report_budget=budget,
        load_control=True,
        workers=WORKERS if store_url else 0,
    )
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
