"""Coordinator load: N simulated nodes reporting and announcing against real
``swarm coordinator`` processes on loopback (issue 12).

    .venv/bin/python bench/coordinator.py                          # 250..5,000 nodes
    .venv/bin/python bench/coordinator.py --nodes 5000 --duration 40
    .venv/bin/python bench/coordinator.py --nodes 5000 --store redis --coordinators 2 --kill-at 20

One load-generator process (asyncio, keep-alive HTTP through one aiohttp connection
pool) drives every simulated node (``swarm.lab.simnode``); each coordinator is its own
process, started fresh for each fleet size (``swarm.lab.loadcoordinators``). A node
joins at ``i * join / N`` seconds (a scale-out), then behaves as the daemon does: it
posts its report (the daemon's fields, one artifact with a 2,048-piece bitfield that
fills as it "downloads", its stripe included) and waits for the reply before the next
one, at the interval the reply asks for (``interval``; 1 s if absent), echoing
``members_epoch``; it announces at join (``event=started``) and then at the tracker's
``interval``. With several coordinators (``--coordinators``) a node starts on
coordinator ``i % K`` and moves to the next one after a failed request, as a node given
``--coordinator A,B`` does.

Per fleet size it prints: reports answered / offered (a node offers one report per
interval it was asked for; a slot passes unanswered while the previous report still
waits), report latency p50 / p99 (from the request to the whole reply read), errors
(non-200, timeouts past ``--timeout``, refused connections), the interval the
coordinator chose (median of the last replies), reply bytes (mean / max), announce p99,
the coordinators' CPU (cores: CPU seconds over wall seconds) and peak RSS, and the load
generator's own CPU, since both share this machine's cores: a load generator near one
core means the latencies are partly its own.

Bounded: loopback only, ``--duration`` seconds per fleet size (join included), at most
``MAX_NODES`` nodes, and every process it starts is stopped by pid on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from swarm.lab.loadcoordinators import REDIS_SERVER, LoadCoordinator, coordinators, redis_server
from swarm.lab.simnode import INFO_HASH, PIECES, SimNode

MAX_NODES = 20_000
SETTLE = 10.0
"""Seconds after the last join from which reports count as steady state."""

FAILOVER_WAIT = 0.25
"""Seconds before a failed report goes to the next coordinator (the daemon's wait)."""


def loadavg() -> str:
    """The 1-minute load average: this machine's cores are shared, so say how busy."""
    return Path("/proc/loadavg").read_text().split()[0]


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- the simulated fleet -----------------------------------------------------------------------


@dataclass
class Stats:
    offered: float = 0.0
    answered: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)
    steady: list[float] = field(default_factory=list)
    """Latencies of reports sent after the scale-out settled (join + ``SETTLE`` s)."""
    announce_latencies: list[float] = field(default_factory=list)
    announce_errors: int = 0
    reply_bytes: list[int] = field(default_factory=list)
    intervals: list[float] = field(default_factory=list)
    members: int = 0
    """Member lists (full or delta) received."""
    error_kinds: dict[str, int] = field(default_factory=dict)
    settled_at: float = float("inf")
    client_lag: list[float] = field(default_factory=list)
    """How late the load generator's own 0.1 s timer fired: its latencies include that."""
    after_kill: list[float] = field(default_factory=list)
    """Latencies of reports answered after a coordinator was killed (from the kill)."""
    orphans: int = 0
    """Nodes reporting to the coordinator when it was killed."""
    recovered: list[float] = field(default_factory=list)
    """For each of them, seconds from the kill to its first answer from another one."""

    def error(self, kind: str) -> None:
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1


async def run_node(
    node: SimNode,
    http: aiohttp.ClientSession,
    stats: Stats,
    start: float,
    join_at: float,
    end: float,
    timeout: float,
    killed: dict[str, float],
) -> None:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start + join_at - loop.time()))
    node.started = loop.time()
    interval = 1.0
    announce_interval = 30.0
    next_announce = loop.time()
    last = loop.time()
    slot = loop.time()
    event = "started"
    while True:
        now = loop.time()
        if now >= end:
            stats.offered += (end - slot) / interval if end > slot else 0.0
            return
        if now >= next_announce:
            announce_interval = await announce(node, http, stats, event, timeout) or 30.0
            event = ""
            next_announce = loop.time() + announce_interval
        node.gain(loop.time() - last)
        last = loop.time()
        stats.offered += 1
        sent = loop.time()
        answered = await post_report(node, http, stats, timeout, killed)
        if answered is not None:
            interval = answered
            # the next slot is one interval after this one; slots missed while this
            # report waited for its reply are offered and not answered
            slot = sent + interval
        else:  # as the daemon: the next coordinator of its list, soon
            slot = loop.time() + min(interval, FAILOVER_WAIT)
        while slot < loop.time():
            stats.offered += 1
            slot += interval
        await asyncio.sleep(max(0.0, min(slot, end) - loop.time()))


async def post_report(
    node: SimNode,
    http: aiohttp.ClientSession,
    stats: Stats,
    timeout: float,
    killed: dict[str, float],
) -> float | None:
    loop = asyncio.get_running_loop()
    body = node.report(loop.time())
    began = loop.time()
    url = node.url
    try:
        async with http.post(
            url + "/v1/report",
            data=body,
            headers={"Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as response:
            raw = await response.read()
            if response.status != 200:
                stats.error(f"http {response.status}")
                node.fail_over()
                return None
    except TimeoutError:
        stats.error("timeout")
        node.fail_over()
        return None
    except aiohttp.ClientError as error:
        stats.error(type(error).__name__)
        node.fail_over()
        return None
    took = loop.time() - began
    stats.answered += 1
    stats.latencies.append(took)
    if began >= stats.settled_at:
        stats.steady.append(took)
    stats.reply_bytes.append(len(raw))
    if killed and url not in killed:
        stats.after_kill.append(loop.time() - min(killed.values()))
        if node.orphaned:
            node.orphaned = False
            stats.recovered.append(loop.time() - min(killed.values()))
    # the reply's member list or delta comes last (the coordinator splices it in): read
    # what a node acts on without decoding thousands of addresses, as a daemon's C
    # JSON parser would not be this machine's bottleneck either
    cut = max(raw.find(b', "members": '), raw.find(b', "members_delta": '))
    if cut > 0:
        stats.members += 1
        reply = json.loads(raw[:cut] + b"}")
    else:
        reply = json.loads(raw)
    interval = reply.get("interval")
    interval = float(interval) if isinstance(interval, int | float) and interval > 0 else 1.0
    stats.intervals.append(interval)
    if "members_epoch" in reply:
        node.members_epoch = reply["members_epoch"]
    plan = (reply.get("plans") or {}).get(INFO_HASH.hex())
    if isinstance(plan, dict):
        node.stripe = [p for p in plan.get("stripe", []) if isinstance(p, int) and 0 <= p < PIECES]
    return interval


async def announce(
    node: SimNode, http: aiohttp.ClientSession, stats: Stats, event: str, timeout: float
) -> float | None:
    loop = asyncio.get_running_loop()
    began = loop.time()
    try:
        async with http.get(
            node.url + "/announce?" + node.announce_query(event),
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as response:
            raw = await response.read()
            if response.status != 200 or b"failure reason" in raw:
                stats.announce_errors += 1
                return None
    except (TimeoutError, aiohttp.ClientError):
        stats.announce_errors += 1
        node.fail_over()
        return None
    stats.announce_latencies.append(loop.time() - began)
    marker = raw.find(b"8:intervali")
    if marker >= 0:
        with contextlib.suppress(ValueError):
            return float(raw[marker + 11 : raw.index(b"e", marker + 11)])
    return None


async def drive(
    count: int, running: list[LoadCoordinator], args: argparse.Namespace
) -> tuple[Stats, float, float]:
    rng = random.Random(args.seed)
    urls = [c.url for c in running]
    nodes = [SimNode(i, random.Random(rng.random()), urls) for i in range(count)]
    for node in nodes:
        node.track_members = args.members != "none"
        node.new_protocol = args.members != "legacy"
    stats = Stats()
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
    killed: dict[str, float] = {}
    async with aiohttp.ClientSession(connector=connector) as http:
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.5
        end = start + args.duration
        stats.settled_at = start + args.join + SETTLE
        wall0, cpu0 = time.monotonic(), self_cpu()
        for coordinator in running:
            coordinator.begin()

        async def probe() -> None:
            while loop.time() < end:
                expected = loop.time() + 0.1
                await asyncio.sleep(0.1)
                stats.client_lag.append(max(0.0, loop.time() - expected))

        lag_probe = asyncio.create_task(probe())
        tasks = [
            asyncio.create_task(
                run_node(node, http, stats, start, args.join * i / count, end, args.timeout, killed)
            )
            for i, node in enumerate(nodes)
        ]
        if args.kill_at is not None and len(running) > 1:
            await asyncio.sleep(max(0.0, start + args.kill_at - loop.time()))
            victim = running[0]
            await asyncio.to_thread(victim.measure)
            victim.server.kill()
            killed[victim.url] = loop.time()
            for node in nodes:
                if node.url == victim.url and node.started:
                    node.orphaned = True
                    stats.orphans += 1
        await asyncio.gather(*tasks)
        await lag_probe
        wall = time.monotonic() - wall0
        for coordinator in running:
            if coordinator.cpu is None:
                await asyncio.to_thread(coordinator.measure)
        return stats, wall, self_cpu() - cpu0


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def row(
    count: int, stats: Stats, wall: float, own_cpu: float, running: list[LoadCoordinator]
) -> str:
    cores = " + ".join(f"{(c.cpu or 0) / wall:.2f}" for c in running)
    requests = sum(c.handled for c in running) or stats.answered + len(stats.announce_latencies)
    per_request = sum(c.cpu or 0 for c in running) / max(1, requests) * 1000
    rss = " + ".join(f"{c.hwm >> 20}" for c in running)
    tail = stats.intervals[-max(1, len(stats.intervals) // 10) :]
    interval = statistics.median(tail) if tail else float("nan")
    mean_bytes = statistics.mean(stats.reply_bytes) if stats.reply_bytes else 0
    max_bytes = max(stats.reply_bytes, default=0)
    kinds = ",".join(f"{k}:{v}" for k, v in sorted(stats.error_kinds.items())) or "-"
    return (
        f"| {count:,} | {stats.answered:,} / {stats.offered:,.0f} = "
        f"{stats.answered / max(stats.offered, 1):.2f} "
        f"| {pct(stats.latencies, 50) * 1000:.0f} ms | {pct(stats.latencies, 99) * 1000:.0f} ms "
        f"| {pct(stats.steady, 99) * 1000:.0f} ms "
        f"| {stats.errors} ({kinds}) | {interval:.1f} s (max {max(stats.intervals, default=0):.1f})"
        f" | {mean_bytes:,.0f} / {max_bytes:,} B | {stats.members:,} "
        f"| {pct(stats.announce_latencies, 99) * 1000:.0f} ms ({stats.announce_errors} err) "
        f"| {cores} | {per_request:.2f} ms | {rss} MiB | {own_cpu / wall:.2f} "
        f"(lag p99 {pct(stats.client_lag, 99) * 1000:.0f} ms) | {loadavg()} |"
    )


HEADER = (
    "| nodes | reports answered / offered | p50 | p99 | p99 steady | errors | interval"
    " | reply bytes"
    " mean / max | replies with members | announce p99 | coordinator CPU (cores) |"
    " coordinator CPU per request | coordinator peak RSS | load generator CPU |"
    " load average |\n|" + "---|" * 15
)


def in_process(sizes: list[int], reports: int = 3000) -> None:
    """CPU per report and per announce of the coordinator's own code (parse, store,
    planner, membership, reply encoding; no HTTP), after N nodes joined: flat in N means
    O(1) per request. ``process_time``, so other processes on the machine matter less."""
    from swarm.coordinator.fleet import parse_epoch
    from swarm.coordinator.handlers import plan_origin
    from swarm.coordinator.load import report_interval
    from swarm.coordinator.memorystore import MemoryPeerStore
    from swarm.coordinator.origin import StripePlanner
    from swarm.coordinator.reports import parse_report
    from swarm.coordinator.tracker import parse_announce

    print("| nodes | CPU per report | CPU per announce |\n|---|---|---|")
    for n in sizes:
        store, planner = MemoryPeerStore(generation="g"), StripePlanner()
        rng = random.Random(1)
        nodes = [SimNode(i, random.Random(i), ["-"]) for i in range(n)]
        now = 1000.0
        for node in nodes:  # the scale-out
            node.gain(5.0)
            report = parse_report(json.loads(node.report(now)))
            store.report(report, now, 10)
            plan_origin(planner, report, now, 1.0)
            node.members_epoch = store.members(None, now).epoch
            store.announce(parse_announce(node.announce_query("started")), node.ip, now)
            now += 0.0001
        spent = 0.0
        for _ in range(reports):
            node = nodes[rng.randrange(n)]
            node.gain(1.0)
            body = node.report(now)
            began = time.process_time()
            payload = json.loads(body)
            report = parse_report(payload)
            interval = report_interval(store.node_count(now), 2000)
            store.report(report, now, 10)
            plans, _, _ = plan_origin(planner, report, now, interval)
            members = store.members(parse_epoch(payload.get("members_epoch")), now)
            json.dumps({"ok": True, "interval": interval, "plans": plans})
            spent += time.process_time() - began
            node.members_epoch = members.epoch
            now += 0.0005
        began = time.process_time()
        for _ in range(reports // 3):
            node = nodes[rng.randrange(n)]
            announce = parse_announce(node.announce_query(""))
            store.announce(announce, node.ip, now)
            store.counts(announce.info_hash, now)
            now += 0.0005
        per_announce = (time.process_time() - began) / (reports // 3)
        print(f"| {n:,} | {spent / reports * 1e6:.0f} us | {per_announce * 1e6:.0f} us |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="250,500,1000,2000,5000", help="fleet sizes")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per fleet size")
    parser.add_argument("--join", type=float, default=5.0, help="seconds over which nodes join")
    parser.add_argument("--timeout", type=float, default=10.0, help="per-request timeout")
    parser.add_argument("--coordinators", type=int, default=1)
    parser.add_argument("--store", choices=["memory", "redis"], default="memory")
    parser.add_argument(
        "--kill-at", type=float, help="SIGKILL the first coordinator this many seconds in"
    )
    parser.add_argument(
        "--members",
        choices=["epoch", "legacy", "none"],
        default="epoch",
        help="nodes keep the member list by epoch (an authenticated fleet, the default), "
        "take the whole list in every reply (daemons before issue 12), or want none "
        "(an open fleet)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="time the coordinator's code per report and announce without HTTP, and exit",
    )
    args = parser.parse_args()
    sizes = [int(n) for n in args.nodes.split(",")]
    if args.in_process:
        in_process(sizes)
        return
    if args.store == "redis" and REDIS_SERVER is None:
        parser.error("--store redis needs redis-server (apt-get install -y redis-server)")
    if any(not 0 < n <= MAX_NODES for n in sizes) or args.duration > 600:
        parser.error(f"fleet sizes must be 1..{MAX_NODES} and --duration at most 600 s")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(
        f"# {args.coordinators} coordinator(s), store {args.store}, {args.duration:.0f} s per "
        f"size, joins over {args.join:.0f} s, timeout {args.timeout:.0f} s, "
        f"members {args.members}, {os.cpu_count()} cores, load average {loadavg()}"
        + (f", first coordinator killed at {args.kill_at:.0f} s" if args.kill_at else "")
    )
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory(prefix="swarm-bench-coord-") as tmp:
        workdir = Path(tmp)
        for count in sizes:
            with contextlib.ExitStack() as stack:
                store = None
                if args.store == "redis":
                    store = stack.enter_context(redis_server(workdir))
                running = stack.enter_context(coordinators(args.coordinators, store, workdir))
                stats, wall, own = asyncio.run(drive(count, running, args))
            print(row(count, stats, wall, own, running), flush=True)
            if stats.orphans:
                slowest = max(stats.recovered, default=float("nan"))
                print(
                    f"#   killed coordinator had {stats.orphans:,} nodes: "
                    f"{len(stats.recovered):,} answered by the survivor, the last "
                    f"{slowest:.2f} s after the kill (p99 {pct(stats.recovered, 99):.2f} s); "
                    f"{len(stats.after_kill):,} reports answered after the kill",
                    flush=True,
                )


if __name__ == "__main__":
    main()
