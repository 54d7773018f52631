"""The S3 source against a real S3 server (moto) on loopback."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import boto3

from swarm.manifest import Manifest
from swarm.s3http import S3Client
from swarm.sources.s3 import OVERTAKEN_CHECK, S3Source, S3SourceConfig
from swarm.sources.s3width import START_WIDTH, GetWidth
from tests.conftest import make_artifact

PIECE = 256 << 10


def _published(
    env: dict[str, str], bucket: str, path: Path, pieces: int, piece: int = PIECE
) -> tuple[Manifest, Any]:
    """An artifact of ``pieces`` pieces in the bucket under its file name: its manifest and
    the node's S3 client."""
    src = make_artifact(path, pieces * piece)
    manifest = Manifest.from_file(
        src, name=path.name, piece_size=piece, bucket=bucket, key=path.name, web_seed=None
    )
    writer = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"])
    writer.put_object(Bucket=bucket, Key=path.name, Body=src.read_bytes())
    return manifest, S3Client(env["AWS_ENDPOINT_URL"])


class RacingSink:
    """Keeps what S3 offers; once piece ``trigger`` is in, pieces ``others`` count as
    brought by another source (a peer, UDP) while the GET still runs."""

    def __init__(self, manifest: Manifest, trigger: int, others: set[int]) -> None:
        self.hashes = manifest.piece_hashes
        self.trigger, self.others = trigger, others
        self.held: set[int] = set()
        self.offered: list[int] = []

    def have(self, index: int) -> bool:
        return index in self.held

    def offer(self, index: int, data: bytes | memoryview, source: str) -> bool:
        self.offered.append(index)
        if hashlib.sha1(data).digest() != self.hashes[index]:
            return False
        self.held.add(index)
        if index == self.trigger:
            self.held |= self.others
        return True


def test_a_get_stops_at_a_piece_another_source_brought(env, bucket, tmp_path):
    """One 8-piece range: pieces 1-3 arrive from elsewhere once piece 0 is read. The GET
    stops there instead of reading them, and the rest comes by a GET of its own."""
    manifest, client = _published(env, bucket, tmp_path / "a.bin", 8)
    sink = RacingSink(manifest, trigger=0, others={1, 2, 3})
    config = S3SourceConfig(concurrency=1, range_size=8 * PIECE)
    S3Source(client, manifest, sink, threading.Event(), config).fetch(range(8))
    assert sink.offered == [0, 4, 5, 6, 7]
    assert sink.held == set(range(8))


def test_a_fetch_told_to_stop_ends_at_the_next_piece(env, bucket, tmp_path):
    """Two 4-piece ranges, one GET at a time; ``stop`` turns true once piece 1 is in (the
    coordinator took ALL back): the GET ends after it, the second range never starts,
    and the fetch returns without an error, the rest left missing."""
    manifest, client = _published(env, bucket, tmp_path / "s.bin", 8)
    sink = RacingSink(manifest, trigger=-1, others=set())
    config = S3SourceConfig(concurrency=1, range_size=4 * PIECE)
    S3Source(client, manifest, sink, threading.Event(), config).fetch(
        range(8), stop=lambda: 1 in sink.held
    )
    assert sink.offered == [0, 1]
    assert sink.held == {0, 1}


class LateSink(RacingSink):
    """Each piece of ``late`` counts as brought by another source from its ``nth`` check
    on (index: nth)."""

    def __init__(self, manifest: Manifest, late: dict[int, int]) -> None:
        super().__init__(manifest, trigger=-1, others=set())
        self.late, self.checks = late, dict.fromkeys(late, 0)

    def have(self, index: int) -> bool:
        if index in self.late:
            self.checks[index] += 1
            if self.checks[index] == self.late[index]:
                self.held.add(index)
        return index in self.held


def test_a_get_gives_up_a_piece_another_source_brought_while_it_was_read(env, bucket, tmp_path):
    """1 MiB pieces are read a quarter at a time: piece 1 arrives from elsewhere after
    its first quarter was read, and the rest of it is not."""
    piece = 1 << 20
    manifest, client = _published(env, bucket, tmp_path / "b.bin", 4, piece)
    # checks of piece 1: choosing the range, before its first quarter, before its second
    sink = LateSink(manifest, {1: 3})
    config = S3SourceConfig(concurrency=1, range_size=4 * piece)
    S3Source(client, manifest, sink, threading.Event(), config).fetch(range(4))
    assert sink.offered == [0, 2, 3]
    assert sink.checks[1] >= 3 and sink.held == {0, 1, 2, 3}


def test_the_bytes_read_for_pieces_another_source_brought_are_counted(env, bucket, tmp_path):
    """The part of piece 1 read before it arrived from elsewhere (a quarter) is counted
    as read in vain, and so is all of piece 3, brought as its last quarter came in (too
    late for the checks that give a piece up; it is offered anyway, a duplicate)."""
    piece = 4 * OVERTAKEN_CHECK
    manifest, client = _published(env, bucket, tmp_path / "v.bin", 4, piece)
    # piece 1's checks: choosing the range, before its first quarter, before its second;
    # piece 3's: choosing each of the two ranges (the first GET stops at piece 1), before
    # each of its four quarters, once read
    sink = LateSink(manifest, {1: 3, 3: 7})
    vain: list[int] = []
    config = S3SourceConfig(concurrency=1, range_size=4 * piece)
    S3Source(client, manifest, sink, threading.Event(), config, overtaken=vain.append).fetch(
        range(4)
    )
    assert sink.held == {0, 1, 2, 3}
    assert sink.offered == [0, 2, 3]
    assert vain == [OVERTAKEN_CHECK, piece]


def test_gets_read_to_their_end_reuse_one_connection(env, bucket, tmp_path):
    """A body read to its end gives its connection back to the pool, so four GETs in a
    row open one (each used to open its own: a TCP handshake and slow start, in AWS a
    TLS handshake)."""
    manifest, client = _published(env, bucket, tmp_path / "c.bin", 8)
    sink = RacingSink(manifest, trigger=-1, others=set())
    config = S3SourceConfig(concurrency=1, range_size=2 * PIECE)
    gets, opened = [], []
    get_object, connect = client.get_object, client.endpoint.connect  # counted, then called
    client.get_object = lambda **kw: gets.append(kw) or get_object(**kw)  # type: ignore[method-assign]
    client.endpoint.connect = lambda: opened.append(1) or connect()  # type: ignore[method-assign]
    S3Source(client, manifest, sink, threading.Event(), config).fetch(range(8))
    assert len(gets) == 4 and sink.held == set(range(8))
    assert len(opened) == 1


def test_no_more_gets_in_flight_than_the_width(env, bucket, tmp_path):
    """Eight threads, each with a range, but a width capped at 2 (it starts at
    START_WIDTH and may double): never more GETs in flight at once, from the request to
    the body's close, than the widest the width has been (so one while it stays at one),
    never more than two, and every piece arrives."""
    manifest, client = _published(env, bucket, tmp_path / "w.bin", 16)
    sink = RacingSink(manifest, trigger=-1, others=set())
    config = S3SourceConfig(concurrency=8, range_size=2 * PIECE)
    width = GetWidth(lambda: len(sink.held), cap=2)
    lock, in_flight, most, widest = threading.Lock(), [0], [0], [0]
    get_object = client.get_object

    def counted(**kw: Any) -> Any:
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            widest[0] = max(widest[0], width.width)
        response = get_object(**kw)
        close = response["Body"].close

        def closed() -> None:
            with lock:
                in_flight[0] -= 1
            close()

        response["Body"].close = closed
        return response

    client.get_object = counted  # type: ignore[method-assign]
    S3Source(client, manifest, sink, threading.Event(), config, width=width).fetch(range(16))
    assert sink.held == set(range(16))
    assert START_WIDTH <= most[0] <= 2
    assert most[0] <= widest[0] <= 2


def test_the_bytes_read_are_counted_as_they_stream_in(env, bucket, tmp_path):
    """The coordinator measures S3's rate from this counter: it moves by parts of a piece
    (OVERTAKEN_CHECK) as they are read, and sums to exactly what was read (a piece
    another source brought first is not read, and not counted)."""
    piece = 4 * OVERTAKEN_CHECK
    manifest, client = _published(env, bucket, tmp_path / "a.bin", 4, piece)
    sink = RacingSink(manifest, trigger=0, others={1})
    parts: list[int] = []
    config = S3SourceConfig(concurrency=1, range_size=4 * piece)
    S3Source(client, manifest, sink, threading.Event(), config, streamed=parts.append).fetch(
        range(4)
    )
    assert sink.held == set(range(4))
    assert set(parts) == {OVERTAKEN_CHECK}  # a part at a time, not a piece
    assert sum(parts) == 3 * piece  # pieces 0, 2 and 3: piece 1 came from elsewhere


def test_each_get_tells_the_pieces_it_reads_before_it_starts_and_once_it_ends(
    env, bucket, tmp_path
):
    """Three 2-piece ranges, one GET at a time, piece 3 already held: each GET tells its
    pieces (the held one left out) before the first of them is offered, and tells the same
    once its last is in (the daemon keeps peers from them meanwhile)."""
    manifest, client = _published(env, bucket, tmp_path / "r.bin", 6)
    sink = RacingSink(manifest, trigger=-1, others=set())
    sink.held.add(3)
    events: list[tuple[str, object]] = []
    original_offer = sink.offer

    def offer(index: int, data: bytes | memoryview, source: str) -> bool:
        events.append(("offer", index))
        return original_offer(index, data, source)

    sink.offer = offer  # type: ignore[method-assign]
    config = S3SourceConfig(concurrency=1, range_size=2 * PIECE)
    S3Source(
        client,
        manifest,
        sink,
        threading.Event(),
        config,
        reading=lambda pieces, on: events.append(("reading" if on else "read", list(pieces))),
    ).fetch(range(6))
    assert events == [
        ("reading", [0, 1]),
        ("offer", 0),
        ("offer", 1),
        ("read", [0, 1]),
        ("reading", [2]),
        ("offer", 2),
        ("read", [2]),
        ("reading", [4, 5]),
        ("offer", 4),
        ("offer", 5),
        ("read", [4, 5]),
    ]
    assert sink.held == set(range(6))
