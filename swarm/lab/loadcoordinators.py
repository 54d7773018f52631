"""``swarm coordinator`` processes on loopback for the coordinator load bench
(``bench/coordinator.py``): fresh ones for each fleet size, a private ``redis-server``
for them to share, and what each spent (CPU, peak memory, requests it counted)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from swarm.lab.coordinator import Coordinator
from swarm.lab.hosts import LocalHost, free_port
from swarm.lab.procs import own_cpu_seconds


def proc_hwm(pid: int) -> int:
    """Peak resident memory of ``pid``, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


@dataclass
class LoadCoordinator:
    """One coordinator the bench started (the lab's :class:`Coordinator` on loopback),
    and what it spent over a run."""

    server: Coordinator
    cpu0: float = 0.0
    cpu: float | None = None
    """CPU seconds over the run, kept at kill time for a coordinator killed mid-run."""
    hwm: int = 0
    handled: int = 0
    """Reports and announces the coordinator counted (its /metrics), answered in time or not."""

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def pid(self) -> int:
        assert self.server.process is not None, "not running"
        return self.server.process.pid

    def begin(self) -> None:
        """The run starts: its CPU is counted from here."""
        self.cpu0 = own_cpu_seconds(self.pid)

    def measure(self) -> None:
        """What it spent since :meth:`begin` and the requests it counted (blocking: one
        HTTP request)."""
        self.cpu = own_cpu_seconds(self.pid) - self.cpu0
        self.hwm = proc_hwm(self.pid)
        self.handled = handled(self.url)


REDIS_SERVER = shutil.which("redis-server")
"""The ``redis-server`` binary (None: not installed; ``apt-get install redis-server``)."""


@contextlib.contextmanager
def redis_server(workdir: Path) -> Iterator[str]:
    """A private ``redis-server`` (no persistence) on a free loopback port, its URL while
    this is held; stopped by pid. RuntimeError if it is not installed or does not
    answer within 10 s."""
    if REDIS_SERVER is None:
        raise RuntimeError("redis-server is not installed (apt-get install -y redis-server)")
    port = free_port()
    process = subprocess.Popen(
        [
            REDIS_SERVER,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.kill()
        process.wait(10)


@contextlib.contextmanager
def coordinators(count: int, store: str | None, workdir: Path) -> Iterator[list[LoadCoordinator]]:
    """``count`` fresh coordinators on free loopback ports (sharing ``store``, a Redis
    URL, if given), ready; killed on exit."""
    host = LocalHost()
    env = {k: v for k, v in os.environ.items() if k != "SWARM_SECRET"}  # an open fleet
    args = ("--store", store) if store else ()
    started = [
        LoadCoordinator(
            Coordinator(host, env, workdir / f"coordinator{i}.log", free_port(), args=args)
        )
        for i in range(count)
    ]
    try:
        for coordinator in started:
            coordinator.server.start(wait=False)
        for coordinator in started:
            coordinator.server.wait_ready()
        yield started
    finally:
        for coordinator in started:
            coordinator.server.kill()
        host.stop()


def handled(url: str) -> int:
    """Reports and announces the coordinator at ``url`` processed, from its Prometheus
    counters (0 if it does not answer)."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return 0
    total = 0.0
    for line in text.splitlines():
        if line.startswith(("swarm_reports_total ", "swarm_announces_total{")):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)
