"""Fleet benchmark: time to put one artifact on N new nodes, vs the P2P bound and baselines.

Every host is a network namespace on one bridge (swarm/lab/netlab.py) with tbf-shaped
upload and download. One "origin" host runs the S3 server (MinIO, or moto), a host of
its own (1 Gbit links) ``swarm coordinator`` (the tracker of every system below); N node
hosts fetch; k optional "seeder" hosts hold the artifact beforehand (existing
instances). The artifact (random bytes) is published once with ``swarm publish``; then
each system runs on fresh node state (homes, destinations; every process of the
previous system killed, the coordinator restarted). The systems (swarm/lab/systems.py,
one class each):

    swarm       ``swarm fetch NAME DEST --listen IP --coordinator URL --json`` on all nodes
    libtorrent  swarm/lab/baseline_libtorrent.py: stock libtorrent 2.1 with the published
                .torrent (S3 object as web seed) + the coordinator as tracker; seeds on
                after it is done, until every node is done
    aria2c      aria2c with the same torrent and tracker, seeding until every node is done
    s5cmd       ``s5cmd cp s3://BUCKET/KEY DEST`` on all nodes (S3 only; no seeders)
    swarm@REV   swarm as commit REV has it (swarm/lab/revisions.py: its ``swarm/`` from
                git, nodes and coordinator running it), to judge a change against the
                code before it in one invocation: ``--systems swarm,swarm@HEAD~1
                --repeat 4`` alternates the two round by round

Reported per system: all-done seconds (the last node's completion, from the common
start), each node's time, the ratio to the Kumar-Ross lower bound

    T* = max(F / (u_s + k u_k), F / d, N F / (u_s + k u_k + N u))

(F bits, u_s origin upload, u_k a seeder's upload, u/d a node's upload/download, bit/s),
the ratio to swarm, the bytes the origin host sent (its veth, headers included) / F, and
the CPU seconds a node spent per GiB (every process in its namespace until all nodes were
done). Every node's file is checked against the artifact's SHA-256; a mismatch fails the
run. The machine's CPU use during each system is sampled (/proc/stat): a saturated CPU
means the numbers measure the CPU, not the links.

    .venv/bin/python bench/fleet.py --scenario origin-bound [--systems swarm,s5cmd] [--json]

``--repeat K`` runs the whole invocation K times (each round on a fresh lab, the systems'
order rotated a place each round, so that none always runs first) and ends with what
the rounds show together: each system's all-done median and range, swarm's time over the
fastest baseline's per round, and in how many rounds swarm met issue 11's targets (at
most 1.25x T*, and no slower than the fastest baseline: 1.05x of it at full rates).

The lab, the origin, the systems and the run are swarm/lab/ (tests/fleet drives the same
code); the scenarios are data in swarm/lab/scenarios.py. This file is the command line
and the table. Needs root (network namespaces), aria2c, and MinIO (built on first use:
swarm.lab.s3.build_minio) or ``--s3 moto``. Every process and namespace is removed at the
end, on failure too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import statistics
import sys
from collections.abc import Iterator
from dataclasses import asdict
from types import FrameType

from swarm.lab.fleet import LAB_ENV_NAMES, log, run_fleet
from swarm.lab.fleetdata import (
    TARGET_BOUND,
    FleetConfig,
    RoundsSummary,
    SystemResult,
    fastest_baseline,
    summarize_rounds,
    target_baseline,
)
from swarm.lab.jobs import FleetError
from swarm.lab.netlab import LabError, available_tcp_cc, machine_tcp_cc
from swarm.lab.s3 import S3Error, build_minio
from swarm.lab.scenarios import DEFAULTS, SCENARIOS, scenario
from swarm.lab.systems import DEFAULT_SYSTEMS, SYSTEMS, base_name
from swarm.lab.systems import system as named_system
from swarm.pieces import parse_size
from swarm.sources.peertrace import TRACE_ENV


def name_width(names: list[str]) -> int:
    """The system column's width: 11, or the longest name (``swarm@REV``)."""
    return max([11, *map(len, names)])


def table(config: FleetConfig, results: list[SystemResult], failures: dict[str, str]) -> str:
    swarm = next((r.all_done for r in results if r.system == "swarm"), None)
    rows = [r.row(swarm) for r in results]
    width = name_width([r.system for r in results] + list(failures))
    plan = config.allocation()
    lines = [
        f"scenario {config.scenario or 'custom'}: N={config.nodes} new nodes, "
        f"k={config.seeders} seeders (up {config.seeder_rate:g}), "
        f"F={config.size / 2**20:g} MiB, piece {config.piece_size >> 10} KiB, "
        f"origin up {config.origin_up:g} Mbit, nodes up/down {config.node_up:g}/"
        f"{config.node_down:g} Mbit, S3 {config.s3}"
        + (f", far RTT {config.far_rtt_ms:g} ms loss {config.far_loss:g}" if config.far else "")
        + (
            f", origin up {config.origin_slow_up:g} Mbit from {slows:.1f} s"
            if (slows := config.origin_slows_after()) is not None
            else ""
        )
        + f", TCP {config.tcp_cc or machine_tcp_cc()}"
        + (
            f", swarm coordinator --origin-rate {config.origin_rate}"
            if config.origin_rate != "auto"
            else ""
        ),
        f"T* (Kumar-Ross bound) = {config.bound():.2f} s; the allocator plans "
        f"{plan.mode.value} (direct S3 share {plan.direct:.0%}) and predicts "
        f"{plan.finish:.2f} s",
        "",
        f"{'system':<{width}} {'all-done s':>10} {'median s':>9} {'x T*':>6} {'x swarm':>8} "
        f"{'origin B/F':>10} {'node B/F':>8} {'CPU-s/node/GiB':>14} {'cpu avg':>8} "
        f"{'cpu sat':>8}",
    ]
    for row in rows:
        vs = f"{row['vs_swarm']:.2f}" if row["vs_swarm"] is not None else "-"
        node_cpu = row["cpu_s_per_node_gib"]
        cpu = f"{node_cpu:.2f}" if node_cpu is not None else "-"
        received = row["node_received_per_F"]
        node_bf = f"{received:.3f}" if received is not None else "-"
        lines.append(
            f"{row['system']:<{width}} {row['all_done_s']:>10.2f} {row['median_s']:>9.2f} "
            f"{row['vs_bound']:>6.2f} {vs:>8} {row['origin_bytes_per_F']:>10.2f} {node_bf:>8} "
            f"{cpu:>14} {row['cpu_busy_avg']:>8.0%} {row['cpu_saturated']:>8.0%}"
        )
    for r in results:
        per_node = " ".join(f"{n.seconds:.1f}" for n in sorted(r.nodes, key=lambda n: n.node))
        lines.append(f"  {r.system} per node (s): {per_node}")
        if r.links is not None:
            first = "-" if r.links.first_bytes is None else f"{r.links.first_bytes:.2f} s"
            lines.append(
                f"  {r.system} links: first MB at {first}; until all done, node downlinks "
                f"{r.links.down:.0%} used, uplinks {r.links.up:.0%}, origin {r.links.origin:.0%}"
            )
        for note in r.notes:
            lines.append(f"  {r.system}: {note}")
        if base_name(r.system) == "swarm":
            total: dict[str, int] = {}
            for n in r.nodes:
                for k, v in (n.bytes_by_source or {}).items():
                    total[k] = total.get(k, 0) + int(v)
            shares = ", ".join(f"{k} {v / (r.size * len(r.nodes)):.0%}" for k, v in total.items())
            lines.append(f"  {r.system} bytes by source (share of N*F): {shares}")
    best = fastest_baseline(results)
    if swarm is not None and best is not None:
        lines.append(f"  swarm / fastest baseline ({best.system}) = {swarm / best.all_done:.2f}")
    for system, why in failures.items():
        # the header and the failing job's own reason (its log tails are in the run's log)
        lines.append(f"{system:<{width}} FAILED: {' '.join(why.splitlines()[:2])}")
    lines.append(
        "node B/F: what a node's downlink carried until all were done (every protocol, "
        "headers included), in F, the mean over nodes; "
        "CPU-s/node/GiB: a node's CPU seconds (every process in its namespace, until all "
        "were done) per GiB; cpu avg: mean machine CPU use during the run (2 cores); "
        "cpu sat: share of 1-s samples >= 95% busy; links: the bridge's counters, the nodes' "
        "first MB (all nodes together) from the start, and each side's bytes over its "
        "capacity at the configured rates from the start until all were done"
    )
    return "\n".join(lines)


def rounds_table(
    config: FleetConfig, summary: RoundsSummary, rounds: int, baseline_limit: float
) -> str:
    """What ``rounds`` rounds show together (``--repeat``)."""
    bound = config.bound()
    width = name_width(list(summary.all_done))
    lines = [
        f"{rounds} rounds, T* {bound:.2f} s (a system's failed rounds left out)",
        f"{'system':<{width}} {'median s':>9} {'min s':>7} {'max s':>7} {'median x T*':>12}",
    ]
    for system, times in summary.all_done.items():
        median = statistics.median(times)
        lines.append(
            f"{system:<{width}} {median:>9.2f} {min(times):>7.2f} {max(times):>7.2f} "
            f"{median / bound:>12.2f}"
        )
    for other, paired in summary.vs_swarm.items():
        faster = sum(ratio < 1 for ratio in paired)
        lines.append(
            f"  {other} / swarm, round by round: {' '.join(f'{r:.3f}' for r in paired)} "
            f"(median {statistics.median(paired):.3f}; faster in {faster} of {len(paired)})"
        )
    if summary.swarm_vs_fastest:
        ratios = " ".join(f"{r:.2f}" for r in summary.swarm_vs_fastest)
        lines.append(f"  swarm / fastest baseline, round by round: {ratios}")
        lines.append(
            f"  issue 11's targets (<= {TARGET_BOUND:g}x T*, <= {baseline_limit:g}x the fastest "
            f"baseline) met in {summary.met} of {summary.judged} rounds"
        )
    return "\n".join(lines)


@contextlib.contextmanager
def run_deadline(seconds: float) -> Iterator[None]:
    """Raise FleetError in the main thread after ``seconds`` (SIGALRM)."""

    def expired(signum: int, frame: FrameType | None) -> None:
        raise FleetError(f"the whole run timed out after {seconds:.0f}s (--run-timeout)")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def parse_args(argv: list[str] | None = None) -> tuple[FleetConfig, argparse.Namespace]:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="scenarios:\n"
        + "\n".join(f"  {name}: {preset}" for name, preset in SCENARIOS.items()),
    )
    parser.add_argument(
        "--scenario", choices=sorted(SCENARIOS), help="preset (listed below); flags override it"
    )
    parser.add_argument("--nodes", type=int, help=f"new nodes N ({DEFAULTS['nodes']})")
    parser.add_argument("--size", type=parse_size, help="artifact size (128M)")
    parser.add_argument("--piece-size", type=parse_size, help="piece size (1M)")
    parser.add_argument("--node-up", type=float, help="node upload, Mbit/s (200)")
    parser.add_argument("--node-down", type=float, help="node download, Mbit/s (200)")
    parser.add_argument("--origin-up", type=float, help="origin upload u_s, Mbit/s (100)")
    parser.add_argument("--seeders", type=int, help="pre-existing complete instances k (0)")
    parser.add_argument("--seeder-up", type=float, help="a seeder's upload, Mbit/s (node-up)")
    parser.add_argument(
        "--far-rtt-ms",
        type=float,
        help="put the new nodes in another region, this RTT from the origin and seeders (0)",
    )
    parser.add_argument(
        "--far-loss", type=float, help="loss each way between the regions, 0..1 (0)"
    )
    parser.add_argument(
        "--tcp-cc",
        help="TCP congestion control on every host (cubic, bbr; default: the scenario's, "
        "else the machine's)",
    )
    parser.add_argument(
        "--rate-scale",
        type=float,
        default=1.0,
        help="multiply every link rate (after the preset and flags): 0.25 runs a scenario "
        "at a quarter of its rates, so that on a small machine the network, not the CPU, "
        "limits every system (1)",
    )
    parser.add_argument(
        "--systems",
        default=",".join(DEFAULT_SYSTEMS),
        help=f"comma list of {', '.join(SYSTEMS)}, and swarm@REV: swarm as commit REV has "
        f"it, beside the working tree's (default: {','.join(DEFAULT_SYSTEMS)})",
    )
    parser.add_argument(
        "--s3",
        choices=("minio", "moto"),
        default="minio",
        help="S3 server (minio, built once on first use; moto reads the whole object on "
        "every ranged GET: for a run that times nothing)",
    )
    parser.add_argument(
        "--origin-rate",
        default="auto",
        help="the swarm coordinator's --origin-rate: auto (measured), unlimited (S3 known "
        "to be in the fleet's region), or bytes/s such as 12M (auto)",
    )
    parser.add_argument(
        "--timeout", type=float, help="seconds per system (60 + max(10 T*, 2 N F / u_s))"
    )
    parser.add_argument("--run-timeout", type=float, default=3600.0, help="whole run (3600)")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the work directory (node logs; each system's link counters every 0.1 s "
        "in links.json, for bench/timeline.py; for swarm the coordinator's /v1/fleet every "
        "0.5 s in fleet-trace.jsonl and its debug log, each allocation's inputs)",
    )
    parser.add_argument(
        "--trace-peers",
        action="store_true",
        help="with --keep: every swarm daemon logs its peer connections once a second "
        "(rates, request queues, chokes: swarm.sources.peertrace) into its daemon.log",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set NAME on every process the run starts (nodes, seeders, coordinator), on "
        "top of the lab's environment, which drops this shell's SWARM_*, AWS_*, S3_* and "
        "MINIO_* variables and proxies: a setting a change under test reads (repeatable)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the invocation this many times, the systems' order rotated each round, "
        "and summarize the rounds (1)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    if args.rate_scale <= 0:
        parser.error("--rate-scale must be positive")
    if not 1 <= args.repeat <= 50:
        parser.error("--repeat must be 1-50")
    if args.repeat > 1 and args.keep:
        parser.error("--keep keeps one run's work directory: use it without --repeat")
    if args.trace_peers and not args.keep:
        parser.error("--trace-peers writes into the node logs: add --keep to keep them")
    args.extra_env = {}
    for item in args.env:
        name, equals, value = item.partition("=")
        if not equals or not name.isidentifier():
            parser.error(f"--env {item!r}: give NAME=VALUE")
        if name in LAB_ENV_NAMES:
            parser.error(f"--env {name}: the lab sets it itself (the origin's S3, the fleet)")
        args.extra_env[name] = value
    if args.trace_peers:
        args.extra_env[TRACE_ENV] = "1"
    if args.tcp_cc and args.tcp_cc not in available_tcp_cc():
        parser.error(f"--tcp-cc {args.tcp_cc}: this kernel has {' '.join(available_tcp_cc())}")
    flags = {key: getattr(args, key, None) for key in DEFAULTS}
    values = scenario(args.scenario, args.rate_scale, **flags)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if len(set(systems)) < len(systems):
        parser.error(f"--systems: {args.systems!r} names a system twice")
    args.chosen = []
    for name in systems:
        try:  # (swarm@REV: its commit resolved and extracted here, once for every round)
            args.chosen.append(named_system(name))
        except ValueError as error:
            parser.error(f"--systems: {error}")
        code = getattr(args.chosen[-1], "code", None)
        if code is not None:
            log(f"{name} is commit {code.name[:12]}")
    args.systems = systems
    try:
        config = FleetConfig(
            **values,
            s3=args.s3,
            origin_rate=args.origin_rate.strip().lower(),
            system_timeout=args.timeout,
            scenario=args.scenario,
        )
    except ValueError as error:
        parser.error(str(error))
    return config, args


def main(argv: list[str] | None = None) -> int:
    config, args = parse_args(argv)
    if args.extra_env:
        settings = " ".join(f"{name}={value}" for name, value in args.extra_env.items())
        log(f"every process of the run gets {settings}")
    try:
        if config.s3 == "minio":
            build_minio(log)
        rounds: list[tuple[list[SystemResult], dict[str, str]]] = []
        with run_deadline(args.run_timeout):
            for round_no in range(args.repeat):
                turn = round_no % len(args.chosen)
                order = args.chosen[turn:] + args.chosen[:turn]
                if args.repeat > 1:
                    names = ", ".join(each.name for each in order)
                    log(f"round {round_no + 1} of {args.repeat}: {names}")
                results, failures = run_fleet(
                    config,
                    order,
                    keep=args.keep,
                    extra_env=args.extra_env,
                )
                results.sort(key=lambda r: args.systems.index(r.system))  # as asked
                rounds.append((results, failures))
    except (FleetError, LabError, S3Error) as error:
        log(f"FAILED: {error}")
        return 1
    baseline_limit = target_baseline(args.rate_scale)
    summary = summarize_rounds([results for results, _ in rounds], baseline_limit)
    if args.json:
        body = []
        for results, failures in rounds:
            swarm = next((r.all_done for r in results if r.system == "swarm"), None)
            body.append(
                {
                    "rows": [r.row(swarm) for r in results],
                    "results": [asdict(r) for r in results],
                    "failures": failures,
                }
            )
        report = {"config": asdict(config), "bound_s": config.bound(), **body[0]}
        if args.repeat > 1:
            report["rounds"] = body
            report["summary"] = asdict(summary)
        print(json.dumps(report, indent=2))
    else:
        print("\n\n".join(table(config, results, failures) for results, failures in rounds))
        if args.repeat > 1:
            print()
            print(rounds_table(config, summary, len(rounds), baseline_limit))
    failed = sorted({system for _, failures in rounds for system in failures})
    if failed:
        log(f"FAILED systems: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
