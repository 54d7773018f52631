"""Typed messages shared by the CLI, the node daemon and the coordinator.

On the wire they are JSON objects; here they are dataclasses, built from JSON by
``from_json`` (which refuses a bad field with a :class:`UsageError` naming it) and turned
back by ``to_json``. Unknown fields are ignored, so an older peer's message still parses.
"""

from __future__ import annotations

import ipaddress
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeGuard

from swarm.errors import UsageError

SOURCES: tuple[str, ...] = ("s3", "peers")
"""What a fetch reads from unless told otherwise (``udp://HOST:PORT`` sources are extra)."""


def parse_udp_source(source: str) -> tuple[str, int]:
    """``udp://HOST:PORT`` -> (host, port)."""
    host, sep, port = source.removeprefix("udp://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"swarm: bad UDP source {source!r}: use udp://HOST:PORT")
    return host.strip("[]"), int(port)


def check_sources(sources: tuple[str, ...]) -> tuple[str, ...]:
    """The sources of a fetch, validated: s3, peers, udp://HOST:PORT."""
    for source in sources:
        if source.startswith("udp://"):
            parse_udp_source(source)
        elif source not in SOURCES:
            raise UsageError(f"swarm: unknown source {source!r}: use s3, peers, udp://HOST:PORT")
    if not sources:
        raise UsageError("swarm: a fetch needs at least one source")
    return sources


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


MAX_PEERS_NAMED = 64
"""Peers of a plan a node dials at most (the coordinator names 16)."""


def _peer_addr(text: object) -> tuple[str, int] | None:
    """``ip:port`` (IPv6 as ``[ip]:port``) as a tuple, or None if it is not one."""
    if not isinstance(text, str):
        return None
    host, _, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if ":" not in host:
            return None
    elif ":" in host:  # an IPv6 address without its brackets: which colon is the port's?
        return None
    if not _is_ip(host) or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)


def _piece_indices(body: dict[str, Any], name: str) -> tuple[int, ...]:
    value = body.get(name) or []
    if not isinstance(value, list) or not all(_is_count(i) for i in value):
        raise UsageError(f"swarm: bad fetch request: {name} must be piece indices, got {value!r}")
    return tuple(value)


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_seconds(value: object) -> TypeGuard[int | float]:
    """A duration a node measured: 0 to an hour (NaN and infinities are not)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 3600


def _optional_seconds(body: dict[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_seconds(value):
        raise UsageError(f"swarm: bad fetch request: {name} must be seconds, got {value!r}")
    return float(value)


def _optional_str(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise UsageError(f"swarm: bad fetch request: {name} must be a string, got {value!r}")
    return value or None


@dataclass(frozen=True)
class S3Read:
    """What ``swarm fetch``'s own S3 GET streamed while the node's daemon started
    (:mod:`swarm.agent.earlyread`): the daemon counts it as its S3 reader's (its bytes,
    and its seconds as reading time), so the coordinator's S3 rates include it."""

    bytes: int
    seconds: float

    @classmethod
    def from_json(cls, body: object) -> S3Read:
        if isinstance(body, dict):
            nbytes, seconds = body.get("bytes"), body.get("seconds")
            if _is_count(nbytes) and _is_seconds(seconds):
                return cls(nbytes, float(seconds))
        raise UsageError(f"swarm: bad request: an S3 read is {{bytes, seconds}}, got {body!r}")

    def to_json(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "seconds": self.seconds}


@dataclass(frozen=True)
class FetchRequest:
    """``POST /v1/fetch``: what ``swarm fetch`` asks of its node's daemon.

    Attributes:
        source: ``s3://BUCKET/KEY`` or a catalog name.
        dest: DEST as an absolute path; the daemon keeps the artifact's data there (one
            copy on disk). None: data stays in the daemon's home (seeders).
        copy: DEST is a private writable copy; the daemon seeds its own copy.
        catalog, endpoint_url: how to resolve ``source`` (None: the daemon's settings).
        sources: what to read from (see :data:`SOURCES`).
        listen, coordinator: what the CLI was told; a running daemon that was started
            otherwise refuses the request rather than ignore them.
        peers_from_asg: an Auto Scaling group whose instances the daemon dials as peers.
        manifest: the artifact's manifest (its JSON text) as ``swarm fetch`` read it
            while the daemon it started came up; the daemon checks it as one it reads
            itself (and its signature, with a fleet secret). None: the daemon reads it.
        early: pieces ``swarm fetch`` read from S3 meanwhile and hands over next
            (``PUT /v1/artifacts/IH/pieces/N``); the S3 reader leaves them alone until
            they arrive (:mod:`swarm.agent.earlyread`).
        s3_rtt: S3's round trip in seconds as ``swarm fetch`` measured it before its
            first GET, on an idle link (the daemon's own measurement waits behind the
            bytes of that GET in the downlink's queue). None: not measured.
        s3_read: the bytes that GET received and the seconds it took until the daemon
            took the fetch: S3's rate to this node, counted as the S3 reader's own (the
            coordinator's first sample of it). None: no such read.
    """

    source: str
    dest: str | None = None
    copy: bool = False
    catalog: str | None = None
    endpoint_url: str | None = None
    sources: tuple[str, ...] = SOURCES
    listen: str | None = None
    coordinator: str | None = None
    peers_from_asg: str | None = None
    manifest: str | None = None
    early: tuple[int, ...] = ()
    s3_rtt: float | None = None
    s3_read: S3Read | None = None

    @classmethod
    def from_json(cls, body: object) -> FetchRequest:
        if not isinstance(body, dict):
            raise UsageError("swarm: bad fetch request: expected a JSON object")
        source = body.get("source")
        if not isinstance(source, str) or not source:
            raise UsageError("swarm: the fetch request names no source")
        raw_sources = body.get("sources") or list(SOURCES)
        if not isinstance(raw_sources, list) or not all(isinstance(s, str) for s in raw_sources):
            raise UsageError(f"swarm: bad fetch request: sources must be strings: {raw_sources!r}")
        dest = _optional_str(body, "dest")
        if dest is not None and not dest.startswith("/"):
            raise UsageError(f"swarm: bad fetch request: dest must be absolute, got {dest!r}")
        return cls(
            source=source,
            dest=dest,
            copy=bool(body.get("copy", False)),
            catalog=_optional_str(body, "catalog"),
            endpoint_url=_optional_str(body, "endpoint_url"),
            sources=check_sources(tuple(dict.fromkeys(raw_sources))),
            listen=_optional_str(body, "listen"),
            coordinator=_optional_str(body, "coordinator"),
            peers_from_asg=_optional_str(body, "peers_from_asg"),
            manifest=_optional_str(body, "manifest"),
            early=_piece_indices(body, "early"),
            s3_rtt=_optional_seconds(body, "s3_rtt"),
            s3_read=S3Read.from_json(body["s3_read"]) if body.get("s3_read") else None,
        )

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["sources"] = list(self.sources)
        body["early"] = list(self.early)
        return body


@dataclass
class ArtifactStatus:
    """``GET /v1/artifacts/IH``: one artifact as its daemon sees it.

    ``complete`` means verified (whole-file SHA-256) and at ``path``; ``failed`` (with
    ``exit_code``) means no source can make progress; ``waiting`` says, per source, what
    it waits on (shown on the progress line, so a stalled fetch says why).
    """

    info_hash: str
    name: str
    size: int
    sha256: str
    path: str
    state: str
    complete: bool
    have_bytes: int
    bytes_by_source: dict[str, int]
    down_rate: int = 0
    up_rate: int = 0
    uploaded: int = 0
    peers: int = 0
    seconds: float | None = None
    elapsed: float | None = None
    error: str | None = None
    error_no_space: bool = False
    s3_error: str | None = None
    udp_error: str | None = None
    waiting: dict[str, str] = field(default_factory=dict)
    failed: str | None = None
    exit_code: int | None = None
    hash_failures: int = 0
    peer_hash_failures: int = 0
    peers_banned: int = 0
    piece_size: int = 0
    piece_count: int = 0
    pieces: str | None = None
    mode: str | None = None
    s3_busy: float | None = None
    """Seconds the S3 reader has spent reading (None: it never started)."""
    s3_streamed: int | None = None
    """Bytes the S3 reader has received, counted as they stream in, not per piece stored
    (None: it never started)."""
    s3_early: int | None = None
    """Bytes of S3's that ``swarm fetch`` read while the daemon started, streamed (part of
    ``s3_streamed`` and of the pieces in ``bytes_by_source``; None: none)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> ArtifactStatus:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in body.items() if k in known})


@dataclass(frozen=True)
class OriginPlan:
    """The coordinator's origin plan for one node and artifact (``plans[IH]`` of a report
    reply): the pieces to read from S3 (``stripe``), the mode, and whether fill reads of
    rare pieces are worth it."""

    stripe: tuple[int, ...] = ()
    mode: str = "stripe"
    fill: bool = False
    s3_estimate: float | None = None
    direct: float = 0.0
    """Share of the artifact to read from S3 for this node alone, besides the stripe."""
    fleet_down: float = 0.0
    """What the fleet's fetching nodes can receive (the median of their download peaks,
    bytes/s; 0: not known): the node's uplink pacer judges its link's asymmetry by it."""
    link_bound: bool = False
    """The fleet's bound is its nodes' downlinks: a direct share leaves the pieces asked
    of peers to them (:func:`swarm.batch.planned_batch`'s ``leave_in_flight``)."""
    holders: tuple[str, ...] = ()
    """Addresses of nodes that hold the whole artifact, in a node's first plans (before
    it holds a piece): its UDP source may start from them before libtorrent connects."""
    peers: tuple[tuple[str, int], ...] = ()
    """``(ip, port)`` of nodes fetching the artifact just before this node's report, in
    its first plans: its libtorrent dials them before its tracker announce returns."""

    @classmethod
    def from_json(cls, body: object) -> OriginPlan | None:
        """None for anything that is not a plan (an old or hostile coordinator)."""
        if not isinstance(body, dict):
            return None
        stripe = body.get("stripe") or []
        if not isinstance(stripe, list) or not all(isinstance(p, int) for p in stripe):
            return None
        estimate = body.get("s3_estimate")
        direct = body.get("direct")
        fleet_down = body.get("fleet_down")
        holders = body.get("holders") or []
        if not isinstance(holders, list):
            return None
        peers = body.get("peers")
        peers = peers[:MAX_PEERS_NAMED] if isinstance(peers, list) else []  # a hint only
        return cls(
            stripe=tuple(stripe),
            mode=str(body.get("mode") or "stripe"),
            fill=bool(body.get("fill")),
            s3_estimate=float(estimate) if isinstance(estimate, int | float) else None,
            direct=min(1.0, max(0.0, float(direct))) if isinstance(direct, int | float) else 0.0,
            fleet_down=max(0.0, float(fleet_down)) if isinstance(fleet_down, int | float) else 0.0,
            link_bound=body.get("link_bound") is True,
            holders=tuple(h for h in holders if isinstance(h, str) and _is_ip(h)),
            peers=tuple(a for a in map(_peer_addr, peers) if a is not None),
        )
