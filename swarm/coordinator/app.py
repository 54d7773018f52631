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

- ``interval`` (:func:`report_interval`) grows with the fleet so that the coordinators
  together receive at most ``report_budget`` reports a second (1 s up to 2,000 nodes
  at the default budget; 2.5 s at 5,000), between ``REPORT_INTERVAL`` and
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
a reply holds one plan per reported artifact (at most ``MAX_PLANS``) and stripes of at
most ``MAX_STRIPE_PIECES`` pieces; only membership changes are sent with it.

All the logic is in ``tracker`` (codec), ``fleet`` (state), ``origin`` (plans), ``load``
(the report interval), ``metrics`` (Prometheus) and
``history`` (SQLite); this module only moves bytes, reads the clock and counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final, TypeVar

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from swarm.coordinator import page
from swarm.coordinator.fleet import (
    ANNOUNCE_INTERVAL,
    PEER_TTL_INTERVALS,
    REPORT_INTERVAL,
    REPORT_TTL,
    REPORT_TTL_INTERVALS,
    Members,
    PeerStore,
    StoreFull,
    parse_epoch,
)
from swarm.coordinator.history import History
from swarm.coordinator.load import (
    REDIS_REPORT_BUDGET,
    REPORT_BUDGET,
    Load,
    report_interval,
    stretched_interval,
    watch_lag,
)
from swarm.coordinator.memorystore import MemoryPeerStore
from swarm.coordinator.metrics import Clock, Metrics
from swarm.coordinator.origin import StripePlanner
from swarm.coordinator.planstate import GeometryError, bits
from swarm.coordinator.rates import NodeRates, spare_upload
from swarm.coordinator.reports import Completion, NodeReport, ReportError, parse_report
from swarm.coordinator.tracker import (
    Announce,
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

EXPIRY_PERIOD: Final = 1.0
"""Seconds between sweeps of stale peers and nodes. Readers already hide stale entries,
so the sweep reclaims memory, hands departed nodes' stripes back and updates the
membership; it pops only what expired, so it costs nothing in a quiet fleet."""

MAX_PLANS: Final = 64
"""Plans in one reply (one per reported artifact with a bitfield, in report order)."""


STORE: Final = web.AppKey("store", PeerStore)
HISTORY: Final = web.AppKey("history", History)
METRICS: Final = web.AppKey("metrics", Metrics)
CLOCK: Final[web.AppKey[Clock]] = web.AppKey("clock")
INTERVAL: Final = web.AppKey("interval", int)
PLANNER: Final = web.AppKey("planner", StripePlanner)
TOKEN: Final = web.AppKey("token", str)
BUDGET: Final = web.AppKey("budget", float)
LOAD: Final = web.AppKey("load", Load)
POOL: Final[web.AppKey[ThreadPoolExecutor | None]] = web.AppKey("pool")

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
            (:func:`report_interval`).
        workers: threads that run the store's and planner's work (0: on the event loop,
            right for the in-memory store; ``WORKERS`` for Redis, see :func:`_offload`).
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
    app[BUDGET] = float(report_budget)
    app[LOAD] = Load()
    app[POOL] = ThreadPoolExecutor(workers, thread_name_prefix="store") if workers else None
    app.router.add_get("/announce", _announce)
    app.router.add_post("/v1/report", _report)
    app.router.add_get("/v1/fleet", _fleet)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/metrics", _metrics)
    page.add_routes(app)
    app.cleanup_ctx.append(_background(expiry_period, load_control))
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
        body = await _offload(app, _handle_announce, app, announce, ip, now)
    except StoreFull as error:
        metrics.refused.labels(kind="announce").inc()
        log.warning("announce from %s refused: %s", request.remote, error)
        return _bencoded(encode_failure(f"coordinator is full ({error}); retry later"))
    except Exception:
        # A tracker client treats a 500 as "tracker down" and backs off for minutes; a
        # failure reason is retried at the next interval and shows up in its logs.
        log.exception("announce from %s failed", request.remote)
        metrics.announce_failures.inc()
        return _bencoded(encode_failure("coordinator internal error; retry at the next interval"))
    metrics.announces.labels(event=announce.event or "none").inc()
    return _bencoded(body)


def _handle_announce(app: web.Application, announce: Announce, ip: str, now: float) -> bytes:
    store = app[STORE]
    peers = store.announce(announce, ip, now)
    complete, incomplete = store.counts(announce.info_hash, now)
    return encode_response(app[INTERVAL], peers, complete, incomplete, announce.compact)


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
    outcome = await _offload(app, _handle_report, app, report, payload, now)
    if isinstance(outcome.error, GeometryError):
        metrics.report_failures.inc()
        return web.json_response({"ok": False, "error": str(outcome.error)}, status=400)
    if isinstance(outcome.error, StoreFull):
        metrics.refused.labels(kind="report").inc()
        log.warning("report from %s (%s) refused: %s", report.node, request.remote, outcome.error)
        return _unavailable(f"coordinator is full ({outcome.error}); retry later", outcome.interval)
    if outcome.error is not None:
        # a shared store (Redis) that does not answer: the node decides alone meanwhile
        log.error("report from %s (%s) failed: %r", report.node, request.remote, outcome.error)
        return _unavailable(
            f"coordinator cannot serve reports now ({outcome.error})", outcome.interval
        )
    metrics.reports.inc()
    for completion in outcome.completions:
        try:
            if app[HISTORY].record(completion):
                metrics.completions.inc()
        except Exception:
            # History is a record, not a dependency: a full disk must not refuse reports.
            log.exception("cannot record completion of %s by %s", completion.name, completion.node)
    reply: dict[str, object] = {"ok": True, "interval": outcome.interval, "plans": outcome.plans}
    members = outcome.members
    if members is None:
        return web.json_response(reply)
    reply["members_epoch"] = members.epoch
    head = json.dumps(reply)
    # the member list is kept encoded: splice it in (last) rather than encode it per reply
    tail = ""
    if members.members is not None:
        tail = ', "members": ' + members.members
    elif members.delta is not None:
        tail = ', "members_delta": ' + members.delta
    return web.Response(text=head[:-1] + tail + "}", content_type="application/json")


@dataclass
class _Outcome:
    interval: float = REPORT_INTERVAL
    completions: list[Completion] = field(default_factory=list)
    plans: dict[str, object] = field(default_factory=dict)
    members: Members | None = None
    error: Exception | None = None


def _handle_report(
    app: web.Application, report: NodeReport, payload: dict[str, object], now: float
) -> _Outcome:
    """Everything a report does to the store and the planner (synchronous: with a Redis
    store it runs in a worker thread, see :func:`_offload`)."""
    store, planner = app[STORE], app[PLANNER]
    outcome = _Outcome()
    try:
        for item in report.artifacts:
            if item.pieces is not None:
                planner.check(item.info_hash, item.piece_size or 0, item.piece_count or 0)
        outcome.interval = _interval(app, now)
        ttl = max(REPORT_TTL, REPORT_TTL_INTERVALS * outcome.interval)
        outcome.completions = store.report(report, now, ttl)
        # an artifact the node no longer lists is gone from it (not only when it expires)
        planner.forget_unlisted(report.node, [item.info_hash for item in report.artifacts])
        outcome.plans, rates = _plan_origin(planner, report, now, outcome.interval)
        store.set_spare(report.addr, spare_upload(rates))
    except Exception as error:  # StoreFull, GeometryError, a store that does not answer
        outcome.error = error
        return outcome
    if payload.get("want_members") is False:  # an open fleet's node filters no peers
        return outcome
    legacy = "members_epoch" not in payload
    try:
        outcome.members = store.members(parse_epoch(payload.get("members_epoch")), now, legacy)
    except Exception:
        log.exception("membership for %s failed; it keeps the list it has", report.node)
    return outcome


_T = TypeVar("_T")


async def _offload(app: web.Application, fn: Callable[..., _T], *args: object) -> _T:
    """Run ``fn`` on the event loop (an in-memory store: microseconds), or in the app's
    worker threads when the store does network round trips (Redis), so that one
    request's wait for Redis does not hold up every other request."""
    pool = app[POOL]
    if pool is None:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)


_UNSPECIFIED: Final = {"0.0.0.0", "::"}


def _unavailable(reason: str, interval: float) -> web.Response:
    return web.json_response(
        {"ok": False, "error": reason},
        status=503,
        headers={"Retry-After": str(math.ceil(interval))},
    )


def _plan_origin(
    planner: StripePlanner, report: NodeReport, now: float, interval: float
) -> tuple[dict[str, object], list[NodeRates]]:
    """Stripes and modes for each artifact the node reported with its bitfield, and the
    node's rates for them."""
    plans: dict[str, object] = {}
    rates: list[NodeRates] = []
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
            interval=interval,
            uploaded=item.uploaded,
            node_at=item.elapsed,
            s3_busy=item.s3_busy,
        )
        if plan.rates is not None:
            rates.append(plan.rates)
        if len(plans) < MAX_PLANS:
            plans[item.info_hash] = plan.to_json()
    return plans, rates


async def _fleet(request: web.Request) -> web.Response:
    app = request.app
    now = app[CLOCK]()
    snapshot = await _offload(app, app[STORE].snapshot, now)
    history = app[HISTORY].counts()
    planner = app[PLANNER]
    for artifact in snapshot["artifacts"]:  # type: ignore[union-attr,attr-defined]
        artifact["history"] = history.get(artifact["info_hash"], _NO_HISTORY)
        # per piece, how many reporting nodes hold it (empty before any bitfield report)
        artifact["availability"] = planner.availability(artifact["info_hash"])
        # the allocation's mode, direct share and predicted finish beside the bound
        artifact["allocation"] = planner.capacity.describe(artifact["info_hash"])
    for node in snapshot["nodes"]:  # type: ignore[union-attr,attr-defined]
        for item in node["artifacts"]:
            rates = planner.rates(node["node"], item["info_hash"])
            item["rates"] = {k: round(v, 1) for k, v in rates.down.items()} if rates else {}
            item["mode"] = planner.mode(node["node"], item["info_hash"])
    body = {
        "time": now,
        "interval": app[INTERVAL],
        "report_interval": _interval(app, now),
        **snapshot,
        "history": history,
    }
    return web.json_response(body)


_NO_HISTORY: Final[dict[str, object]] = {
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
    expiry_period: float, load_control: bool
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def context(app: web.Application) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(_expire_forever(app, expiry_period))]
        if load_control:
            tasks.append(asyncio.create_task(watch_lag(app[LOAD])))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            pool = app[POOL]
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
            app[HISTORY].close()

    return context


def _interval(app: web.Application, now: float) -> float:
    store = app[STORE]
    base = report_interval(store.node_count(now), app[BUDGET], store.coordinators(now))
    return stretched_interval(base, app[LOAD].factor)


def _sweep(app: web.Application) -> tuple[int, int]:
    peers, nodes = app[STORE].expire(app[CLOCK]())
    app[PLANNER].forget(app[STORE].departed())
    return peers, nodes


async def _expire_forever(app: web.Application, period: float) -> None:
    metrics = app[METRICS]
    while True:
        await asyncio.sleep(period)
        try:
            peers, nodes = await _offload(app, _sweep, app)
        except Exception:
            log.exception("expiry sweep failed; retrying in %ss", period)
            continue
        if peers:
            metrics.expired.labels(kind="peer").inc(peers)
        if nodes:
            metrics.expired.labels(kind="node").inc(nodes)
