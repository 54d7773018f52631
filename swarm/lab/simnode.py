"""A simulated node of a large fleet, as its coordinator sees it: the reports and
announces of a daemon fetching one 2 GiB artifact (:class:`SimNode`). ``bench/coordinator.py``
drives thousands of them against real coordinators over HTTP, and times the
coordinator's own code with them in one process (``--in-process``).

Its reports carry the daemon's fields, one artifact with a 2,048-piece bitfield that
fills as the node "downloads" (its stripe first), and ``members_epoch`` as an
authenticated fleet's daemon echoes it."""

from __future__ import annotations

import base64
import json
import random
from typing import Any
from urllib.parse import quote_from_bytes

PIECES = 2048
PIECE_SIZE = 1 << 20
ARTIFACT_SIZE = PIECES * PIECE_SIZE
INFO_HASH = bytes.fromhex("c0ffee" * 6 + "c0ff")
FETCH_SECONDS = 120.0
"""A simulated node gains random pieces at a rate that completes the artifact in about
this long (plus its stripe, which it "reads" by the next report)."""


class SimNode:
    def __init__(self, index: int, rng: random.Random, urls: list[str]) -> None:
        self.index = index
        self.name = f"sim-{index:05d}"
        self.ip = f"10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255 or 1}"
        self.peer_id = b"-SIM001-" + index.to_bytes(12, "big")
        self.rng = rng
        self.urls = urls
        self.current = index % len(urls)
        self.held = bytearray(PIECES // 8)
        self.have = 0
        self.counters = {"peers": 0, "s3": 0, "udp": 0}
        self.stripe: list[int] = []
        self.members_epoch: Any = None
        self.orphaned = False
        """Its coordinator was killed and no other one has answered it yet."""
        self.track_members = True
        """An authenticated fleet's node keeps the member list (its peer filter)."""
        self.new_protocol = True
        """Sends ``members_epoch`` (issue 12); False: as daemons before it, no epoch."""
        self.started = 0.0

    @property
    def url(self) -> str:
        return self.urls[self.current]

    def fail_over(self) -> None:
        self.current = (self.current + 1) % len(self.urls)

    def gain(self, seconds: float) -> None:
        """Pieces that arrived since the last report: the stripe, then random ones."""
        for piece in self.stripe:
            self._take(piece, "s3")
        self.stripe = []
        for _ in range(int(seconds * PIECES / FETCH_SECONDS + self.rng.random())):
            self._take(self.rng.randrange(PIECES), "peers")

    def _take(self, piece: int, source: str) -> None:
        byte, bit = divmod(piece, 8)
        if not self.held[byte] & (0x80 >> bit):
            self.held[byte] |= 0x80 >> bit
            self.have += 1
            self.counters[source] += PIECE_SIZE

    def report(self, now: float) -> bytes:
        complete = self.have == PIECES
        body: dict[str, Any] = {
            "node": self.name,
            "addr": f"{self.ip}:6881",
            "artifacts": [
                {
                    "info_hash": INFO_HASH.hex(),
                    "name": "index.db",
                    "dest": "/var/lib/app/index.db",
                    "state": "seeding" if complete else "fetching",
                    "complete": complete,
                    "size": ARTIFACT_SIZE,
                    "have_bytes": self.have * PIECE_SIZE,
                    "bytes_by_source": dict(self.counters),
                    "down_rate": 50e6 if not complete else 0.0,
                    "up_rate": 20e6,
                    "uploaded": self.have * PIECE_SIZE,
                    "peers": 30,
                    "seconds": None,
                    "error": None,
                    "error_no_space": False,
                    "s3_error": None,
                    "udp_error": None,
                    "hash_failures": 0,
                    "peer_hash_failures": 0,
                    "peers_banned": 0,
                    "elapsed": round(now - self.started, 3),
                    "piece_size": PIECE_SIZE,
                    "piece_count": PIECES,
                    "pieces": base64.b64encode(bytes(self.held)).decode(),
                    "mode": "stripe",
                }
            ],
        }
        if not self.track_members:
            body["want_members"] = False
        elif self.members_epoch is not None or self.new_protocol:
            body["members_epoch"] = self.members_epoch
        return json.dumps(body).encode()

    def announce_query(self, event: str) -> str:
        params = {
            "info_hash": INFO_HASH,
            "peer_id": self.peer_id,
            "port": 6881,
            "uploaded": self.have * PIECE_SIZE,
            "downloaded": self.have * PIECE_SIZE,
            "left": (PIECES - self.have) * PIECE_SIZE,
            "compact": 1,
            "numwant": 200,
            "ip": self.ip,
        }
        if event:
            params["event"] = event
        return "&".join(
            f"{k}={quote_from_bytes(v if isinstance(v, bytes) else str(v).encode(), safe='')}"
            for k, v in params.items()
        )
