"""The fleet shapes the bench runs (``bench/fleet.py --scenario NAME``), as data.

A scenario is a set of :class:`swarm.lab.fleetdata.FleetConfig` fields over
:data:`DEFAULTS`; rates in Mbit/s. Adding one is adding an entry here (and, for a new
kind of shape, a field to ``FleetConfig`` that :class:`~swarm.lab.fleet.Fleet` applies).
Tests of the allocator can take their capacities from here.
"""

from __future__ import annotations

from typing import Any

DEFAULTS: dict[str, Any] = {
    "nodes": 8,
    "size": 128 << 20,
    "piece_size": 1 << 20,
    "origin_up": 100,
    "origin_down": 1000,
    "node_up": 200,
    "node_down": 200,
    "seeders": 0,
    "seeder_up": None,  # = node_up
    "far_rtt_ms": 0.0,  # > 0 (or far_loss > 0): the new nodes are in another region
    "far_loss": 0.0,
    "tcp_cc": None,  # every host's TCP congestion control; None: the machine's default
    "origin_slows_at": 0.0,  # share of T* into the run at which the origin slows (0: never)
    "origin_slow_up": None,  # its upload then
}

SCENARIOS: dict[str, dict[str, Any]] = {
    "origin-bound": {"origin_up": 100, "node_up": 200, "node_down": 200},
    "swarm-bound": {"origin_up": 1000, "node_up": 200, "node_down": 200},
    "slow-uploads": {"origin_up": 1000, "node_up": 20, "node_down": 400},
    # S3 in the same region: every node can read it at link speed (issue 11).
    "s3-fast": {"origin_up": 1500, "node_up": 250, "node_down": 250, "nodes": 6},
    # Both halves useful: S3 alone feeds 8 nodes at 50 Mbit each, peers alone carry
    # 8 x 100 Mbit of uploads; the bound needs both (T* = N*F/(u_s + sum u)).
    "mixed": {"origin_up": 400, "node_up": 100, "node_down": 300},
    # The mixed fleet whose origin falls to an eighth a third of the way to T* (S3
    # throttling the bucket, or another fleet reading it): plans made on S3's first rate
    # must follow it down.
    "s3-slows": {
        "origin_up": 400,
        "node_up": 100,
        "node_down": 300,
        "origin_slows_at": 0.35,
        "origin_slow_up": 50,
    },
    "existing-seeders": {
        "origin_up": 50,
        "node_up": 200,
        "node_down": 200,
        "seeders": 2,
        "seeder_up": 200,
    },
    # Issue 13: S3 and two seeders in one region, four new nodes in another, 100 ms of
    # RTT and 0.5% loss away (one CUBIC flow gets ~2 Mbit/s there); fast among themselves.
    # CUBIC as on EC2's Linux images: a new namespace would take this machine's bbr, which
    # ignores random loss, so no TCP would be the lossy long-RTT TCP the shape is about.
    "far-region": {
        "nodes": 4,
        "origin_up": 1000,
        "node_up": 200,
        "node_down": 200,
        "seeders": 2,
        "seeder_up": 200,
        "far_rtt_ms": 100,
        "far_loss": 0.005,
        "tcp_cc": "cubic",
    },
}

RATES = ("node_up", "node_down", "origin_up", "origin_down", "seeder_up", "origin_slow_up")
"""The fields ``--rate-scale`` multiplies."""


def scenario(name: str | None, rate_scale: float = 1.0, **overrides: Any) -> dict[str, Any]:
    """FleetConfig fields: DEFAULTS, then scenario ``name``'s, then ``overrides`` (None
    values ignored), every rate times ``rate_scale``."""
    if rate_scale <= 0:
        raise ValueError(f"rate_scale must be positive, got {rate_scale}")
    values = dict(DEFAULTS)
    if name:
        values.update(SCENARIOS[name])
    values.update({k: v for k, v in overrides.items() if v is not None})
    for key in RATES:
        if values.get(key) is not None:
            values[key] = values[key] * rate_scale
    return values
