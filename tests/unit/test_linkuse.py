"""The fleet bench's link summary (swarm.lab.linkuse): a run's first bytes and the share
of each side's capacity it used, from the bridge's counters."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from swarm.lab.linkuse import (
    FIRST_BYTES,
    link_use,
    load_samples,
    rates,
    read_net_dev,
    save_samples,
)

MB = 1_000_000


def test_first_bytes_and_shares_from_the_counters() -> None:
    # two nodes of 10 MB/s down, 5 up; an origin of 20 up. Port rx: what its host sent.
    nodes = {"n0": (10 * MB, 5 * MB), "n1": (10 * MB, 5 * MB)}
    zero = {"n0": (0, 0), "n1": (0, 0), "o": (0, 0)}
    samples = [
        (99.95, zero),
        (100.5, {"n0": (0, FIRST_BYTES // 4), "n1": (0, FIRST_BYTES // 4), "o": (10, 0)}),
        (101.0, {"n0": (0, FIRST_BYTES // 2), "n1": (0, FIRST_BYTES // 2), "o": (20, 0)}),
        (104.0, {"n0": (10 * MB, 20 * MB), "n1": (5 * MB, 20 * MB), "o": (25 * MB, 0)}),
        (200.0, {"n0": (99 * MB, 99 * MB), "n1": (0, 0), "o": (0, 0)}),  # after the run
    ]
    use = link_use(samples, 100.0, 104.0, nodes, ("o", 20 * MB))
    assert use is not None
    assert use.first_bytes == pytest.approx(1.0)  # 1 MB in all at 101.0
    assert use.down == pytest.approx(40 / (4 * 20))
    assert use.up == pytest.approx(15 / (4 * 10))
    assert use.origin == pytest.approx(25 / (4 * 20))


def test_no_summary_without_samples_across_the_run() -> None:
    assert link_use([], 0.0, 1.0, {"n0": (1.0, 1.0)}, ("o", 1.0)) is None
    only = [(0.5, {"n0": (0, 0), "o": (0, 0)})]
    assert link_use(only, 0.0, 1.0, {"n0": (1.0, 1.0)}, ("o", 1.0)) is None


def test_no_summary_when_a_port_is_not_among_the_counters() -> None:
    samples = [(0.0, {"n0": (0, 0), "o": (0, 0)}), (1.0, {"n0": (0, 10)})]
    assert link_use(samples, 0.0, 1.0, {"n0": (1.0, 1.0)}, ("o", 1.0)) is None


def test_first_bytes_is_none_when_the_nodes_received_too_little() -> None:
    samples = [(0.0, {"n0": (0, 0), "o": (0, 0)}), (1.0, {"n0": (0, 10), "o": (10, 0)})]
    use = link_use(samples, 0.0, 1.0, {"n0": (1.0, 1.0)}, ("o", 1.0))
    assert use is not None and use.first_bytes is None


def test_reads_this_namespaces_interfaces() -> None:
    counters = read_net_dev("/proc/self/net/dev")
    assert "lo" in counters and all(rx >= 0 and tx >= 0 for rx, tx in counters.values())


def test_rates_per_window_for_the_timeline(tmp_path: Path) -> None:
    """bench/timeline.py's rows: each host's received (its port's tx) and sent (rx)
    bytes/s over windows of at least ``step``, through the file --keep leaves."""
    ports = {"node0": "p0", "origin": "po"}
    samples = [
        (50.0, {"p0": (0, 0), "po": (0, 0)}),
        (50.1, {"p0": (1 * MB, 3 * MB), "po": (3 * MB, 0)}),
        (50.2, {"p0": (2 * MB, 6 * MB), "po": (6 * MB, 0)}),
        (50.3, {"p0": (2 * MB, 6 * MB), "po": (6 * MB, 0)}),  # idle
        (50.4, {"p0": (4 * MB, 7 * MB), "po": (7 * MB, 0)}),
    ]
    path = tmp_path / "links.json"
    save_samples(path, samples, 50.0, ports)
    wall, loaded_ports, loaded = load_samples(path)
    assert loaded_ports == ports
    assert [t for t, _ in loaded] == pytest.approx([0, 0.1, 0.2, 0.3, 0.4])
    # the wall clock at the start (the daemons' logs are on it)
    assert wall == pytest.approx(time.time() - (time.monotonic() - 50.0), abs=1.0)
    rows = rates(loaded, ports, step=0.2)
    assert [t for t, _ in rows] == pytest.approx([0.2, 0.4])
    first, second = rows[0][1], rows[1][1]
    assert first["node0"] == pytest.approx((30 * MB, 10 * MB))  # received 6 MB, sent 2
    assert first["origin"] == pytest.approx((0, 30 * MB))
    assert second["node0"] == pytest.approx((5 * MB, 10 * MB))
