"""The fleet over the last minutes, for the status page's chart (``GET /v1/timeline``).

A ring buffer of samples taken every :data:`SAMPLE_PERIOD` from the node reports the
coordinator already keeps: the fleet's download rate by source (peers, S3, UDP) and how
many nodes hold a complete copy. Pure: the caller passes the clock and the reports.

Rates come from each node's own counters, not from differences between samples: a
node's rate is the bytes its latest report added over the time since its previous
report (both as the coordinator received them), held until its next report, dropped
after :data:`STALE_AFTER`. Samples and reports are not in step (a node reports every
second, on its own clock), so differencing fleet totals per sample would alias into
a saw-tooth; per-node intervals do not.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

SOURCES: Final = ("peers", "s3", "udp")
"""The chart's series; a node's other sources (none today) are counted in ``other``."""

SAMPLE_PERIOD: Final = 1.0
"""Seconds between samples."""

WINDOW: Final = 600.0
"""Seconds of samples kept (10 minutes: 600 points of 6 numbers, a few tens of KiB)."""

STALE_AFTER: Final = 5.0
"""Seconds after its last report at which a node's rate counts as zero (a node reports
every second; a few missed reports mean it stopped or lost the coordinator)."""


class ItemReport(Protocol):
    """What the timeline reads of one artifact in a node report
    (:class:`swarm.coordinator.reports.ArtifactReport` is one)."""

    @property
    def info_hash(self) -> str: ...
    @property
    def complete(self) -> bool: ...
    @property
    def bytes_by_source(self) -> Mapping[str, int]: ...


@dataclass(frozen=True, slots=True)
class NodeSample:
    """A node's latest report: who, when the coordinator received it, what it held."""

    node: str
    seen_at: float
    artifacts: Sequence[ItemReport]


@dataclass(slots=True)
class _Pair:
    """The timeline's memory of one (node, artifact)."""

    seen_at: float
    counts: dict[str, int]
    rates: dict[str, float] = field(default_factory=dict)


class Timeline:
    """Samples of fleet throughput by source and completeness, oldest first."""

    def __init__(self, window: float = WINDOW, period: float = SAMPLE_PERIOD) -> None:
        if period <= 0 or window < period:
            raise ValueError(f"need 0 < period <= window, got period={period} window={window}")
        self.period = period
        self.window = window
        self._points: deque[tuple[float, dict[str, float], int, int]] = deque(
            maxlen=int(window / period) + 1
        )
        self._pairs: dict[tuple[str, str], _Pair] = {}

    def sample(self, now: float, nodes: Iterable[NodeSample]) -> None:
        """Add the sample at ``now`` (ignored unless later than the last one)."""
        if self._points and now <= self._points[-1][0]:
            return
        rates = dict.fromkeys((*SOURCES, "other"), 0.0)
        complete = reporting = 0
        live: set[tuple[str, str]] = set()
        for node in nodes:
            reporting += 1
            for item in node.artifacts:
                key = (node.node, item.info_hash)
                live.add(key)
                complete += bool(item.complete)
                pair = self._pairs.get(key)
                counts = dict(item.bytes_by_source)
                if pair is None:
                    # First sight: what it holds arrived before we looked; no rate yet.
                    self._pairs[key] = _Pair(node.seen_at, counts)
                    continue
                if node.seen_at > pair.seen_at:
                    elapsed = node.seen_at - pair.seen_at
                    pair.rates = {
                        # a counter that went down is a restarted daemon counting from 0
                        source: (count - pair.counts.get(source, 0)
                                 if count >= pair.counts.get(source, 0) else count) / elapsed
                        for source, count in counts.items()
                    }  # fmt: skip
                    pair.seen_at, pair.counts = node.seen_at, counts
                if now - pair.seen_at > STALE_AFTER:
                    continue
                for source, rate in pair.rates.items():
                    rates[source if source in SOURCES else "other"] += rate
        for key in self._pairs.keys() - live:  # nodes gone from the store (expired)
            del self._pairs[key]
        self._points.append((now, rates, complete, reporting))

    def to_json(self) -> dict[str, object]:
        """Columns for the chart: ``t`` (epoch seconds), one rate column per source
        (bytes/s), ``other``, ``complete`` (nodes holding a complete copy, summed over
        artifacts) and ``nodes`` (reporting nodes)."""
        points = list(self._points)
        body: dict[str, object] = {"period": self.period, "window": self.window}
        body["t"] = [round(t, 3) for t, _, _, _ in points]
        for source in (*SOURCES, "other"):
            body[source] = [round(rates[source], 1) for _, rates, _, _ in points]
        body["complete"] = [complete for _, _, complete, _ in points]
        body["nodes"] = [nodes for _, _, _, nodes in points]
        return body
