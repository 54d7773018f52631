"""Resource bounds: daemon memory on a 2 GiB artifact, and an upload cap that holds for LAN
peers (libtorrent exempts local peers from rate limits unless told otherwise)."""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import boto3

from swarm.manifest import MANIFEST_SUFFIX, Manifest
from tests.integration.test_publish_fetch import published
from tests.integration.test_swarm import FETCH_TIMEOUT
from tests.servers import wait_until
from tests.swarmnet import Node, done_event

MiB = 1 << 20
BIG = 2048 * MiB
RSS_LIMIT = 250 * MiB
UPLOAD_CAP = 2 * MiB
CAP_ARTIFACT = 64 * MiB
CAP_WINDOW = 16.0


def rss(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise LookupError(field)


def test_daemon_rss_stays_under_250_mib_on_a_2_gib_artifact(fleet, env, bucket, tmp_path):
    # A 2 GiB artifact made of 32 random 64 MiB blocks (cheap to generate, all real bytes).
    src = tmp_path / "big.bin"
    rng = random.Random(5)
    blocks = [rng.randbytes(64 * MiB) for _ in range(4)]
    with src.open("wb") as out:
        for i in range(BIG // (64 * MiB)):
            out.write(blocks[i % 4][: 64 * MiB - 1] + bytes([i]))
    key = "big/big.bin"
    manifest = Manifest.from_file(
        src, name="big.bin", piece_size=2 * MiB, bucket=bucket, key=key, web_seed=None
    )
    # Only the manifest goes to S3: the bytes come from a seeder that already holds them.
    boto3.client("s3").put_object(Bucket=bucket, Key=key + MANIFEST_SUFFIX, Body=manifest.dumps())
    seeder = fleet.node(0)
    data = seeder.home / "data" / manifest.info_hash
    data.mkdir(parents=True)
    os.link(src, data / "big.bin")
    (seeder.home / "artifacts").mkdir()
    (seeder.home / "artifacts" / f"{manifest.info_hash}.swarm").write_bytes(manifest.dumps())
    fleet.start_daemon(seeder)
    wait_until(
        lambda: seeder.artifacts() and seeder.artifacts()[0]["state"] == "seeding",
        120,
        "the seeder to check its 2 GiB",
    )

    leecher = fleet.node(1)
    fleet.start_daemon(leecher)
    pid = leecher.daemon_pid()
    process = leecher.fetch(f"s3://{bucket}/{key}", tmp_path / "out.bin", "--source", "peers")
    peak = 0
    deadline = time.monotonic() + 300
    while process.poll() is None and time.monotonic() < deadline:  # bounded sampling
        peak = max(peak, rss(pid))
        time.sleep(0.2)
    done = done_event(process, 10)
    peak = max(peak, rss(pid, "VmHWM"))
    assert done["bytes_by_source"]["peers"] >= BIG
    assert peak < RSS_LIMIT, f"daemon peak RSS {peak / MiB:.0f} MiB"
    digest = hashlib.sha256()
    with (tmp_path / "out.bin").open("rb") as f:
        while chunk := f.read(16 * MiB):
            digest.update(chunk)
    assert digest.hexdigest() == manifest.sha256


def test_upload_cap_holds_within_5_percent_for_lan_peers(fleet, bucket, tmp_path):
    # Its own 64 MiB artifact: 32 s at the cap, long enough for a window well inside it.
    _src, url = published(tmp_path, bucket, CAP_ARTIFACT)
    seeder = fleet.node(0)
    fleet.start_daemon(seeder, "--upload-limit", str(UPLOAD_CAP))
    done_event(seeder.fetch(url, tmp_path / "seeder.bin"), FETCH_TIMEOUT)
    leecher = fleet.node(1)
    process = leecher.fetch(url, tmp_path / "leecher.bin", "--source", "peers")
    # Past the first seconds (socket buffers fill at line rate before the limiter bites).
    wait_until(lambda: _on_the_wire(seeder, leecher) > 6 * MiB, 30, "the upload to settle")
    samples = _sample(lambda: _on_the_wire(seeder, leecher), CAP_WINDOW)
    still_fetching = process.poll() is None
    rate = _slope(samples)
    done_event(process, FETCH_TIMEOUT)
    assert still_fetching  # the window fell inside the transfer, not after it
    assert all(a[1] <= b[1] for a, b in itertools.pairwise(samples))  # one connection
    # Without the setting libtorrent exempts LAN peers and this runs at loopback speed; the
    # lower bound shows the cap is what limits. libtorrent's limiter is a token bucket that
    # holds up to 3 s of quota, so short windows burst past the cap (6 s windows measured
    # up to 1.12x); over this 16 s window the wire rate measured 0.98-1.00x.
    assert 0.75 * UPLOAD_CAP <= rate <= 1.05 * UPLOAD_CAP, f"{rate / UPLOAD_CAP:.3f}x the cap"


def _on_the_wire(seeder: Node, leecher: Node) -> int:
    """Bytes the kernel has seen the leecher acknowledge on the seeder's connections to it:
    a counter read at the moment it is asked (the daemon's own figures are snapshots)."""
    out = subprocess.run(
        ["ss", "-tinH", "src", seeder.ip, "dst", leecher.ip],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    ).stdout
    return sum(int(n) for n in re.findall(r"bytes_acked:(\d+)", out))


def _sample(read: Callable[[], int], seconds: float) -> list[tuple[float, int]]:
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # bounded by the deadline
        samples.append((time.monotonic(), read()))
        time.sleep(0.1)
    return samples


def _slope(samples: list[tuple[float, int]]) -> float:
    """Least-squares rate (units per second) through (time, counter) samples."""
    n = len(samples)
    mt = sum(t for t, _ in samples) / n
    mv = sum(v for _, v in samples) / n
    return sum((t - mt) * (v - mv) for t, v in samples) / sum((t - mt) ** 2 for t, _ in samples)
