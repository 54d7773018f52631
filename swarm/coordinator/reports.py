"""Node reports: their types, their parsing and the limits every report is held to.

:func:`parse_report` turns a decoded ``POST /v1/report`` body into a :class:`NodeReport`
or raises :class:`ReportError`; every input is bounded (issue 15): a report's geometry
must agree with its size, names and counters are capped. :class:`PeerRecord` (a tracker
entry), :class:`NodeState` and :class:`Completion` are the records the peer stores
(:mod:`swarm.coordinator.fleet`) keep and return. Pure: no I/O, no clock.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from swarm.coordinator.tracker import Peer, normalize_ip

MAX_REPORT_ARTIFACTS: Final = 1024
"""Artifacts one report may list; far above real use, low enough to bound a bad client."""

MAX_NODE_ID: Final = 255
"""Longest node id accepted (a hostname is at most 253 characters)."""

MAX_NAME: Final = 1024
"""Longest artifact name accepted (an S3 key is at most 1,024 bytes)."""

MAX_SOURCES: Final = 16
"""Entries of one artifact's ``bytes_by_source`` (a daemon sends three: peers, s3, udp)."""

MAX_SOURCE_NAME: Final = 32
"""Longest key of ``bytes_by_source``."""

MAX_BYTES: Final = 2**63 - 1
"""Largest byte count (size, counters) accepted: what libtorrent's int64 holds."""

MAX_RATE: Final = 1e12
"""Largest rate (bytes/s) accepted: 8 Tbit/s, beyond any NIC; bounds the EMAs and the
spare-upload ranking a hostile report could otherwise skew without limit."""

MIN_PIECE_SIZE: Final = 16 << 10
"""Smallest piece size a report may carry: BEP 3 practice and ``swarm publish``'s own
minimum (:func:`swarm.pieces.validate_piece_size`). A report claiming ``piece_size: 1``
on a large ``size`` once cost 78 MB of state and a 9.7 MB reply (issue 15)."""

MAX_PIECE_SIZE: Final = 128 << 20
"""Largest piece size a report may carry: libtorrent 2.x refuses 256 MiB pieces
("invalid piece size", checked with libtorrent 2.1.1's ``create_torrent``)."""

MAX_PIECE_COUNT: Final = 1 << 20
"""Most pieces a report's bitfield may describe (128 KiB of bitfield): a 16 GiB artifact
at 16 KiB pieces. The default piece size keeps an artifact at 2,048 pieces up to 32 GiB
and at 65,536 up to 1 TiB (:func:`swarm.pieces.default_piece_size`)."""


class ReportError(ValueError):
    """A node report is malformed; the message names the field and the bad value."""


@dataclass(frozen=True, slots=True)
class PeerRecord:
    """What the tracker knows about one (info_hash, peer_id), from its latest announce."""

    info_hash: bytes
    peer_id: bytes
    ip: str
    port: int
    left: int
    uploaded: int
    downloaded: int
    first_seen: float
    last_seen: float
    completed: bool = False
    """Sent ``event=completed`` at some point (it downloaded the artifact while tracked)."""

    @property
    def seeder(self) -> bool:
        return self.left == 0

    @property
    def peer(self) -> Peer:
        return Peer(self.peer_id, self.ip, self.port)

    def to_json(self, now: float, node: str | None = None) -> dict[str, object]:
        return {
            "peer_id": self.peer_id.hex(),
            "ip": self.ip,
            "port": self.port,
            "node": node,
            "left": self.left,
            "uploaded": self.uploaded,
            "downloaded": self.downloaded,
            "seeder": self.seeder,
            "completed": self.completed,
            "age": round(now - self.last_seen, 3),
        }


@dataclass(frozen=True, slots=True)
class ArtifactReport:
    """One artifact in a node report. ``info_hash`` is 40 lowercase hex characters."""

    info_hash: str
    name: str
    size: int
    have_bytes: int
    complete: bool
    bytes_by_source: Mapping[str, int]
    down_rate: float
    up_rate: float
    elapsed: float | None = None
    """Optional: seconds the node spent fetching, for history when it completes."""
    piece_size: int | None = None
    piece_count: int | None = None
    pieces: bytes | None = None
    """Optional: the pieces held, as a BitTorrent bitfield (piece 0 = high bit of byte 0);
    with ``piece_size`` and ``piece_count`` it lets the coordinator stripe origin reads."""
    uploaded: int | None = None
    """Optional: payload bytes uploaded to peers so far (a counter). The coordinator
    measures the node's upload capacity from it; ``up_rate`` is libtorrent's 5-second
    average, which takes seconds to show a saturated uplink."""
    s3_busy: float | None = None
    """Optional: seconds the node's S3 reader has spent reading so far (a counter): S3's
    rate while asked, where an interval's average dilutes a short stripe."""
    s3_streamed: int | None = None
    """Optional: bytes the node's S3 reader has received so far, counted as they stream
    in (a counter): the S3 counter the rates are measured with, where ``bytes_by_source``
    moves a whole piece at a time."""
    s3_early: int | None = None
    """Optional: bytes of the S3 counters that ``swarm fetch`` read while the node's daemon
    started (:mod:`swarm.agent.earlyread`): S3 bytes, but no stripe."""

    def to_json(self) -> dict[str, object]:
        return {
            "info_hash": self.info_hash,
            "name": self.name,
            "size": self.size,
            "have_bytes": self.have_bytes,
            "progress": fraction(self.have_bytes, self.size),
            "complete": self.complete,
            "bytes_by_source": dict(self.bytes_by_source),
            "down_rate": self.down_rate,
            "up_rate": self.up_rate,
        }


@dataclass(frozen=True, slots=True)
class NodeReport:
    """A validated ``POST /v1/report`` body."""

    node: str
    addr: str
    """The node's peer address as ``ip:port`` (IPv6 as ``[ip]:port``), normalised."""
    artifacts: tuple[ArtifactReport, ...]


@dataclass(slots=True)
class NodeState:
    """A node's latest report plus what the coordinator remembers between reports."""

    report: NodeReport
    first_seen: float
    last_seen: float
    expires_at: float = math.inf
    """When the node leaves the fleet unless it reports again (a few of the report
    intervals it was told, at least ``REPORT_TTL``)."""
    started: dict[str, float] = field(default_factory=dict)
    """info_hash -> when this node was first seen holding it incomplete."""
    completed: set[str] = field(default_factory=set)
    """info_hashes this node has been seen complete (a completion is recorded once)."""
    weight: int = 0
    """Bytes this state takes, about (:func:`report_weight`), for the store's budget."""


@dataclass(frozen=True, slots=True)
class Completion:
    """A node finished an artifact: one row of history."""

    info_hash: str
    name: str
    node: str
    completed_at: float
    seconds: float | None
    """Fetch duration: the node's ``elapsed`` if it sent one, else the time since the
    coordinator first saw it incomplete, else ``None`` (it was complete when first seen,
    e.g. an origin seeder)."""
    bytes_by_source: Mapping[str, int]


def parse_report(payload: object) -> NodeReport:
    """Validate a decoded ``/v1/report`` JSON body. Unknown keys are ignored, so nodes
    can send more than this coordinator understands.

    Raises:
        ReportError: a field is missing or has the wrong type or range.
    """
    body = _mapping(payload, "report")
    node = _str(body, "node", "report")
    if not node or len(node) > MAX_NODE_ID or not node.isprintable():
        raise ReportError(f"report.node must be 1..{MAX_NODE_ID} printable characters")
    addr = _addr(_str(body, "addr", "report"))
    items = body.get("artifacts")
    if not isinstance(items, list):
        raise ReportError("report.artifacts must be a list (empty if the node holds nothing)")
    if len(items) > MAX_REPORT_ARTIFACTS:
        raise ReportError(f"report.artifacts lists {len(items)}; at most {MAX_REPORT_ARTIFACTS}")
    artifacts = tuple(_artifact(item, f"report.artifacts[{i}]") for i, item in enumerate(items))
    return NodeReport(node=node, addr=addr, artifacts=artifacts)


# -- report validation helpers ------------------------------------------------------------


def fraction(part: int, whole: int) -> float:
    # An empty artifact (or no reporting node) counts as done only if nothing is wanted.
    return 1.0 if whole <= 0 else round(min(part / whole, 1.0), 6)


def format_addr(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _addr(text: str) -> str:
    host, sep, port_text = text.rpartition(":")
    try:
        if not sep or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise ValueError
        return format_addr(normalize_ip(host), int(port_text))
    except ValueError:
        raise ReportError(
            f"report.addr must be 'ip:port' (IPv6 as '[ip]:port'), got {text!r}"
        ) from None


def _mapping(value: object, where: str) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise ReportError(f"{where} must be a JSON object, got {type(value).__name__}")
    return value


def _str(body: Mapping[str, object], key: str, where: str) -> str:
    value = body.get(key)
    if not isinstance(value, str):
        raise ReportError(f"{where}.{key} must be a string, got {value!r}")
    return value


def _nonneg_int(body: Mapping[str, object], key: str, where: str) -> int:
    value = body.get(key)
    # bool is an int in Python but never a byte count in JSON.
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_BYTES:
        shown = value if not isinstance(value, int) or value.bit_length() < 128 else "(huge)"
        raise ReportError(
            f"{where}.{key} must be a non-negative integer below 2**63, got {shown!r}"
        )
    return value


def _nonneg_float(value: object, name: str, limit: float = MAX_RATE) -> float:
    try:
        valid = (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and 0 <= value <= limit
        )
    except OverflowError:  # a JSON integer beyond float range, like 10**400 (tests/fuzz)
        valid = False
    if not valid:
        shown = "(huge)" if isinstance(value, int) and value.bit_length() >= 128 else repr(value)
        raise ReportError(f"{name} must be a non-negative number up to {limit:g}, got {shown}")
    return float(value)  # type: ignore[arg-type]  # checked above: an int or a float


def _artifact(value: object, where: str) -> ArtifactReport:
    body = _mapping(value, where)
    info_hash = _str(body, "info_hash", where).lower()
    if len(info_hash) != 40 or any(c not in "0123456789abcdef" for c in info_hash):
        raise ReportError(f"{where}.info_hash must be 40 hex characters (SHA-1), got {info_hash!r}")
    size = _nonneg_int(body, "size", where)
    have = _nonneg_int(body, "have_bytes", where)
    if have > size:
        raise ReportError(f"{where}.have_bytes ({have}) exceeds size ({size})")
    complete = body.get("complete")
    if not isinstance(complete, bool):
        raise ReportError(f"{where}.complete must be true or false, got {complete!r}")
    name = _str(body, "name", where)
    if len(name) > MAX_NAME:
        raise ReportError(f"{where}.name is {len(name)} characters; at most {MAX_NAME}")
    sources = _mapping(body.get("bytes_by_source"), f"{where}.bytes_by_source")
    if len(sources) > MAX_SOURCES or any(len(key) > MAX_SOURCE_NAME for key in sources):
        raise ReportError(
            f"{where}.bytes_by_source must have at most {MAX_SOURCES} keys of at most "
            f"{MAX_SOURCE_NAME} characters"
        )
    by_source = {key: _nonneg_int(sources, key, f"{where}.bytes_by_source") for key in sources}
    elapsed = body.get("elapsed")
    pieces = piece_size = piece_count = None
    if body.get("pieces") is not None:
        piece_size, piece_count, pieces = _geometry(body, size, where)
    return ArtifactReport(
        info_hash=info_hash,
        name=name,
        size=size,
        have_bytes=have,
        complete=complete,
        bytes_by_source=by_source,
        down_rate=_nonneg_float(body.get("down_rate"), f"{where}.down_rate"),
        up_rate=_nonneg_float(body.get("up_rate"), f"{where}.up_rate"),
        elapsed=None
        if elapsed is None
        else _nonneg_float(elapsed, f"{where}.elapsed", MAX_ELAPSED),
        piece_size=piece_size,
        piece_count=piece_count,
        pieces=pieces,
        uploaded=None if body.get("uploaded") is None else _nonneg_int(body, "uploaded", where),
        s3_busy=None
        if body.get("s3_busy") is None
        else _nonneg_float(body.get("s3_busy"), f"{where}.s3_busy", MAX_ELAPSED),
        s3_streamed=None
        if body.get("s3_streamed") is None
        else _nonneg_int(body, "s3_streamed", where),
        s3_early=None if body.get("s3_early") is None else _nonneg_int(body, "s3_early", where),
    )


MAX_ELAPSED: Final = 10 * 365 * 86400.0
"""Longest fetch duration accepted (seconds): ten years, to keep history's sums finite."""


def _geometry(body: Mapping[str, object], size: int, where: str) -> tuple[int, int, bytes]:
    """``(piece_size, piece_count, bitfield)`` of a report that sends its pieces, checked
    against its ``size`` the way BitTorrent metainfo is: a power-of-two piece size
    within libtorrent's range, ``piece_count == ceil(size / piece_size)``, and a bitfield
    of exactly ``ceil(piece_count / 8)`` bytes. Checked before decoding, so a bogus
    geometry costs nothing (issue 15: ``piece_size: 1`` with a large ``size``)."""
    piece_size = _nonneg_int(body, "piece_size", where)
    if not MIN_PIECE_SIZE <= piece_size <= MAX_PIECE_SIZE or piece_size & (piece_size - 1):
        raise ReportError(
            f"{where}.piece_size must be a power of two from {MIN_PIECE_SIZE} to "
            f"{MAX_PIECE_SIZE} bytes, got {piece_size}"
        )
    piece_count = _nonneg_int(body, "piece_count", where)
    expected = -(-size // piece_size)
    if piece_count != expected:
        raise ReportError(
            f"{where}.piece_count must be ceil(size / piece_size) = {expected}, got {piece_count}"
        )
    if piece_count > MAX_PIECE_COUNT:
        raise ReportError(
            f"{where} has {piece_count} pieces; this coordinator tracks at most "
            f"{MAX_PIECE_COUNT} (publish with a larger --piece-size)"
        )
    text = _str(body, "pieces", where)
    if len(text) != 4 * -(-((piece_count + 7) // 8) // 3):
        raise ReportError(f"{where}.pieces must be base64 of {(piece_count + 7) // 8} bytes")
    try:
        pieces = base64.b64decode(text, validate=True)
    except ValueError:
        raise ReportError(f"{where}.pieces must be base64") from None
    if len(pieces) != (piece_count + 7) // 8:
        raise ReportError(f"{where}.pieces must hold {piece_count} bits")
    return piece_size, piece_count, pieces
