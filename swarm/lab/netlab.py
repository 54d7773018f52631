"""A network lab of Linux network namespaces with tbf-shaped links (fleet tests, bench).

One "switch" namespace holds a bridge; every host is a namespace of its own joined to the
bridge by a veth pair, with an address in ``subnet`` and a token-bucket filter each way::

    host ns "<prefix><pid>-<n>-<name>"   switch ns "<prefix><pid>-<n>-sw"
    eth0 10.77.0.N/24  <-- veth -->  hN (port of bridge br0)
    egress tbf = upload              egress tbf = download

Nothing touches the root namespace's interfaces: the bridge and the bridge-side veths live
in the switch namespace, the host-side veths in the hosts' namespaces. Traffic can only
reach loopback and the lab's own addresses (the hosts have no default route).

Every name carries a tag made of ``prefix``, our pid and a counter, so labs of several
processes coexist and cleanup deletes only what this lab created. Cleanup kills every process the
lab started (their process groups, and any other process still inside a lab namespace,
such as daemons that detached into a session of their own), then deletes the namespaces,
which takes their veths and the bridge with them. It runs on ``__exit__`` (exceptions
included), at interpreter exit and on SIGTERM/SIGHUP (best effort, main thread only).

    with Lab("fl") as lab:
        a = lab.host("a", up_mbit=100, down_mbit=100)
        b = lab.host("b", up_mbit=100, down_mbit=100)
        print(tcpmeasure.measure_tcp(a, b, 20 << 20))   # ~12 MB/s: tbf holds

Needs root and ``ip`` (iproute2) with ``ip netns``; :func:`lab_unavailable` says why not.
:class:`swarm.lab.hosts.LocalHost` is the same interface on loopback, without namespaces.
:mod:`swarm.lab.tcpmeasure` measures a TCP flow across the lab (``measure_tcp``) and holds
the lab's self-check.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from swarm.lab.procs import HTTP_READY, KILL_GRACE, kill_group, pid_alive, signal_group

IP = shutil.which("ip") or "/usr/sbin/ip"
TC = shutil.which("tc") or "/usr/sbin/tc"
COMMAND_TIMEOUT = 20.0
"""Seconds any one ``ip``/``tc`` command may take (they take milliseconds)."""

SYSCTL = shutil.which("sysctl") or "/usr/sbin/sysctl"
CC_SYSCTL = "net.ipv4.tcp_congestion_control"
"""Per network namespace (Linux >= 4.15); IPv6 TCP follows it too."""


def machine_tcp_cc() -> str:
    """The machine's TCP congestion control (what a new namespace starts with)."""
    return Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()


def available_tcp_cc() -> list[str]:
    """The congestion controls this kernel has loaded."""
    return Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()


def allow_tcp_cc(name: str) -> None:
    """Let namespaces default to ``name``: only the first namespace may make a default of
    a congestion control outside ``tcp_allowed_congestion_control`` (EPERM otherwise).
    The machine's own default is left as it is; the list only grows."""
    allowed = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
    names = allowed.read_text().split()
    if name not in names:
        allowed.write_text(" ".join([*names, name]))


KERNEL_HZ = 250
"""Timer frequency assumed for tbf bursts: the common distro value (``CONFIG_HZ=250``).
With a 1000 Hz kernel the bursts below are just 4x larger than needed."""
BURST_FLOOR = 64 << 10
"""Smallest tbf bucket in bytes. tbf refills its bucket once per timer tick, so to carry
``rate`` the bucket must hold ``rate / HZ`` bytes (100 Mbit at 250 Hz: 50 KB); below that
the link runs slower than its rate. The floor also covers a 64 KiB GSO super-packet on a
veth, which tbf would otherwise have to segment."""
QUEUE_SECONDS = 0.1
"""tbf queue (``limit``) in seconds at line rate, on top of the burst: deep enough that a
handful of TCP flows at line rate are not dropped (drops would measure TCP's recovery, not
the link), shallow enough to keep the RTT under the link's bufferbloat of 100 ms."""
QUEUE_FLOOR = 256 << 10


def tbf_params(mbit: float) -> tuple[int, int, int]:
    """``(rate bit/s, burst bytes, limit bytes)`` for a tbf of ``mbit`` megabit/s."""
    if mbit <= 0:
        raise ValueError(f"link rate must be > 0 Mbit/s, got {mbit}")
    rate = int(mbit * 1_000_000)
    burst = max(BURST_FLOOR, 2 * rate // 8 // KERNEL_HZ)
    limit = burst + max(QUEUE_FLOOR, int(rate / 8 * QUEUE_SECONDS))
    return rate, burst, limit


def lab_unavailable() -> str | None:
    """Why a lab cannot run here (a reason for ``pytest.skip``), or None if it can."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (run the fleet tests as root)"
    if not Path(IP).exists() or not Path(TC).exists():
        return "iproute2 (`ip`, `tc`) is not installed"
    probe = f"swprobe-{os.getpid()}"
    try:
        _run([IP, "netns", "add", probe])
    except (LabError, OSError) as error:
        return f"`ip netns add` does not work here: {error}"
    try:
        _run([IP, "-n", probe, "link", "add", "probe0", "type", "veth", "peer", "name", "p1"])
        _run([TC, "-n", probe, "qdisc", "add", "dev", "probe0", "root", "tbf", "rate",
              "1mbit", "burst", "64kb", "limit", "256kb"])  # fmt: skip
    except (LabError, OSError) as error:
        return f"veth or tbf unavailable in this kernel: {error}"
    finally:
        with contextlib.suppress(LabError, OSError):
            _run([IP, "netns", "del", probe])
    return None


class LabError(RuntimeError):
    """A lab command failed; the message holds the command and its stderr."""


def _run(args: Sequence[str], timeout: float = COMMAND_TIMEOUT) -> str:
    try:
        done = subprocess.run(
            list(args), capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise LabError(f"timed out after {timeout:g}s: {' '.join(args)}") from None
    if done.returncode != 0:
        raise LabError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


@dataclass
class Host:
    """One namespace on the lab's bridge."""

    lab: Lab
    name: str
    netns: str
    ip: str
    up_mbit: float
    down_mbit: float
    port: str
    """The bridge-side veth (in the switch namespace); its rx is what this host sent."""
    processes: list[subprocess.Popen[Any]] = field(default_factory=list)

    def command(self, args: Sequence[str]) -> list[str]:
        """``args`` prefixed to run inside this host's namespace."""
        return [IP, "netns", "exec", self.netns, *map(str, args)]

    def popen(
        self, args: Sequence[str | os.PathLike[str]], env: dict[str, str] | None = None, **kw: Any
    ) -> subprocess.Popen[Any]:
        """Start ``args`` in this host (in a process group of its own, killed at cleanup)."""
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw.setdefault("start_new_session", True)
        process = subprocess.Popen(self.command([str(a) for a in args]), env=env, **kw)
        self.processes.append(process)
        self.lab._processes.append(process)
        return process

    def run(
        self,
        args: Sequence[str | os.PathLike[str]],
        env: dict[str, str] | None = None,
        timeout: float = 60.0,
        check: bool = True,
        **kw: Any,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``args`` in this host to completion within ``timeout`` (killed after it)."""
        process = self.popen(
            args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw
        )
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(process)
            raise LabError(f"{self.name}: timed out after {timeout:g}s: {list(args)}") from None
        finally:
            self._forget(process)
        done = subprocess.CompletedProcess(process.args, process.returncode, out, err)
        if check and done.returncode != 0:
            raise LabError(
                f"{self.name}: {list(args)} failed ({done.returncode}): "
                f"{(err or out or '').strip()[-2000:]}"
            )
        return done

    def _forget(self, process: subprocess.Popen[Any]) -> None:
        with contextlib.suppress(ValueError):
            self.processes.remove(process)
        with contextlib.suppress(ValueError):
            self.lab._processes.remove(process)

    def stop(self) -> None:
        """Stop every process of this host (started here or not); the host stays."""
        self.lab.stop_processes([self.netns])

    def set_rates(self, up_mbit: float, down_mbit: float) -> None:
        """Reshape this host's links (connections survive; see :func:`reshape`)."""
        reshape(self.netns, "eth0", up_mbit)
        reshape(self.lab.switch, self.port, down_mbit)
        self.up_mbit, self.down_mbit = up_mbit, down_mbit

    def tx_bytes(self) -> int:
        """Bytes this host has sent into the bridge (all protocols, headers included)."""
        return self.lab.port_stats(self.port)["rx"]

    def rx_bytes(self) -> int:
        """Bytes the bridge has delivered to this host."""
        return self.lab.port_stats(self.port)["tx"]

    def pids(self) -> list[int]:
        """Every process whose network namespace is this host's."""
        return self.lab.netns_pids(self.netns)

    def wait_http(self, url: str, timeout: float, what: str) -> None:
        """Return once ``url`` answers from inside this host (any HTTP status is an
        answer); LabError naming ``what`` after ``timeout`` seconds."""
        done = self.run(
            [sys.executable, "-c", HTTP_READY, url, str(timeout)],
            timeout=timeout + 15,
            check=False,
        )
        if done.returncode != 0:
            raise LabError(f"{self.name}: {what} did not answer at {url}: {done.stderr.strip()}")


_LIVE_LABS: weakref.WeakSet[Lab] = weakref.WeakSet()
_LAB_NUMBERS = itertools.count()
"""Labs of one process are numbered, so several may be open at once."""


def _cleanup_live_labs() -> None:
    for lab in list(_LIVE_LABS):
        with contextlib.suppress(Exception):
            lab.close()


atexit.register(_cleanup_live_labs)


class Lab:
    """A bridge in a namespace of its own, and hosts attached to it (context manager)."""

    def __init__(
        self, prefix: str = "lab", subnet: str = "10.77.0.0/24", tcp_cc: str | None = None
    ) -> None:
        """``tcp_cc``: the TCP congestion control of every host's namespace (``cubic``,
        ``bbr``...); None: the namespace's default, which a new namespace copies from the
        machine's (``bbr`` on the lab machine)."""
        if not re.fullmatch(r"[a-z][a-z0-9]{0,5}", prefix):
            raise ValueError(f"lab prefix must be 1-6 lowercase letters/digits, got {prefix!r}")
        self.tag = f"{prefix}{os.getpid()}-{next(_LAB_NUMBERS)}"
        self.network = ipaddress.ip_network(subnet)
        self._addresses: Iterator[Any] = iter(self.network.hosts())
        self.switch = f"{self.tag}-sw"
        self.hosts: dict[str, Host] = {}
        self._netns: list[str] = []
        self._processes: list[subprocess.Popen[Any]] = []
        self._closed = False
        self._old_handlers: dict[int, Any] = {}
        self.tcp_cc = tcp_cc

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> Lab:
        _LIVE_LABS.add(self)
        self._install_signal_handlers()
        try:
            self._add_netns(self.switch)
            _run([IP, "-n", self.switch, "link", "add", "br0", "type", "bridge"])
            _run([IP, "-n", self.switch, "link", "set", "br0", "up"])
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _install_signal_handlers(self) -> None:
        """Turn SIGTERM/SIGHUP into SystemExit so ``with`` blocks (and we) clean up."""
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum: int, frame: FrameType | None) -> None:
            raise SystemExit(128 + signum)

        for signum in (signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError, OSError):
                old = signal.getsignal(signum)
                if old in (signal.SIG_DFL, None):
                    self._old_handlers[signum] = old
                    signal.signal(signum, handler)

    def close(self) -> None:
        """Kill our processes, delete our namespaces (idempotent, never raises)."""
        if self._closed:
            return
        self._closed = True
        self.stop_processes()
        for netns in reversed(self._netns):
            with contextlib.suppress(LabError, OSError):
                _run([IP, "netns", "del", netns])
        self._netns.clear()
        for signum, old in self._old_handlers.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(signum, old if old is not None else signal.SIG_DFL)
        _LIVE_LABS.discard(self)

    def stop_processes(self, netns: Sequence[str] | None = None) -> None:
        """Stop every process we started and every process left inside our namespaces
        (or only those of ``netns``): SIGTERM, up to ``KILL_GRACE`` s, then SIGKILL."""
        spaces = list(self._netns if netns is None else netns)
        started = [p for p in self._processes if netns is None or _netns_of(p) in spaces]
        for process in started:
            signal_group(process, signal.SIGTERM)
        strays = {pid for ns in spaces for pid in self.netns_pids(ns)}
        for pid in strays:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + KILL_GRACE
        for process in started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.05, deadline - time.monotonic()))
            kill_group(process)
        while strays and time.monotonic() < deadline:
            strays = {pid for pid in strays if pid_alive(pid)}
            time.sleep(0.05)  # bounded by KILL_GRACE
        for ns in spaces:
            for pid in self.netns_pids(ns):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        self._processes = [p for p in self._processes if p not in started]
        for host in self.hosts.values():
            host.processes = [p for p in host.processes if p not in started]

    # -- building ---------------------------------------------------------------------------

    def _add_netns(self, name: str) -> None:
        _run([IP, "netns", "add", name])
        self._netns.append(name)
        _run([IP, "-n", name, "link", "set", "lo", "up"])

    def host(self, name: str, up_mbit: float, down_mbit: float) -> Host:
        """Add host ``name``: its namespace, a veth to the bridge, the next address,
        an upload tbf (host-side egress) and a download tbf (bridge-side egress)."""
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,30}", name) or name == "sw":
            raise ValueError(f"host name must be lowercase letters, digits, '-': {name!r}")
        if name in self.hosts:
            raise ValueError(f"host {name!r} already exists in this lab")
        if self._closed:
            raise LabError("the lab is closed")
        try:
            ip = str(next(self._addresses))
        except StopIteration:
            raise LabError(f"no address left in {self.network}") from None
        netns = f"{self.tag}-{name}"
        port = f"h{len(self.hosts)}"
        self._add_netns(netns)
        sw = [IP, "-n", self.switch]
        _run([*sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", netns])
        _run([*sw, "link", "set", port, "master", "br0"])
        _run([*sw, "link", "set", port, "up"])
        inside = [IP, "-n", netns]
        _run([*inside, "addr", "add", f"{ip}/{self.network.prefixlen}", "dev", "eth0"])
        _run([*inside, "link", "set", "eth0", "up"])
        if self.tcp_cc:
            allow_tcp_cc(self.tcp_cc)
            _run([IP, "netns", "exec", netns, SYSCTL, "-qw", f"{CC_SYSCTL}={self.tcp_cc}"])
        shape(netns, "eth0", up_mbit)
        shape(self.switch, port, down_mbit)
        host = Host(self, name, netns, ip, up_mbit, down_mbit, port)
        self.hosts[name] = host
        return host

    # -- observation ------------------------------------------------------------------------

    def port_stats(self, port: str) -> dict[str, int]:
        """``{"rx": bytes, "tx": bytes}`` of a bridge-side veth (switch namespace)."""
        out = _run([IP, "-n", self.switch, "-j", "-s", "link", "show", "dev", port])
        stats = json.loads(out)[0]["stats64"]
        return {"rx": int(stats["rx"]["bytes"]), "tx": int(stats["tx"]["bytes"])}

    def qdisc_drops(self) -> dict[str, int]:
        """tbf drops per link, ``{"<host>/up": n, "<host>/down": n}`` (0 = no loss)."""
        drops: dict[str, int] = {}
        for host in self.hosts.values():
            for key, netns, dev in (("up", host.netns, "eth0"), ("down", self.switch, host.port)):
                out = _run([TC, "-n", netns, "-j", "-s", "qdisc", "show", "dev", dev])
                drops[f"{host.name}/{key}"] = sum(int(q.get("drops", 0)) for q in json.loads(out))
        return drops

    @staticmethod
    def netns_pids(netns: str) -> list[int]:
        try:
            out = _run([IP, "netns", "pids", netns])
        except LabError:
            return []
        return [int(p) for p in out.split()]


def _netns_of(process: subprocess.Popen[Any]) -> str | None:
    """The namespace a process was started in by :meth:`Host.popen` (``ip netns exec NS``)."""
    args = process.args
    return str(args[3]) if isinstance(args, list) and len(args) > 3 else None


def shape(netns: str, dev: str, mbit: float) -> None:
    """Replace ``dev``'s root qdisc (in ``netns``) with a tbf of ``mbit`` (see tbf_params)."""
    rate, burst, limit = tbf_params(mbit)
    _run([TC, "-n", netns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
          f"{rate}bit", "burst", str(burst), "limit", str(limit)])  # fmt: skip


def reshape(netns: str, dev: str, mbit: float) -> None:
    """Give a shaped link a new rate: its tbf deleted and a new one added, not changed in
    place. A tbf changed to a smaller bucket keeps what it queued under the larger one,
    and a GSO packet at its head larger than the new bucket never leaves: the s3-slows
    bench's origin (100 Mbit to 12.5 at a quarter) stalled for good, its ARP replies
    queued behind it, and every node lost its route to S3 (EHOSTUNREACH for ten minutes,
    the tbf's backlog unchanged). The queued packets are dropped; TCP sends them again.
    The link's tbf drop counter starts again from zero."""
    with contextlib.suppress(LabError):  # no root qdisc yet: nothing to delete
        _run([TC, "-n", netns, "qdisc", "del", "dev", dev, "root"])
    shape(netns, dev, mbit)


def sweep_stale(prefix: str = "lab") -> list[str]:
    """Delete namespaces left by labs of ``prefix`` whose process died without cleanup
    (``kill -9``). Only names ``<prefix><pid>-<n>-<host>`` with a dead pid are touched."""
    try:
        out = _run([IP, "netns", "list"])
    except LabError:
        return []
    removed = []
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        match = re.fullmatch(rf"{re.escape(prefix)}(\d+)-\d+-[a-z0-9-]+", name)
        if match and not pid_alive(int(match.group(1))):
            for pid in Lab.netns_pids(name):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(LabError):
                _run([IP, "netns", "del", name])
                removed.append(name)
    return removed


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, step: float = 0.1) -> None:
    """Poll ``predicate`` until true; raise ``TimeoutError`` naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(step)
