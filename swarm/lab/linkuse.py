"""Where a fleet run's seconds go, as the links saw them: when the nodes' first bytes
came, and how much of the nodes' downlinks and uplinks and of the origin's uplink the
run used until its last node was done.

The bound T* counts every link busy from the first instant; a system loses to it in its
start (process, daemon, first request), in its ramp (peers have nothing to relay
until whole pieces arrive) and in its end (the last pieces). The client's all-done time
folds them together; the bridge's counters tell them apart, for every system of one
invocation alike. A thread of the bench joins the lab's switch namespace (``setns``
holds for the calling thread alone) and reads its ``/proc/thread-self/net/dev`` every
:data:`PERIOD` seconds: no process started per sample, nothing in the hosts' namespaces.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

PERIOD: Final = 0.1
"""Seconds between samples of the bridge's counters."""

FIRST_BYTES: Final = 1_000_000
"""The nodes' downlinks have carried this much in all once a system's transfer has begun
(the catalog's and manifest's reads before it are a few KB)."""

CLONE_NEWNET: Final = 0x40000000

Counters = dict[str, tuple[int, int]]
"""Per bridge port: (rx, tx) bytes. A port's rx is what its host sent, its tx what the
host received."""


def read_net_dev(path: str = "/proc/thread-self/net/dev") -> Counters:
    """Every interface's (rx, tx) byte counters in this thread's network namespace."""
    counters: Counters = {}
    with open(path) as dev:
        for line in dev.readlines()[2:]:
            name, rest = line.split(":", 1)
            fields = rest.split()
            counters[name.strip()] = (int(fields[0]), int(fields[8]))
    return counters


class LinkSampler:
    """Samples the switch namespace's port counters every :data:`PERIOD` in a thread, from
    ``__enter__`` to ``__exit__``: ``samples`` is ``[(monotonic seconds, counters)]``."""

    def __init__(self, switch: str, period: float = PERIOD) -> None:
        self.switch = switch
        self.period = period
        self.samples: list[tuple[float, Counters]] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="links", daemon=True)

    def _run(self) -> None:
        try:
            fd = os.open(f"/run/netns/{self.switch}", os.O_RDONLY)
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns")
            finally:
                os.close(fd)
            while True:
                self.samples.append((time.monotonic(), read_net_dev()))
                if self._stop.wait(self.period):
                    self.samples.append((time.monotonic(), read_net_dev()))
                    return
        except OSError as error:  # the run goes on; its summary says what is missing
            self.error = f"link counters unavailable: {error}"

    def __enter__(self) -> LinkSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


@dataclass(frozen=True)
class LinkUse:
    first_bytes: float | None
    """Seconds from the start until the nodes' downlinks had carried :data:`FIRST_BYTES`
    (None if they never did)."""
    down: float
    """Share of the nodes' downlinks' capacity used from the start until all were done."""
    up: float
    """Share of the nodes' uplinks' capacity used over the same time."""
    origin: float
    """Share of the origin's uplink capacity used over the same time."""

    def to_json(self) -> dict[str, float | None]:
        first = None if self.first_bytes is None else round(self.first_bytes, 2)
        return {
            "first_mb_s": first,
            "down_use": round(self.down, 3),
            "up_use": round(self.up, 3),
            "origin_use": round(self.origin, 3),
        }


def link_use(
    samples: Sequence[tuple[float, Counters]],
    started: float,
    ended: float,
    nodes: Mapping[str, tuple[float, float]],
    origin: tuple[str, float],
) -> LinkUse | None:
    """What ``samples`` (:class:`LinkSampler`'s) show of a run from ``started`` to
    ``ended`` (monotonic seconds): ``nodes`` maps each node's bridge port to its (down,
    up) capacity in bytes/s, ``origin`` is the origin's port and its upload capacity.
    None without samples spanning the run, or of every one of those ports."""
    within = [(t, c) for t, c in samples if started - PERIOD <= t <= ended + PERIOD]
    if len(within) < 2 or ended <= started:
        return None
    first, last = within[0][1], within[-1][1]
    ports = {*nodes, origin[0]}
    if not all(ports <= set(c) for _, c in within):
        return None
    span = ended - started

    def received(counters: Counters) -> int:
        return sum(counters[port][1] - first[port][1] for port in nodes)

    first_bytes = next(
        (max(0.0, t - started) for t, c in within if received(c) >= FIRST_BYTES), None
    )
    down = received(last) / (span * sum(d for d, _ in nodes.values()))
    up = sum(last[p][0] - first[p][0] for p in nodes) / (span * sum(u for _, u in nodes.values()))
    port, capacity = origin
    sent = last[port][0] - first[port][0]
    return LinkUse(first_bytes, down, up, sent / (span * capacity))


def save_samples(
    path: Path, samples: Sequence[tuple[float, Counters]], started: float, ports: Mapping[str, str]
) -> None:
    """Write a run's samples for :func:`load_samples` (``bench/timeline.py``): their times
    from ``started``, the wall clock then (the daemons' logs are on it), and each host's
    bridge port by host name."""
    wall = time.time() - (time.monotonic() - started)
    body = {
        "wall_at_start": wall,
        "ports": dict(ports),
        "samples": [[round(t - started, 4), c] for t, c in samples],
    }
    path.write_text(json.dumps(body))


def load_samples(path: Path) -> tuple[float, dict[str, str], list[tuple[float, Counters]]]:
    """A run's samples as :func:`save_samples` wrote them: the wall clock at its start,
    the ports by host name, and the samples, timed from the start."""
    body = json.loads(path.read_text())
    samples = [
        (float(t), {p: (int(r), int(x)) for p, (r, x) in c.items()}) for t, c in body["samples"]
    ]
    return float(body["wall_at_start"]), dict(body["ports"]), samples


def rates(
    samples: Sequence[tuple[float, Counters]], ports: Mapping[str, str], step: float
) -> list[tuple[float, dict[str, tuple[float, float]]]]:
    """Each named host's (received, sent) bytes/s over consecutive windows of at least
    ``step`` seconds, each row timed at its window's end (the samples' clock). A host's
    received bytes are its bridge port's tx."""
    rows: list[tuple[float, dict[str, tuple[float, float]]]] = []
    if not samples:
        return rows
    base_t, base = samples[0]
    for t, counters in samples[1:]:
        if t - base_t < step - 1e-9:
            continue
        span = t - base_t
        row = {
            name: (
                (counters[port][1] - base[port][1]) / span,
                (counters[port][0] - base[port][0]) / span,
            )
            for name, port in ports.items()
            if port in counters and port in base
        }
        rows.append((t, row))
        base_t, base = t, counters
    return rows
