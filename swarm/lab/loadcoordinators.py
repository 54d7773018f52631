"""``swarm coordinator`` processes on loopback for the coordinator load bench
(``bench/coordinator.py``): fresh ones for each fleet size, a private ``redis-server``
for them to share, and what each spent (CPU, peak memory, requests it counted)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from swarm.lab.hosts import free_port
from swarm.lab.procs import cpu_seconds

BIN = Path(sys.executable).parent


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` so far (0 once it is gone)."""
    return cpu_seconds(pid, children=False) or 0.0


def proc_hwm(pid: int) -> int:
    """Peak resident memory of ``pid``, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


@dataclass
class Coordinator:
    """One coordinator process the bench started, and what it spent."""

    url: str
    process: subprocess.Popen[bytes]
    cpu0: float = 0.0
    cpu: float | None = None
    """CPU seconds over the run, kept at kill time for a coordinator killed mid-run."""
    hwm: int = 0
    handled: int = 0
    """Reports and announces the coordinator counted (its /metrics), answered in time or not."""


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
def coordinators(count: int, store: str | None, workdir: Path) -> Iterator[list[Coordinator]]:
    started: list[Coordinator] = []
    try:
        for index in range(count):
            port = free_port()
            command = [str(BIN / "swarm"), "coordinator", "--listen", f"127.0.0.1:{port}"]
            if store:
                command += ["--store", store]
            log = (workdir / f"coordinator{index}.log").open("wb")
            env = {k: v for k, v in os.environ.items() if k != "SWARM_SECRET"}
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
            log.close()
            started.append(Coordinator(f"http://127.0.0.1:{port}", process))
        for coordinator in started:
            wait_healthy(coordinator)
            coordinator.cpu0 = proc_cpu(coordinator.process.pid)
        yield started
    finally:
        for coordinator in started:
            if coordinator.process.poll() is None:
                coordinator.process.kill()
            coordinator.process.wait(10)


def handled(coordinator: Coordinator) -> int:
    """Reports and announces the coordinator processed, from its Prometheus counters."""
    try:
        with urllib.request.urlopen(coordinator.url + "/metrics", timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return 0
    total = 0.0
    for line in text.splitlines():
        if line.startswith(("swarm_reports_total ", "swarm_announces_total{")):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def wait_healthy(coordinator: Coordinator) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if coordinator.process.poll() is not None:
            raise SystemExit(f"coordinator exited with {coordinator.process.returncode}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(coordinator.url + "/healthz", timeout=1),
        ):
            return
        time.sleep(0.05)
    raise SystemExit("coordinator did not answer /healthz within 30 s")
