"""How ``swarm fetch`` learns that the daemon it forked serves (a pipe, not polling), and
how it ends (its own code and output, without tearing down what it shares with it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from swarm.errors import NotFoundError
from tests.swarmnet import Node, Swarm, done_event

# Run in a process of its own: a fork of pytest's would carry its threads and state.
FORK_AND_WAIT = """
import json, os, select, sys, time
from pathlib import Path
from swarm.agent.client import DaemonClient, fork_daemon
home = Path(sys.argv[1])
pid, ready = fork_daemon(home, ["daemon", "--listen", sys.argv[2], "--udp-port", "0"])
started = time.monotonic()
readable, _, _ = select.select([ready], [], [], 30)
waited = time.monotonic() - started
byte = os.read(ready, 1) if readable else b""
alive = DaemonClient(home).alive()  # at once: no look at the socket before the byte
print(json.dumps({"pid": pid, "byte": byte.decode(), "alive": alive,
                  "readable": bool(readable), "waited": waited}))
"""


def _fork_and_wait(node: Node) -> dict[str, Any]:
    env = {k: v for k, v in node.env.items() if k != "SWARM_COORDINATOR"}
    done = subprocess.run(
        [sys.executable, "-c", FORK_AND_WAIT, str(node.home), node.ip],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


# The daemons these tests fork write daemon.pid before they serve; the fleet fixture stops
# them by it (Swarm.stop: swarm.lab.procs.stop_daemons), whatever the outcome.


def test_a_forked_daemon_writes_to_its_pipe_once_it_serves(fleet: Swarm) -> None:
    node = fleet.node(0)
    result = _fork_and_wait(node)
    assert result["byte"] == "1" and result["alive"] is True
    assert result["readable"] is True


def test_a_daemon_that_fails_at_start_closes_its_pipe(fleet: Swarm) -> None:
    # A second daemon for a home one already serves exits at once: the pipe ends with
    # no byte, and the waiting fetch goes on to say why (not after DAEMON_START_TIMEOUT).
    node = fleet.node(0)
    first = fleet.start_daemon(node)
    result = _fork_and_wait(node)
    assert result["byte"] == "" and result["alive"] is True  # the first one answers
    assert node.daemon_pid() == first.pid
    # the pipe's end, not the select's 30 s timeout: the second daemon exits at its lock
    assert result["readable"] is True and result["waited"] < 10


def test_a_fetch_that_forked_its_daemon_exits_with_its_code_and_all_its_output(
    fleet: Swarm, tmp_path: Path
) -> None:
    # Such a fetch leaves by os._exit, not the interpreter's teardown (swarm.cli.main):
    # its exit code, its last JSON event and its message must get out all the same.
    node = fleet.node(0)
    done = done_event(node.fetch("index.db", tmp_path / "index.db"), 60)
    assert done["sha256"] and (tmp_path / "index.db").exists()
    assert node.daemon_pid() is not None  # this fetch forked it

    node = fleet.node(1)
    missing = node.fetch("ghost.db", tmp_path / "ghost.db")
    out, err = missing.communicate(timeout=60)
    assert missing.returncode == NotFoundError.exit_code == 3, err
    assert json.loads(out.splitlines()[-1])["event"] == "error"
    assert "ghost.db" in err and not (tmp_path / "ghost.db").exists()
    assert node.daemon_pid() is not None


def test_sigusr1_writes_a_forked_daemons_stacks_to_its_log_and_it_goes_on(
    fleet: Swarm, tmp_path: Path
) -> None:
    # What a wedged daemon waits on, without stopping it (the fleet harness asks for it
    # when a run times out).
    node = fleet.node(0)
    assert _fork_and_wait(node)["alive"] is True
    pid = node.daemon_pid()
    assert pid is not None
    log = node.home / "daemon.log"
    before = log.stat().st_size
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 10
    dumped = ""
    while "Thread 0x" not in dumped and time.monotonic() < deadline:
        time.sleep(0.05)  # faulthandler writes from the signal handler: a moment
        dumped = log.read_bytes()[before:].decode(errors="replace")
    assert "Current thread 0x" in dumped or "Thread 0x" in dumped, dumped
    assert "swarm/agent/serve.py" in dumped or "asyncio" in dumped, dumped  # the loop's
    done = done_event(node.fetch("index.db", tmp_path / "index.db"), 60)
    assert done["sha256"] and node.daemon_pid() == pid  # the same daemon answered
