"""`swarm demo`: the whole system on one machine, as a newcomer first meets it.

An embedded S3 server (moto's server mode), a coordinator, and 4 nodes on loopback
addresses 127.0.0.2-5. A generated artifact is published, then fetched on every node
at once with live per-node progress and bytes per source. Everything started here is
stopped here, by pid, whatever happens.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table

from swarm.errors import SwarmError
from swarm.pieces import file_sha256, write_random_file

DEMO_SIZE = 256 << 20
DEMO_NODES = 4
DEMO_BUCKET = "swarm-demo"
READY_TIMEOUT = 30.0
FETCH_TIMEOUT = 120.0
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "demo",
    "AWS_SECRET_ACCESS_KEY": "demo-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def wait_http(url: str, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError as error:
            if getattr(error, "code", None):  # an HTTP error status is an answer
                return
        if time.monotonic() > deadline:
            raise SwarmError(f"swarm demo: {what} did not start within {timeout:.0f}s")
        time.sleep(0.1)


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
    error: str | None = None
    process: subprocess.Popen[str] | None = None

    def follow(self, stream: TextIO) -> None:
        for line in stream:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            kind = event.get("event")
            if kind == "progress":
                self.have, self.total = event["bytes"], event["total"]
                self.by_source, self.peers = event["bytes_by_source"], event["peers"]
            elif kind == "done":
                self.have = self.total = event["size"]
                self.by_source, self.seconds = event["bytes_by_source"], event["seconds"]
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
    """Processes the demo starts, stopped in reverse order by pid on exit."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.processes: list[subprocess.Popen[Any]] = []
        self.daemon_homes: list[Path] = []

    def start(self, args: list[str], env: dict[str, str], log: str) -> subprocess.Popen[Any]:
        out = (self.workdir / log).open("wb")
        process = subprocess.Popen(
            args, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        out.close()
        self.processes.append(process)
        return process

    def stop(self) -> None:
        for home in self.daemon_homes:  # daemons were started by `swarm fetch`, detached
            pid_file = home / "daemon.pid"
            with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
        for home in self.daemon_homes:
            pid_file = home / "daemon.pid"
            with contextlib.suppress(FileNotFoundError, ValueError):
                pid = int(pid_file.read_text())
                deadline = time.monotonic() + 10
                while _alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.05)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(5)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie child of ours still "exists"; reap it if it is ours
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    return True


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
) -> int:
    """Run the demo; return 0 when every node holds the verified artifact."""
    console = console or Console()
    swarm = [sys.executable, "-m", "swarm"]
    with workspace(keep) as work:
        stack = Stack(work)
        try:
            return _run(work, stack, swarm, size, nodes, console)
        finally:
            stack.stop()
            if keep:
                console.print(f"kept {work}")


def _run(
    work: Path, stack: Stack, swarm: list[str], size: int, count: int, console: Console
) -> int:
    env = {**os.environ, **CREDENTIALS}
    for var in ("SWARM_CATALOG", "SWARM_SECRET", "AWS_PROFILE", "SWARM_COORDINATOR"):
        env.pop(var, None)
    s3_port, coord_port = free_port("127.0.0.1"), free_port("127.0.0.1")
    s3_url = f"http://127.0.0.1:{s3_port}"
    coordinator = f"http://127.0.0.1:{coord_port}"
    env["AWS_ENDPOINT_URL"] = s3_url
    env["SWARM_CONFIG"] = str(work / "no-config.toml")

    console.print(f"[bold]1.[/] S3 server (moto) on {s3_url}, coordinator on {coordinator}")
    stack.start(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(s3_port)], env, "s3.log"
    )
    stack.start(
        [
            *swarm,
            "coordinator",
            "--listen",
            f"127.0.0.1:{coord_port}",
            "--db",
            str(work / "history.db"),
        ],
        env,
        "coordinator.log",
    )
    wait_http(s3_url + "/moto-api/", READY_TIMEOUT, "the S3 server")
    wait_http(coordinator + "/healthz", READY_TIMEOUT, "the coordinator")

    import boto3

    boto3.client("s3", endpoint_url=s3_url, **_boto_credentials()).create_bucket(Bucket=DEMO_BUCKET)
    artifact = work / "index.db"
    console.print(f"[bold]2.[/] generating a {size >> 20} MiB artifact and publishing it")
    sha256 = write_random_file(artifact, size, seed=42)
    env["SWARM_CATALOG"] = f"s3://{DEMO_BUCKET}/catalog/"
    subprocess.run(
        [
            *swarm,
            "publish",
            str(artifact),
            f"s3://{DEMO_BUCKET}/builds/index.db",
            "--name",
            "index.db",
        ],
        env=env,
        check=True,
        timeout=FETCH_TIMEOUT,
        stdout=subprocess.DEVNULL,
    )

    console.print(f"[bold]3.[/] `swarm fetch index.db` on {count} nodes at once")
    views = []
    for i in range(count):
        ip = f"127.0.0.{i + 2}"
        home = work / f"node{i + 1}"
        home.mkdir()
        stack.daemon_homes.append(home)
        view = NodeView(f"node{i + 1}", ip, home, home / "index.db")
        node_env = {**env, "SWARM_HOME": str(home), "SWARM_COORDINATOR": coordinator}
        view.process = subprocess.Popen(
            [*swarm, "fetch", "index.db", str(view.dest), "--listen", ip, "--json"],
            env=node_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        threading.Thread(target=view.follow, args=(view.process.stdout,), daemon=True).start()
        views.append(view)
    started = time.monotonic()
    with Live(table(views, size), console=console, refresh_per_second=4) as live:
        while any(v.process and v.process.poll() is None for v in views):
            if time.monotonic() - started > FETCH_TIMEOUT:
                raise SwarmError(f"swarm demo: nodes did not finish within {FETCH_TIMEOUT:.0f}s")
            live.update(table(views, size))
            time.sleep(0.25)
        time.sleep(0.3)  # let the reader threads take the last events
        live.update(table(views, size))
    elapsed = time.monotonic() - started

    failed = [v for v in views if v.process and v.process.returncode != 0]
    good = [v for v in views if v.dest.exists() and file_sha256(v.dest) == sha256]
    s3_total = sum(v.by_source.get("s3", 0) for v in views)
    peers_total = sum(v.by_source.get("peers", 0) for v in views)
    console.print(
        f"\n[bold]4.[/] {len(good)}/{count} nodes hold the verified artifact in {elapsed:.1f}s. "
        f"Bytes from S3: {s3_total / size:.2f}x the artifact (every node reading S3 itself: "
        f"{count}x); from peers: {peers_total / size:.2f}x."
    )
    if failed or len(good) != count:
        for view in failed:
            console.print(f"[red]{view.name} failed: {view.error}[/]")
        return 1
    console.print("Daemons, coordinator and S3 server are stopped now; nothing is left running.")
    return 0


def _boto_credentials() -> dict[str, str]:
    return {
        "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        "region_name": CREDENTIALS["AWS_DEFAULT_REGION"],
    }
