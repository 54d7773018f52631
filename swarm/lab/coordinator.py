"""``swarm coordinator`` on a lab host (a namespace or a loopback address)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

from swarm.fleetauth import fleet_token
from swarm.lab.hosts import LabHost
from swarm.lab.procs import KILL_GRACE, kill_group, signal_group
from swarm.lab.s3 import SWARM

COORDINATOR_PORT = 7070
READY_TIMEOUT = 30.0


class Coordinator:
    """One coordinator process: :meth:`start` (returns once ``/healthz`` answers),
    :meth:`stop` (SIGTERM, then SIGKILL), :meth:`kill` (SIGKILL: a crash). It may be
    started again after either (a restart; ``db`` keeps its history)."""

    def __init__(
        self,
        host: LabHost,
        env: dict[str, str],
        log: Path,
        port: int = COORDINATOR_PORT,
        db: Path | None = None,
        args: tuple[str, ...] = (),
        verbose: int = 0,
    ) -> None:
        self.host = host
        self.args = args
        """More ``swarm coordinator`` options (e.g. ``--origin-rate unlimited``)."""
        self.verbose = verbose
        """``swarm -v`` count (2: debug, e.g. each allocation's inputs in its log)."""
        self.env = env
        self.log = log
        self.port = port
        self.db = db
        self.url = f"http://{host.ip}:{port}"
        secret = env.get("SWARM_SECRET")
        self.token = fleet_token(secret) if secret else None
        """The fleet token its API and tracker require (a fleet with a secret)."""
        # the baselines announce to the same tracker: with the token, as daemons do
        self.tracker_url = self.url + "/announce" + (f"?token={self.token}" if self.token else "")
        self.process: subprocess.Popen[Any] | None = None

    def start(self, wait: bool = True) -> subprocess.Popen[Any]:
        """Start it (a running one is stopped first); unless ``wait`` is false, return
        once it answers."""
        self.stop()
        verbosity = [f"-{'v' * self.verbose}"] if self.verbose else []
        args = [*SWARM, *verbosity, "coordinator", "--listen", f"{self.host.ip}:{self.port}"]
        if self.db is not None:
            args += ["--db", str(self.db)]
        args += self.args
        with self.log.open("ab") as out:
            self.process = self.host.popen(
                args, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        if wait:
            self.wait_ready()
        return self.process

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        self.host.wait_http(self.url + "/healthz", timeout, "the coordinator")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            signal_group(self.process, signal.SIGTERM)
            try:
                self.process.wait(KILL_GRACE * 2)
            except subprocess.TimeoutExpired:
                kill_group(self.process)
        self.process = None

    def kill(self) -> None:
        """SIGKILL (the coordinator crashing); :meth:`start` brings it back."""
        if self.process:
            kill_group(self.process)
        self.process = None
