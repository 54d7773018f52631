"""Processes of the lab: stopping them (groups, daemons by pid file) and their CPU time.

Shared by both kinds of host (:mod:`swarm.lab.netlab` namespaces, :mod:`swarm.lab.hosts`
loopback) and by everything that starts swarm nodes: ``swarm demo``, the tests, the bench.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

KILL_GRACE = 5.0
"""Seconds between SIGTERM and SIGKILL when stopping the lab's processes."""
DAEMON_GRACE = 10.0
"""Seconds a node daemon gets to exit on SIGTERM (it saves resume data) before SIGKILL."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

HTTP_READY = """\
import sys, time, urllib.request
url, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
while True:
    try:
        urllib.request.urlopen(url, timeout=2).close()
        break
    except OSError as error:
        if getattr(error, "code", None) is not None:
            break  # an HTTP error status is an answer
        if time.monotonic() > deadline:
            sys.exit("%s not ready: %s" % (url, error))
        time.sleep(0.1)
"""
"""``python -c HTTP_READY URL TIMEOUT``: wait until URL answers, from wherever it runs
(inside a namespace, the root namespace cannot reach the lab's addresses)."""


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def signal_group(process: subprocess.Popen[Any], signum: int) -> None:
    """Signal ``process``'s group (it leads one: started with ``start_new_session``)."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def kill_group(process: subprocess.Popen[Any]) -> None:
    """SIGKILL ``process``'s group and reap it (bounded)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(KILL_GRACE)


def stop_process(process: subprocess.Popen[Any], grace: float = DAEMON_GRACE) -> None:
    """SIGTERM ``process`` (not its group), wait up to ``grace`` s, then SIGKILL; reaped."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(KILL_GRACE)


def daemon_pid(home: Path) -> int | None:
    """The pid a node daemon wrote to its home (``daemon.pid``), or None."""
    try:
        return int((home / "daemon.pid").read_text())
    except (OSError, ValueError):
        return None


def stop_daemons(homes: Iterable[Path], wait: bool = True, grace: float = DAEMON_GRACE) -> None:
    """SIGTERM the node daemon of every home (``swarm fetch`` starts one, detached, and
    it writes ``daemon.pid``); unless ``wait`` is false, wait for them all, SIGKILL after
    ``grace`` seconds."""
    pids = [pid for pid in map(daemon_pid, homes) if pid]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    if not wait:
        return
    deadline = time.monotonic() + grace
    for pid in pids:
        while pid_alive(pid) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.05)  # bounded by ``grace``; a foreign pid cannot be waited on
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
        _reap(pid)


def _reap(pid: int) -> None:
    """Reap ``pid`` if it is an exited child of ours (else it would stay a zombie)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def cpu_seconds(pid: int, children: bool = True) -> float | None:
    """User + system CPU seconds ``pid`` has used (a zombie's too), plus, with
    ``children``, those of the children it has reaped; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    # after the ")": state is field 3 of stat(5), so utime (14) is index 11 here
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / CLOCK_TICKS


def own_cpu_seconds(pid: int | None) -> float:
    """CPU seconds ``pid`` itself has used (its reaped children left out), 0 for None or a
    process gone: what a bench counts from a mark to a mark."""
    return (cpu_seconds(pid, children=False) or 0.0) if pid is not None else 0.0
