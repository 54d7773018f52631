"""Swarm processes for tests: coordinator, node daemons (via `swarm fetch`), origin seeder.

Everything started here is stopped by its pid (daemons by their pid file), even when a
test fails: use the ``Swarm`` object as a context manager. The coordinator and the
stopping are :mod:`swarm.lab`'s (as for ``swarm demo`` and the fleet bench), on loopback.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarm.lab.coordinator import Coordinator
from swarm.lab.hosts import LocalHost
from swarm.lab.procs import daemon_pid, pid_alive, stop_daemons
from tests.servers import BIN, free_port, wait_until

SWARM = str(BIN / "swarm")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@dataclass
class Node:
    name: str
    ip: str
    home: Path
    env: dict[str, str]
    fetches: list[subprocess.Popen[str]] = field(default_factory=list)

    def fetch(self, source: str, dest: Path, *args: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [SWARM, "fetch", source, str(dest), "--listen", self.ip, "--json", *args],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.fetches.append(process)
        return process

    def daemon_pid(self) -> int | None:
        return daemon_pid(self.home)

    def status(self) -> dict[str, Any]:
        from swarm.agent.client import DaemonClient

        return DaemonClient(self.home).call("GET", "/v1/artifacts")

    def artifacts(self) -> list[dict[str, Any]]:
        """The daemon's artifacts, or [] while no daemon answers."""
        try:
            return self.status()["artifacts"]
        except OSError:
            return []


def done_event(process: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """Wait for a `swarm fetch --json` process; return its final event (fail on error)."""
    out, err = process.communicate(timeout=timeout)
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert process.returncode == 0, f"fetch failed ({process.returncode}): {err[-2000:]}"
    assert events and events[-1]["event"] == "done", out[-2000:]
    return events[-1]


class Swarm:
    """A coordinator and nodes on 127.0.0.x, cleaned up on exit."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.env = dict(env)
        self.nodes: list[Node] = []
        self.processes: list[subprocess.Popen[Any]] = []
        self.coordinator_port = free_port()
        self.coordinator_url = f"http://127.0.0.1:{self.coordinator_port}"
        self.coordinator: subprocess.Popen[Any] | None = None
        self._coordinator = Coordinator(
            LocalHost("coordinator", "127.0.0.1"),
            self.env,
            root / "coordinator.log",
            port=self.coordinator_port,
            db=root / "history.db",
        )

    def __enter__(self) -> Swarm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start_coordinator(self, *args: str) -> None:
        """Start (or restart) the coordinator with ``swarm coordinator`` options ``args``;
        returns once it answers."""
        self._coordinator.args = args
        self.coordinator = self._coordinator.start()
        self.processes.append(self.coordinator)

    def kill_coordinator(self) -> None:
        """SIGKILL the coordinator (a crash); ``start_coordinator`` brings it back."""
        self._coordinator.kill()

    def node(self, index: int) -> Node:
        ip = f"127.0.0.{index + 10}"
        home = self.root / f"node{index}"
        home.mkdir(parents=True, exist_ok=True)
        env = {**self.env, "SWARM_HOME": str(home), "SWARM_COORDINATOR": self.coordinator_url}
        node = Node(f"node{index}", ip, home, env)
        self.nodes.append(node)
        return node

    def start_daemon(
        self, node: Node, *args: str, verbose: bool = False, coordinator: bool = True
    ) -> subprocess.Popen[Any]:
        """Run ``swarm daemon`` for ``node`` (with ``args``; ``verbose``: its info lines
        too; ``coordinator`` False: none configured); return once its API answers (it
        restores held artifacts before it serves, so they are listed by then). Its
        output: ``daemon-started.log`` in the home."""
        log = (node.home / "daemon-started.log").open("ab")
        command = [SWARM, *(["-v"] if verbose else []), "daemon", "--listen", node.ip, *args]
        env = (
            node.env
            if coordinator
            else {k: v for k, v in node.env.items() if k != "SWARM_COORDINATOR"}
        )
        process = subprocess.Popen(command, env=env, stdout=log, stderr=log)
        log.close()
        self.processes.append(process)

        def answers() -> bool:
            try:
                node.status()
                return node.daemon_pid() == process.pid
            except OSError:
                return False

        wait_until(answers, 30, f"{node.name}'s daemon")
        return process

    def start_origin_seeder(self, catalog: str, name: str) -> Node:
        node = self.node(99)
        log = (node.home / "seeder.log").open("ab")
        process = subprocess.Popen(
            [
                str(BIN / "swarm-seeder"),
                "origin",
                "--catalog",
                catalog,
                "--artifact",
                name,
                "--listen",
                node.ip,
                "--coordinator",
                self.coordinator_url,
            ],
            env=node.env,
            stdout=log,
            stderr=log,
        )
        log.close()
        self.processes.append(process)
        return node

    def stop(self) -> None:
        stop_daemons([n.home for n in self.nodes], grace=10)
        for process in self.processes + [f for n in self.nodes for f in n.fetches]:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + 10
        for process in self.processes + [f for n in self.nodes for f in n.fetches]:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    return pid_alive(pid)
