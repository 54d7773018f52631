from __future__ import annotations

import hashlib
import random

import pytest

from swarm.errors import ManifestError
from swarm.manifest import Manifest
from swarm.pieces import MiB, PieceLayout, default_piece_size, plan_ranges
from swarm.s3http import BACKOFF_CAP, backoff_delay


@pytest.mark.parametrize(
    ("size", "piece"),
    [
        (0, MiB),
        (1, MiB),
        (128 * MiB, MiB),
        (2048 * MiB, MiB),
        (2049 * MiB, 2 * MiB),
        (4096 * MiB, 2 * MiB),
        (64 << 30, 16 * MiB),
        (1 << 40, 16 * MiB),
    ],
)
def test_default_piece_size_rule(size, piece):
    assert default_piece_size(size) == piece


def test_layout_last_piece_is_short():
    layout = PieceLayout(10 * MiB + 5, MiB)
    assert layout.count == 11
    assert layout.length(10) == 5
    with pytest.raises(IndexError):
        layout.length(11)
    assert PieceLayout(0, MiB).count == 0


def test_plan_ranges_groups_runs_up_to_range_size():
    layout = PieceLayout(40 * MiB + 1, MiB)
    ranges = plan_ranges(layout, [0, 1, 2, 5, 6, *range(10, 41)], range_size=16 * MiB)
    assert [(r.first, r.count) for r in ranges] == [(0, 3), (5, 2), (10, 16), (26, 15)]
    last = ranges[-1]
    assert last.end == layout.size and last.header == f"bytes={26 * MiB}-{layout.size - 1}"
    # every range is a whole number of pieces, and pieces are covered exactly once
    covered = [i for r in ranges for i in r.pieces]
    assert covered == sorted(set(covered))


def test_plan_ranges_piece_bigger_than_range():
    ranges = plan_ranges(PieceLayout(8 * MiB, 4 * MiB), [0, 1], range_size=MiB)
    assert [(r.first, r.count) for r in ranges] == [(0, 1), (1, 1)]


def test_backoff_is_jittered_and_capped():
    rng = random.Random(7)
    delays = [backoff_delay(a, rng) for a in range(20)]
    assert all(0 <= d <= BACKOFF_CAP for d in delays)
    assert len(set(delays)) == len(delays)


@pytest.fixture
def manifest(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(random.Random(1).randbytes(3 * MiB + 7))
    return Manifest.from_file(
        path,
        name="a.bin",
        piece_size=MiB,
        bucket="b",
        key="k/a.bin",
        web_seed="http://s3.local/b/k/a.bin",
    )


def test_manifest_round_trip(manifest, tmp_path):
    again = Manifest.loads(manifest.dumps())
    assert again == manifest
    assert again.sha256 == hashlib.sha256((tmp_path / "a.bin").read_bytes()).hexdigest()
    assert len(again.piece_hashes) == 4
    assert len(again.info_hash) == 40


def test_manifest_signature(manifest):
    signed = manifest.dumps(secret="s1")
    assert Manifest.loads(signed, secret="s1") == manifest
    with pytest.raises(ManifestError, match="signature"):
        Manifest.loads(signed, secret="s2")
    with pytest.raises(ManifestError, match="signature"):
        Manifest.loads(manifest.dumps(), secret="s1")


@pytest.mark.parametrize("blob", [b"", b"[]", b"{}", b"null", b'{"version": 1}', b"\xff"])
def test_garbage_manifest_raises_manifest_error(blob):
    with pytest.raises(ManifestError):
        Manifest.loads(blob)


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/b", "..", ".", ""])
def test_unsafe_names_refused(tmp_path, name):
    path = tmp_path / "f"
    path.write_bytes(b"x")
    with pytest.raises(ManifestError, match="unsafe"):
        Manifest.from_file(path, name=name, piece_size=MiB, bucket="b", key="k", web_seed=None)
