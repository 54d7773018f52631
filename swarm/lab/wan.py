"""WAN links for the namespace lab: delay, jitter, random loss and a rate, in user space.

The kernel here has no ``netem`` qdisc (``tc`` can shape a rate with tbf, but cannot delay
or drop), so ``tools/wanem/wanem.c`` does it: two TAP devices bridged through one timed
queue per direction (loss, then a serializer with a tail-drop queue, then delay and
jitter, FIFO). It is compiled on first use with the machine's ``cc`` into
``~/.cache/swarm/bin/wanem-<hash of the source>``.

Two ways to put it in a lab (:class:`swarm.lab.netlab.Lab`):

- :func:`split_regions`: hosts stay on the lab's bridge ``br0`` (region "near") except
  the ``far`` hosts, whose bridge ports move to a second bridge ``br1``; the emulator joins
  the two bridges. Traffic inside a region is untouched (each host's tbf still applies);
  everything between the regions crosses the WAN. Addresses stay in the lab's subnet::

      with Lab("fr") as lab:
          origin = lab.host("origin", 1000, 1000)
          nodes = [lab.host(f"n{i}", 1000, 1000) for i in range(4)]
          wan = split_regions(lab, far=nodes, shape=Shape.path(rtt_ms=100, loss=0.005))
          ...                      # origin <-> nodes: 100 ms RTT, 0.5% loss each way
          print(wan.stats())       # frames, lost, dropped per direction
          wan.set(Shape.path(rtt_ms=20))   # reshape live (e.g. "TCP catches up")
          wan.attach_far(lab.host("n4", 1000, 1000))   # a far host added later

- :class:`Wan` directly: any two namespaces, any device names (e.g. one TAP end in each
  of two namespaces as their only link).

Everything the emulator creates dies with it: its TAP devices disappear when it exits,
and it exits when its stdin closes (when the Python process that started it ends, even
by ``kill -9``). A lab's cleanup also kills it, since it runs in the lab's switch namespace.

Validation (tests/fleet/test_wan.py): ping RTT, measured loss, and one CUBIC flow against
the Mathis estimate, with the measurements of :mod:`swarm.lab.wanprobe` (benchmarks use
them too).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarm.lab.netlab import IP, Host, Lab, LabError, _run, kill_group

SOURCE = Path(__file__).resolve().parents[2] / "tools" / "wanem" / "wanem.c"
"""The emulator's source: in the repository (an editable install), not in the wheel."""
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "swarm" / "bin"
CC = os.environ.get("CC", "cc")
START_TIMEOUT = 10.0
TXQUEUELEN = 10000
"""TAP transmit queue (frames): the kernel queues frames for the emulator here when it is
slow to read (a busy core); 10,000 frames is 120 ms at 1 Gbit/s, so a scheduling hiccup
is not mistaken for loss. The emulated queue is the emulator's, not this one."""
COALESCE_US = 200.0
"""The emulator writes frames out at most every 200 us, like a NIC's interrupt moderation,
and a UDP flow's datagrams among them as one GRO-style batch (see wanem.c): without it
every datagram would cross the receiving stack alone, which no NIC under load does. It
adds at most 0.2 ms each way (0.4% of a 100 ms RTT)."""
EMULATOR_NICE = -10
"""The emulator stands for hardware: it gets the CPU before the endpoints it serves."""


@dataclass(frozen=True)
class Shape:
    """One direction of a WAN link.

    ``delay_ms``: one-way propagation delay; ``jitter_ms``: a uniform +-jitter added per
    frame (frames keep their order); ``loss``: probability a frame is lost (0..1);
    ``rate_mbit``: the link's rate (0: unlimited); ``queue_ms``: the bottleneck's buffer
    in milliseconds at ``rate_mbit`` (tail drop beyond it).
    """

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0
    rate_mbit: float = 0.0
    queue_ms: float = 50.0

    def __post_init__(self) -> None:
        for name in ("delay_ms", "jitter_ms", "rate_mbit"):
            if getattr(self, name) < 0:
                raise ValueError(f"Shape.{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.loss <= 1:
            raise ValueError(f"Shape.loss must be in 0..1, got {self.loss}")
        if self.queue_ms <= 0:
            raise ValueError(f"Shape.queue_ms must be > 0, got {self.queue_ms}")

    @classmethod
    def path(
        cls,
        rtt_ms: float = 0.0,
        loss: float = 0.0,
        rate_mbit: float = 0.0,
        jitter_ms: float = 0.0,
        queue_ms: float = 50.0,
    ) -> Shape:
        """One direction of a symmetric path: half the RTT as delay, the loss each way."""
        return cls(rtt_ms / 2, jitter_ms, loss, rate_mbit, queue_ms)

    def spec(self) -> str:
        return (
            f"delay_ms={self.delay_ms:g},jitter_ms={self.jitter_ms:g},loss={self.loss:g},"
            f"rate_mbit={self.rate_mbit:g},queue_ms={self.queue_ms:g}"
        )


@dataclass(frozen=True)
class End:
    """Where one TAP end of the emulator goes: namespace, device name, and optionally a
    bridge to join (``master``) or an address to take (``address``, CIDR)."""

    netns: str
    name: str
    master: str | None = None
    address: str | None = None
    mtu: int = 1500


_BUILD_LOCK = threading.Lock()


def build_wanem() -> Path:
    """Compile tools/wanem/wanem.c (once per source version); the binary's path."""
    source = SOURCE.read_bytes()
    binary = CACHE / f"wanem-{hashlib.sha256(source).hexdigest()[:12]}"
    with _BUILD_LOCK:
        if binary.exists():
            return binary
        if shutil.which(CC) is None:
            raise LabError(f"no C compiler ({CC}) to build {SOURCE}")
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = binary.with_name(f".{binary.name}.{os.getpid()}")
        done = subprocess.run(
            [CC, "-O2", "-Wall", "-o", str(tmp), str(SOURCE), "-lm"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise LabError(f"cannot build {SOURCE}: {done.stderr.strip()[-2000:]}")
        tmp.replace(binary)  # atomic: concurrent builders agree on one file
        for old in CACHE.glob("wanem-*"):
            if old != binary:
                old.unlink(missing_ok=True)  # an older source's build
    return binary


def wanem_unavailable() -> str | None:
    """Why the emulator cannot run here (a pytest skip reason), or None."""
    if not Path("/dev/net/tun").exists():
        return "/dev/net/tun is missing (no TUN/TAP in this kernel)"
    built = any(CACHE.glob("wanem-*"))
    if shutil.which(CC) is None and not built:
        return f"no C compiler ({CC}) to build tools/wanem"
    if not SOURCE.exists() and not built:
        return f"{SOURCE} is missing (the emulator is built from a repository checkout)"
    return None


class Wan:
    """A running emulator between two ends (context manager; :meth:`close` is idempotent).

    ``run_netns`` is where the process runs and creates its TAP devices; each end is moved
    to its own namespace (if different), joined to its bridge or given its address, and
    brought up. ``ab`` shapes frames from end ``a`` to end ``b``, ``ba`` the way back.
    """

    def __init__(
        self,
        run_netns: str,
        a: End,
        b: End,
        ab: Shape,
        ba: Shape | None = None,
        seed: int = 1,
        lab: Lab | None = None,
        coalesce_us: float = COALESCE_US,
    ) -> None:
        self.run_netns = run_netns
        self.a, self.b = a, b
        self.ab, self.ba = ab, ba if ba is not None else ab
        self._lock = threading.Lock()
        binary = build_wanem()
        args = [binary, "run", "--tap-a", a.name, "--tap-b", b.name]
        args += ["--ab", self.ab.spec(), "--ba", self.ba.spec(), "--seed", str(seed)]
        args += ["--coalesce-us", f"{coalesce_us:g}"]
        self.process = subprocess.Popen(
            [IP, "netns", "exec", run_netns, *map(str, args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        if lab is not None:
            lab._processes.append(self.process)  # the lab's cleanup kills it too
        self._closed = False
        try:
            line = self._readline(START_TIMEOUT)
            if not line.startswith("ready"):
                raise LabError(f"wanem did not start: {line!r} {self._stderr()}")
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, self.process.pid, EMULATOR_NICE)
            for end in (a, b):
                self._place(end)
        except BaseException:
            self.close()
            raise

    def _readline(self, timeout: float) -> str:
        assert self.process.stdout is not None
        result: list[str] = []
        reader = threading.Thread(
            target=lambda: result.append(self.process.stdout.readline()),  # type: ignore[union-attr]
            daemon=True,
        )
        reader.start()
        reader.join(timeout)
        if not result:
            raise LabError(f"wanem did not answer within {timeout:g}s")
        return result[0].strip()

    def _stderr(self) -> str:
        if self.process.poll() is None or self.process.stderr is None:
            return ""
        return self.process.stderr.read().strip()[-1000:]

    def _place(self, end: End) -> None:
        if end.netns != self.run_netns:
            _run([IP, "-n", self.run_netns, "link", "set", end.name, "netns", end.netns])
        ns = [IP, "-n", end.netns, "link", "set", end.name]
        _run([*ns, "mtu", str(end.mtu), "txqueuelen", str(TXQUEUELEN)])
        if end.master:
            _run([*ns, "master", end.master])
        if end.address:
            _run([IP, "-n", end.netns, "addr", "add", end.address, "dev", end.name])
        _run([*ns, "up"])

    def _command(self, line: str) -> str:
        with self._lock:
            if self._closed or self.process.poll() is not None:
                raise LabError(f"wanem is not running {self._stderr()}")
            assert self.process.stdin is not None
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()
            return self._readline(START_TIMEOUT)

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per direction (``"ab"``, ``"ba"``): the shape, frames/bytes in, ``lost``
        (random loss), ``dropped`` (queue full), ``overflow`` (emulator buffer full: should
        stay 0), ``delivered``, ``max_backlog_bytes``."""
        return json.loads(self._command("stats"))

    def set(self, ab: Shape, ba: Shape | None = None) -> None:
        """Reshape the link (frames already queued keep their times)."""
        ba = ab if ba is None else ba
        for direction, shape in (("ab", ab), ("ba", ba)):
            answer = self._command(f"set {direction} {shape.spec()}")
            if answer != "ok":
                raise LabError(f"wanem refused {shape}: {answer}")
        self.ab, self.ba = ab, ba

    def attach_far(self, host: Host) -> None:
        """Move a lab host (added after :func:`split_regions`) to the far region."""
        if self.b.master is None or self.b.netns != host.lab.switch:
            raise LabError("attach_far needs a Wan made by split_regions")
        _run([IP, "-n", host.lab.switch, "link", "set", host.port, "master", self.b.master])

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(OSError, ValueError):
            assert self.process.stdin is not None
            self.process.stdin.close()  # EOF: wanem exits, its TAP devices vanish
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            kill_group(self.process)
        for stream in (self.process.stdout, self.process.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.close()  # type: ignore[union-attr]

    def __enter__(self) -> Wan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_REGION_COUNT: dict[str, int] = {}


def split_regions(
    lab: Lab,
    far: Sequence[Host],
    shape: Shape,
    back: Shape | None = None,
    seed: int = 1,
    coalesce_us: float = COALESCE_US,
) -> Wan:
    """Move ``far`` hosts onto a bridge of their own, joined to the lab's bridge by a WAN
    link: ``shape`` from the near region to the far one, ``back`` (default: the same) the
    other way. Returns the running :class:`Wan` (closed with the lab, or by you)."""
    n = _REGION_COUNT.get(lab.tag, 0)
    _REGION_COUNT[lab.tag] = n + 1
    bridge = f"br{n + 1}"
    sw = [IP, "-n", lab.switch]
    _run([*sw, "link", "add", bridge, "type", "bridge"])
    _run([*sw, "link", "set", bridge, "up"])
    for host in far:
        _run([*sw, "link", "set", host.port, "master", bridge])
    pin_neighbours(lab, far)
    near_end = End(lab.switch, f"wan{n}a", master="br0")
    far_end = End(lab.switch, f"wan{n}b", master=bridge)
    return Wan(
        lab.switch, near_end, far_end, shape, back, seed=seed, lab=lab, coalesce_us=coalesce_us
    )


def pin_neighbours(lab: Lab, far: Sequence[Host]) -> None:
    """Give every host the link-layer address of each host across the WAN (a permanent
    neighbour entry), so that no ARP crosses it. The emulator bridges layer 2, where a
    real WAN routes: its far side's hosts sit behind a router whose address each host
    resolves on its own LAN. Without this, a host's first packet to each host across the
    emulated WAN waited a round trip for ARP (far-region's nodes timed their first connect
    to a seeder at 200 ms on a 100 ms path), and a lost ARP request a second. Hosts added
    to the lab later are not pinned."""
    far_names = {host.name for host in far}
    macs = {
        host.name: json.loads(_run([IP, "-n", host.netns, "-j", "link", "show", "eth0"]))[0][
            "address"
        ]
        for host in lab.hosts.values()
    }
    for host in lab.hosts.values():
        for other in lab.hosts.values():
            if (host.name in far_names) != (other.name in far_names):
                _run([IP, "-n", host.netns, "neigh", "replace", other.ip, "lladdr",
                      macs[other.name], "dev", "eth0", "nud", "permanent"])  # fmt: skip


def enable_gro(host: Host) -> None:
    """Let a lab host's ``eth0`` batch what it receives (GRO), as a physical NIC does.

    On a veth, GRO on turns on a NAPI receive path, where UDP GRO batches datagrams for
    sockets that set ``UDP_GRO`` (and TCP GRO merges segments). The kernel uses it only
    for frames its peer (the host's bridge port) may not hand over as TSO super-packets,
    so TSO goes off on the bridge port: frames crossing the bridge are MTU-sized anyway.
    """
    binary = build_wanem()
    _run([IP, "netns", "exec", host.lab.switch, str(binary), "feature", host.port, "tso", "off"])
    host.run([binary, "feature", "eth0", "gro", "on"], timeout=10)
