"""Hostile reports against a real ``swarm coordinator`` process (issue 15, item 4): its
memory stays bounded and it keeps answering the fleet.

Before the geometry checks, one 200 KB report claiming ``piece_size: 1`` on a 1.2 MB
artifact added 78 MB to the coordinator and got a 9.7 MB reply; a loop of them ran it
into the OOM killer.
"""

from __future__ import annotations

import base64
import json
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.servers import BIN, free_port, wait_until

RSS_LIMIT = 300 << 20
"""Peak resident memory the coordinator may reach over the whole test (issue 15)."""

REPLY_LIMIT = 64 << 10
"""Largest reply any report may get: answers stay small whatever the report claims."""


def _vm(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` memory field (VmRSS, VmHWM) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for pid {pid}")


def _post(url: str, body: bytes) -> tuple[int, bytes]:
    request = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "coordinator.log").open("wb")
    process = subprocess.Popen(
        [str(BIN / "swarm"), "coordinator", "--listen", f"127.0.0.1:{port}"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    try:

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=1) as response:
                    return response.status == 200
            except OSError:
                return False

        wait_until(healthy, 30, "the coordinator to answer /healthz")
        yield url, process
    finally:
        process.kill()
        process.wait(10)


def artifact(n: int, size: int, piece_size: int, count: int, bitfield: bytes) -> dict[str, Any]:
    return {
        "info_hash": f"{n:040x}",
        "name": f"crafted-{n}",
        "size": size,
        "have_bytes": 0,
        "complete": False,
        "bytes_by_source": {"s3": 0, "peers": 0},
        "down_rate": 0,
        "up_rate": 0,
        "piece_size": piece_size,
        "piece_count": count,
        "pieces": base64.b64encode(bitfield).decode(),
    }


def crafted(index: int) -> bytes:
    """The ``index``-th hostile report, each from a new node, each under the 1 MiB body
    limit: bogus geometries (refused) and the heaviest valid ones (accepted, bounded)."""
    node = {"node": f"attacker-{index}", "addr": f"10.66.{index}.1:6881"}
    kind = index % 5
    if kind == 0:  # issue 15's report: 1-byte pieces, 1.2M of them, 200 KB
        count = 1_200_000
        items = [artifact(index, count, 1, count, b"\x00" * (count // 8))]
    elif kind == 1:  # a piece count that disagrees with size / piece_size
        items = [artifact(index, 16 << 10, 16 << 10, 6_000_000, b"\x00" * 750_000)]
    elif kind == 2:  # a consistent geometry past the coordinator's piece cap: 5M pieces
        count = 5_000_000
        items = [artifact(index, count << 14, 16 << 10, count, b"\x00" * (count // 8))]
    elif kind == 3:  # valid and as heavy as the cap allows: five 1M-piece bitfields
        count = 1 << 20
        items = [
            artifact(index * 8 + k, count << 14, 16 << 10, count, b"\x00" * (count // 8))
            for k in range(5)
        ]
    else:  # valid and wide: 1,024 artifacts of 16 sources each
        sources = {f"source-{k:025d}": 1 << 40 for k in range(16)}
        items = []
        for k in range(1024):
            item = artifact(index * 2048 + k, 1 << 20, 1 << 20, 1, b"\x00")
            item["bytes_by_source"] = sources
            item.pop("pieces"), item.pop("piece_size"), item.pop("piece_count")
            items.append(item)
    body = json.dumps({**node, "artifacts": items}).encode()
    assert len(body) < 1 << 20, (kind, len(body))
    return body


def test_crafted_reports_leave_the_coordinator_alive_and_small(
    coordinator: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, process = coordinator
    statuses = []
    for index in range(20):
        status, reply = _post(url + "/v1/report", crafted(index))
        statuses.append(status)
        assert len(reply) < REPLY_LIMIT, (index, status, len(reply))
        assert process.poll() is None, f"the coordinator died after crafted report {index}"
    # the bogus geometries are refused with a message, the valid heavy ones accepted
    assert statuses[:5] == [400, 400, 400, 200, 200]
    peak = _vm(process.pid, "VmHWM")
    assert peak < RSS_LIMIT, f"coordinator peaked at {peak >> 20} MiB"

    # still serving the fleet: a real-sized report gets its stripe
    count = 2048
    honest = {
        "node": "honest",
        "addr": "10.0.0.1:6881",
        "artifacts": [artifact(1 << 100, count << 20, 1 << 20, count, b"\x00" * (count // 8))],
    }
    status, reply = _post(url + "/v1/report", json.dumps(honest).encode())
    assert status == 200
    plan = json.loads(reply)["plans"][f"{1 << 100:040x}"]
    assert plan["stripe"][:2] == [0, 1]
    with urllib.request.urlopen(url + "/healthz", timeout=10) as response:
        assert json.loads(response.read()) == {"ok": True}
