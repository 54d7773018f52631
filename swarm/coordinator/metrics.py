"""The coordinator's Prometheus metrics: counters per app, gauges read from the store."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from swarm.coordinator.fleet import PeerStore

Clock = Callable[[], float]


class Metrics:
    """Per-app counters on a private registry, so tests can run several apps at once."""

    def __init__(self, store: PeerStore, clock: Clock) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.announces = Counter(
            "swarm_announces",
            "Tracker announces accepted, by event ('none' for a regular re-announce).",
            ["event"],
            registry=self.registry,
        )
        self.announce_failures = Counter(
            "swarm_announce_failures",
            "Announces answered with a failure reason (malformed or internal error).",
            registry=self.registry,
        )
        self.reports = Counter("swarm_reports", "Node reports accepted.", registry=self.registry)
        self.unauthorized = Counter(
            "swarm_unauthorized",
            "Requests refused (403) for a missing or wrong fleet token.",
            registry=self.registry,
        )
        self.report_failures = Counter(
            "swarm_report_failures", "Node reports rejected as malformed.", registry=self.registry
        )
        self.refused = Counter(
            "swarm_refused",
            "Reports and announces refused because the coordinator is at a bound "
            "(nodes, peers, bytes of state); see the coordinator's log.",
            ["kind"],
            registry=self.registry,
        )
        self.completions = Counter(
            "swarm_completions",
            "Artifact completions recorded in history (first per node and artifact).",
            registry=self.registry,
        )
        self.expired = Counter(
            "swarm_expired",
            "Peers and nodes dropped for not announcing or reporting in time.",
            ["kind"],
            registry=self.registry,
        )
        self.registry.register(StoreCollector(store, clock))


class StoreCollector(Collector):
    """Gauges read from the store at scrape time, so an artifact whose last peer left
    disappears from the output instead of lingering at its last value."""

    def __init__(self, store: PeerStore, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        now = self._clock()
        peers = GaugeMetricFamily(
            "swarm_peers",
            "Live tracker peers per artifact, by role (seeder: left == 0).",
            labels=["info_hash", "role"],
        )
        for info_hash in self._store.info_hashes(now):
            seeders, leechers = self._store.counts(info_hash, now)
            peers.add_metric([info_hash.hex(), "seeder"], seeders)
            peers.add_metric([info_hash.hex(), "leecher"], leechers)
        yield peers
        yield GaugeMetricFamily(
            "swarm_nodes", "Nodes that reported recently.", value=self._store.node_count(now)
        )
