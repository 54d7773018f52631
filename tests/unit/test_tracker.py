"""The coordinator without sockets: announce codec, peer state and ranking, node reports,
history. Clocks are plain floats passed in."""

from __future__ import annotations

import base64
import sqlite3
from pathlib import Path
from urllib.parse import quote_from_bytes

import fastbencode
import pytest

from swarm.coordinator.history import History
from swarm.coordinator.memorystore import MemoryPeerStore
from swarm.coordinator.ranking import rank_peers
from swarm.coordinator.reports import (
    Completion,
    NodeReport,
    PeerRecord,
    ReportError,
    parse_report,
)
from swarm.coordinator.tracker import (
    DEFAULT_NUMWANT,
    MAX_NUMWANT,
    Announce,
    Peer,
    RemoteProtocolError,
    decode_compact_peers,
    encode_failure,
    encode_response,
    parse_announce,
)
from swarm.errors import SwarmError

INFO_HASH = bytes(range(20))
OTHER_HASH = b"\xee" * 20


def peer_id(n: int) -> bytes:
    return b"-LT2110-" + n.to_bytes(12, "big")


def query(**params: bytes | str | int | None) -> str:
    """A raw announce query string, percent-encoded the way libtorrent does it."""
    values: dict[str, bytes | str | int | None] = {
        "info_hash": INFO_HASH,
        "peer_id": peer_id(1),
        "port": 6881,
        "uploaded": 0,
        "downloaded": 0,
        "left": 1000,
    }
    values.update(params)
    parts = []
    for key, value in values.items():
        if value is None:
            continue
        raw = value if isinstance(value, bytes) else str(value).encode()
        parts.append(f"{key}={quote_from_bytes(raw, safe='')}")
    return "&".join(parts)


def announce(n: int = 1, *, left: int = 1000, event: str = "", numwant: int = 50) -> Announce:
    return Announce(
        info_hash=INFO_HASH,
        peer_id=peer_id(n),
        port=6000 + n,
        uploaded=0,
        downloaded=0,
        left=left,
        event=event,
        numwant=numwant,
    )


def record(n: int, left: int, *, ip: str = "10.0.0.1", port: int | None = None) -> PeerRecord:
    return PeerRecord(
        info_hash=INFO_HASH,
        peer_id=peer_id(n),
        ip=ip,
        port=6000 + n if port is None else port,
        left=left,
        uploaded=0,
        downloaded=0,
        first_seen=0.0,
        last_seen=0.0,
    )


# -- parse_announce ------------------------------------------------------------------------


def test_parse_announce_reads_every_field() -> None:
    a = parse_announce(
        query(
            info_hash=b"\x00&=+%\xff" * 3 + b"ab",
            uploaded=5,
            downloaded=7,
            left=0,
            event="completed",
            numwant=12,
            compact=0,
            ip="::ffff:192.0.2.7",
            key="ignored",
        )
    )
    assert a == Announce(
        info_hash=b"\x00&=+%\xff" * 3 + b"ab",
        peer_id=peer_id(1),
        port=6881,
        uploaded=5,
        downloaded=7,
        left=0,
        event="completed",
        numwant=12,
        compact=False,
        ip="192.0.2.7",
    )
    assert a.seeder


def test_parse_announce_defaults_and_input_types() -> None:
    raw = query()
    a = parse_announce(raw)
    assert (a.event, a.numwant, a.compact, a.ip) == ("", DEFAULT_NUMWANT, True, None)
    assert parse_announce(raw.encode()) == a


def test_parse_announce_keeps_literal_plus_and_lowercase_escapes() -> None:
    value = b"+" * 10 + b"\xab" * 10
    raw = query(info_hash=None) + "&info_hash=" + "+" * 10 + "%ab" * 10
    assert parse_announce(raw).info_hash == value


def test_numwant_is_capped() -> None:
    assert parse_announce(query(numwant=10_000)).numwant == MAX_NUMWANT
    assert parse_announce(query(numwant=0)).numwant == 0


@pytest.mark.parametrize("event", ["", "started", "completed", "stopped", "paused"])
def test_known_events_parse(event: str) -> None:
    assert parse_announce(query(event=event)).event == event


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (query(info_hash=None), "missing info_hash"),
        (query(peer_id=None), "missing peer_id"),
        (query(port=None), "missing port"),
        (query(uploaded=None), "missing uploaded"),
        (query(downloaded=None), "missing downloaded"),
        (query(left=None), "missing left"),
        ("", "missing info_hash, peer_id, port"),
        (query(info_hash=b"x" * 19), "info_hash must be 20 bytes"),
        (query(info_hash=b"x" * 21), "info_hash must be 20 bytes"),
        (query(info_hash=b"ab" * 20), "got 40 bytes"),  # hex instead of raw bytes
        (query(peer_id=b"short"), "peer_id must be 20 bytes"),
        (query(port=0), "port must be 1..65535"),
        (query(port=65536), "port must be 1..65535"),
        (query(port=-1), "port must be a non-negative decimal integer"),
        (query(port="http"), "port must be"),
        (query(port=""), "port must be"),
        (query(uploaded=-1), "uploaded must be a non-negative"),
        (query(downloaded="1.5"), "downloaded must be"),
        (query(left="+5"), "left must be"),
        (query(left=" 5"), "left must be"),
        (query(left="1_0"), "left must be"),
        (query(left="\u0665"), "left must be ASCII"),  # ARABIC-INDIC DIGIT FIVE
        (query(left="9" * 21), "left must be"),
        (query(event="bogus"), "event must be one of"),
        (query(numwant=-1), "numwant must be"),
        (query(compact=2), "compact must be 0 or 1"),
        (query(ip="not-an-ip"), "ip must be an IPv4 or IPv6 address"),
        (query(ip="10.0.0.256"), "ip must be"),
        (query() + "&info_hash=" + "%00" * 20, "'info_hash' is given more than once"),
        (query() + "&%ff=1", "names must be ASCII"),
        (query(key="x" * 5000), "at most 4096"),
    ],
)
def test_bad_announce_raises_remote_protocol_error(raw: str, message: str) -> None:
    with pytest.raises(RemoteProtocolError, match=message.replace("+", r"\+")):
        parse_announce(raw)


def test_remote_protocol_error_is_a_value_error() -> None:
    assert issubclass(RemoteProtocolError, ValueError)


# -- encode_response / encode_failure -------------------------------------------------------


def test_compact_response_is_byte_exact() -> None:
    peers = [Peer(peer_id(1), "1.2.3.4", 6881), Peer(peer_id(2), "10.0.0.255", 80)]
    body = encode_response(30, peers, complete=3, incomplete=2)
    assert body == (
        b"d8:completei3e10:incompletei2e8:intervali30e"
        b"5:peers12:\x01\x02\x03\x04\x1a\xe1\x0a\x00\x00\xff\x00\x50e"
    )
    assert decode_compact_peers(fastbencode.bdecode(body)[b"peers"]) == [
        ("1.2.3.4", 6881),
        ("10.0.0.255", 80),
    ]


def test_compact_response_puts_ipv6_in_peers6() -> None:
    peers = [Peer(peer_id(1), "2001:db8::1", 443), Peer(peer_id(2), "192.0.2.1", 1)]
    reply = fastbencode.bdecode(encode_response(10, peers, 0, 2))
    assert reply[b"peers"] == bytes([192, 0, 2, 1, 0, 1])
    assert reply[b"peers6"] == bytes.fromhex("20010db8000000000000000000000001") + b"\x01\xbb"
    assert decode_compact_peers(reply[b"peers6"], ipv6=True) == [("2001:db8::1", 443)]


def test_empty_compact_response_has_empty_peers_and_no_peers6() -> None:
    reply = fastbencode.bdecode(encode_response(30, [], 0, 0))
    assert reply == {b"interval": 30, b"complete": 0, b"incomplete": 0, b"peers": b""}


def test_non_compact_response_lists_dictionaries() -> None:
    peers = [Peer(b"\xff" * 20, "1.2.3.4", 6881)]
    reply = fastbencode.bdecode(encode_response(30, peers, 1, 0, compact=False))
    assert reply[b"peers"] == [{b"peer id": b"\xff" * 20, b"ip": b"1.2.3.4", b"port": 6881}]


def test_failure_is_byte_exact() -> None:
    assert encode_failure("no such torrent") == b"d14:failure reason15:no such torrente"
    assert fastbencode.bdecode(encode_failure("caf\u00e9")) == {b"failure reason": b"caf\xc3\xa9"}


def test_compact_decoder_rejects_partial_entries() -> None:
    with pytest.raises(RemoteProtocolError, match="multiple of 6"):
        decode_compact_peers(b"\x00" * 7)


# -- ranking ----------------------------------------------------------------------------------


def test_rank_puts_seeders_first_then_least_left() -> None:
    candidates = [record(2, 500), record(3, 0), record(4, 100), record(5, 0), record(6, 900)]
    ranked = rank_peers(candidates, requester=peer_id(1), limit=10)
    assert [r.left for r in ranked] == [0, 0, 100, 500, 900]
    assert {r.peer_id for r in ranked[:2]} == {peer_id(3), peer_id(5)}


def test_rank_excludes_the_requester_by_id_and_by_address() -> None:
    me = record(1, 10, ip="10.0.0.9", port=7000)
    restarted = record(2, 0, ip="10.0.0.9", port=7000)  # same endpoint, new peer id
    other = record(3, 0, ip="10.0.0.9", port=7001)
    ranked = rank_peers([me, restarted, other], peer_id(1), 10, ("10.0.0.9", 7000))
    assert ranked == [other]


def test_rank_limit() -> None:
    candidates = [record(n, n) for n in range(2, 12)]
    assert len(rank_peers(candidates, peer_id(1), 3)) == 3
    assert rank_peers(candidates, peer_id(1), 0) == []


def test_rank_spreads_equal_peers_per_requester_and_is_stable() -> None:
    seeders = [record(n, 0) for n in range(10, 40)]
    first_picks = {rank_peers(seeders, peer_id(n), 1)[0].peer_id for n in range(1, 9)}
    assert len(first_picks) > 1, "every requester was sent to the same seeder"
    assert rank_peers(seeders, peer_id(1), 5) == rank_peers(list(reversed(seeders)), peer_id(1), 5)


# -- MemoryPeerStore: announce, counts, expiry ------------------------------------------------


def test_announce_returns_other_peers_and_counts() -> None:
    store = MemoryPeerStore(peer_ttl=90)
    assert store.announce(announce(1), "10.0.0.1", now=0) == []
    assert store.announce(announce(2, left=0), "10.0.0.2", now=1) == [
        Peer(peer_id(1), "10.0.0.1", 6001)
    ]
    peers = store.announce(announce(3), "10.0.0.3", now=2)
    assert [p.peer_id for p in peers] == [peer_id(2), peer_id(1)]  # the seeder first
    assert store.counts(INFO_HASH, now=2) == (1, 2)
    assert store.counts(OTHER_HASH, now=2) == (0, 0)


def test_announce_respects_numwant() -> None:
    store = MemoryPeerStore()
    for n in range(1, 10):
        store.announce(announce(n), f"10.0.0.{n}", now=0)
    assert len(store.announce(announce(20, numwant=4), "10.0.1.1", now=0)) == 4
    assert store.announce(announce(21, numwant=0), "10.0.1.2", now=0) == []


def test_stopped_removes_and_completed_marks() -> None:
    store = MemoryPeerStore()
    store.announce(announce(1), "10.0.0.1", now=0)
    store.announce(announce(2), "10.0.0.2", now=0)
    store.announce(announce(1, left=0, event="completed"), "10.0.0.1", now=5)
    seeder = store.get_peer(INFO_HASH, peer_id(1), now=5)
    assert seeder is not None and seeder.completed and seeder.seeder
    assert seeder.first_seen == 0 and seeder.last_seen == 5
    store.announce(announce(1, left=0), "10.0.0.1", now=6)  # a later plain announce
    assert store.get_peer(INFO_HASH, peer_id(1), now=6).completed  # type: ignore[union-attr]
    assert store.announce(announce(2, event="stopped"), "10.0.0.2", now=7) == []
    assert [p.peer_id for p in store.peers(INFO_HASH, now=7)] == [peer_id(1)]
    store.announce(announce(1, event="stopped"), "10.0.0.1", now=8)
    assert store.info_hashes(now=8) == []


def test_peers_expire_after_ttl_with_injected_clock() -> None:
    store = MemoryPeerStore(peer_ttl=90)
    store.announce(announce(1), "10.0.0.1", now=100)
    store.announce(announce(2), "10.0.0.2", now=150)
    assert len(store.peers(INFO_HASH, now=190)) == 2  # exactly at the TTL: still live
    assert store.counts(INFO_HASH, now=190.5) == (0, 1)  # hidden before any sweep
    assert store.announce(announce(3), "10.0.0.3", now=191) == [Peer(peer_id(2), "10.0.0.2", 6002)]
    assert store.expire(now=191) == (1, 0)
    assert store.expire(now=191) == (0, 0)
    assert store.expire(now=1000) == (2, 0)
    assert store.info_hashes(now=1000) == []


def test_reannounce_keeps_a_peer_alive() -> None:
    store = MemoryPeerStore(peer_ttl=90)
    for now in range(0, 300, 30):
        store.announce(announce(1), "10.0.0.1", now=now)
    assert store.expire(now=300) == (0, 0)
    peer = store.get_peer(INFO_HASH, peer_id(1), now=300)
    assert peer is not None and peer.first_seen == 0


def test_ttl_must_be_positive() -> None:
    with pytest.raises(ValueError, match="peer_ttl=0"):
        MemoryPeerStore(peer_ttl=0)


# -- node reports ------------------------------------------------------------------------------

HEX = INFO_HASH.hex()


def payload(node: str = "node-a", **artifact: object) -> dict[str, object]:
    item: dict[str, object] = {
        "info_hash": HEX,
        "name": "index.db",
        "size": 1000,
        "have_bytes": 250,
        "complete": False,
        "bytes_by_source": {"peers": 100, "s3": 150, "udp": 0},
        "down_rate": 2.5e6,
        "up_rate": 1e6,
    }
    item.update(artifact)
    return {"node": node, "addr": "10.0.0.1:6881", "artifacts": [item]}


def test_parse_report_accepts_the_documented_shape() -> None:
    report = parse_report({**payload(info_hash=HEX.upper()), "future_field": 1})
    assert isinstance(report, NodeReport)
    assert report.node == "node-a" and report.addr == "10.0.0.1:6881"
    (item,) = report.artifacts
    assert item.info_hash == HEX
    assert item.bytes_by_source == {"peers": 100, "s3": 150, "udp": 0}
    assert item.down_rate == 2.5e6 and item.elapsed is None and item.uploaded is None
    assert parse_report(payload(uploaded=7)).artifacts[0].uploaded == 7
    assert parse_report({**payload(), "addr": "[::1]:7000"}).addr == "[::1]:7000"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "report must be a JSON object"),
        ({**payload(), "node": ""}, "report.node must be"),
        ({**payload(), "node": 7}, "report.node must be a string"),
        ({**payload(), "addr": "10.0.0.1"}, "report.addr must be 'ip:port'"),
        ({**payload(), "addr": "host:80"}, "report.addr"),
        ({**payload(), "addr": "10.0.0.1:0"}, "report.addr"),
        ({**payload(), "artifacts": None}, "report.artifacts must be a list"),
        ({**payload(), "artifacts": [1]}, r"artifacts\[0\] must be a JSON object"),
        (payload(info_hash="abc"), "info_hash must be 40 hex"),
        (payload(info_hash="g" * 40), "info_hash must be 40 hex"),
        (payload(size=-1), "size must be a non-negative integer"),
        (payload(size=True), "size must be"),
        (payload(have_bytes=1.5), "have_bytes must be"),
        (payload(have_bytes=2000), r"have_bytes \(2000\) exceeds size \(1000\)"),
        (payload(complete="yes"), "complete must be true or false"),
        (payload(bytes_by_source=[]), "bytes_by_source must be a JSON object"),
        (payload(bytes_by_source={"s3": -5}), r"bytes_by_source.s3 must be"),
        (payload(down_rate=-1), "down_rate must be a non-negative number"),
        (payload(up_rate=float("nan")), "up_rate must be"),
        (payload(up_rate=None), "up_rate must be"),
        (payload(uploaded=-1), "uploaded must be a non-negative integer"),
        (payload(uploaded=2.5), "uploaded must be"),
        (payload(name=None), "name must be a string"),
        (payload(elapsed="1s"), "elapsed must be"),
        (payload(size=2**63), "size must be a non-negative integer below 2"),
        (payload(up_rate=1e13), "up_rate must be a non-negative number up to"),
        (payload(name="n" * 1025), "name is 1025 characters"),
        (payload(bytes_by_source={f"s{n}": 0 for n in range(17)}), "at most 16 keys"),
        (payload(bytes_by_source={"s" * 33: 0}), "at most 16 keys of at most 32"),
    ],
)
def test_bad_report_raises_report_error(body: object, message: str) -> None:
    with pytest.raises(ReportError, match=message):
        parse_report(body)


def geometry(
    size: int, piece_size: int, count: int, blob: bytes, text: str | None = None
) -> dict[str, object]:
    return payload(
        size=size,
        have_bytes=0,
        piece_size=piece_size,
        piece_count=count,
        pieces=base64.b64encode(blob).decode() if text is None else text,
    )


MiB = 1 << 20


@pytest.mark.parametrize(
    ("body", "message"),
    [
        # issue 15: 1-byte pieces on a 1.2 MB artifact, 1.2M bits of bitfield
        (geometry(1_200_000, 1, 1_200_000, bytes(150_000)), "piece_size must be a power of two"),
        (geometry(MiB, 0, 0, b""), "piece_size must be a power of two"),
        (geometry(MiB, 8192, 128, bytes(16)), "piece_size must be a power of two from 16384"),
        (geometry(MiB, 3 << 20, 1, b"\x00"), "piece_size must be a power of two"),
        (geometry(MiB, 256 * MiB, 1, b"\x00"), "piece_size must be a power of two"),
        (geometry(4 * MiB, MiB, 5, b"\x00"), r"piece_count must be ceil\(size / piece_size\) = 4"),
        (geometry(4 * MiB, MiB, 3, b"\x00"), "= 4, got 3"),
        (geometry((1 << 20) * (1 << 14) + 1, 1 << 14, (1 << 20) + 1, bytes(131073)), "pieces; "),
        (geometry(4 * MiB, MiB, 4, b""), "pieces must be base64 of 1 bytes"),
        (geometry(4 * MiB, MiB, 4, b"\x00\x00"), "pieces must hold 4 bits"),
        (geometry(4 * MiB, MiB, 4, b"", "!!!!"), "pieces must be base64"),
    ],
)
def test_report_geometry_must_agree_with_size(body: object, message: str) -> None:
    with pytest.raises(ReportError, match=message):
        parse_report(body)


@pytest.mark.parametrize(
    ("size", "piece_size", "count"),
    [
        (0, 16384, 0),
        (1, 16384, 1),
        (4 * MiB, MiB, 4),
        (4 * MiB + 1, MiB, 5),
        (1 << 40, 128 * MiB, 8192),
    ],
)
def test_report_geometry_accepts_what_publish_makes(size: int, piece_size: int, count: int) -> None:
    (item,) = parse_report(geometry(size, piece_size, count, bytes((count + 7) // 8))).artifacts
    assert (item.piece_size, item.piece_count, len(item.pieces or b"")) == (
        piece_size,
        count,
        (count + 7) // 8,
    )


def test_report_records_a_completion_once_with_its_duration() -> None:
    store = MemoryPeerStore()
    assert store.report(parse_report(payload()), now=10) == []
    assert store.report(parse_report(payload(have_bytes=900)), now=11) == []
    done = payload(have_bytes=1000, complete=True)
    (completion,) = store.report(parse_report(done), now=15.5)
    assert completion == Completion(
        info_hash=HEX,
        name="index.db",
        node="node-a",
        completed_at=15.5,
        seconds=5.5,
        bytes_by_source={"peers": 100, "s3": 150, "udp": 0},
    )
    assert store.report(parse_report(done), now=16) == []


def test_report_duration_prefers_elapsed_and_is_unknown_for_a_born_seeder() -> None:
    store = MemoryPeerStore()
    store.report(parse_report(payload()), now=0)
    (timed,) = store.report(parse_report(payload(complete=True, elapsed=3.25)), now=9)
    assert timed.seconds == 3.25
    (seeded,) = store.report(parse_report(payload("origin", complete=True)), now=9)
    assert seeded.seconds is None


def test_nodes_expire_after_report_ttl() -> None:
    store = MemoryPeerStore(report_ttl=10)
    store.report(parse_report(payload()), now=0)
    assert [s.report.node for s in store.nodes(now=10)] == ["node-a"]
    assert store.nodes(now=10.1) == []
    assert store.expire(now=11) == (0, 1)


def test_snapshot_merges_reports_and_peers() -> None:
    store = MemoryPeerStore()
    store.announce(announce(1), "10.0.0.1", now=0)
    store.announce(announce(2, left=0), "10.0.0.9", now=0)
    a = {**payload(), "addr": "10.0.0.1:6001"}
    b = {**payload("node-b", have_bytes=1000, complete=True, down_rate=0), "addr": "10.0.0.9:1"}
    store.report(parse_report(a), now=1)
    store.report(parse_report(b), now=2)
    snap = store.snapshot(now=3)
    assert [n["node"] for n in snap["nodes"]] == ["node-a", "node-b"]  # type: ignore[index]
    assert snap["nodes"][0]["age"] == 2  # type: ignore[index]
    (art,) = snap["artifacts"]  # type: ignore[misc]
    assert art["name"] == "index.db" and art["size"] == 1000
    assert (art["nodes"], art["nodes_complete"], art["progress"]) == (2, 1, 0.625)
    assert (art["down_rate"], art["up_rate"]) == (2.5e6, 2e6)
    assert art["bytes_by_source"] == {"peers": 200, "s3": 300, "udp": 0}
    assert (art["complete"], art["incomplete"]) == (1, 1)
    assert [(p["ip"], p["node"]) for p in art["peers"]] == [
        ("10.0.0.1", "node-a"),  # its report's addr matches its announce
        ("10.0.0.9", None),
    ]


# -- history -------------------------------------------------------------------------------------


def completion(node: str, seconds: float | None, at: float = 100.0) -> Completion:
    return Completion(HEX, "index.db", node, at, seconds, {"s3": 10, "peers": 90})


def test_history_records_once_and_counts(tmp_path: Path) -> None:
    db = tmp_path / "sub" / "history.db"
    history = History(db)
    assert history.record(completion("a", 10.0))
    assert not history.record(completion("a", 99.0, at=200))  # same node again
    assert history.record(completion("b", 20.0, at=150))
    assert history.record(completion("origin", None))
    history.close()

    reopened = History(db)  # survives a restart
    assert reopened.counts() == {
        HEX: {
            "name": "index.db",
            "completed": 3,
            "mean_seconds": 15.0,
            "median_seconds": 10.0,
            "p99_seconds": 20.0,
            "max_seconds": 20.0,
            "last_completed_at": 150.0,
            "bytes_by_source": {"s3": 30, "peers": 270},
        }
    }
    assert [c.node for c in reopened.completions(HEX)] == ["a", "origin", "b"]
    assert reopened.completions(HEX)[0].bytes_by_source == {"peers": 90, "s3": 10}
    reopened.close()


def test_history_in_memory_by_default() -> None:
    history = History()
    assert history.counts() == {}
    assert history.record(completion("a", 1.0))
    assert history.counts()[HEX]["completed"] == 1


def test_history_refuses_a_newer_schema(tmp_path: Path) -> None:
    db = tmp_path / "h.db"
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(SwarmError, match=r"schema version 99.*upgrade swarm or pass another --db"):
        History(db)


def test_history_explains_an_unopenable_path(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SwarmError, match="cannot open history database"):
        History(blocker / "history.db")
