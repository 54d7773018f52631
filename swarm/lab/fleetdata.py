"""A fleet benchmark's data: the setup it runs (:class:`FleetConfig`, with the P2P lower
bound T* and the coordinator allocator's plan for its capacities) and what one system's run
measured (:class:`NodeResult`, :class:`SystemResult`). No processes, no I/O:
:class:`swarm.lab.fleet.Fleet` builds and runs a fleet from a config and returns results.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from swarm.config import origin_rate
from swarm.coordinator.allocate import Allocation, Snapshot, allocate
from swarm.lab.linkuse import LinkUse

FAR_TCP_FLOWS = 4
"""TCP flows a client keeps across the WAN for :meth:`FleetConfig.far_tcp_seconds`
(s5cmd's parts in flight for a 128 MiB object, roughly)."""


# -- configuration ------------------------------------------------------------------------


@dataclass
class FleetConfig:
    """One benchmark setup. Rates in Mbit/s (10^6 bit/s), sizes in bytes."""

    nodes: int = 8
    size: int = 128 << 20
    piece_size: int = 1 << 20
    origin_up: float = 100
    origin_down: float = 1000
    node_up: float = 200
    node_down: float = 200
    seeders: int = 0
    seeder_up: float | None = None
    """Upload of each pre-existing seeder; None = ``node_up``."""
    s3: str = "minio"
    """S3 server on the origin host: ``minio`` or ``moto``."""
    system_timeout: float | None = None
    """Seconds one system may take; None = see :meth:`timeout`."""
    scenario: str | None = None
    far_rtt_ms: float = 0.0
    """The new nodes are in another region: this RTT to the origin and seeders (0 with
    ``far_loss`` 0: one region). Links among the nodes stay as they are."""
    far_loss: float = 0.0
    """Loss each way between the regions (0..1)."""
    tcp_cc: str | None = None
    """TCP congestion control in every host's namespace (``cubic``, ``bbr``); None: the
    machine's default, which new namespaces copy."""
    origin_slows_at: float = 0.0
    """The origin's upload falls to ``origin_slow_up`` this far into each system's run,
    as a share of T* on its first rate (scale-free: the same moment of the fetch at any
    ``--rate-scale``); 0: it never does."""
    origin_slow_up: float | None = None
    """The origin's upload once it has slowed, Mbit/s."""
    origin_rate: str = "auto"
    """The swarm coordinator's ``--origin-rate``: ``auto`` (measured), ``unlimited`` (an
    operator who knows S3 is in the fleet's region), or bytes/s (``12M``)."""

    @property
    def far(self) -> bool:
        return self.far_rtt_ms > 0 or self.far_loss > 0

    def __post_init__(self) -> None:
        for name in ("origin_up", "origin_down", "node_up", "node_down"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0 Mbit/s, got {getattr(self, name)}")
        if self.nodes < 1 or self.seeders < 0:
            raise ValueError(f"need nodes >= 1 and seeders >= 0, got {self.nodes}/{self.seeders}")
        if self.s3 not in ("minio", "moto"):
            raise ValueError(f"s3 must be minio or moto, got {self.s3!r}")
        origin_rate(self.origin_rate)  # ValueError as the coordinator's flag gives it
        if self.origin_slows_at < 0 or (
            self.origin_slows_at > 0 and (self.origin_slow_up or 0) <= 0
        ):
            raise ValueError("origin_slows_at needs origin_slow_up > 0 Mbit/s (and >= 0 itself)")

    @property
    def seeder_rate(self) -> float:
        return self.seeder_up if self.seeder_up is not None else self.node_up

    def bound(self) -> float:
        """Kumar & Ross's minimum distribution time T* in seconds; with an origin that
        slows, the least T at which the servers have sent F bits, the slowest link has
        taken F, and the servers and all nodes' uploads together N F (the same three
        conditions, on the bits sent by T rather than rates)."""
        fast = self._steady_bound()
        if not self.origin_slows_at:
            return fast
        f, n, mbit = self.size * 8, self.nodes, 1e6
        slows = self.origin_slows_at * fast
        seeders = self.seeders * self.seeder_rate * mbit
        slow_up = (self.origin_slow_up or 0.0) * mbit

        def served(t: float) -> float:  # bits the origin and seeders have sent by t
            origin = self.origin_up * mbit * min(t, slows) + slow_up * max(0.0, t - slows)
            return origin + seeders * t

        def enough(t: float) -> bool:
            return served(t) >= f and served(t) + n * self.node_up * mbit * t >= n * f

        low, high = 0.0, fast  # (``enough`` is monotone in T, whichever way the rate moves)
        while not enough(high):
            high *= 2
        for _ in range(60):  # bisection to well under a millisecond
            mid = (low + high) / 2
            low, high = (low, mid) if enough(mid) else (mid, high)
        return high

    def _steady_bound(self) -> float:
        f = self.size * 8
        mbit = 1e6
        server = (self.origin_up + self.seeders * self.seeder_rate) * mbit
        total = server + self.nodes * self.node_up * mbit
        return max(f / server, f / (self.node_down * mbit), self.nodes * f / total)

    def origin_slows_after(self) -> float | None:
        """Seconds into a system's run at which the origin slows (None: never)."""
        return self.origin_slows_at * self._steady_bound() if self.origin_slows_at else None

    def allocation(self) -> Allocation:
        """What the coordinator's allocator plans for this shape's capacities at the
        start (every node lacking everything), with its predicted finish."""
        mbit = 1e6 / 8  # bytes/s
        return allocate(
            Snapshot(
                self.size,
                self.nodes,
                self.node_down * mbit,
                self.node_up * mbit,
                self.origin_up * mbit,
                self.seeders * self.seeder_rate * mbit,
            )
        )

    def timeout(self) -> float:
        """Seconds one system may take: the explicit setting, else 60 s plus the larger of
        10 x T* and twice the time for every node to read the whole object from the origin
        (so an S3-only client on a slow origin is slow, not failed)."""
        if self.system_timeout:
            return self.system_timeout
        origin = min(self.origin_up, self.origin_slow_up or self.origin_up)
        origin_only = self.nodes * self.size * 8 / (origin * 1e6)
        return 60.0 + max(10.0 * self.bound(), 2.0 * origin_only, 2.0 * self.far_tcp_seconds())

    def far_tcp_seconds(self) -> float:
        """Seconds for a far node to read the object over :data:`FAR_TCP_FLOWS` TCP flows
        across the WAN at Mathis's rate (MSS/RTT x 1.22/sqrt(loss)): an S3-only client
        there is that slow (0 for one region, or a WAN without loss)."""
        if not self.far or self.far_loss <= 0 or self.far_rtt_ms <= 0:
            return 0.0
        flow = 1448 * 8 / (self.far_rtt_ms / 1e3) * 1.22 / math.sqrt(self.far_loss)
        return self.size * 8 / (FAR_TCP_FLOWS * flow)


# -- results ------------------------------------------------------------------------------


@dataclass
class NodeResult:
    node: str
    seconds: float
    sha256_ok: bool
    bytes_by_source: dict[str, int] | None = None
    cpu_s: float | None = None
    """CPU seconds of every process on the node (client, daemon) until all were done."""
    received: int | None = None
    """Bytes the node's downlink carried until all were done: every protocol, headers
    included (the bridge port's counter), so a system's overhead shows beside the object's
    size: its peers' and S3's bytes, pieces brought twice, the ACKs of its own uploads."""


@dataclass
class SystemResult:
    system: str
    all_done: float
    nodes: list[NodeResult]
    origin_tx_bytes: int
    bound: float
    size: int
    cpu_busy_avg: float
    cpu_saturated_fraction: float
    notes: list[str] = field(default_factory=list)
    links: LinkUse | None = None
    """What the bridge's counters showed of the run (:mod:`swarm.lab.linkuse`)."""

    @property
    def median(self) -> float:
        return statistics.median(n.seconds for n in self.nodes)

    @property
    def cpu_per_node_gib(self) -> float | None:
        """Mean CPU seconds a node spent per GiB of artifact, or None if not measured."""
        cpu = [n.cpu_s for n in self.nodes if n.cpu_s is not None]
        return statistics.fmean(cpu) / (self.size / 2**30) if cpu else None

    @property
    def received_per_node_f(self) -> float | None:
        """What a node's downlink carried on average, in F, or None if not measured."""
        received = [n.received for n in self.nodes if n.received is not None]
        return statistics.fmean(received) / self.size if received else None

    def row(self, swarm_all_done: float | None) -> dict[str, Any]:
        received = self.received_per_node_f
        cpu = self.cpu_per_node_gib
        return {
            "system": self.system,
            "all_done_s": round(self.all_done, 2),
            "median_s": round(self.median, 2),
            "vs_bound": round(self.all_done / self.bound, 2),
            "vs_swarm": round(self.all_done / swarm_all_done, 2) if swarm_all_done else None,
            "origin_bytes_per_F": round(self.origin_tx_bytes / self.size, 2),
            "node_received_per_F": round(received, 3) if received is not None else None,
            "cpu_busy_avg": round(self.cpu_busy_avg, 2),
            "cpu_saturated": round(self.cpu_saturated_fraction, 2),
            "cpu_s_per_node_gib": round(cpu, 2) if cpu is not None else None,
            "links": self.links.to_json() if self.links is not None else None,
        }


@dataclass(frozen=True)
class RoundsSummary:
    """Several invocations' worth of one scenario (``bench/fleet.py --repeat``): single
    runs of the same code spread by several seconds here (mixed at a quarter read
    35.3-39.8 s in one session), more than most changes move them."""

    all_done: dict[str, list[float]]
    """Each system's all-done seconds, round by round (a failed round left out)."""
    swarm_vs_fastest: list[float]
    """Per round with swarm and a baseline: swarm's all-done over the fastest baseline's."""
    met: int
    """Rounds in which swarm met both targets: at most :data:`TARGET_BOUND` x T* and at
    most ``baseline_limit`` x the fastest baseline's time."""
    judged: int
    """Rounds with swarm and a baseline (the ones ``met`` counts among)."""
    vs_swarm: dict[str, list[float]] = field(default_factory=dict)
    """Per other swarm (``swarm@REV``, ``swarm-solo``): its all-done over swarm's, round by
    round (rounds with both): a change judged pair by pair, the rounds' noise shared."""


TARGET_BOUND = 1.25
"""Issue 11: swarm's all-done time is at most this multiple of T*..."""


def target_baseline(rate_scale: float) -> float:
    """...and at most this multiple of the fastest baseline's: 1.05 at full rates (eight
    nodes share two cores with MinIO), 1.0 at reduced rates."""
    return 1.05 if rate_scale >= 1 else 1.0


def fastest_baseline(results: list[SystemResult]) -> SystemResult | None:
    """The fastest system other than swarm's own (``swarm``, ``swarm-solo``)."""
    baselines = [r for r in results if not r.system.startswith("swarm")]
    return min(baselines, key=lambda r: r.all_done, default=None)


def summarize_rounds(
    rounds: list[list[SystemResult]], baseline_limit: float = 1.0
) -> RoundsSummary:
    """What ``rounds`` (each a list of the systems' results in one invocation) show
    together; targets as issue 11 puts them (``baseline_limit`` 1.05 at full rates)."""
    all_done: dict[str, list[float]] = {}
    ratios: list[float] = []
    vs_swarm: dict[str, list[float]] = {}
    met = 0
    for results in rounds:
        for result in results:
            all_done.setdefault(result.system, []).append(result.all_done)
        swarm = next((r for r in results if r.system == "swarm"), None)
        for other in results:
            if swarm is not None and other.system.startswith("swarm") and other is not swarm:
                vs_swarm.setdefault(other.system, []).append(other.all_done / swarm.all_done)
        best = fastest_baseline(results)
        if swarm is None or best is None:
            continue
        ratio = swarm.all_done / best.all_done
        ratios.append(ratio)
        if swarm.all_done <= TARGET_BOUND * swarm.bound and ratio <= baseline_limit:
            met += 1
    return RoundsSummary(all_done, ratios, met, len(ratios), vs_swarm)
