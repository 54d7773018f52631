"""A node ahead of its fleet leaves its direct share of the origin to those behind
(swarm.agent.aheadyield): the rule on what libtorrent tells of the peers."""

from __future__ import annotations

from dataclasses import dataclass

from swarm.agent.aheadyield import AHEAD, ahead_of_fleet


@dataclass
class Peer:
    """What the rule reads of libtorrent's ``peer_info``."""

    progress: float


def test_a_node_that_leads_the_fetching_median_by_the_margin_is_ahead() -> None:
    peers = [Peer(0.30), Peer(0.40), Peer(0.50)]
    assert ahead_of_fleet(0.40 + AHEAD + 0.01, peers)
    assert not ahead_of_fleet(0.40 + AHEAD - 0.01, peers)
    assert not ahead_of_fleet(0.10, peers)  # behind: catchup's concern, not this one


def test_seeders_do_not_count_and_alone_a_node_is_never_ahead() -> None:
    # complete peers (existing seeders, nodes done) would lift the median to 1.0
    assert ahead_of_fleet(0.5, [Peer(1.0), Peer(1.0), Peer(0.2)])
    assert not ahead_of_fleet(0.9, [Peer(1.0)])
    assert not ahead_of_fleet(0.9, [])
