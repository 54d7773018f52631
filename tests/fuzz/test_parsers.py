"""Every parser of untrusted input raises only its declared error type.

The contract (ARCHITECTURE, house style 1 and 5): bad input from the other side becomes a
``RemoteProtocolError`` (announce, UDP), a ``ReportError`` (node reports) or a
``ManifestError`` (manifests, and the bencoded torrent inside them); anything else
escaping is a bug, because the edges catch only those (an aiohttp handler would answer
500, the CLI would print a traceback instead of exiting 5).

Each target gets both shapeless input (bytes, JSON values) and structurally valid input
with a few fields mutated, so the checks deep inside a parser are reached too. What a
parser accepts must also satisfy its invariants (a 20-byte info_hash, a safe name...).
Profiles: see ``tests/fuzz/__init__.py``.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os.path
import struct
from typing import Any
from urllib.parse import quote_from_bytes

import fastbencode
import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from swarm.coordinator.reports import (
    MAX_NODE_ID,
    MAX_PIECE_COUNT,
    MAX_PIECE_SIZE,
    MIN_PIECE_SIZE,
    NodeReport,
    ReportError,
    parse_report,
)
from swarm.coordinator.tracker import (
    EVENTS,
    HASH_LEN,
    MAX_NUMWANT,
    Announce,
    RemoteProtocolError,
    normalize_ip,
    parse_announce,
)
from swarm.errors import ManifestError
from swarm.manifest import Manifest, check_name
from swarm.pieces import PieceLayout
from tests.fuzz import FUZZ

# -- shared strategies -----------------------------------------------------------------------

BIG_INTS = st.integers(min_value=-(10**400), max_value=10**400)
"""Python ints far beyond float and int64 range: JSON and bencode both allow them."""

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | BIG_INTS
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=24)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=16,
)
"""What ``json.loads`` can return (NaN and Infinity included: Python's json accepts them)."""

BENCODE_VALUES = st.recursive(
    st.integers() | BIG_INTS | st.binary(max_size=24),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.binary(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
"""What ``fastbencode.bdecode`` can return."""


def _only(
    errors: type[BaseException] | tuple[type[BaseException], ...], call: Any, *args: Any
) -> Any:
    """``call(*args)``, or ``None`` if it raised one of ``errors``; anything else propagates
    (and fails the test with the input that caused it)."""
    try:
        return call(*args)
    except errors:
        return None


# -- announce (tracker.parse_announce): only RemoteProtocolError ---------------------------

ANNOUNCE_KEYS = (
    "info_hash",
    "peer_id",
    "port",
    "uploaded",
    "downloaded",
    "left",
    "event",
    "numwant",
    "compact",
    "ip",
    "key",
    "no_peer_id",
)
REQUIRED_KEYS = ANNOUNCE_KEYS[:6]

ANNOUNCE_VALUES = st.one_of(
    st.binary(max_size=24).map(lambda b: quote_from_bytes(b, safe="")),
    st.binary(min_size=HASH_LEN, max_size=HASH_LEN).map(lambda b: quote_from_bytes(b, safe="")),
    st.integers(min_value=-5, max_value=2**70).map(str),
    st.sampled_from(
        [
            "",
            "0",
            "1",
            "65535",
            "65536",
            "+5",
            " 5",
            "1_0",
            "\u0663",  # ARABIC-INDIC DIGIT THREE: str.isdigit() says yes
            "\u00b2",  # SUPERSCRIPT TWO: isdigit() yes, int() no
            "9" * 21,
            "started",
            "completed",
            "stopped",
            "paused",
            "bogus",
            "1.2.3.4",
            "::ffff:10.0.0.1",
            "%5B%3A%3A1%5D",
            "fe80::1%25eth0",
            "%",
            "%zz",
            "%e2%82",
            "%00",
        ]
    ),
    st.text(max_size=12),  # not percent-encoded at all: '&', '=', '%', U+0100 and up
)


@st.composite
def announce_queries(draw: st.DrawFn) -> str:
    """A query string: usually every required key (so the value checks are reached), in any
    order, some repeated, some dropped, plus unknown keys."""
    keys = list(REQUIRED_KEYS) if draw(st.booleans()) else []
    keys += draw(st.lists(st.sampled_from(ANNOUNCE_KEYS) | st.text(max_size=6), max_size=6))
    keys = draw(st.permutations(keys))
    parts = [f"{key}={draw(ANNOUNCE_VALUES)}" for key in keys]
    return "&".join(parts)


def _check_announce(announce: Announce | None) -> None:
    if announce is None:
        return
    assert len(announce.info_hash) == len(announce.peer_id) == HASH_LEN
    assert 1 <= announce.port <= 65535
    assert announce.event in EVENTS
    assert 0 <= announce.numwant <= MAX_NUMWANT
    assert min(announce.uploaded, announce.downloaded, announce.left) >= 0
    assert announce.ip is None or normalize_ip(announce.ip) == announce.ip


@FUZZ
@given(query=announce_queries())
@example(query="info_hash=\u0100")
def test_announce_query_raises_only_remote_protocol_error(query: str) -> None:
    # handlers.py passes yarl's raw_query_string, a str; bytes are accepted too.
    _check_announce(_only(RemoteProtocolError, parse_announce, query))
    _check_announce(_only(RemoteProtocolError, parse_announce, query.encode("utf-8", "replace")))


@FUZZ
@given(query=st.binary(max_size=5000) | st.text(max_size=300))
def test_announce_arbitrary_input_raises_only_remote_protocol_error(query: bytes | str) -> None:
    _check_announce(_only(RemoteProtocolError, parse_announce, query))


# -- node report (reports.parse_report): only ReportError ------------------------------------

ODD_VALUES = st.sampled_from(
    [
        None,
        True,
        -1,
        0,
        2**63,
        10**400,
        -(10**400),
        float("nan"),
        float("inf"),
        1e308,
        "",
        "1",
        "\u0663",
        "\x00",
        "::1:80",
        "[::1]:80",
        "1.2.3.4:0",
        "1.2.3.4:\u0663",
        "1.2.3.4:" + "9" * 5000,
        "A" * 40,
        "g" * 40,
        "=",
        "AA==",
        "\u00e9",
        [],
        {},
    ]
)


def _valid_report() -> dict[str, Any]:
    return {
        "node": "node-1",
        "addr": "10.0.0.1:6881",
        "artifacts": [
            {
                "info_hash": "ab" * 20,
                "name": "index.db",
                "size": 3 * 16384,
                "have_bytes": 16384,
                "complete": False,
                "bytes_by_source": {"s3": 16384, "peers": 0},
                "down_rate": 1.5e6,
                "up_rate": 0,
                "elapsed": 2.5,
                "piece_size": 16384,
                "piece_count": 3,
                "pieces": base64.b64encode(b"\x80").decode(),
            }
        ],
    }


REPORT_KEYS = ("node", "addr", "artifacts")
ARTIFACT_KEYS = tuple(_valid_report()["artifacts"][0])


@st.composite
def mutated_reports(draw: st.DrawFn) -> dict[str, Any]:
    """A valid report with one to three fields replaced, deleted or added."""
    report = _valid_report()
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        artifacts = report.get("artifacts")
        artifact = artifacts[0] if isinstance(artifacts, list) and artifacts else None
        sources = artifact.get("bytes_by_source") if isinstance(artifact, dict) else None
        level = draw(st.sampled_from(["report", "artifact", "sources"]))
        target: dict[str, Any] = report
        keys: tuple[str, ...] = REPORT_KEYS
        if level == "artifact" and isinstance(artifact, dict):
            target, keys = artifact, ARTIFACT_KEYS
        elif level == "sources" and isinstance(sources, dict):
            target, keys = sources, ("s3", "peers", "udp")
        key = (
            draw(st.sampled_from(keys) | st.text(max_size=6)) if keys else draw(st.text(max_size=6))
        )
        if key in target and draw(st.booleans()):
            del target[key]
        else:
            target[key] = copy.deepcopy(draw(ODD_VALUES | JSON_VALUES))
    return report


def _check_report(report: NodeReport | None) -> None:
    if report is None:
        return
    assert 1 <= len(report.node) <= MAX_NODE_ID and report.node.isprintable()
    host, _, port = report.addr.rpartition(":")
    assert normalize_ip(host.strip("[]")) == host.strip("[]") and 1 <= int(port) <= 65535
    for artifact in report.artifacts:
        assert len(artifact.info_hash) == 40 and int(artifact.info_hash, 16) >= 0
        assert 0 <= artifact.have_bytes <= artifact.size
        assert artifact.down_rate >= 0 and artifact.up_rate >= 0
        assert all(count >= 0 for count in artifact.bytes_by_source.values())
        if artifact.pieces is not None:
            assert artifact.piece_size and artifact.piece_count is not None
            assert len(artifact.pieces) == (artifact.piece_count + 7) // 8
            # the geometry agrees with the size, as metainfo would (issue 15)
            size, piece, count = artifact.size, artifact.piece_size, artifact.piece_count
            assert MIN_PIECE_SIZE <= piece <= MAX_PIECE_SIZE and piece & (piece - 1) == 0
            assert count == -(-size // piece) and count <= MAX_PIECE_COUNT


@FUZZ
@given(report=mutated_reports())
@example(
    report={
        **_valid_report(),
        "artifacts": [{**_valid_report()["artifacts"][0], "down_rate": 10**400}],
    }
)
def test_mutated_report_raises_only_report_error(report: dict[str, Any]) -> None:
    _check_report(_only(ReportError, parse_report, report))


@FUZZ
@given(payload=JSON_VALUES)
def test_arbitrary_json_report_raises_only_report_error(payload: object) -> None:
    _check_report(_only(ReportError, parse_report, payload))


MAX_FUZZ_BITFIELD = (MAX_PIECE_COUNT + 8) // 8
"""Bytes of bitfield a geometry example may carry: one past the cap's."""


@st.composite
def report_geometries(draw: st.DrawFn) -> dict[str, Any]:
    """A report with a consistent geometry (a power-of-two piece size within the range,
    ``size`` within the last piece, an exact bitfield), then, usually, one part of it
    pushed across its bound: the piece size to a neighbour or out of range (1 B to
    1 GiB), the count off by one or past the cap, the size by a piece or past 2**63, the
    bitfield a byte short or long or not base64."""
    piece_size = 2 ** draw(st.integers(min_value=14, max_value=27))
    count = draw(
        st.integers(min_value=0, max_value=4096)
        | st.sampled_from([MAX_PIECE_COUNT, MAX_PIECE_COUNT + 1])
    )
    size = (count - 1) * piece_size + draw(st.integers(1, piece_size)) if count else 0
    length = (count + 7) // 8
    mutation = draw(st.sampled_from(["none", "piece_size", "count", "size", "bitfield", "text"]))
    event(f"geometry mutation: {mutation}")
    if mutation == "piece_size":
        exponent = draw(st.integers(min_value=0, max_value=30))
        piece_size = draw(
            st.sampled_from([2**exponent, 2**exponent - 1, 2**exponent + 1, 3 << exponent, 0])
        )
    elif mutation == "count":
        count = draw(st.sampled_from([count - 1, count + 1, -1, 2 * MAX_PIECE_COUNT]))
    elif mutation == "size":
        size = draw(st.sampled_from([size - piece_size, size + piece_size, 2**63, -1, 2**63 - 1]))
    elif mutation == "bitfield":
        length = max(0, length + draw(st.sampled_from([-1, 1])))
    length = min(length, MAX_FUZZ_BITFIELD)
    head = draw(st.binary(min_size=min(length, 8), max_size=min(length, 8)))
    text = base64.b64encode(head + bytes(length - len(head))).decode()
    if mutation == "text":
        text = draw(st.sampled_from([text.rstrip("="), text + "=", "!" + text[1:], " " + text]))
    report = _valid_report()
    report["artifacts"][0].update(
        size=size, have_bytes=0, piece_size=piece_size, piece_count=count, pieces=text
    )
    return report


@FUZZ
@given(report=report_geometries())
@example(  # issue 15: 1-byte pieces, 1.2M of them: refused before the bitfield is decoded
    report={
        **_valid_report(),
        "artifacts": [
            {
                **_valid_report()["artifacts"][0],
                "size": 1_200_000,
                "piece_size": 1,
                "piece_count": 1_200_000,
                "pieces": base64.b64encode(bytes(150_000)).decode(),
            }
        ],
    }
)
def test_report_geometry_is_consistent_or_refused(report: dict[str, Any]) -> None:
    parsed = _only(ReportError, parse_report, report)
    event("geometry: accepted" if parsed is not None else "geometry: refused")
    _check_report(parsed)


# -- bencode, as our code paths use it ----------------------------------------------------


@FUZZ
@given(data=st.binary(max_size=200) | BENCODE_VALUES.map(fastbencode.bencode))
def test_bdecode_raises_only_value_error(data: bytes) -> None:
    """``Manifest._check`` relies on this: fastbencode refuses bad input with ValueError.
    What it accepts is canonical, so re-encoding gives the same bytes (and our info_hash
    equals the one libtorrent computes over the raw info dict)."""
    decoded = _only(ValueError, fastbencode.bdecode, data)
    if decoded is not None:
        assert fastbencode.bencode(decoded) == data


# -- manifests (Manifest.loads): only ManifestError ---------------------------------------

SECRET = "fleet-secret"
DATA_DIR = "/var/lib/swarm/data"

INFO_KEYS = (
    b"name",
    b"length",
    b"piece length",
    b"pieces",
    b"private",
    b"files",
    b"file tree",
    b"attr",
    b"symlink path",
    b"name.utf-8",
    b"meta version",
)
ODD_BENCODE = st.sampled_from(
    [
        b"",
        b"../x",
        b"/etc/passwd",
        b"a\x00b",
        b"l",
        b"x",
        b"p",
        b"lx",
        b"-rf",
        b"index.db\n",
        b"\xff\xfe",
        b"a" * 20,
        0,
        -1,
        16384,
        2**64,
        [b"..", b"etc", b"passwd"],
        [{b"length": 1, b"path": [b"..", b"x"]}],
        {b"a": {b"": {b"length": 1}}},
    ]
)
NAMES = st.one_of(
    st.sampled_from(
        [
            "index.db",
            "model-v1.2.bin",
            "build_2026.tar.gz",
            "..",
            ".",
            "...",
            "../etc/passwd",
            "/etc/passwd",
            "a/b",
            "-rf",
            ".hidden",
            "a\x00b",
            "index.db\n",
            "a b",
            "\u00e9t\u00e9.bin",
            "x" * 234,
        ]
    ),
    st.text(max_size=12),
    st.from_regex(r"[A-Za-z0-9._+@=/\\-]{1,12}", fullmatch=True),
)
MANIFEST_KEYS = ("version", "name", "size", "sha256", "piece_size", "s3", "info_hash", "torrent")


def _info(name: bytes, size: int, piece_size: int) -> dict[bytes, Any]:
    count = PieceLayout(size, piece_size).count if piece_size > 0 else 1
    pieces = b"".join(hashlib.sha1(i.to_bytes(4, "big")).digest() for i in range(count))
    return {
        b"name": name,
        b"length": size,
        b"piece length": piece_size,
        b"pieces": pieces,
        b"private": 1,
    }


def _body(
    name: str, size: int, piece_size: int, info: dict[bytes, Any] | None = None
) -> dict[str, Any]:
    """A manifest body whose fields agree with its torrent (``_check`` accepts it unless the
    name or ``info`` is bad), signed with ``SECRET``."""
    if info is None:
        info = _info(name.encode("utf-8", "surrogatepass"), size, piece_size)
    torrent = fastbencode.bencode({b"info": info, b"created by": b"swarm"})
    manifest = Manifest(name, size, "0" * 64, piece_size, "bucket", "k", torrent)
    return json.loads(manifest.dumps(SECRET))


SIZES = st.integers(min_value=0, max_value=5 * 2**16)
PIECE_SIZES = st.sampled_from([2**14, 2**15, 2**16, 2**20, 2**13, 0, -(2**14), 3 * 2**14])


@st.composite
def consistent_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """Manifest and torrent agree; only the name (any string) and the piece size vary."""
    return _body(draw(NAMES), draw(SIZES), draw(PIECE_SIZES))


@st.composite
def info_mutated_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A valid torrent whose info dict gains, loses or changes up to three keys; the
    manifest's info_hash and signature follow it or not."""
    name, size, piece_size = draw(NAMES), draw(SIZES), 2**14
    info = _info(name.encode("utf-8", "surrogatepass"), size, piece_size)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        key = draw(st.sampled_from(INFO_KEYS) | st.binary(max_size=8))
        if key in info and draw(st.booleans()):
            del info[key]
        else:
            info[key] = copy.deepcopy(draw(ODD_BENCODE | BENCODE_VALUES))
    body = _body(name, size, piece_size, info)
    if draw(st.booleans()):
        body["info_hash"] = "f" * 40
    return body


@st.composite
def field_mutated_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A valid manifest with up to three JSON fields replaced, deleted or added; the torrent
    may become arbitrary bytes or an arbitrary bencoded value."""
    body = _body(draw(st.sampled_from(["index.db", "model-v1.2.bin"])), draw(SIZES), 2**14)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        key = draw(st.sampled_from((*MANIFEST_KEYS, "signature", "s3.bucket", "s3.key")))
        target = body
        if key.startswith("s3.") and isinstance(body.get("s3"), dict):
            target, key = body["s3"], key[3:]
        choice = draw(st.sampled_from(["delete", "json", "torrent"]))
        if choice == "delete" and key in target:
            del target[key]
        elif choice == "torrent":
            torrent = draw(st.binary(max_size=120) | BENCODE_VALUES.map(fastbencode.bencode))
            body["torrent"] = base64.b64encode(torrent).decode()
        else:
            target[key] = copy.deepcopy(draw(ODD_VALUES | JSON_VALUES | NAMES))
    return body


def _check_manifest(manifest: Manifest | None) -> None:
    """What an accepted manifest guarantees; the daemon writes
    ``home/data/<info_hash>/<name>`` and libtorrent writes ``save_dir/<info name>``."""
    if manifest is None:
        return
    assert check_name(manifest.name) == manifest.name
    # Independent of check_name: one printable ASCII component, not hidden, not an option.
    name = manifest.name
    assert name.isascii() and name.isprintable() and name[0] not in ".-" and "/" not in name
    save_dir = os.path.join(DATA_DIR, manifest.info_hash)
    target = os.path.normpath(os.path.join(save_dir, manifest.name))
    assert os.path.dirname(target) == save_dir and os.path.basename(target) == manifest.name
    info = manifest.info
    assert info[b"name"] == manifest.name.encode()
    assert info.get(b"name.utf-8", info[b"name"]) == info[b"name"]
    assert not {b"files", b"file tree", b"symlink path"} & info.keys()
    assert b"l" not in info.get(b"attr", b"")
    assert fastbencode.bencode(fastbencode.bdecode(manifest.torrent)) == manifest.torrent
    assert len(manifest.piece_hashes) == manifest.layout.count


def _load_both(body: object) -> None:
    data = json.dumps(body).encode()
    _check_manifest(_only(ManifestError, Manifest.loads, data))
    _check_manifest(_only(ManifestError, Manifest.loads, data, SECRET))


@FUZZ
@given(data=st.binary(max_size=300))
@example(data=b"[" * 100_000)
def test_arbitrary_bytes_manifest_raises_only_manifest_error(data: bytes) -> None:
    _check_manifest(_only(ManifestError, Manifest.loads, data))
    _check_manifest(_only(ManifestError, Manifest.loads, data, SECRET))


@FUZZ
@given(
    body=JSON_VALUES | st.fixed_dictionaries({}, optional=dict.fromkeys(MANIFEST_KEYS, JSON_VALUES))
)
def test_arbitrary_json_manifest_raises_only_manifest_error(body: object) -> None:
    _load_both(body)


@FUZZ
@given(body=consistent_bodies())
def test_consistent_manifest_with_any_name_raises_only_manifest_error(body: dict[str, Any]) -> None:
    _load_both(body)


@FUZZ
@given(body=info_mutated_bodies())
@example(body=_body("a.bin", 5, 2**14, {**_info(b"a.bin", 5, 2**14), b"name": 5}))
def test_manifest_with_mutated_torrent_raises_only_manifest_error(body: dict[str, Any]) -> None:
    _load_both(body)


@FUZZ
@given(body=field_mutated_bodies())
@example(body={**_body("a.bin", 5, 2**14), "signature": "\u00e9"})
def test_manifest_with_mutated_fields_raises_only_manifest_error(body: dict[str, Any]) -> None:
    _load_both(body)


def test_fuzz_fixtures_are_valid() -> None:
    """The mutation strategies start from manifests and reports that are accepted, so a
    mutation, not the base, is what a refusal is about."""
    body = _body("index.db", 3 * 2**14 + 1, 2**14)
    manifest = Manifest.loads(json.dumps(body).encode(), SECRET)
    _check_manifest(manifest)
    assert manifest.layout.count == 4
    report = parse_report(copy.deepcopy(_valid_report()))
    _check_report(report)
    assert report.artifacts[0].pieces == b"\x80"


# -- UDP transfer (swarm.udp.protocol): RemoteProtocolError, or the datagram is dropped ------
#
# The module's contract: bad control input from the peer raises RemoteProtocolError (its
# AuthenticationError included) and the edge closes; a bad datagram is dropped and
# counted, never raised, except an *authentic* data block that does not fit the plan
# (only the authenticated server can seal one). Nothing else may escape, in particular no
# LocalProtocolError: that one means "our own bug".
#
# Shapeless bytes die at the handshake, so the attacker here is also an *authenticated*
# peer (it holds the fleet secret: a compromised node) that seals arbitrary frames and
# datagrams with the session keys, built from the wire format in the module docstring.

UDP_SECRET = b"fuzz-fleet-secret-0123456789abcdef"
CLIENT_NONCE = bytes(range(32))
SERVER_NONCE = bytes(range(32, 64))
PEER_IP = "192.0.2.1"
UDP_PIECE = 2**14
UDP_PIECES = 8
UDP_TOTAL = UDP_PIECES * UDP_PIECE - 100
UDP_BLOCK = 1024
U32 = st.integers(min_value=0, max_value=2**32 - 1)
U64 = st.integers(min_value=0, max_value=2**64 - 1)
EDGE_U32 = st.sampled_from([0, 1, 7, 8, 511, 512, UDP_BLOCK, UDP_PIECE, 65469, 65470, 2**32 - 1])


def _udp_protocol() -> Any:
    return pytest.importorskip(
        "swarm.udp.protocol",
        reason="swarm/udp/protocol.py is not written yet (another engineer's room); "
        "these targets fuzz its sender and receiver once it exists",
    )


class _Sealer:
    """The peer's side of a sealed direction: AES-256-GCM, 12-byte nonce = 4 zero bytes and
    a 64-bit counter, the frame type as associated data (module docstring)."""

    def __init__(self, key: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self.aead = AESGCM(key)
        self.counter = 0

    def frame(self, kind: int, body: bytes) -> bytes:
        nonce = b"\0\0\0\0" + self.counter.to_bytes(8, "big")
        self.counter += 1
        sealed = self.aead.encrypt(nonce, body, bytes([kind]))
        return struct.pack("!IB", len(sealed), kind) + sealed

    def datagram(
        self, kind: int, flags: int, sid: bytes, seq: int, ordinal: int, payload: bytes
    ) -> bytes:
        header = struct.pack("!BB8sQI", kind, flags, sid, seq, ordinal)
        return header + self.aead.encrypt(b"\0\0\0\0" + seq.to_bytes(8, "big"), payload, header)


def _plain_frame(kind: int, body: bytes) -> bytes:
    return struct.pack("!IB", len(body), kind) + body


def _u32_list(draw: st.DrawFn, values: st.SearchStrategy[int]) -> bytes:
    items = draw(st.lists(values, max_size=6))
    count = draw(st.just(len(items)) | U32)  # usually honest, sometimes a lying count
    return struct.pack("!I", count) + struct.pack(f"!{len(items)}I", *items)


@st.composite
def _request_body(draw: st.DrawFn) -> bytes:
    head = struct.pack(
        "!20sQI", draw(st.binary(min_size=20, max_size=20)), draw(U64), draw(EDGE_U32 | U32)
    )
    return head + _u32_list(draw, st.integers(0, UDP_PIECES + 1) | U32)


@st.composite
def _report_body(draw: st.DrawFn) -> bytes:
    head = struct.pack("!QQII", draw(U64), draw(U64), draw(U32), draw(U32))
    return head + _u32_list(draw, st.integers(0, 200) | U32)


@st.composite
def _accept_body(draw: st.DrawFn) -> bytes:
    head = struct.pack(
        "!IIQIQ",
        draw(st.sampled_from([UDP_PIECE, 2**26, 2**26 + 1]) | EDGE_U32),
        draw(st.sampled_from([UDP_PIECES, 1]) | EDGE_U32),
        draw(st.sampled_from([UDP_TOTAL, 1]) | U64),
        draw(st.just(UDP_BLOCK) | EDGE_U32),
        draw(U64),
    )
    return head + _u32_list(draw, st.integers(0, UDP_PIECES) | U32)


@st.composite
def _progress_body(draw: st.DrawFn) -> bytes:
    return struct.pack("!QQQQQB", *(draw(U64) for _ in range(5)), draw(st.integers(0, 255)))


KINDS = st.integers(min_value=1, max_value=12) | st.integers(min_value=0, max_value=255)
SERVER_BOUND = st.one_of(
    st.tuples(st.just("frame"), KINDS, st.binary(max_size=80) | _request_body() | _report_body()),
    st.tuples(st.just("frame"), st.just(4), _request_body()),  # REQUEST
    st.tuples(st.just("frame"), st.just(8), _report_body()),  # REPORT
    st.tuples(st.just("raw"), st.binary(max_size=64)),
    st.tuples(st.just("probe"), U64 | st.integers(0, 4), st.booleans(), st.booleans()),
    st.tuples(st.just("datagram"), st.binary(max_size=64)),
    st.tuples(st.just("timer"), st.floats(min_value=0, max_value=0.2)),
)
CLIENT_BOUND = st.one_of(
    st.tuples(st.just("frame"), KINDS, st.binary(max_size=80) | _accept_body() | _progress_body()),
    st.tuples(st.just("frame"), st.just(5), _accept_body()),  # ACCEPT
    st.tuples(st.just("frame"), st.just(9), _progress_body()),  # PROGRESS
    st.tuples(st.just("raw"), st.binary(max_size=64)),
    st.tuples(
        st.just("block"),
        st.integers(0, 3),
        U64 | st.integers(0, 40),
        st.integers(0, 40) | U32,
        st.sampled_from([UDP_BLOCK, 0, 1, UDP_BLOCK + 1, 924]),
    ),
    st.tuples(st.just("datagram"), st.binary(max_size=64)),
    st.tuples(st.just("timer"), st.floats(min_value=0, max_value=0.2)),
    st.tuples(st.just("verdict"), st.booleans()),
)


def _server_edge(p: Any, server: Any) -> None:
    """What ``swarm.udp.server`` does with the server's events, minus the I/O."""
    for happened in server.events():
        if isinstance(happened, p.RequestReceived):
            # What the machine promises the edge about a request it passed on.
            assert len(happened.info_hash_hex) == 40
            assert happened.pieces  # an empty REQUEST is the other side's error
            assert len(happened.pieces) == len(set(happened.pieces)), happened
            assert p.MIN_BLOCK_SIZE <= happened.block_size <= p.MAX_BLOCK_SIZE
            if max(happened.pieces) >= UDP_PIECES:
                server.refuse(p.RefuseCode.BAD_REQUEST, f"the artifact has {UDP_PIECES} pieces")
                continue
            have = [i for i in happened.pieces if i % 3]
            gone = [i for i in happened.pieces if not i % 3]
            server.accept(UDP_PIECE, UDP_TOTAL, have, gone, happened.rate_bps, happened.block_size)
        elif isinstance(happened, p.NeedPieces):
            for index in happened.pieces:
                length = min(UDP_PIECE, UDP_TOTAL - index * UDP_PIECE)
                server.piece_loaded(index, bytes([index]) * length)
    server.data_to_send()


@FUZZ
@given(authenticate=st.booleans(), actions=st.lists(SERVER_BOUND, max_size=10))
def test_udp_server_raises_only_remote_protocol_error(
    authenticate: bool, actions: list[tuple[Any, ...]]
) -> None:
    p = _udp_protocol()  # skips every example at once while the module is missing
    key = p.FleetKey(UDP_SECRET)
    keys = key.session_keys(CLIENT_NONCE, SERVER_NONCE)
    hello = p.VERSION_MAGIC + CLIENT_NONCE
    server = p.ServerSession(key, SERVER_NONCE, PEER_IP, rate_cap_bps=10**8)
    ctl, probe = _Sealer(keys.control_c2s), _Sealer(keys.data_c2s)
    now = 1000.0
    if authenticate:
        server.receive_control(_plain_frame(p.Msg.HELLO, hello), now)
        proof = key.proof(b"client", hello + SERVER_NONCE)
        server.receive_control(_plain_frame(p.Msg.AUTH, proof), now)
        assert server.session_id == keys.session_id
    for action in actions:
        verb = action[0]
        try:
            if verb == "frame":
                server.receive_control(ctl.frame(action[1], action[2]), now)
            elif verb == "raw":
                server.receive_control(action[1], now)
        except p.RemoteProtocolError:
            return  # the edge sends ERROR and closes
        if verb == "probe":
            _, seq, same_ip, own_session = action
            sid = keys.session_id if own_session else bytes(8)
            dgram = probe.datagram(p.DGRAM_PROBE, 0, sid, seq, 0, b"")
            addr = (PEER_IP if same_ip else "198.51.100.7", 40000)
            assert server.receive_datagram(dgram, addr) in (True, False)
        elif verb == "datagram":
            assert server.receive_datagram(action[1], (PEER_IP, 40000)) is False
        elif verb == "timer":
            now += action[1]
            for dgram in server.handle_timer(now):
                assert len(dgram) <= p.MAX_BLOCK_SIZE + p.DGRAM_OVERHEAD
        _server_edge(p, server)
    event(f"server ended in {server.state.value}")  # --hypothesis-show-statistics


@FUZZ
@given(
    authenticate=st.booleans(),
    accept=st.booleans(),
    expect_layout=st.booleans(),
    actions=st.lists(CLIENT_BOUND, max_size=10),
)
def test_udp_client_raises_only_remote_protocol_error(
    authenticate: bool, accept: bool, expect_layout: bool, actions: list[tuple[Any, ...]]
) -> None:
    p = _udp_protocol()
    key = p.FleetKey(UDP_SECRET)
    keys = key.session_keys(CLIENT_NONCE, SERVER_NONCE)
    hello = p.VERSION_MAGIC + CLIENT_NONCE
    proof = key.proof(b"server", hello + SERVER_NONCE)
    valid_accept = struct.pack("!IIQIQI", UDP_PIECE, UDP_PIECES, UDP_TOTAL, UDP_BLOCK, 10**7, 0)
    client = p.ClientSession(
        key,
        CLIENT_NONCE,
        "ab" * 20,
        [0, 2, 5],
        rate_bps=10**7,
        block_size=UDP_BLOCK,
        piece_size=UDP_PIECE if expect_layout else None,
        piece_count=UDP_PIECES if expect_layout else None,
    )
    client.data_to_send()
    ctl, data = _Sealer(keys.control_s2c), _Sealer(keys.data_s2c)
    now = 1000.0
    checking: list[int] = []
    if authenticate:
        client.receive_control(_plain_frame(p.Msg.CHALLENGE, SERVER_NONCE + proof), now)
        assert client.session_id == keys.session_id
        if accept:
            client.receive_control(ctl.frame(p.Msg.ACCEPT, valid_accept), now)
    for action in actions:
        verb = action[0]
        try:
            if verb == "frame":
                client.receive_control(ctl.frame(action[1], action[2]), now)
            elif verb == "raw":
                client.receive_control(action[1], now)
            elif verb == "block":
                _, flags, seq, ordinal, size = action
                payload = bytes(size)
                dgram = data.datagram(p.DGRAM_DATA, flags, keys.session_id, seq, ordinal, payload)
                client.receive_datagram(dgram)
        except p.RemoteProtocolError:
            return  # the edge closes the transfer
        if verb == "datagram":
            client.receive_datagram(action[1])  # forged: dropped, never raised
        elif verb == "timer":
            now += action[1]
            client.handle_timer(now)
        elif verb == "verdict" and checking:
            client.piece_checked(checking.pop(0), action[1])
        for happened in client.events():
            if isinstance(happened, p.PieceReceived):
                assert happened.index in (0, 2, 5)
                checking.append(happened.index)
        client.data_to_send()
    event(f"client ended in {client.state.value}")
    event(f"client pieces received: {client.stats.datagrams > 0}")


# Escapes the fuzzers found in swarm/udp/protocol.py, fixed there; kept as regressions.


def _udp_authenticated_pair(p: Any) -> tuple[Any, Any, Any]:
    key = p.FleetKey(UDP_SECRET)
    keys = key.session_keys(CLIENT_NONCE, SERVER_NONCE)
    hello = p.VERSION_MAGIC + CLIENT_NONCE
    server = p.ServerSession(key, SERVER_NONCE, PEER_IP, rate_cap_bps=10**8)
    server.receive_control(_plain_frame(p.Msg.HELLO, hello), 0.0)
    server.receive_control(
        _plain_frame(p.Msg.AUTH, key.proof(b"client", hello + SERVER_NONCE)), 0.0
    )
    client = p.ClientSession(key, CLIENT_NONCE, "ab" * 20, [0, 2, 5], 10**7, UDP_BLOCK)
    challenge = SERVER_NONCE + key.proof(b"server", hello + SERVER_NONCE)
    client.receive_control(_plain_frame(p.Msg.CHALLENGE, challenge), 0.0)
    return server, client, keys


def test_udp_regression_empty_request_is_remote_error() -> None:
    p = _udp_protocol()
    server, _, keys = _udp_authenticated_pair(p)
    request = struct.pack("!20sQII", bytes(20), 10**7, UDP_BLOCK, 0)
    with pytest.raises(p.RemoteProtocolError):
        server.receive_control(_Sealer(keys.control_c2s).frame(p.Msg.REQUEST, request), 0.0)


def test_udp_regression_bad_accept_block_size_is_remote_error() -> None:
    p = _udp_protocol()
    _, client, keys = _udp_authenticated_pair(p)
    accept = struct.pack("!IIQIQI", UDP_PIECE, UDP_PIECES, UDP_TOTAL, 0, 10**7, 0)
    with pytest.raises(p.RemoteProtocolError):
        client.receive_control(_Sealer(keys.control_s2c).frame(p.Msg.ACCEPT, accept), 0.0)
