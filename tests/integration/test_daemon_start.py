"""How ``swarm fetch`` learns that the daemon it forked serves (a pipe, not polling), and
how it ends (its own code and output, without tearing down what it shares with it)."""

from __future__ import annotations

import json
import subprocess
import sys
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
