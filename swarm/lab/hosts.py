"""What the lab needs of a host, and the loopback host (no namespaces, no root).

A host runs processes and has an address others reach it at. Two kinds:

- :class:`swarm.lab.netlab.Host`: a network namespace on the lab's bridge, tbf-shaped
  (the fleet tests, ``bench/fleet.py``); needs root.
- :class:`LocalHost`: a loopback address (127.0.0.x) of this machine, unshaped
  (``swarm demo``, the integration tests); needs nothing.

:mod:`swarm.lab.s3` and :mod:`swarm.lab.coordinator` start their servers on either.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from typing import Any, Protocol

from swarm.lab.procs import stop_process


class LabHost(Protocol):
    """The interface :mod:`swarm.lab.s3` and :mod:`swarm.lab.coordinator` use."""

    name: str
    ip: str

    def popen(
        self, args: Sequence[str | os.PathLike[str]], env: dict[str, str] | None = None, **kw: Any
    ) -> subprocess.Popen[Any]: ...

    def run(
        self,
        args: Sequence[str | os.PathLike[str]],
        env: dict[str, str] | None = None,
        timeout: float = 60.0,
        check: bool = True,
        **kw: Any,
    ) -> subprocess.CompletedProcess[str]: ...

    def wait_http(self, url: str, timeout: float, what: str) -> None: ...


class HostError(RuntimeError):
    """A process of a loopback host failed or a server did not start."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the OS's pick)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class LocalHost:
    """A loopback address of this machine; its processes are stopped by :meth:`stop`
    (SIGTERM in reverse start order, SIGKILL after a grace), whatever happened."""

    def __init__(self, name: str = "local", ip: str = "127.0.0.1") -> None:
        self.name = name
        self.ip = ip
        self.processes: list[subprocess.Popen[Any]] = []

    def popen(
        self, args: Sequence[str | os.PathLike[str]], env: dict[str, str] | None = None, **kw: Any
    ) -> subprocess.Popen[Any]:
        kw.setdefault("stdin", subprocess.DEVNULL)
        process = subprocess.Popen([str(a) for a in args], env=env, **kw)
        self.processes.append(process)
        return process

    def run(
        self,
        args: Sequence[str | os.PathLike[str]],
        env: dict[str, str] | None = None,
        timeout: float = 60.0,
        check: bool = True,
        **kw: Any,
    ) -> subprocess.CompletedProcess[str]:
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw.setdefault("capture_output", True)
        try:
            done = subprocess.run(
                [str(a) for a in args], env=env, timeout=timeout, text=True, check=False, **kw
            )
        except subprocess.TimeoutExpired:
            raise HostError(f"{self.name}: timed out after {timeout:g}s: {list(args)}") from None
        if check and done.returncode != 0:
            raise HostError(
                f"{self.name}: {list(args)} failed ({done.returncode}): "
                f"{(done.stderr or done.stdout or '').strip()[-2000:]}"
            )
        return done

    def wait_http(self, url: str, timeout: float, what: str) -> None:
        """Return once ``url`` answers (any HTTP status is an answer)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(url, timeout=1).close()
                return
            except OSError as error:
                if getattr(error, "code", None):  # an HTTP error status is an answer
                    return
            if time.monotonic() > deadline:
                raise HostError(f"{what} did not start within {timeout:.0f}s ({url})")
            time.sleep(0.1)  # polling a server that is starting: nothing to wait on

    def stop(self) -> None:
        """Stop every process started here, the last started first."""
        for process in reversed(self.processes):
            stop_process(process)
        self.processes.clear()
