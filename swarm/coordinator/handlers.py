"""The coordinator's request handlers and its background sweep.

Each handler parses a request, runs its work on the store and the planner (on the event
loop, or in worker threads for a store that does round trips: :func:`_offload`) and
turns the outcome into a reply; a timer sweeps stale peers and nodes. The routes and the
report protocol are documented in :mod:`swarm.coordinator.app`, which builds the
application, fills its state (the keys below) and serves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Final, TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from swarm.coordinator.fleet import (
    REPORT_INTERVAL,
    REPORT_TTL,
    REPORT_TTL_INTERVALS,
    Members,
    PeerStore,
    StoreFull,
    parse_epoch,
)
from swarm.coordinator.history import History
from swarm.coordinator.holders import RecentFetchers, SeederCache, seeders_for
from swarm.coordinator.load import (
    Load,
    members_changed_interval,
    report_interval,
    stretched_interval,
    watch_lag,
)
from swarm.coordinator.metrics import Clock, Metrics
from swarm.coordinator.origin import StripePlanner
from swarm.coordinator.planstate import GeometryError, bits
from swarm.coordinator.rates import NodeRates, link_capacity, spare_upload
from swarm.coordinator.reports import Completion, NodeReport, ReportError, parse_report
from swarm.coordinator.tracker import (
    Announce,
    RemoteProtocolError,
    encode_failure,
    encode_response,
    normalize_ip,
    parse_announce,
)

log = logging.getLogger(__name__)

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


def _bencoded(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="text/plain")


async def on_announce(request: web.Request) -> web.Response:
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


async def on_report(request: web.Request) -> web.Response:
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
    outcome = await _offload(app, handle_report, app, report, payload, now)
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
    if outcome.link > 0:
        reply["link"] = round(outcome.link)
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
    link: float = 0.0
    """The node's link capacity as its reports show it (:func:`link_capacity`)."""


def handle_report(
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
        app[FETCHERS].note(report, now)

        def named(info_hash: str) -> dict[str, list[str]]:
            return {
                "holders": seeders_for(app[SEEDERS], store, info_hash, report, now),
                "peers": app[FETCHERS].others(info_hash, report.addr, now),
            }

        outcome.plans, rates, outcome.link = plan_origin(
            planner, report, now, outcome.interval, named
        )
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
    # A node whose list this reply changes hears from the fleet again soon: more nodes
    # may be joining (a legacy node gets the whole list each time: no change to tell).
    members = outcome.members
    if not legacy and (members.members is not None or members.delta is not None):
        outcome.interval = min(outcome.interval, _members_changed_interval(app, now))
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


SEEDERS: Final = web.AppKey("seeders", SeederCache)
FETCHERS: Final = web.AppKey("fetchers", RecentFetchers)


def plan_origin(
    planner: StripePlanner,
    report: NodeReport,
    now: float,
    interval: float,
    named: Callable[[str], dict[str, list[str]]] | None = None,
) -> tuple[dict[str, object], list[NodeRates], float]:
    """Stripes and modes for each artifact the node reported with its bitfield, and the
    node's rates for them, and its link as the rates of the artifacts it holds whole show
    it (:func:`link_capacity`: a fetch's first seconds would understate it; 0 if none).
    A node that holds none of an artifact yet is also told whom ``named`` gives, by
    info-hash (:mod:`swarm.coordinator.holders`): its seeders (the plan's ``holders``):
    where they are far, its UDP source pulls from them before libtorrent has announced
    and connected (far-region: half a second, of the five round trips a far node's start
    takes); and the nodes fetching it just before (``peers``), whom its libtorrent dials."""
    plans: dict[str, object] = {}
    rates: list[NodeRates] = []
    held: list[NodeRates] = []
    for item in report.artifacts:
        if item.pieces is None or item.piece_count is None or item.piece_size is None:
            continue
        counters = dict(item.bytes_by_source)
        if item.s3_streamed is not None:
            # S3's bytes as they came, not a piece at a time: a node's rates are one
            # report interval's counters, and whole pieces read by two GETs at once made
            # a 62.5 Mbit link's download peak 8.2-9.8 MB/s (s3-fast at a quarter of its
            # rates), so that S3, at 5.2-6.3 of it, never looked as if it filled the link.
            # (Every piece stored from S3 was streamed first: never less than the pieces.)
            counters["s3"] = item.s3_streamed
        plan = planner.plan(
            report.node,
            item.info_hash,
            piece_size=item.piece_size,
            count=item.piece_count,
            held=bits(item.pieces, item.piece_count),
            complete=item.complete,
            counters=counters,
            up_rate=item.up_rate,
            now=now,
            interval=interval,
            uploaded=item.uploaded,
            node_at=item.elapsed,
            s3_busy=item.s3_busy,
            s3_early=item.s3_early or 0,
        )
        if plan.rates is not None:
            rates.append(plan.rates)
            if item.complete:
                held.append(plan.rates)
        if len(plans) < MAX_PLANS:
            body = plan.to_json()
            if named is not None and not item.complete and not any(item.pieces):
                body.update(named(item.info_hash))
            plans[item.info_hash] = body
    return plans, rates, link_capacity(held)


async def on_fleet(request: web.Request) -> web.Response:
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


async def on_healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def on_metrics(request: web.Request) -> web.Response:
    registry = request.app[METRICS].registry
    return web.Response(
        body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


def background(
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


def _members_changed_interval(app: web.Application, now: float) -> float:
    """:func:`_interval`'s counterpart for a node whose member list a reply changes
    (the store's counts are cached: no second round trip)."""
    store = app[STORE]
    nodes, coordinators = store.node_count(now), store.coordinators(now)
    return members_changed_interval(nodes, app[BUDGET], coordinators) * app[LOAD].factor


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
