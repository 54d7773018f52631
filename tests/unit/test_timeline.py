from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from swarm.coordinator.timeline import STALE_AFTER, NodeSample, Timeline

MB = 1_000_000


@dataclass(frozen=True)
class Item:
    info_hash: str = "ab" * 20
    complete: bool = False
    bytes_by_source: dict[str, int] = field(default_factory=dict)


def node(name: str, seen_at: float, complete: bool = False, **by_source: int) -> NodeSample:
    return NodeSample(name, seen_at, [Item(complete=complete, bytes_by_source=by_source)])


def column(timeline: Timeline, name: str) -> list:
    return timeline.to_json()[name]  # type: ignore[return-value]


def test_rates_come_from_each_nodes_own_report_interval():
    timeline = Timeline()
    timeline.sample(10.0, [node("a", 9.5, peers=0, s3=0)])
    # a's next report came 0.5 s later: 10 MB from peers, 5 MB from S3 in that interval
    timeline.sample(11.0, [node("a", 10.0, peers=10 * MB, s3=5 * MB)])
    # no new report by the next sample: the rate holds (reports and samples are not in step)
    timeline.sample(12.0, [node("a", 10.0, peers=10 * MB, s3=5 * MB)])
    assert column(timeline, "t") == [10.0, 11.0, 12.0]
    assert column(timeline, "peers") == [0.0, 20 * MB, 20 * MB]
    assert column(timeline, "s3") == [0.0, 10 * MB, 10 * MB]
    assert column(timeline, "udp") == [0.0, 0.0, 0.0]


def test_rates_sum_over_nodes_and_a_silent_node_stops_counting():
    timeline = Timeline()
    timeline.sample(1.0, [node("a", 1.0, peers=0), node("b", 1.0, udp=0)])
    timeline.sample(2.0, [node("a", 2.0, peers=3 * MB), node("b", 2.0, udp=2 * MB)])
    assert column(timeline, "peers")[-1] == 3 * MB and column(timeline, "udp")[-1] == 2 * MB
    timeline.sample(2.0 + STALE_AFTER + 0.5, [node("a", 2.0, peers=3 * MB), node("b", 7.0)])
    assert column(timeline, "peers")[-1] == 0.0  # a has not reported for > STALE_AFTER


def test_restarted_daemon_counts_from_zero_and_others_are_other():
    timeline = Timeline()
    timeline.sample(1.0, [node("a", 1.0, peers=50 * MB)])
    timeline.sample(2.0, [node("a", 2.0, peers=4 * MB, ftp=MB)])  # counters reset
    assert column(timeline, "peers")[-1] == 4 * MB
    assert column(timeline, "other")[-1] == MB


def test_completions_and_nodes_are_counted_and_gone_nodes_forgotten():
    timeline = Timeline()
    timeline.sample(1.0, [node("a", 1.0), node("b", 1.0)])
    timeline.sample(2.0, [node("a", 2.0, complete=True), node("b", 2.0)])
    timeline.sample(3.0, [node("a", 3.0, complete=True)])  # b expired from the store
    assert column(timeline, "complete") == [0, 1, 1]
    assert column(timeline, "nodes") == [2, 2, 1]
    # b comes back: its first report again gives no rate (its bytes came before)
    timeline.sample(4.0, [node("b", 4.0, peers=100 * MB)])
    assert column(timeline, "peers")[-1] == 0.0


def test_ring_buffer_keeps_the_window_and_time_only_moves_forward():
    timeline = Timeline(window=10, period=1)
    for t in range(30):
        timeline.sample(float(t), [])
    timeline.sample(5.0, [])  # out of order: ignored
    assert column(timeline, "t") == [float(t) for t in range(19, 30)]


@pytest.mark.parametrize(("window", "period"), [(10, 0), (1, 2), (10, -1)])
def test_bad_settings_are_refused(window, period):
    with pytest.raises(ValueError, match="period"):
        Timeline(window=window, period=period)
