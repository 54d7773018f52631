"""Fleet allocation: how much each node should take from S3 directly, from a capacity
snapshot. Pure: no clock, no I/O.

The model is the fluid one of Kumar and Ross (2006): ``N`` nodes each lack ``F`` bytes;
servers that hold everything (the S3 origin at ``origin`` bytes/s in all, and existing
seeders) upload; every node downloads at most ``down`` and uploads at most ``up``. No
schedule beats

    T* = max(F / (u_s + seeders), F / d, N F / (u_s + seeders + N u))

and one schedule meets it: the fleet receives at a common rate
``r = F / T*``; servers send every byte once to some node that relays it to all the
others (*relay*, each piece leaves S3 once), and send the part the relays cannot carry
straight to each node (*direct*, a node reads it for itself).

Among the schedules that meet ``T*`` this one prefers S3 over peers: the relay rate is
the *smallest* the servers' capacity allows, ``rho = max(0, (N r - U) / (N - 1))``, and
every node reads ``r - rho`` directly. The fleet runs it with stripes that send *every*
piece through the servers once, the direct part too (a piece no node has asked for is
fetched by one node's stripe), and a node's direct share is read once the stripes have
spread the object: of what S3 sends over ``T*``, one copy of ``F`` has gone to the
stripes, and the direct share is what is left, ``(u_s T* - F) / (N F)`` of each node's
bytes: ``(N - 1) / N`` of the schedule's ``(r - rho) / r``. The peers then relay every
piece that a node does not read for itself, ``N - 1 - N d`` copies of ``F`` in all, as
many as the schedule's relays; with the schedule's own share the origin was asked one
such share more (``d F``) than it sends in ``T*`` (the mixed fleet: 2.84 F against 2.61).

S3 reads cost a node less CPU than a peer exchange (no SHA-1 per piece from libtorrent's
side, no upload), start without the swarm's ramp-up, and S3's capacity is otherwise
wasted; peers carry what S3 cannot. So when S3 can feed every node at link speed (the
same-region bucket), every node reads all of it from S3 (``Mode.ALL``); when the origin
is the bottleneck, every piece leaves it once (``Mode.STRIPE``, direct share 0); in
between, each node reads a share of its bytes from S3 for itself next to its stripe
(``direct``, a fraction of what it lacks).

Existing seeders are servers too, but they serve through the swarm, not S3: they carry
the relay part first, and S3 carries what is left.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

ALL_DIRECT: Final = 0.9
"""A direct share at least this large is read as all of it (``Mode.ALL``): the relay part
left is too small to be worth a swarm exchange (and ALL reads skip libtorrent)."""

MIN_DIRECT: Final = 0.05
"""A direct share below this is rounded to none: a few extra GETs would only compete with
the stripes for the origin."""


class Mode(StrEnum):
    STRIPE = "stripe"
    """Each piece leaves S3 once (the node's stripe); peers carry the rest."""
    MIX = "mix"
    """The stripe, plus a share of the node's bytes read from S3 for itself."""
    ALL = "all"
    """Every missing piece from S3 at full width: S3 feeds every node at link speed."""


@dataclass(frozen=True)
class Snapshot:
    """What the coordinator knows of one artifact's fleet (bytes and bytes/s)."""

    size: int
    """F: bytes each fetching node still lacks (the artifact's size at the start)."""
    nodes: int
    """N: nodes fetching it."""
    down: float
    """d: the slowest fetching node's download capacity."""
    up: float
    """u: a fetching node's upload capacity (the fleet's mean)."""
    origin: float
    """u_s: S3's aggregate rate to the fleet; ``math.inf`` when no limit was seen (every
    reader got its link's rate)."""
    seeders: float = 0.0
    """Upload capacity of nodes that already hold the whole artifact."""


@dataclass(frozen=True)
class Allocation:
    mode: Mode
    rate: float
    """r: the bytes/s every fetching node receives under the plan."""
    direct: float
    """Fraction of a node's bytes it reads from S3 for itself (not relayed)."""
    finish: float
    """Predicted seconds until the last node is done (``F / r``)."""
    link_bound: bool = False
    """The bound is the slowest node's downlink (``F / d``): every byte a node receives
    twice delays the fleet's end; elsewhere the downlinks have room to spare."""

    @property
    def relay(self) -> float:
        """Fraction of a node's bytes that come through the swarm: its stripe (from S3 or
        the seeders) and what its peers relay."""
        return 1.0 - self.direct


def bound(snap: Snapshot) -> float:
    """The Kumar-Ross lower bound ``T*`` on the time until every node is done."""
    if snap.nodes <= 0 or snap.size <= 0:
        return 0.0
    servers = snap.origin + snap.seeders
    return max(
        snap.size / servers,  # every byte leaves a server once
        snap.size / snap.down,  # the slowest node's link
        snap.nodes * snap.size / (servers + snap.nodes * snap.up),  # all uploads together
    )


def allocate(snap: Snapshot) -> Allocation:
    """The plan that meets :func:`bound` with the most S3 (see the module docstring)."""
    if snap.nodes <= 0 or snap.size <= 0:
        return Allocation(Mode.STRIPE, 0.0, 0.0, 0.0)
    finish = bound(snap)
    link_bound = finish > 0 and snap.size / snap.down >= finish
    rate = snap.size / finish if finish > 0 else math.inf
    n = snap.nodes
    servers = snap.origin + snap.seeders
    if math.isinf(snap.origin):
        return Allocation(Mode.ALL, rate, 1.0, finish, link_bound)
    # new content must reach the fleet at ``rate``: as little of it relayed as the
    # servers' capacity allows (each relayed byte costs them one send, a direct one N)
    relay = rate if n == 1 else max(0.0, (n * rate - servers) / (n - 1))
    relay = min(relay, rate)
    direct_rate = rate - relay if n > 1 else rate
    # seeders serve through the swarm: they carry the relayed bytes before S3 does, and
    # S3 gives each node a direct share of what capacity it has left
    s3_relay = max(0.0, relay - snap.seeders)
    s3_direct = min(direct_rate, max(0.0, snap.origin - s3_relay) / n)
    if rate <= 0 or s3_direct / rate >= ALL_DIRECT:
        return Allocation(Mode.ALL, rate, 1.0, finish, link_bound)
    # the stripes send all of F once (the seeders' share of it first): S3's direct share
    # is what it has left over T* beyond that copy (see the module docstring)
    stripes_from_s3 = max(0.0, rate - snap.seeders)
    direct = min(s3_direct, max(0.0, snap.origin - stripes_from_s3) / n) / rate
    if direct < MIN_DIRECT:
        direct = 0.0
    mode = Mode.MIX if direct > 0 else Mode.STRIPE
    return Allocation(mode, rate, direct, finish, link_bound)
