"""BitTorrent HTTP tracker codec (BEP 3, compact peers per BEP 23, IPv6 peers per BEP 7).

Sans-IO: this module turns an announce's raw query string into an :class:`Announce` and
turns peers into a bencoded reply. It never touches a socket, a clock or an RNG; the
aiohttp edge (``handlers.py``) and the soft state (``fleet.py``) do that. Bad input from a
client raises :class:`RemoteProtocolError`, whose message is safe to send back as the
``failure reason``.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, NamedTuple
from urllib.parse import unquote_to_bytes

import fastbencode

HASH_LEN: Final = 20
"""Length of ``info_hash`` and ``peer_id`` (BEP 3: both are 20 raw bytes)."""

DEFAULT_NUMWANT: Final = 50
"""Peers returned when the client does not say (BEP 3 suggests 50)."""

MAX_NUMWANT: Final = 200
"""Cap on ``numwant``: libtorrent asks for 200, and a larger reply only costs the tracker
bandwidth while a client keeps a few dozen connections anyway."""

EVENTS: Final = frozenset({"", "started", "completed", "stopped", "paused"})
"""Announce events. BEP 3 defines the first four; libtorrent 2.x also sends ``paused``
(BEP 21, a partial seed that stopped downloading), which we treat like a regular
re-announce rather than fail a well-behaved client."""

_REQUIRED: Final = ("info_hash", "peer_id", "port", "uploaded", "downloaded", "left")
_MAX_QUERY: Final = 4096
"""A real announce is ~300 bytes; refuse absurd ones before splitting them."""


class RemoteProtocolError(ValueError):
    """A client sent an announce we cannot accept; the message says what to fix."""


class Peer(NamedTuple):
    """One entry of a tracker reply."""

    peer_id: bytes
    ip: str
    port: int


@dataclass(frozen=True, slots=True)
class Announce:
    """A validated announce request (BEP 3 fields we use; unknown fields are ignored)."""

    info_hash: bytes
    peer_id: bytes
    port: int
    uploaded: int
    downloaded: int
    left: int
    event: str = ""
    numwant: int = DEFAULT_NUMWANT
    compact: bool = True
    ip: str | None = None
    """The ``ip`` parameter, normalised; ``None`` means use the request's remote address."""

    @property
    def seeder(self) -> bool:
        return self.left == 0


def parse_announce(query: bytes | str) -> Announce:
    """Parse the raw (still percent-encoded) query string of ``GET /announce``.

    The raw string matters: ``info_hash`` and ``peer_id`` are arbitrary bytes, so each
    value is decoded with ``unquote_to_bytes`` rather than as UTF-8 text. A literal ``+``
    is kept as ``+`` (clients percent-encode everything outside the unreserved set, and
    form-style ``+``-as-space would corrupt binary values).

    Raises:
        RemoteProtocolError: a parameter is missing, repeated or out of range.
    """
    try:
        raw = query.encode("latin-1") if isinstance(query, str) else bytes(query)
    except UnicodeEncodeError:  # a str query holding a code point > U+00FF (tests/fuzz)
        raise RemoteProtocolError("announce query must be percent-encoded ASCII") from None
    if len(raw) > _MAX_QUERY:
        raise RemoteProtocolError(f"announce query is {len(raw)} bytes; at most {_MAX_QUERY}")
    params: dict[str, bytes] = {}
    for part in raw.split(b"&"):
        if not part:
            continue
        key_raw, _, value_raw = part.partition(b"=")
        try:
            key = unquote_to_bytes(key_raw).decode("ascii")
        except UnicodeDecodeError:
            raise RemoteProtocolError("announce parameter names must be ASCII") from None
        if key in params:
            raise RemoteProtocolError(f"announce parameter {key!r} is given more than once")
        params[key] = unquote_to_bytes(value_raw)

    missing = [key for key in _REQUIRED if key not in params]
    if missing:
        raise RemoteProtocolError(f"announce is missing {', '.join(missing)} (BEP 3 requires them)")

    info_hash = _exact_bytes(params, "info_hash")
    peer_id = _exact_bytes(params, "peer_id")
    port = _int(params, "port")
    if not 1 <= port <= 65535:
        raise RemoteProtocolError(f"port must be 1..65535, got {port}")
    event = _text(params, "event", "")
    if event not in EVENTS:
        allowed = ", ".join(repr(e) for e in sorted(EVENTS))
        raise RemoteProtocolError(f"event must be one of {allowed}; got {event!r}")
    numwant = _int(params, "numwant") if "numwant" in params else DEFAULT_NUMWANT
    compact_flag = _text(params, "compact", "1")
    if compact_flag not in ("0", "1"):
        raise RemoteProtocolError(f"compact must be 0 or 1, got {compact_flag!r}")
    ip = None
    if params.get("ip"):
        ip = _ip(_text(params, "ip", ""))
    return Announce(
        info_hash=info_hash,
        peer_id=peer_id,
        port=port,
        uploaded=_int(params, "uploaded"),
        downloaded=_int(params, "downloaded"),
        left=_int(params, "left"),
        event=event,
        numwant=min(numwant, MAX_NUMWANT),
        compact=compact_flag == "1",
        ip=ip,
    )


@functools.lru_cache(maxsize=65536)
def normalize_ip(address: str) -> str:
    """Canonical text form of an IP address; IPv4-mapped IPv6 (``::ffff:a.b.c.d``, what a
    dual-stack listener reports for an IPv4 client) becomes plain IPv4 so it packs into
    a 6-byte compact entry. Cached: a fleet's addresses repeat every report and announce
    (``ipaddress`` took 6% of a coordinator's time at 1,000 nodes).

    Raises:
        ValueError: ``address`` is not an IP literal.
    """
    parsed = ipaddress.ip_address(address.strip().strip("[]"))
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        parsed = parsed.ipv4_mapped
    return str(parsed)


def encode_response(
    interval: int,
    peers: Iterable[Peer],
    complete: int,
    incomplete: int,
    compact: bool = True,
) -> bytes:
    """Bencode a successful announce reply.

    Compact (BEP 23): ``peers`` is a string of 6-byte entries, 4 bytes of IPv4 address
    and 2 of port, both big-endian; IPv6 peers go in ``peers6`` as 18-byte entries
    (BEP 7), present only when there are any. Non-compact (BEP 3): ``peers`` is a list of
    ``{"peer id", "ip", "port"}`` dictionaries.
    """
    reply: dict[bytes, object] = {
        b"interval": int(interval),
        b"complete": int(complete),
        b"incomplete": int(incomplete),
    }
    if compact:
        v4, v6 = bytearray(), bytearray()
        for peer in peers:
            packed = _packed(peer.ip)
            (v4 if len(packed) == 4 else v6).extend(packed + peer.port.to_bytes(2, "big"))
        reply[b"peers"] = bytes(v4)
        if v6:
            reply[b"peers6"] = bytes(v6)
    else:
        reply[b"peers"] = [
            {b"peer id": peer.peer_id, b"ip": peer.ip.encode("ascii"), b"port": peer.port}
            for peer in peers
        ]
    return fastbencode.bencode(reply)


@functools.lru_cache(maxsize=65536)
def _packed(ip: str) -> bytes:
    return ipaddress.ip_address(ip).packed


def encode_failure(reason: str) -> bytes:
    """Bencode a failure reply (BEP 3): clients show ``failure reason`` to the user."""
    return fastbencode.bencode({b"failure reason": reason.encode("utf-8")})


def decode_compact_peers(data: bytes, ipv6: bool = False) -> list[tuple[str, int]]:
    """Inverse of the compact encoding, for tests and for tools reading a reply.

    Raises:
        RemoteProtocolError: ``data`` is not a whole number of entries.
    """
    size = 18 if ipv6 else 6
    if len(data) % size:
        raise RemoteProtocolError(f"compact peers must be a multiple of {size} bytes")
    out = []
    for offset in range(0, len(data), size):
        entry = data[offset : offset + size]
        address = ipaddress.ip_address(entry[:-2])
        out.append((str(address), int.from_bytes(entry[-2:], "big")))
    return out


def _exact_bytes(params: dict[str, bytes], key: str) -> bytes:
    value = params[key]
    if len(value) != HASH_LEN:
        raise RemoteProtocolError(
            f"{key} must be {HASH_LEN} bytes, percent-encoded; got {len(value)} bytes"
        )
    return value


def _text(params: dict[str, bytes], key: str, default: str) -> str:
    value = params.get(key)
    if value is None:
        return default
    try:
        return value.decode("ascii")
    except UnicodeDecodeError:
        raise RemoteProtocolError(f"{key} must be ASCII text") from None


def _int(params: dict[str, bytes], key: str) -> int:
    text = _text(params, key, "")
    # isdigit() alone accepts non-ASCII digits and int() accepts "+5", " 5" and "1_0";
    # BEP 3 integers are plain decimal.
    if not (text.isascii() and text.isdigit()) or len(text) > 20:
        raise RemoteProtocolError(f"{key} must be a non-negative decimal integer, got {text!r}")
    return int(text)


def _ip(text: str) -> str:
    try:
        return normalize_ip(text)
    except ValueError:
        raise RemoteProtocolError(f"ip must be an IPv4 or IPv6 address, got {text!r}") from None
