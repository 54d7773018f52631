"""The fleet's client processes, one per node, and what they cost: each client's
``done`` event, exit and CPU seconds (:class:`Job`), and the machine's CPU use while they
run (:class:`CpuSampler`)."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from swarm.lab.hosts import LabHost
from swarm.lab.procs import cpu_seconds

CPU_SAMPLE = 1.0
"""Seconds between /proc/stat samples; a sample >= 95% busy counts as saturated."""


class FleetError(Exception):
    """A failure of the setup or of one system's run."""


class Job:
    """One client process on one host; a thread reads its stdout for a ``done`` event.

    ``settled`` is set once the client is done (a JSON ``done`` line, or a clean exit when
    ``done_on_exit``) or has failed (exit without ``done``).
    """

    def __init__(
        self,
        name: str,
        host: LabHost,
        args: list[str],
        env: dict[str, str],
        log_path: Path,
        started: float,
        done_on_exit: bool = False,
    ) -> None:
        self.name = name
        self.started = started
        self.done_on_exit = done_on_exit
        self.done_at: float | None = None
        self.done_event: dict[str, Any] | None = None
        self.error: str | None = None
        self.settled = threading.Event()
        self.reaped = threading.Event()
        self.exit_cpu: float | None = None
        self.tail: deque[str] = deque(maxlen=40)
        self.log_path = log_path
        with log_path.open("ab") as stderr:
            self.process = host.popen(
                args, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True
            )
        self._thread = threading.Thread(target=self._read, name=f"job-{name}", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.tail.append(line.rstrip())
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if event.get("event") == "done" and self.done_at is None:
                        self.done_at = time.monotonic()
                        self.done_event = event
                        self.settled.set()
                    elif event.get("event") == "error":
                        self.error = event.get("message", line)
        code = self._reap()
        if self.done_at is None:
            if code == 0 and self.done_on_exit:
                self.done_at = time.monotonic()
            else:
                self.error = self.error or f"exited with {code} before it was done"
        self.settled.set()

    def _reap(self) -> int:
        """Wait for the process with wait4, which also gives the CPU it used."""
        try:
            _, status, usage = os.wait4(self.process.pid, 0)
        except ChildProcessError:  # reaped by a stop meanwhile (Popen.wait)
            code = self.process.wait()
        else:
            self.exit_cpu = usage.ru_utime + usage.ru_stime
            code = self.process.returncode = os.waitstatus_to_exitcode(status)
        self.reaped.set()
        return code

    def cpu_seconds(self) -> float:
        """CPU seconds the client has used so far (its reaped children included)."""
        cpu = cpu_seconds(self.process.pid)
        if cpu is None:  # exited and reaped: wait4 told
            self.reaped.wait(2)
            cpu = self.exit_cpu
        return cpu or 0.0

    @property
    def seconds(self) -> float:
        assert self.done_at is not None
        return self.done_at - self.started

    def last_said(self) -> str:
        """The client's last line of output (its last progress event), shortened."""
        last = self.tail[-1] if self.tail else "(nothing)"
        return last if len(last) <= 300 else last[:300] + "..."

    def describe_failure(self) -> str:
        stderr = ""
        with contextlib.suppress(OSError):
            stderr = self.log_path.read_text(errors="replace")[-1500:]
        out = "\n".join(self.tail)[-1500:]
        return f"{self.name}: {self.error}\n--- stdout tail:\n{out}\n--- stderr tail:\n{stderr}"


def wait_jobs(jobs: list[Job], timeout: float, what: str) -> None:
    """Wait until every job is settled; raise on the first failure or at ``timeout``."""
    deadline = time.monotonic() + timeout
    pending = list(jobs)
    while pending:
        job = pending[0]
        if not job.settled.wait(max(0.0, min(1.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                # (pending is popped in order: those after the first may be done)
                late = [j for j in pending if not j.settled.is_set()]
                left = ", ".join(j.name for j in late)
                said = "; ".join(f"{j.name}: {j.last_said()}" for j in late)
                raise FleetError(
                    f"{what}: timed out after {timeout:.0f}s; not done: {left} (their last "
                    f"output: {said})"
                )
            # check the others for an early failure meanwhile
            for other in pending:
                if other.settled.is_set() and other.error:
                    raise FleetError(f"{what} failed:\n{other.describe_failure()}")
            continue
        if job.error:
            raise FleetError(f"{what} failed:\n{job.describe_failure()}")
        pending.pop(0)


class CpuSampler:
    """Samples the machine's CPU use from /proc/stat once a second in a thread."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu", daemon=True)

    @staticmethod
    def _read() -> tuple[int, int]:
        with open("/proc/stat") as stat:
            values = [int(v) for v in stat.readline().split()[1:]]
        idle = values[3] + values[4]  # idle + iowait
        return sum(values) - idle, sum(values)

    def _run(self) -> None:
        busy0, total0 = self._read()
        stopped = False
        while not stopped:
            stopped = self._stop.wait(CPU_SAMPLE)  # the last sample is the partial second
            busy, total = self._read()
            if total > total0:
                self.samples.append((busy - busy0) / (total - total0))
            busy0, total0 = busy, total

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    @property
    def average(self) -> float:
        return statistics.fmean(self.samples) if self.samples else 0.0

    @property
    def saturated(self) -> float:
        if not self.samples:
            return 0.0
        return sum(s >= 0.95 for s in self.samples) / len(self.samples)
