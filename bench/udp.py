"""UDP transfer goodput vs TCP, on loopback and over an emulated WAN; CPU per GB.

    sudo .venv/bin/python bench/udp.py                   # loopback + the two WAN cases
    .venv/bin/python bench/udp.py --no-wan               # loopback only (no root)
    sudo .venv/bin/python bench/udp.py --no-loopback --wan 100:0.005:0 --wan 20:0.01:0

Loopback: UDP (the default block size: the largest datagram loopback's MTU allows) vs TCP
``sendfile`` of the same file. WAN: two network namespaces joined by ``tools/wanem`` (a
user-space netem: delay, random loss, a ``--link-mbit`` serializer with a 50 ms tail-drop
queue, both ways; swarm/lab/wan.py) with GRO on both hosts. A case ``RTT_MS:LOSS:BLOCK`` runs
one UDP transfer (``BLOCK`` payload bytes per datagram, 0 = the path MTU's 1434) and one
TCP flow (CUBIC, default buffers, ``--tcp-seconds`` long) in the same invocation; the
table gives each as a fraction of the link and UDP as a multiple of TCP.

Each transfer runs as two processes (server, client), so both cores work as on two hosts.
Every received piece is SHA-1-checked by the client in both methods (the daemon's sink
does the same), and the UDP client decrypts and authenticates every datagram.
The subcommands ``serve``/``fetch``/``tcp-serve``/``tcp-fetch`` are those processes.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swarm.udp import FilePieces, StaticProvider, UdpServer, fetch_pieces  # noqa: E402

INFO_HASH = "be" * 20
PIECE_SIZE = 4 << 20
SECRET_ENV = "SWARM_SECRET"


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def piece_hashes(path: Path, piece_size: int) -> list[bytes]:
    pieces = FilePieces.open(path, piece_size)
    return [hashlib.sha1(pieces.read(i)).digest() for i in range(pieces.piece_count)]


# -- the processes -----------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> None:
    secret = os.environ[SECRET_ENV].encode()
    pieces = FilePieces.open(args.file, args.piece_size)

    async def main() -> None:
        server = UdpServer(
            secret,
            StaticProvider({INFO_HASH: pieces}),
            host=args.host,
            port=args.port,
            rate_cap_bps=int(args.cap_mbit * 1e6),
        )
        await server.start()
        print(f"serving {server.port}", flush=True)
        cpu0 = None
        trace: list[tuple[float, ...]] = []
        started = time.monotonic()
        while args.count == 0 or server.sessions_total < args.count or server.sessions_active:
            if cpu0 is None and server.sessions_total:
                cpu0 = cpu_seconds()
            await asyncio.sleep(0.01 if not args.trace else 0.05)
            for conn in list(server._conns) if args.trace else ():
                s = conn.session
                trace.append(
                    (round(time.monotonic() - started, 3), s.stats.datagrams, s.stats.retransmits,
                     round(s.rate / 1e6), int(s._blocked),
                     len(s._schedule.retx) if s._schedule else 0, len(conn.backlog))
                )  # fmt: skip
        if args.trace:
            args.trace.write_text(json.dumps(trace))
        cpu = cpu_seconds() - (cpu0 or 0.0)
        result: dict[str, object] = {
            "server_cpu": cpu,
            "bytes_sent": server.bytes_sent,
            "gso": server.gso_active,
        }
        if server.finished:
            stats = server.finished[-1]
            result["retransmits"] = stats.retransmits
            result["rate_changes"] = [(round(t, 3), round(r / 1e6)) for t, r in stats.rate_changes]
        print(json.dumps(result), flush=True)
        await server.close()

    asyncio.run(main())


def cmd_fetch(args: argparse.Namespace) -> None:
    secret = os.environ[SECRET_ENV].encode()
    hashes = piece_hashes(args.file, args.piece_size)
    verified = [False] * len(hashes)

    def on_piece(index: int, data: bytes) -> bool:
        ok = hashlib.sha1(data).digest() == hashes[index]
        verified[index] = verified[index] or ok
        return ok

    size = args.file.stat().st_size
    cpu0 = cpu_seconds()
    started = time.monotonic()
    trace: list[tuple[float, int, int, int]] = []

    def progress(s: Any) -> None:
        trace.append((round(time.monotonic() - started, 3), s.datagrams, s.naks, s.duplicates))

    stats = asyncio.run(
        fetch_pieces(
            args.host,
            args.port,
            secret,
            INFO_HASH,
            list(range(len(hashes))),
            on_piece,
            piece_size=args.piece_size,
            piece_count=len(hashes),
            rate_bps=int(args.rate_mbit * 1e6),
            block_size=args.block_size or None,
            timeout=600,
            progress=progress if args.trace else None,
        )
    )
    if args.trace:
        args.trace.write_text(json.dumps(trace))
    seconds = time.monotonic() - started
    print(
        json.dumps(
            {
                "complete": len(stats.kept) == len(hashes),
                "verified": all(verified),
                "seconds": seconds,
                "goodput_mbit": size * 8 / seconds / 1e6,
                "client_cpu": cpu_seconds() - cpu0,
                "bytes": size,
                "duplicates": stats.duplicates,
                "naks": stats.naks,
                "datagrams": stats.datagrams,
                "receives": stats.receives,
                "gro": stats.gro,
                "block": stats.block_size,
                "final_rate_mbit": stats.sender_rate_bps / 1e6,
            }
        )
    )


def cmd_tcp_serve(args: argparse.Namespace) -> None:
    listener = socket.create_server((args.host, args.port))
    print(f"serving {listener.getsockname()[1]}", flush=True)
    conn, _ = listener.accept()
    cpu0 = cpu_seconds()
    with conn, args.file.open("rb") as f:
        conn.recv(1)
        conn.sendfile(f)  # the kernel's zero-copy path: TCP at its cheapest
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)
    print(json.dumps({"server_cpu": cpu_seconds() - cpu0}), flush=True)


def cmd_tcp_fetch(args: argparse.Namespace) -> None:
    hashes = piece_hashes(args.file, args.piece_size)
    size = args.file.stat().st_size
    buf = bytearray(args.piece_size)
    view = memoryview(buf)
    cpu0 = cpu_seconds()
    started = time.monotonic()
    verified = True
    with socket.create_connection((args.host, args.port)) as conn:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        conn.sendall(b"g")
        for index in range(len(hashes)):
            length = min(args.piece_size, size - index * args.piece_size)
            got = 0
            while got < length:
                n = conn.recv_into(view[got:length])
                if not n:
                    raise SystemExit("tcp: short transfer")
                got += n
            verified &= hashlib.sha1(view[:length]).digest() == hashes[index]
        conn.sendall(b"x")
    seconds = time.monotonic() - started
    print(
        json.dumps(
            {
                "complete": True,
                "verified": verified,
                "seconds": seconds,
                "goodput_mbit": size * 8 / seconds / 1e6,
                "client_cpu": cpu_seconds() - cpu0,
                "bytes": size,
            }
        )
    )


# -- orchestration -----------------------------------------------------------------------------


def one_run(
    server_cmd: list[str],
    client_cmd: list[str],
    env: dict[str, str],
    server_prefix: Sequence[str] = (),
    client_prefix: Sequence[str] = (),
) -> dict[str, Any]:
    server = subprocess.Popen(
        [*server_prefix, *server_cmd], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline().split()
        if not line or line[0] != "serving":
            raise RuntimeError("server did not start")
        port = line[1]
        done = subprocess.run(
            [*client_prefix, *client_cmd, "--port", port],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if done.returncode:
            raise RuntimeError(f"client failed: {done.stderr[-2000:]}")
        result = json.loads(done.stdout)
        out, _ = server.communicate(timeout=30)
        result.update(json.loads(out.strip().splitlines()[-1]))
        return result
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def udp_run(
    path: Path,
    server_ip: str,
    block: int,
    rate_mbit: float,
    env: dict[str, str],
    server_prefix: Sequence[str] = (),
    client_prefix: Sequence[str] = (),
) -> dict[str, Any]:
    me = [sys.executable, str(Path(__file__).resolve())]
    common = ["--file", str(path), "--host", server_ip]
    return one_run(
        [*me, "serve", *common, "--port", "0", "--count", "1", "--cap-mbit", "100000"],
        [*me, "fetch", *common, "--block-size", str(block), "--rate-mbit", str(rate_mbit)],
        env,
        server_prefix,
        client_prefix,
    )


def loopback_rows(path: Path, env: dict[str, str], args: argparse.Namespace) -> list[dict]:
    me = [sys.executable, str(Path(__file__).resolve())]
    common = ["--file", str(path), "--host", "127.0.0.1"]
    tcp = one_run([*me, "tcp-serve", *common, "--port", "0"], [*me, "tcp-fetch", *common], env)
    rows: list[dict[str, Any]] = [
        {"path": "loopback", "method": "TCP (sendfile)", "block": "-", "link_mbit": None, **tcp}
    ]
    for block in args.loop_blocks:
        udp = udp_run(path, "127.0.0.1", block, args.loop_rate_mbit, env)
        rows.append({"path": "loopback", "method": "UDP", "link_mbit": None, **udp})
    for row in rows:
        row["vs_tcp"] = row["goodput_mbit"] / tcp["goodput_mbit"]
    return rows


def parse_case(text: str) -> tuple[float, float, int]:
    """``RTT_MS:LOSS:BLOCK`` (block 0: the path MTU's)."""
    try:
        rtt, loss, block = text.split(":")
        return float(rtt), float(loss), int(block)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a WAN case is RTT_MS:LOSS:BLOCK, got {text!r}") from None


def wan_rows(path: Path, env: dict[str, str], args: argparse.Namespace) -> list[dict]:
    from swarm.lab import wan, wanprobe
    from swarm.lab.netlab import Lab, lab_unavailable

    reason = lab_unavailable() or wan.wanem_unavailable()
    if reason:
        print(f"WAN cases skipped: {reason}", file=sys.stderr)
        return []
    rows: list[dict[str, Any]] = []
    mbit = args.link_mbit
    with Lab("swudpb") as lab:
        # The hosts' own links are 20x the WAN's: the emulator is the only bottleneck.
        srv = lab.host("srv", up_mbit=20 * mbit, down_mbit=20 * mbit)
        cli = lab.host("cli", up_mbit=20 * mbit, down_mbit=20 * mbit)
        for host in (srv, cli):
            wan.enable_gro(host)
        link = wan.split_regions(lab, [cli], wan.Shape.path(rate_mbit=mbit))
        for rtt, loss, block in args.wan:
            shape = wan.Shape.path(rtt_ms=rtt, loss=loss, rate_mbit=mbit)
            link.set(shape)
            name = f"WAN {rtt:g} ms {100 * loss:g}% {mbit:g} Mbit"
            before = link.stats()
            udp = udp_run(
                path, srv.ip, block, args.rate_mbit, env, srv.command([]), cli.command([])
            )
            after = link.stats()
            lost = after["ab"]["lost"] - before["ab"]["lost"]
            dropped = after["ab"]["dropped"] - before["ab"]["dropped"]
            frames = after["ab"]["frames"] - before["ab"]["frames"]
            tcp = wanprobe.tcp_flow(srv, cli, seconds=args.tcp_seconds, algorithm="cubic")
            tcp_row = {
                "path": name,
                "method": "TCP (1 CUBIC flow)",
                "block": "-",
                "goodput_mbit": tcp["mbit"],
                "seconds": tcp["seconds"],
                "bytes": tcp["bytes"],
                "verified": "-",
                "retrans": tcp["total_retrans"],
            }
            udp_row = {
                "path": name,
                "method": "UDP",
                **udp,
                "wan_frames": frames,
                "wan_lost": lost,
                "wan_dropped": dropped,
            }
            for row in (udp_row, tcp_row):
                row["link_mbit"] = mbit
                row["vs_tcp"] = row["goodput_mbit"] / tcp["mbit"]
            rows += [udp_row, tcp_row]
            print(table([udp_row, tcp_row]), file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| path | method | block B | goodput Mbit/s | of link | vs TCP | "
        "client CPU s/GB | server CPU s/GB | datagrams/receive | GSO/GRO | dup | verified |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        gb = r["bytes"] / 1e9
        link = f"{r['goodput_mbit'] / r['link_mbit']:.2f}x" if r.get("link_mbit") else "-"
        cpu_c = f"{r['client_cpu'] / gb:.2f}" if "client_cpu" in r else "-"
        cpu_s = f"{r['server_cpu'] / gb:.2f}" if "server_cpu" in r else "-"
        batch = f"{r['datagrams'] / max(1, r['receives']):.1f}" if r.get("receives") else "-"
        offload = (
            f"{'on' if r['gso'] else 'off'}/{'on' if r['gro'] else 'off'}" if "gso" in r else "-"
        )
        lines.append(
            f"| {r['path']} | {r['method']} | {r['block']} | {r['goodput_mbit']:.1f} | {link} | "
            f"{r['vs_tcp']:.2f}x | {cpu_c} | {cpu_s} | {batch} | {offload} | "
            f"{r.get('duplicates', '-')} | {r['verified']} |"
        )
    return "\n".join(lines)


def write_file(path: Path, mib: int) -> None:
    with path.open("wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1 << 20))


def cmd_run(args: argparse.Namespace) -> None:
    env = {**os.environ, SECRET_ENV: os.environ.get(SECRET_ENV) or os.urandom(24).hex()}
    env["PYTHONPATH"] = str(ROOT)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="swudp-bench-") as tmp:
        if not args.no_loopback:
            path = Path(tmp) / "loop.bin"
            write_file(path, args.size_mb)
            rows += loopback_rows(path, env, args)
            path.unlink()
            print(table(rows), file=sys.stderr, flush=True)
        if not args.no_wan:
            path = Path(tmp) / "wan.bin"
            write_file(path, args.wan_size_mb)
            rows += wan_rows(path, env, args)
    print(table(rows))
    if args.json:
        print(json.dumps(rows, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd")
    for name in ("serve", "fetch", "tcp-serve", "tcp-fetch"):
        sp = sub.add_parser(name)
        sp.add_argument("--file", type=Path, required=True)
        sp.add_argument("--host", default="127.0.0.1")
        sp.add_argument("--port", type=int, default=7881)
        sp.add_argument("--piece-size", type=int, default=PIECE_SIZE)
        sp.add_argument("--block-size", type=int, default=0, help="0: the path MTU's")
        sp.add_argument("--rate-mbit", type=float, default=1000)
        sp.add_argument("--cap-mbit", type=float, default=10000)
        sp.add_argument("--count", type=int, default=0, help="exit after N sessions (0: never)")
        sp.add_argument("--trace", type=Path, help="write a time series here (JSON)")
    parser.add_argument("--size-mb", type=int, default=1024, help="loopback file")
    parser.add_argument("--wan-size-mb", type=int, default=1024, help="WAN file")
    parser.add_argument("--link-mbit", type=float, default=500, help="the WAN's rate")
    parser.add_argument(
        "--rate-mbit", type=float, default=1000, help="UDP ask on the WAN (the NIC)"
    )
    parser.add_argument("--loop-rate-mbit", type=float, default=20000)
    parser.add_argument(
        "--loop-blocks", type=int, nargs="+", default=[0], help="0: the largest datagram"
    )
    parser.add_argument(
        "--wan",
        type=parse_case,
        action="append",
        help="RTT_MS:LOSS:BLOCK (repeatable; default 0:0:1400 and 100:0.005:0)",
    )
    parser.add_argument("--tcp-seconds", type=float, default=20.0, help="TCP flow on the WAN")
    parser.add_argument("--no-wan", action="store_true")
    parser.add_argument("--no-loopback", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.cmd is None and not args.wan:
        args.wan = [(0.0, 0.0, 1400), (100.0, 0.005, 0)]
    handlers = {
        "serve": cmd_serve,
        "fetch": cmd_fetch,
        "tcp-serve": cmd_tcp_serve,
        "tcp-fetch": cmd_tcp_fetch,
        None: cmd_run,
    }
    handlers[args.cmd](args)


if __name__ == "__main__":
    main()
