"""Flow-level fleet simulator: predicted all-done time / T* for fleets this machine cannot
host (issue 12), driving the coordinator's real planner.

    .venv/bin/python bench/fleetsim.py                       # N = 100, 1,000, 10,000; 10 GiB
    .venv/bin/python bench/fleetsim.py --calibrate           # N = 8, 128 MiB: bench/fleet.py's runs
    .venv/bin/python bench/fleetsim.py --nodes 1000 --scenario slow-uploads --size 10G

The model, per time step ``--dt`` (seconds):

- the origin (S3) serves its readers (nodes with a stripe, in WIDE mode, or filling) a
  max-min fair share of ``origin_up``, each capped by its downlink;
- the swarm is a fluid: every node holding pieces that others lack uploads at its link
  rate, and the total is shared max-min fairly among the nodes that lack pieces someone
  holds, capped by what is left of each one's downlink and by that backlog;
- bytes become whole pieces: S3 bytes fill the node's stripe (lowest first), then, WIDE,
  any missing piece; peer bytes fill pieces others hold that it lacks (a random one of
  them: rarest-first without its bookkeeping);
- every node reports at the interval the coordinator would ask for
  (:func:`swarm.coordinator.load.report_interval`, staggered), and the planner
  (:class:`swarm.coordinator.origin.StripePlanner`, the coordinator's own code) returns
  its stripe, mode and fill flag from its bitfield and byte counters, as in production;
- a node starts ``--startup`` seconds late (its daemon's imports; bench/fleet.py's runs
  show 3-4 s with eight daemons starting on two cores, about 1 s alone).

Not modelled: TCP dynamics, per-connection limits, piece-level peer choice, CPU. The
shapes are bench/fleet.py's (rates in Mbit/s).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swarm.coordinator.load import report_interval  # noqa: E402
from swarm.coordinator.origin import StripePlanner  # noqa: E402
from swarm.coordinator.planstate import set_bits  # noqa: E402
from swarm.pieces import default_piece_size, parse_size  # noqa: E402
from swarm.policy import Mode  # noqa: E402

SCENARIOS = {  # bench/fleet.py's shapes, Mbit/s
    "origin-bound": {"origin_up": 100, "node_up": 200, "node_down": 200},
    "swarm-bound": {"origin_up": 1000, "node_up": 200, "node_down": 200},
    "slow-uploads": {"origin_up": 1000, "node_up": 20, "node_down": 400},
    "existing-seeders": {"origin_up": 50, "node_up": 200, "node_down": 200, "seeders": 2},
}

MEASURED_N8 = {  # README, bench/fleet.py at N=8, 128 MiB, swarm's all-done / T*
    ("origin-bound", 1.0): 1.56,
    ("swarm-bound", 1.0): 2.16,
    ("slow-uploads", 1.0): 1.95,
    ("existing-seeders", 1.0): 2.28,
    ("swarm-bound", 0.25): 1.43,
    ("slow-uploads", 0.25): 1.51,
}
INFO_HASH = "5e" * 20
MBIT = 1e6 / 8  # bytes/s per Mbit/s


@dataclass
class Node:
    name: str
    up: float
    down: float
    start: float
    held: int = 0
    s3_bytes: int = 0
    peer_bytes: int = 0
    s3_carry: float = 0.0
    peer_carry: float = 0.0
    stripe: list[int] = field(default_factory=list)
    mode: Mode = Mode.STRIPE
    fill: bool = False
    done_at: float | None = None
    next_report: float = 0.0


def max_min(capacity: float, demands: list[float]) -> list[float]:
    """Max-min fair shares of ``capacity`` among ``demands``."""
    shares = [0.0] * len(demands)
    order = sorted(range(len(demands)), key=lambda i: demands[i])
    left, count = capacity, len(demands)
    for rank, i in enumerate(order):
        share = min(demands[i], left / (count - rank)) if count - rank else 0.0
        shares[i] = share
        left -= share
    return shares


def bound(n: int, size: int, shape: Mapping[str, float]) -> float:
    """Kumar-Ross T* (seconds), as bench/fleet.py computes it."""
    server = (shape["origin_up"] + shape.get("seeders", 0) * shape["node_up"]) * MBIT
    total = server + n * shape["node_up"] * MBIT
    return max(size / server, size / (shape["node_down"] * MBIT), n * size / total)


def simulate(
    n: int,
    size: int,
    shape: Mapping[str, float],
    *,
    piece_size: int | None = None,
    dt: float = 0.5,
    startup: float = 1.0,
    budget: float = 2000.0,
    seed: int = 1,
    limit: float = 20.0,
) -> tuple[float, float, float]:
    """(all-done seconds, T*, origin bytes / size); gives up at ``limit`` x T*."""
    rng = random.Random(seed)
    piece = piece_size or default_piece_size(size)
    count = -(-size // piece)
    full = (1 << count) - 1
    planner = StripePlanner()
    interval = report_interval(n, budget)
    seeders = int(shape.get("seeders", 0))
    nodes = [
        Node(f"n{i}", shape["node_up"] * MBIT, shape["node_down"] * MBIT, startup) for i in range(n)
    ]
    for node in nodes:
        node.next_report = startup + rng.random() * interval  # staggered
    holders = [
        Node(f"seed{i}", shape["node_up"] * MBIT, shape["node_down"] * MBIT, 0.0, full)
        for i in range(seeders)
    ]
    avail = array("I", [seeders] * count)
    union = full if seeders else 0
    origin = shape["origin_up"] * MBIT
    origin_bytes = 0.0
    t_star = bound(n, size, shape)
    now = 0.0
    while now < limit * t_star + startup:
        active = [x for x in nodes if x.start <= now and x.done_at is None]
        if not active and all(x.done_at is not None for x in nodes):
            break
        for node in active:  # reports due: the real planner
            if now >= node.next_report:
                node.next_report = now + interval
                plan = planner.plan(
                    node.name,
                    INFO_HASH,
                    piece_size=piece,
                    count=count,
                    held=node.held,
                    complete=False,
                    counters={"s3": node.s3_bytes, "peers": node.peer_bytes},
                    up_rate=0.0,
                    now=now,
                    interval=interval,
                )
                node.stripe = [p for p in plan.stripe if not node.held >> p & 1]
                node.mode, node.fill = plan.mode, plan.fill
        # the origin: readers with work from S3
        readers = [
            x for x in active if x.stripe or x.mode is Mode.WIDE or (x.fill and union & ~x.held)
        ]
        s3 = max_min(origin * dt, [x.down * dt for x in readers])
        got_s3 = {id(x): share for x, share in zip(readers, s3, strict=True)}
        # the swarm: uploaders that hold what someone lacks, shared by who lacks it
        needy = [x for x in active if union & ~x.held]
        supply = sum(x.up for x in nodes + holders if x.held and x.start <= now) * dt
        wants = [
            min(
                x.down * dt - got_s3.get(id(x), 0.0),
                (union & ~x.held).bit_count() * piece,
            )
            for x in needy
        ]
        peer = max_min(supply, [max(0.0, w) for w in wants])
        gains: list[tuple[Node, list[int], str]] = []
        from_s3: dict[int, set[int]] = {}
        for x in readers:
            x.s3_carry += got_s3[id(x)]
            pieces = []
            # the stripe first, then (WIDE, fill) the missing pieces, each once
            targets = x.stripe + [p for p in set_bits(full & ~x.held) if p not in x.stripe]
            while x.s3_carry >= piece and targets:
                p = targets.pop(0)
                if p in x.stripe:
                    x.stripe.remove(p)
                x.s3_carry -= piece
                origin_bytes += piece
                pieces.append(p)
            gains.append((x, pieces, "s3"))
            from_s3[id(x)] = set(pieces)
        for x, share in zip(needy, peer, strict=True):
            x.peer_carry += share
            pieces = []
            taken = from_s3.get(id(x), set())
            candidates = [p for p in set_bits(union & ~x.held) if p not in taken]
            while x.peer_carry >= piece and candidates:
                pieces.append(candidates.pop(rng.randrange(len(candidates))))
                x.peer_carry -= piece
            gains.append((x, pieces, "peers"))
        now += dt
        for x, pieces, source in gains:  # pieces land at the end of the step
            for p in pieces:
                if x.held >> p & 1:
                    continue
                x.held |= 1 << p
                avail[p] += 1
                union |= 1 << p
                if source == "s3":
                    x.s3_bytes += piece
                else:
                    x.peer_bytes += piece
            if x.held == full and x.done_at is None:
                x.done_at = now
                planner.forget([x.name])
    done = [x.done_at for x in nodes]
    finished = max(d for d in done if d is not None) if all(d is not None for d in done) else None
    return (finished if finished is not None else float("inf")), t_star, origin_bytes / size


def scaled(shape: Mapping[str, float], scale: float) -> dict[str, float]:
    return {k: (v * scale if k != "seeders" else v) for k, v in shape.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="100,1000,10000")
    parser.add_argument("--size", default="10G", help="artifact size (10G)")
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    parser.add_argument("--dt", type=float, help="seconds per step (default: T*/400)")
    parser.add_argument("--startup", type=float, default=1.0, help="daemon start-up, seconds")
    parser.add_argument("--calibrate", action="store_true", help="N=8, 128 MiB vs bench/fleet.py")
    args = parser.parse_args()
    if args.calibrate:
        print("| scenario | rates | measured (bench/fleet.py) | simulated | error |")
        print("|---|---|---|---|---|")
        errors = []
        for (name, scale), measured in MEASURED_N8.items():
            shape: Mapping[str, float] = scaled(SCENARIOS[name], scale)
            t_star = bound(8, 128 << 20, shape)
            done, t_star, _ = simulate(
                8, 128 << 20, shape, piece_size=1 << 20, dt=t_star / 400, startup=args.startup
            )
            ratio = done / t_star
            errors.append(abs(ratio - measured) / measured)
            print(
                f"| {name} | x{scale:g} | {measured:.2f}x | {ratio:.2f}x | "
                f"{(ratio - measured) / measured:+.0%} |"
            )
        print(f"\nmean absolute error {sum(errors) / len(errors):.0%} (start-up {args.startup} s)")
        return
    size = parse_size(args.size)
    print("| scenario | nodes | T* | predicted all-done | / T* | origin bytes / F | sim time |")
    print("|---|---|---|---|---|---|---|")
    for name in args.scenario or ["origin-bound", "swarm-bound", "slow-uploads"]:
        for n in (int(x) for x in args.nodes.split(",")):
            shape = SCENARIOS[name]
            t_star = bound(n, size, shape)
            began = time.monotonic()
            done, t_star, origin = simulate(
                n, size, shape, dt=args.dt or t_star / 400, startup=args.startup
            )
            print(
                f"| {name} | {n:,} | {t_star:.0f} s | {done:.0f} s | {done / t_star:.2f}x "
                f"| {origin:.2f} | {time.monotonic() - began:.0f} s |",
                flush=True,
            )


if __name__ == "__main__":
    main()
