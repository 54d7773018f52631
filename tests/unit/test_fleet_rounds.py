"""What several rounds of one fleet scenario show together (bench/fleet.py --repeat)."""

from __future__ import annotations

from swarm.lab.fleetdata import (
    NodeResult,
    SystemResult,
    fastest_baseline,
    summarize_rounds,
    target_baseline,
)


def result(system: str, all_done: float, bound: float = 20.0) -> SystemResult:
    return SystemResult(system, all_done, [], 0, bound, 1 << 27, 0.5, 0.0)


def test_rounds_are_judged_one_by_one_against_issue_11s_targets() -> None:
    rounds = [
        [result("swarm", 24.0), result("aria2c", 25.0), result("s5cmd", 30.0)],  # met
        [result("swarm", 24.0), result("aria2c", 23.0)],  # slower than aria2c
        [result("swarm", 26.0), result("aria2c", 40.0)],  # over 1.25x T* (25 s)
        [result("aria2c", 22.0)],  # swarm failed: not judged
    ]
    summary = summarize_rounds(rounds)
    assert summary.all_done == {
        "swarm": [24.0, 24.0, 26.0],
        "aria2c": [25.0, 23.0, 40.0, 22.0],
        "s5cmd": [30.0],
    }
    assert summary.swarm_vs_fastest == [24.0 / 25.0, 24.0 / 23.0, 26.0 / 40.0]
    assert (summary.met, summary.judged) == (1, 3)
    # at full rates a baseline may be up to 5% faster
    assert summarize_rounds(rounds, baseline_limit=1.05).met == 2


def test_swarm_solo_is_not_a_baseline() -> None:
    summary = summarize_rounds([[result("swarm", 24.0), result("swarm-solo", 20.0)]])
    assert summary.swarm_vs_fastest == [] and summary.judged == 0


def test_another_commits_swarm_is_paired_with_swarm_round_by_round() -> None:
    rounds = [
        [result("swarm", 20.0), result("swarm@HEAD~1", 22.0), result("aria2c", 30.0)],
        [result("swarm@HEAD~1", 19.0), result("swarm", 20.0)],
        [result("swarm@HEAD~1", 21.0)],  # swarm failed: nothing to pair
    ]
    summary = summarize_rounds(rounds)
    assert summary.vs_swarm == {"swarm@HEAD~1": [22.0 / 20.0, 19.0 / 20.0]}
    assert summary.swarm_vs_fastest == [20.0 / 30.0]  # swarm@REV is no baseline
    assert summarize_rounds([[result("swarm", 20.0), result("s5cmd", 19.0)]]).vs_swarm == {}


def test_the_fastest_baseline_and_the_targets_margin() -> None:
    results = [result("swarm", 24.0), result("swarm-solo", 20.0), result("s5cmd", 23.0)]
    best = fastest_baseline([*results, result("aria2c", 25.0)])
    assert best is not None and best.system == "s5cmd"
    assert fastest_baseline([result("swarm", 24.0)]) is None
    assert (target_baseline(1.0), target_baseline(0.25)) == (1.05, 1.0)


def test_a_nodes_received_bytes_are_reported_in_f_where_measured() -> None:
    size = 1 << 27
    nodes = [
        NodeResult("node0", 10.0, True, received=int(1.02 * size)),
        NodeResult("node1", 11.0, True, received=int(1.04 * size)),
        NodeResult("node2", 12.0, True),  # not measured: left out of the mean
    ]
    measured = SystemResult("swarm", 12.0, nodes, 0, 10.0, size, 0.5, 0.0)
    assert measured.row(12.0)["node_received_per_F"] == 1.03
    unmeasured = SystemResult("swarm", 12.0, nodes[2:], 0, 10.0, size, 0.5, 0.0)
    assert unmeasured.row(12.0)["node_received_per_F"] is None
