"""Measurements across a lab link (:mod:`swarm.lab.wan`): ping round trips, UDP loss,
TCP flows, the Mathis estimate, and the emulator's self-check
(``python -m swarm.lab.wanprobe``). Each runs small Python programs in the hosts'
namespaces, bounded in count and time."""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

from swarm.lab.netlab import Host, Lab
from swarm.lab.tcpmeasure import listen_then_send
from swarm.lab.wan import Shape, split_regions, wanem_unavailable

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
    out, _ = listen_then_send(
        dst,
        [UDP_SINK, dst.ip, str(port), "5"],
        src,
        [UDP_SOURCE, dst.ip, str(port), str(count), str(pps), str(size)],
        count / pps + 60,
        30,
        "UDP sink",
    )
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
    out, sent = listen_then_send(
        dst,
        [TCP_SINK, dst.ip, str(port), str(seconds), str(warmup)],
        src,
        [TCP_SOURCE, dst.ip, str(port), str(seconds), algorithm, str(warmup)],
        seconds + warmup + 60,
        30,
        "TCP sink",
    )
    result = json.loads(out.strip().splitlines()[-1])
    result.update(json.loads(sent.strip().splitlines()[-1]))
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
    (``python -m swarm.lab.wanprobe``)."""
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
