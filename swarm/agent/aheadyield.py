"""A node ahead of its fleet reads no direct share from a shared origin.

Where the origin is the fleet's bound and several nodes read their direct shares from it
at once (a MIX or WIDE plan), it serves them flow by flow, not node by node: a node with
more GETs in flight, or fewer gaps between its batches, gets more of it, and the others
less (``swarm.sources.s3width`` says why widths differ). In the slow-uploads fleet at a
quarter of its rates one node held 36% of the artifact 9 s in while another held 7%,
and the nodes finished between 28 and 37 s. The origin's bytes are the fleet's, so the
last node's time is what counts: a node that leads its fetching peers' median progress
by :data:`AHEAD` reads only its stripe (pieces nobody has, which serve everyone) until
the others are near again, and its share of the origin goes to those behind.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from swarm.agent.catchup import lag

AHEAD: Final = 0.05
"""Share of the artifact by which a node leads its fetching peers' median progress
before it leaves its direct share to them."""


def ahead_of_fleet(own: float, peers: Iterable[Any]) -> bool:
    """Whether ``own`` progress (0..1) leads the median of the fetching peers' (libtorrent's
    ``peer_info.progress``) by :data:`AHEAD` or more."""
    behind = lag(own, peers)
    return behind is not None and -behind >= AHEAD
