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
the Mathis estimate. Helpers for those (:func:`ping`, :func:`udp_loss`, :func:`tcp_flow`)
are here for benchmarks too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
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
    near_end = End(lab.switch, f"wan{n}a", master="br0")
    far_end = End(lab.switch, f"wan{n}b", master=bridge)
    return Wan(
        lab.switch, near_end, far_end, shape, back, seed=seed, lab=lab, coalesce_us=coalesce_us
    )


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


# -- measurements -------------------------------------------------------------------------------

PING = """\
import json, os, socket, struct, sys, time
dst, count, interval = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
sock.settimeout(0.01)
ident = os.getpid() & 0xFFFF
def checksum(data):
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    return ~(total + (total >> 16)) & 0xFFFF
def echo(seq):
    body = struct.pack("!d", time.monotonic()) + bytes(48)
    head = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
    sock.sendto(struct.pack("!BBHHH", 8, 0, checksum(head + body), ident, seq) + body, (dst, 0))
# one echo first, not counted: it waits for ARP across the link
echo(65535)
end = time.monotonic() + 5
while time.monotonic() < end:
    try:
        data = sock.recv(2048)
    except TimeoutError:
        continue
    if struct.unpack("!HH", data[(data[0] & 0x0F) * 4 + 4:][:4]) == (ident, 65535):
        break
sent, rtts = {}, {}
next_send, seq, deadline = time.monotonic(), 0, None
while True:
    now = time.monotonic()
    if seq < count and now >= next_send:
        echo(seq)
        sent[seq] = now
        seq += 1
        next_send += interval
        if seq == count:
            deadline = now + 2.0
    if deadline is not None and (now > deadline or len(rtts) == count):
        break
    try:
        data = sock.recv(2048)
    except TimeoutError:
        continue
    icmp = data[(data[0] & 0x0F) * 4 :]
    kind, _, _, rid, rseq = struct.unpack("!BBHHH", icmp[:8])
    if kind == 0 and rid == ident and rseq in sent and rseq not in rtts:
        rtts[rseq] = time.monotonic() - sent[rseq]
print(json.dumps({"sent": count, "rtts_ms": [1000 * r for r in rtts.values()]}))
"""


def ping(src: Host, dst_ip: str, count: int = 50, interval: float = 0.02) -> dict[str, Any]:
    """ICMP echo from ``src`` (raw socket: root): ``{"sent", "rtts_ms": [...]}``."""
    done = src.run(
        [sys.executable, "-c", PING, dst_ip, str(count), str(interval)],
        timeout=count * interval + 30,
    )
    return json.loads(done.stdout)


UDP_SINK = """\
import json, socket, sys, time
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 20)
sock.bind((sys.argv[1], int(sys.argv[2])))
sock.settimeout(float(sys.argv[3]))
print("listening", flush=True)
seen = set()
while True:
    try:
        data = sock.recv(2048)
    except TimeoutError:
        break
    if data[:4] == b"done":
        break
    seen.add(int.from_bytes(data[:8], "big"))
print(json.dumps({"received": len(seen)}), flush=True)
"""

UDP_SOURCE = """\
import socket, sys, time
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
dst = (sys.argv[1], int(sys.argv[2]))
count, pps, size = int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
pad = bytes(size - 8)
start = time.monotonic()
for i in range(count):
    while time.monotonic() < start + i / pps:
        pass
    sock.sendto(i.to_bytes(8, "big") + pad, dst)
time.sleep(1.0)  # let the last datagrams cross the delay before the end marker
for _ in range(20):
    sock.sendto(b"done", dst)
"""


def udp_loss(
    src: Host,
    dst: Host,
    count: int = 50_000,
    pps: float = 20_000,
    size: int = 200,
    port: int = 5998,
) -> dict[str, float]:
    """Send ``count`` numbered datagrams from ``src`` to ``dst`` at ``pps``; the fraction
    that did not arrive. ``pps * size`` must stay well under the link's rate."""
    sink = dst.popen(
        [sys.executable, "-c", UDP_SINK, dst.ip, str(port), "5"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert sink.stdout is not None
        if sink.stdout.readline().strip() != "listening":
            raise LabError("the UDP sink did not start")
        src.run(
            [sys.executable, "-c", UDP_SOURCE, dst.ip, str(port), str(count), str(pps), str(size)],
            timeout=count / pps + 60,
        )
        out, _ = sink.communicate(timeout=30)
    finally:
        kill_group(sink)
    received = json.loads(out.strip().splitlines()[-1])["received"]
    return {"sent": count, "received": received, "loss": 1 - received / count}


TCP_SINK = """\
import json, socket, sys, time
srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
conn, _ = srv.accept()
warmup, seconds = float(sys.argv[4]), float(sys.argv[3])
got, start, mark = 0, None, None
buf = bytearray(1 << 20)
while True:
    n = conn.recv_into(buf)
    if not n:
        break
    now = time.monotonic()
    if start is None:
        start = now
    got += n
    if mark is None and now - start >= warmup:
        mark = (now, got)
    if mark is not None and now - mark[0] >= seconds:
        break
result = {"bytes": got - mark[1], "seconds": now - mark[0], "total_bytes": got}
print(json.dumps(result), flush=True)
"""

TCP_SOURCE = """\
import json, socket, struct, sys, time
algorithm = sys.argv[4].encode()
conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, algorithm)
conn.connect((sys.argv[1], int(sys.argv[2])))
block = bytes(1 << 16)
end = time.monotonic() + float(sys.argv[3]) + float(sys.argv[5]) + 10
try:
    while time.monotonic() < end:
        conn.sendall(block)
except (BrokenPipeError, ConnectionResetError):
    pass
# tcp_info: state, ca_state, retransmits, probes, backoff, options, wscale, flags (8 B),
# rto, ato, snd_mss, rcv_mss, unacked, sacked, lost, retrans, fackets, last_* (4),
# pmtu, rcv_ssthresh, rtt, rttvar, snd_ssthresh, snd_cwnd, advmss, reordering, ...
# total_retrans at offset 100
info = conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
fields = struct.unpack_from("=8B24I", info)
mss, rtt_us, total_retrans = fields[10], fields[23], struct.unpack_from("=I", info, 100)[0]
print(json.dumps({"mss": mss, "rtt_ms": rtt_us / 1000, "total_retrans": total_retrans,
                  "algorithm": conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
                  .rstrip(b"\\0").decode()}))
"""


def tcp_flow(
    src: Host,
    dst: Host,
    seconds: float = 20.0,
    algorithm: str = "cubic",
    warmup: float = 0.0,
    port: int = 5997,
) -> dict[str, Any]:
    """One TCP flow (``algorithm``, default buffers) from ``src`` to ``dst``; its rate over
    ``seconds`` after ``warmup`` seconds (from its first byte): ``{"mbit", "bytes",
    "seconds", "mss", "rtt_ms" (the sender's smoothed RTT), "total_retrans"}``."""
    sink = dst.popen(
        [sys.executable, "-c", TCP_SINK, dst.ip, str(port), str(seconds), str(warmup)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert sink.stdout is not None
        if sink.stdout.readline().strip() != "listening":
            raise LabError("the TCP sink did not start")
        sent = src.run(
            [
                sys.executable,
                "-c",
                TCP_SOURCE,
                dst.ip,
                str(port),
                str(seconds),
                algorithm,
                str(warmup),
            ],
            timeout=seconds + warmup + 60,
        )
        out, _ = sink.communicate(timeout=30)
    finally:
        kill_group(sink)
    result = json.loads(out.strip().splitlines()[-1])
    result.update(json.loads(sent.stdout.strip().splitlines()[-1]))
    result["mbit"] = result["bytes"] * 8 / result["seconds"] / 1e6
    return result


def tcp_flows(
    src: Host, dst: Host, count: int, seconds: float, warmup: float = 0.0, port: int = 5990
) -> list[dict[str, Any]]:
    """``count`` independent single TCP flows (CUBIC) at once, each measured as by
    :func:`tcp_flow`: samples of one flow's rate in the time of one (on a link with no
    rate limit they do not compete)."""
    results: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            results.append(tcp_flow(src, dst, seconds, "cubic", warmup, port - i))
        except BaseException as error:  # re-raised in the caller's thread
            errors.append(error)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + warmup + 120)
    if errors:
        raise errors[0]
    return results


def mathis_mbit(mss: int, rtt_ms: float, loss: float) -> float:
    """The Mathis et al. (1997) estimate of one Reno-like flow: MSS/RTT * 1.22/sqrt(p)."""
    return mss * 8 / (rtt_ms / 1000) * 1.22 / loss**0.5 / 1e6


def self_check(mathis_seconds: float = 20.0) -> dict[str, Any]:
    """The figures tests/fleet/test_wan.py asserts on, measured once
    (``python -m swarm.lab.wan``)."""
    import statistics

    out: dict[str, Any] = {}
    with Lab("wchk") as lab:
        a = lab.host("a", 10_000, 10_000)
        b = lab.host("b", 10_000, 10_000)
        link = split_regions(lab, [b], Shape.path(rtt_ms=100))
        rtts = ping(a, b.ip, 100, 0.02)["rtts_ms"]
        out["ping 100 ms: min/median/mean/max ms"] = [
            round(min(rtts), 2),
            round(statistics.median(rtts), 2),
            round(statistics.mean(rtts), 2),
            round(max(rtts), 2),
        ]
        link.set(Shape.path(rtt_ms=100, jitter_ms=5))
        rtts = ping(a, b.ip, 100, 0.02)["rtts_ms"]
        out["ping 100 ms +-5 ms jitter: mean/stdev ms"] = [
            round(statistics.mean(rtts), 2),
            round(statistics.stdev(rtts), 2),
        ]
        for loss in (0.005, 0.01):
            link.set(Shape(loss=loss))
            measured = udp_loss(a, b, count=100_000, pps=40_000, size=100)["loss"]
            out[f"loss {loss:g}: measured (x setting)"] = [measured, round(measured / loss, 3)]
        for mbit in (100, 500):
            link.set(Shape(rate_mbit=mbit))
            flow = tcp_flow(a, b, seconds=4, warmup=0.5)
            out[f"rate {mbit} Mbit: one TCP flow Mbit/s (x 1448/1514 of the rate)"] = [
                round(flow["mbit"], 1),
                round(flow["mbit"] / (mbit * 1448 / 1514), 3),
            ]
        link.set(Shape.path(rtt_ms=100, loss=0.005))
        flows = tcp_flows(a, b, count=4, seconds=mathis_seconds, warmup=3)
        estimate = mathis_mbit(flows[0]["mss"], 100, 0.005)
        out["100 ms 0.5%: Mathis estimate Mbit/s"] = round(estimate, 3)
        out["100 ms 0.5%: 4 single CUBIC flows, x Mathis"] = [
            round(f["mbit"] / estimate, 2) for f in flows
        ]
    return out


if __name__ == "__main__":
    from swarm.lab.netlab import lab_unavailable

    reason = lab_unavailable() or wanem_unavailable()
    if reason:
        sys.exit(f"wan: {reason}")
    print(json.dumps(self_check(), indent=2))
