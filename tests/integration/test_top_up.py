"""Pieces peers have partly sent, completed from S3 (swarm.agent.topup), against a real
S3 server (moto) on loopback and a data file holding the peers' blocks."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from pathlib import Path

import boto3

from swarm.agent.downloadqueue import finished_blocks
from swarm.agent.topup import BLOCK_SIZE, MIN_BLOCKS, TopUps, span, top_up
from swarm.manifest import Manifest
from swarm.s3http import S3Client
from swarm.sources.s3 import S3Source
from tests.conftest import make_artifact

PIECE = 256 << 10  # sixteen blocks
BLOCKS = PIECE // BLOCK_SIZE


class KeepingSink:
    """Keeps pieces whose SHA-1 matches, counting each one's bytes per source as told."""

    def __init__(self, manifest: Manifest) -> None:
        self.hashes = manifest.piece_hashes
        self.held: set[int] = set()
        self.counted: dict[str, int] = {}

    def have(self, index: int) -> bool:
        return index in self.held

    def offer(
        self,
        index: int,
        data: bytes | memoryview,
        source: str,
        counted: Mapping[str, int] | None = None,
    ) -> bool:
        if hashlib.sha1(data).digest() != self.hashes[index]:
            return False
        self.held.add(index)
        for name, nbytes in (counted or {source: len(data)}).items():
            self.counted[name] = self.counted.get(name, 0) + nbytes
        return True


def _setup(env: dict[str, str], bucket: str, tmp_path: Path) -> tuple[Manifest, S3Client, bytes]:
    """A four-piece artifact in the bucket: its manifest, the node's client, its bytes."""
    src = make_artifact(tmp_path / "src.bin", 4 * PIECE)
    manifest = Manifest.from_file(
        src, name="a.bin", piece_size=PIECE, bucket=bucket, key="a.bin", web_seed=None
    )
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"]).put_object(
        Bucket=bucket, Key="a.bin", Body=src.read_bytes()
    )
    return manifest, S3Client(env["AWS_ENDPOINT_URL"]), src.read_bytes()


def _data_file(path: Path, whole: bytes, blocks: Mapping[int, set[int]]) -> Path:
    """The node's sparse data file with only ``blocks`` (per piece) written, as libtorrent
    writes a peer's blocks."""
    with path.open("wb") as file:
        file.truncate(len(whole))
        for index, written in blocks.items():
            for block in written:
                at = index * PIECE + block * BLOCK_SIZE
                file.seek(at)
                file.write(whole[at : at + BLOCK_SIZE])
    return path


def test_the_span_runs_from_the_first_missing_block_to_the_last() -> None:
    assert span(PIECE, frozenset(range(8))) == (8 * BLOCK_SIZE, PIECE)  # a prefix held
    assert span(PIECE, frozenset({0, 1, 2, 3, 15})) == (4 * BLOCK_SIZE, 15 * BLOCK_SIZE)
    assert span(PIECE, frozenset({0, 1, 2})) is None  # under MIN_BLOCKS: read it whole
    assert span(PIECE, frozenset(range(BLOCKS))) is None  # nothing missing
    # a short last piece: its last block ends at the piece's end
    assert span(PIECE - 100, frozenset(range(MIN_BLOCKS))) == (MIN_BLOCKS * BLOCK_SIZE, PIECE - 100)
    queue = [
        {"piece_index": 2, "blocks": [{"state": 3}, {"state": 2}, {"state": 3}, {"state": 1}]},
        {"piece_index": 5, "blocks": [{"state": 1}, {"state": 0}]},
    ]
    assert finished_blocks(queue) == {2: frozenset({0, 2})}


def test_a_partly_sent_piece_reads_only_its_missing_blocks_from_s3(env, bucket, tmp_path):
    manifest, client, whole = _setup(env, bucket, tmp_path)
    held = set(range(10))  # the first ten blocks of piece 1 came from a peer
    data_file = _data_file(tmp_path / "data", whole, {1: held})
    streamed: list[int] = []
    got = top_up(client, manifest, data_file, 1, frozenset(held), streamed.append)
    assert got is not None
    piece, from_s3 = got
    assert bytes(piece) == whole[PIECE : 2 * PIECE]
    assert from_s3 == sum(streamed) == (BLOCKS - 10) * BLOCK_SIZE
    # a block said to be written that the file does not hold (libtorrent dropped it
    # since): the SHA-1 says so, and the piece is left to a whole read
    assert top_up(client, manifest, data_file, 1, frozenset({*range(10), 15}), None) is None
    assert top_up(client, manifest, data_file, 2, frozenset(range(6)), None) is None


def test_a_batch_tops_up_what_it_can_and_reads_the_rest_whole(env, bucket, tmp_path):
    """Piece 1 partly sent (topped up: S3 counted for its rest only), piece 2 with too
    few blocks and piece 3 said partly sent but not in the file (both read whole)."""
    manifest, client, whole = _setup(env, bucket, tmp_path)
    data_file = _data_file(tmp_path / "data", whole, {1: set(range(12)), 2: {0, 1}})
    finished = {1: frozenset(range(12)), 2: frozenset({0, 1}), 3: frozenset(range(8))}
    sink = KeepingSink(manifest)
    reader = S3Source(client, manifest, sink, threading.Event())
    with TopUps(client, manifest, data_file, sink, [0, 1, 2, 3], finished) as top_ups:
        assert top_ups.whole == [0, 2] and set(top_ups.partly_sent) == {1, 3}
        reader.fetch(top_ups.whole)
    assert top_ups.failed == [3]
    reader.fetch(top_ups.failed)
    assert sink.held == {0, 1, 2, 3}
    assert sink.counted == {"s3": 3 * PIECE + 4 * BLOCK_SIZE}
