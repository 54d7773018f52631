"""S3 slows down under ALL: the fleet goes back to sharing (issue 11's allocation).

Real namespaces, a real S3 server, the coordinator and four ``swarm fetch`` nodes. S3
first fills every node's link, so the coordinator's allocation goes ALL (every node
reads everything from S3, upload-only). Then the origin's link is throttled to a
twentieth of what the nodes could take. Before the change ALL stood for good: under ALL a node
takes nothing from peers, its peaks are maxima that went on saying S3 filled its link,
and each node read its whole ALL batch to the end anyway; every node then read all it
lacked through the throttled origin.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from swarm.lab.fleet import started_fleet
from swarm.lab.fleetdata import FleetConfig, SystemResult
from swarm.lab.netlab import lab_unavailable

pytestmark = pytest.mark.fleet

SIZE = 32 << 20
PIECE = 256 << 10
"""Small pieces: a report interval's counters are whole pieces, and with 1 MiB pieces at
2 MB/s the peaks were too coarse for the allocation to see S3 fill the links (MIX in one
run of four)."""
NODES = 4
NODE_MBIT = 16
"""2 MB/s a node: the artifact takes a node 17 s at link speed, long enough for the
allocation to go ALL (its warm-up is two seconds of peer traffic) with most of it left
(moto, the tests' S3 server, does not fill four 40 Mbit links: no ALL there)."""
SLOW_MBIT = 3
"""The origin once throttled: 0.4 MB/s for four nodes that could take 8."""


def _records(trace: Path) -> list[dict[str, Any]]:
    if not trace.exists():
        return []
    lines = trace.read_text().splitlines()
    return [json.loads(line) for line in lines[:-1] if line]  # the last may be partial


def _held(node: dict[str, Any]) -> int:
    """Bytes a node of a fleet view holds."""
    return sum(a["have_bytes"] for a in node["artifacts"])


def _timeline(views: list[dict[str, Any]], start: float, until: float) -> list[Any]:
    """(seconds into the trace, allocation mode, MiB the nodes held) up to ``until``."""
    return [
        (
            round(r["t"] - start, 1),
            [(a.get("allocation") or {}).get("mode") for a in r["fleet"]["artifacts"]],
            sum(_held(n) for n in r["fleet"]["nodes"]) >> 20,
        )
        for r in views
        if r["t"] < until
    ]


def _all_seen(trace: Path) -> dict[str, Any] | None:
    """The first fleet view whose allocation is ALL, or None."""
    for record in _records(trace):
        for artifact in record["fleet"]["artifacts"]:
            allocation = artifact.get("allocation") or {}
            if allocation.get("mode") == "all":
                return record
    return None


def _flows(views: list[dict[str, Any]], since: float) -> list[Any]:
    """(seconds after ``since``, MiB each node received from S3 and from peers since the
    first of ``views``) per view."""
    if not views:
        return []

    def by_source(view: dict[str, Any]) -> dict[str, tuple[int, int]]:
        got = {}
        for node in view["fleet"]["nodes"]:
            counts: dict[str, int] = {}
            for a in node["artifacts"]:
                for source, count in a["bytes_by_source"].items():
                    counts[source] = counts.get(source, 0) + count
            s3 = counts.get("s3", 0)
            got[node["node"]] = (s3, sum(counts.values()) - s3)
        return got

    first = by_source(views[0])

    def since_first(node: str, got: tuple[int, int]) -> tuple[float, float]:
        s3, peers = first.get(node, (0, 0))
        return round((got[0] - s3) / 2**20, 1), round((got[1] - peers) / 2**20, 1)

    def row(view: dict[str, Any]) -> list[tuple[float, float]]:
        got = by_source(view)  # the first view's nodes, in one order: the rows line up
        return [since_first(n, got.get(n, first[n])) for n in sorted(first)]

    return [(round(r["t"] - since, 1), row(r)) for r in views]


def _fed_until(flows: list[Any]) -> float:
    """The last moment (of :func:`_flows`) at which the median node had received from
    peers, over the second before, at least a third of its link: until then it is still
    finishing the pieces peers had partly sent when ALL came (libtorrent completes them,
    ``PEERS_FINISH_SECONDS``), and the slowdown rule rightly waits (a node fed by peers
    has not begun reading under ALL). 0.0 if never."""
    link_mib = NODE_MBIT / 8 * 1e6 / 2**20
    last = 0.0
    for i, (t, nodes) in enumerate(flows):
        j = next((j for j in range(i - 1, -1, -1) if t - flows[j][0] >= 1.0), None)
        if j is None:
            continue
        then, before = flows[j]
        rates = [(peers - before[k][1]) / (t - then) for k, (_, peers) in enumerate(nodes)]
        if statistics.median(rates) >= link_mib / 3:
            last = t
    return last


@dataclass
class _Attempt:
    """One fleet run: the first ALL view, when the origin was throttled, the trace."""

    outcome: dict[str, Any]
    at_all: dict[str, Any] | None
    throttled_at: float
    views: list[dict[str, Any]]
    handed: int
    log_tails: dict[str, list[str]]
    """Each node's last daemon log lines above DEBUG, kept for a run that failed."""

    def all_came_early(self) -> bool:
        """ALL came while the nodes lacked most of the artifact (what the test needs)."""
        if self.at_all is None:
            return False
        return sum(_held(n) for n in self.at_all["fleet"]["nodes"]) < NODES * SIZE // 2


def _daemon_log(node_dir: Path) -> str:
    """A node's daemon log, or a line saying there is none (a daemon that never started)."""
    try:
        return (node_dir / "home" / "daemon.log").read_text()
    except OSError as error:
        return f"(no daemon log: {error.strerror})"


def _log_excerpt(text: str) -> list[str]:
    """What a failed run's daemon log says: its last lines above DEBUG, and before them its
    last few multi-line entries (an exception's traceback, the threads' stacks the harness
    has a daemon write on a timeout), which the last lines alone cut off."""
    entries: list[list[str]] = []
    for line in text.splitlines():
        # a log record starts with its date; faulthandler's dump with a thread, the
        # threads after the first one following a blank line
        dump = line.startswith(("Thread 0x", "Current thread 0x"))
        if line[:2] == "20" or not entries or (dump and entries[-1][-1] != ""):
            entries.append([line])
        else:
            entries[-1].append(line)
    entries = [e for e in entries if " DEBUG " not in e[0]]
    tail = entries[-25:]
    long = [e for e in entries[:-25] if len(e) > 1][-3:]
    return [line for entry in long + tail for line in entry]


def _attempt(config: FleetConfig) -> _Attempt:
    with started_fleet(config, lab_name="sl") as fleet:
        fleet.keep = True  # the coordinator's view every 0.5 s (fleet-trace.jsonl)
        trace = fleet.work / "swarm" / "fleet-trace.jsonl"
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["result"] = fleet.run_system("swarm")
            except Exception as error:  # shown by the assertion below
                outcome["error"] = error

        runner = threading.Thread(target=run)
        runner.start()
        at_all: dict[str, Any] | None = None
        throttled_at = 0.0
        deadline = time.monotonic() + 60
        while runner.is_alive() and at_all is None and time.monotonic() < deadline:
            time.sleep(0.1)
            at_all = _all_seen(trace)
        if at_all is not None:
            fleet.origin.set_rates(SLOW_MBIT, config.origin_down)
            throttled_at = time.time()
        runner.join(300)
        logs = {
            host.name: _daemon_log(fleet.work / "swarm" / host.name) for host in fleet.node_hosts
        }
        handed = sum("handed to libtorrent" in text for text in logs.values())
        tails: dict[str, list[str]] = {}
        if "error" in outcome:  # the work directory goes with the fleet: say what it held
            tails = {name: _log_excerpt(text) for name, text in logs.items()}
        return _Attempt(outcome, at_all, throttled_at, _records(trace), handed, tails)


def test_all_is_taken_back_when_s3_slows_under_it() -> None:
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    config = FleetConfig(
        nodes=NODES, size=SIZE, piece_size=PIECE, origin_up=1000, node_up=NODE_MBIT,
        node_down=NODE_MBIT, s3=os.environ.get("SWARM_FLEET_S3", "moto"), system_timeout=240,
    )  # fmt: skip
    # Whether S3 "fills every link" is a measurement at these rates (one interval's
    # counters of whole pieces against the nodes' peaks): in one CI run the allocation
    # went ALL only as the last nodes finished, leaving nothing to throttle.
    # Such a run says nothing of the take-back; a second one is made, and both missing
    # fails below.
    first = _attempt(config)
    attempt = first if first.all_came_early() else _attempt(config)
    outcome, at_all, throttled_at = attempt.outcome, attempt.at_all, attempt.throttled_at
    views, handed = attempt.views, attempt.handed
    if "error" in outcome:
        start = views[0]["t"] if views else time.time()
        when = f"{throttled_at - start:.1f} s into the trace" if throttled_at else "never"
        raise AssertionError(
            f"{outcome['error']}; the origin throttled {when}; "
            f"(t, mode, MiB held) {_timeline(views, start, math.inf)}; the nodes' daemon "
            f"logs ended: {json.dumps(attempt.log_tails, indent=1)}"
        )
    result: SystemResult = outcome["result"]
    seen = [(a.get("allocation") or {}).get("mode") for r in views for a in r["fleet"]["artifacts"]]
    assert at_all is not None, f"the allocation never went ALL: S3 did not fill the links {seen}"
    assert attempt.all_came_early(), f"ALL came only as the nodes finished, twice: {seen}"
    # What the fleet held, and had read from S3, when the origin was throttled
    before = min((r for r in views if r["t"] >= throttled_at), key=lambda r: r["t"])
    (artifact,) = before["fleet"]["artifacts"]
    nobody = sum(1 for n in artifact["availability"] if n == 0) * PIECE
    lacking = sum(
        SIZE - a["have_bytes"]
        for node in before["fleet"]["nodes"]
        for a in node["artifacts"]
        if not a["complete"]
    )
    s3_then = sum(
        a["bytes_by_source"].get("s3", 0)
        for node in before["fleet"]["nodes"]
        for a in node["artifacts"]
    )
    s3_total = sum((n.bytes_by_source or {}).get("s3", 0) for n in result.nodes)
    after = s3_total - s3_then
    modes = [
        (round(r["t"] - throttled_at, 1), (a.get("allocation") or {}).get("mode"))
        for r in views
        for a in r["fleet"]["artifacts"]
        if r["t"] >= throttled_at
    ]
    taken_back = next((i for i, (_, mode) in enumerate(modes) if mode != "all"), len(modes))
    # What the nodes got after the throttle, view by view, up to ALL's take-back: S3's
    # rate falls at once (or the throttle did not bite), and under ALL peers send nothing
    # (or the nodes had not begun their ALL batches): the slowdown rule's inputs
    flows = _flows([r for r in views if r["t"] >= throttled_at][: taken_back + 2], throttled_at)
    fed_until = _fed_until(flows[: taken_back + 1])
    received = sum(sum((n.bytes_by_source or {}).values()) for n in result.nodes)
    start = views[0]["t"]
    held = [_held(n) >> 20 for n in at_all["fleet"]["nodes"]]
    retried = (
        ""
        if attempt is first or not first.views
        else f"(a first run saw {_timeline(first.views, first.views[0]['t'], math.inf)[:40]}) "
    )
    said = (
        f"{retried}ALL first seen {at_all['t'] - start:.1f} s into the trace, the nodes "
        f"holding {held} MiB; fleet done in {result.all_done:.1f} s; "
        f"(t, mode, MiB held) before the throttle {_timeline(views, start, throttled_at)}; "
        f"S3 after the throttle {after >> 20} MiB; nobody held {nobody >> 20} MiB, the "
        f"nodes lacked {lacking >> 20} MiB; received {received >> 20} MiB for "
        f"{NODES * SIZE >> 20}; {handed} nodes handed their S3 pieces to libtorrent; "
        f"modes {modes[: taken_back + 2]}; (t, MiB from S3, MiB from peers) a node "
        f"since the throttle {flows}; the median node fed by peers until {fed_until} s"
    )
    # ALL was taken back within a few seconds (its proof, two snapshots, a report) of the
    # throttle, or of the moment peers stopped feeding the nodes: a CI run took over 6 s
    # after the throttle, and one run here 4.4 s, its nodes receiving 1.5-6.9 MiB from
    # peers meanwhile (the pieces they had partly sent before ALL)...
    assert taken_back < len(modes), f"ALL was never taken back: {said}"
    assert modes[taken_back][0] <= fed_until + 6.0, said
    # ...and S3 no longer sent every node all it lacked (with ALL kept: `lacking`, here
    # 88-95 MiB). Measured with the change: 6-18 MiB, where nobody held 1-12 MiB (the
    # rest: pieces in flight when the plan changed, and stripes read meanwhile)
    assert after <= nobody + (lacking - nobody) // 2, said
    # the pieces read under ALL reached libtorrent: nothing was fetched twice from peers
    assert received <= NODES * SIZE * 1.05, said
