"""`swarm demo`: the whole system on one machine, as a newcomer first meets it.

An embedded S3 server (moto's, see :mod:`swarm.demo_s3`), a coordinator, and 4 nodes on
loopback addresses 127.0.0.2-5. A generated artifact is published, then fetched on every
node at once with live per-node progress and bytes per source; then, for comparison,
every node reads it from S3 itself (``swarm fetch --no-daemon``, what a fleet without
swarm does). S3's egress is capped at :data:`DEMO_S3_RATE`, the origin link a fleet
shares: the summary sets the two runs' times and S3 bytes (measured at the S3 server)
side by side. Everything started here is stopped here, by pid, whatever happens.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table

from swarm.errors import SwarmError
from swarm.lab.coordinator import Coordinator
from swarm.lab.hosts import HostError, LocalHost, free_port
from swarm.lab.procs import stop_daemons
from swarm.lab.s3 import SWARM, S3Error, S3Server, publish
from swarm.pieces import write_random_file

DEMO_SIZE = 128 << 20
DEMO_NODES = 4
DEMO_S3_RATE = 80_000_000
"""Bytes/s the demo's S3 server sends at most, over all connections: a fleet's shared
origin link (a NAT gateway, a VPC endpoint: 640 Mbit/s here). Uncapped, loopback S3
outruns what four nodes' checksums can take on a laptop, and the comparison would
measure CPU, not the network a fleet has."""
DEMO_BUCKET = "swarm-demo"
READY_TIMEOUT = 30.0
FETCH_TIMEOUT = 120.0
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "demo",
    "AWS_SECRET_ACCESS_KEY": "demo-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass
class NodeView:
    """What the demo shows of one node, fed by its `swarm fetch --json` events."""

    name: str
    ip: str
    home: Path
    dest: Path
    have: int = 0
    total: int = 0
    by_source: dict[str, int] = field(default_factory=dict)
    peers: int = 0
    seconds: float | None = None
    sha256: str | None = None
    """What swarm verified the whole file against before it appeared at ``dest``."""
    error: str | None = None
    process: subprocess.Popen[str] | None = None

    def follow(self, stream: TextIO) -> None:
        for line in stream:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            kind = event.get("event")
            if kind == "progress":  # `--no-daemon` reads S3 alone: it says no sources
                self.have, self.total = event["bytes"], event["total"]
                self.by_source = event.get("bytes_by_source") or {"s3": self.have}
                self.peers = event.get("peers", 0)
            elif kind == "done":
                self.have = self.total = event["size"]
                self.by_source = event.get("bytes_by_source") or {"s3": self.have}
                self.seconds, self.sha256 = event["seconds"], event.get("sha256")
            elif kind == "error":
                self.error = event["message"]


def table(nodes: list[NodeView], size: int) -> Table:
    view = Table(title=f"swarm demo: {size >> 20} MiB to {len(nodes)} nodes")
    for column in ("node", "progress", "from peers", "from S3", "peers", "time"):
        view.add_column(column, justify="right" if column != "node" else "left")
    for node in nodes:
        share = node.have / size if size else 0
        bar = "█" * int(share * 10) + "·" * (10 - int(share * 10))
        state = (
            f"{node.seconds:.1f}s"
            if node.seconds is not None
            else ("failed" if node.error else "…")
        )
        view.add_row(
            node.name,
            f"{bar} {share:5.1%}",
            f"{node.by_source.get('peers', 0) / 2**20:6.1f} MiB",
            f"{node.by_source.get('s3', 0) / 2**20:6.1f} MiB",
            str(node.peers),
            state,
        )
    return view


class Stack:
    """What the demo runs on loopback (:class:`swarm.lab.hosts.LocalHost`): the S3 server,
    the coordinator, the nodes' fetches and their daemons; stopped by pid on exit."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.host = LocalHost("demo", "127.0.0.1")
        self.daemon_homes: list[Path] = []

    def stop(self) -> None:
        self.stop_daemons()
        self.host.stop()

    def stop_daemons(self, wait: bool = True) -> None:
        """SIGTERM every node daemon (started by `swarm fetch`, detached); unless ``wait``
        is false, wait for them (SIGKILL after 10 s). ``stop`` waits for them all."""
        stop_daemons(self.daemon_homes, wait=wait)
        if wait:
            self.daemon_homes.clear()


@contextlib.contextmanager
def workspace(keep: bool) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="swarm-demo-"))
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


def run_demo(
    size: int = DEMO_SIZE,
    nodes: int = DEMO_NODES,
    keep: bool = False,
    console: Console | None = None,
    s3_rate: int = DEMO_S3_RATE,
) -> int:
    """Run the demo; return 0 when every node holds the verified artifact."""
    if importlib.util.find_spec("moto") is None:
        raise SwarmError(
            "swarm demo: its S3 server is moto, in the demo extra: "
            "pip install 'swarm-artifacts[demo]' (or run `make demo`)"
        )
    console = console or Console()
    with workspace(keep) as work:
        stack = Stack(work)
        try:
            return _run(work, stack, SWARM, size, nodes, console, s3_rate)
        except (HostError, S3Error) as error:
            raise SwarmError(f"swarm demo: {error}") from None
        finally:
            stack.stop()
            if keep:
                console.print(f"kept {work}")


@dataclass
class Run:
    """One fetch of the artifact on every node: what the summary compares."""

    views: list[NodeView]
    seconds: float
    s3_bytes: int
    verified: int


def _run(
    work: Path,
    stack: Stack,
    swarm: list[str],
    size: int,
    count: int,
    console: Console,
    s3_rate: int,
) -> int:
    env = {**os.environ, **CREDENTIALS}
    for var in ("SWARM_CATALOG", "SWARM_SECRET", "AWS_PROFILE", "SWARM_COORDINATOR"):
        env.pop(var, None)
    host = stack.host
    s3 = S3Server(host, "demo", free_port(host.ip), work, env, rate=s3_rate)
    coordinator = Coordinator(
        host, env, work / "coordinator.log", port=free_port(host.ip), db=work / "history.db"
    )
    env["AWS_ENDPOINT_URL"] = s3_url = s3.url
    env["SWARM_CONFIG"] = str(work / "no-config.toml")

    link = f"{s3_rate * 8 / 1e6:.0f} Mbit/s" if s3_rate else "uncapped"
    console.print(
        f"[bold]1.[/] S3 server (moto, egress {link}: the fleet's origin link) on {s3_url}, "
        f"coordinator on {coordinator.url}"
    )
    s3.start()
    coordinator.start(wait=False)
    artifact = work / "index.db"
    console.print(f"[bold]2.[/] generating a {size >> 20} MiB artifact and publishing it")
    sha256 = write_random_file(artifact, size, seed=42)  # while the servers start
    s3.wait_ready(READY_TIMEOUT)
    coordinator.wait_ready(READY_TIMEOUT)
    s3.create_bucket(DEMO_BUCKET)
    env["SWARM_CATALOG"] = f"s3://{DEMO_BUCKET}/catalog/"
    publish(host, env, artifact, f"s3://{DEMO_BUCKET}/builds/index.db", name="index.db",
            timeout=FETCH_TIMEOUT)  # fmt: skip

    console.print(f"[bold]3.[/] `swarm fetch index.db` on {count} nodes at once")
    node_env = {**env, "SWARM_COORDINATOR": coordinator.url}
    with_swarm = _fetch_all(work / "swarm", stack, swarm, node_env, size, count, console,
                            s3_url, sha256, daemons=True)  # fmt: skip
    stack.stop_daemons(wait=False)  # they exit while the comparison starts
    failed = [v for v in with_swarm.views if v.process and v.process.returncode != 0]
    if failed or with_swarm.verified != count:
        for view in failed:
            console.print(f"[red]{view.name} failed: {view.error}[/]")
        console.print(f"\n{with_swarm.verified}/{count} nodes hold the verified artifact.")
        return 1
    peers_total = sum(v.by_source.get("peers", 0) for v in with_swarm.views)
    console.print(
        f"\n[bold]4.[/] {count}/{count} nodes hold the verified artifact in "
        f"{with_swarm.seconds:.1f}s. S3 sent {with_swarm.s3_bytes / size:.2f}x the artifact; "
        f"peers {peers_total / size:.2f}x."
    )

    console.print(
        "\n[bold]5.[/] for comparison, every node reads S3 itself "
        "(`swarm fetch --no-daemon`: ranged GETs, no peers)"
    )
    alone = _fetch_all(work / "s3-only", stack, swarm, env, size, count, console, s3_url,
                       sha256, daemons=False)  # fmt: skip
    if alone.verified != count:
        console.print(f"[red]{alone.verified}/{count} nodes reading S3 alone got the artifact[/]")
        return 1
    summary = Table(title=f"{size >> 20} MiB to {count} nodes, S3 egress {link}")
    for column in ("", "time", "S3 sent", "from peers"):
        summary.add_column(column, justify="right" if column else "left")
    summary.add_row(
        "swarm",
        f"[bold]{with_swarm.seconds:.1f}s[/]",
        f"[bold]{with_swarm.s3_bytes / size:.2f}x[/]",
        f"{peers_total / size:.2f}x",
    )
    summary.add_row(
        "every node reading S3", f"{alone.seconds:.1f}s", f"{alone.s3_bytes / size:.2f}x", "-"
    )
    console.print()
    console.print(summary)
    speed = alone.seconds / with_swarm.seconds
    console.print(
        (f"swarm: {speed:.1f}x faster" if speed >= 1 else f"swarm took {1 / speed:.1f}x the time")
        + f", and S3 sent {with_swarm.s3_bytes / size:.2f}x the artifact instead of "
        f"{alone.s3_bytes / size:.2f}x (bytes counted at the S3 server)."
    )
    console.print("Daemons, coordinator and S3 server are stopped now; nothing is left running.")
    return 0


def _fetch_all(
    work: Path,
    stack: Stack,
    swarm: list[str],
    env: dict[str, str],
    size: int,
    count: int,
    console: Console,
    s3_url: str,
    sha256: str,
    *,
    daemons: bool,
) -> Run:
    """``swarm fetch index.db`` on ``count`` nodes at once (through each node's daemon,
    or ``--no-daemon``), with a live table; the S3 bytes are the server's count."""
    sent_before = _s3_bytes_out(s3_url)
    views = []
    for i in range(count):
        ip = f"127.0.0.{i + 2}"
        home = work / f"node{i + 1}"
        home.mkdir(parents=True)
        view = NodeView(f"node{i + 1}", ip, home, home / "index.db")
        if daemons:
            stack.daemon_homes.append(home)
            args = [*swarm, "fetch", "index.db", str(view.dest), "--listen", ip, "--json"]
        else:
            args = [*swarm, "fetch", "index.db", str(view.dest), "--no-daemon", "--json"]
        view.process = subprocess.Popen(
            args,
            env={**env, "SWARM_HOME": str(home)},
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        stack.host.processes.append(view.process)
        threading.Thread(target=view.follow, args=(view.process.stdout,), daemon=True).start()
        views.append(view)
    started = time.monotonic()
    with Live(table(views, size), console=console, refresh_per_second=4) as live:
        while any(v.process and v.process.poll() is None for v in views):
            if time.monotonic() - started > FETCH_TIMEOUT:
                raise SwarmError(f"swarm demo: nodes did not finish within {FETCH_TIMEOUT:.0f}s")
            live.update(table(views, size))
            time.sleep(0.1)
        seconds = time.monotonic() - started
        for view in views:  # the reader threads take the last events
            if view.process and view.process.stdout:
                with contextlib.suppress(OSError, ValueError):
                    view.process.wait(5)
        _settle(views)
        live.update(table(views, size))
    # swarm checks the whole file's SHA-256 before DEST appears; it says which in "done"
    verified = sum(1 for v in views if v.dest.exists() and v.sha256 == sha256)
    return Run(views, seconds, _s3_bytes_out(s3_url) - sent_before, verified)


def _settle(views: list[NodeView], timeout: float = 2.0) -> None:
    """Wait (briefly) until every finished node's reader thread saw its last event."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(
        v.seconds is None and v.error is None and v.process and v.process.returncode == 0
        for v in views
    ):
        time.sleep(0.02)


def _s3_bytes_out(s3_url: str) -> int:
    with urllib.request.urlopen(s3_url + "/_demo/stats", timeout=5) as response:
        return int(json.loads(response.read())["bytes_out"])
