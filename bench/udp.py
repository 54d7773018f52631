"""UDP transfer goodput vs a TCP transfer of the same bytes, on loopback and on a
tbf-shaped link between network namespaces; CPU seconds per GB on each side.

    sudo .venv/bin/python bench/udp.py                     # loopback + 500 Mbit netns link
    .venv/bin/python bench/udp.py --no-netns --size-mb 256  # loopback only (no root)

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
        while args.count == 0 or server.sessions_total < args.count or server.sessions_active:
            if cpu0 is None and server.sessions_total:
                cpu0 = cpu_seconds()
            await asyncio.sleep(0.01)
        cpu = cpu_seconds() - (cpu0 or 0.0)
        print(json.dumps({"server_cpu": cpu, "bytes_sent": server.bytes_sent}), flush=True)
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
            block_size=args.block_size,
            timeout=300,
        )
    )
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
    server_prefix: list[str] = (),  # type: ignore[assignment]
    client_prefix: list[str] = (),  # type: ignore[assignment]
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
            timeout=600,
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


def bench_path(
    name: str,
    path: Path,
    server_ip: str,
    link_mbit: float | None,
    blocks: list[int],
    env: dict[str, str],
    server_prefix: list[str],
    client_prefix: list[str],
    rate_mbit: float,
) -> list[dict[str, Any]]:
    me = [sys.executable, str(Path(__file__).resolve())]
    common = ["--file", str(path), "--host", server_ip]
    rows = []
    tcp = one_run(
        [*me, "tcp-serve", *common, "--port", "0"],
        [*me, "tcp-fetch", *common],
        env,
        server_prefix,
        client_prefix,
    )
    rows.append({"path": name, "method": "TCP (sendfile)", "block": "-", **tcp})
    for block in blocks:
        udp = one_run(
            [*me, "serve", *common, "--port", "0", "--count", "1", "--cap-mbit", "10000"],
            [*me, "fetch", *common, "--block-size", str(block), "--rate-mbit", str(rate_mbit)],
            env,
            server_prefix,
            client_prefix,
        )
        rows.append({"path": name, "method": "UDP (AES-GCM)", "block": block, **udp})
    for row in rows:
        row["link_mbit"] = link_mbit
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| path | method | block B | goodput Mbit/s | % of link | vs TCP | "
        "client CPU s/GB | server CPU s/GB | dup | verified |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    tcp = {r["path"]: r["goodput_mbit"] for r in rows if r["method"].startswith("TCP")}
    for r in rows:
        gb = r["bytes"] / 1e9
        link = f"{100 * r['goodput_mbit'] / r['link_mbit']:.0f}%" if r["link_mbit"] else "-"
        lines.append(
            f"| {r['path']} | {r['method']} | {r['block']} | {r['goodput_mbit']:.0f} | {link} | "
            f"{r['goodput_mbit'] / tcp[r['path']]:.2f}x | {r['client_cpu'] / gb:.2f} | "
            f"{r['server_cpu'] / gb:.2f} | {r.get('duplicates', '-')} | {r['verified']} |"
        )
    return "\n".join(lines)


def cmd_run(args: argparse.Namespace) -> None:
    env = {**os.environ, SECRET_ENV: os.environ.get(SECRET_ENV) or os.urandom(24).hex()}
    env["PYTHONPATH"] = str(ROOT)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="swudp-bench-") as tmp:
        path = Path(tmp) / "artifact.bin"
        with path.open("wb") as f:
            for _ in range(args.size_mb):
                f.write(os.urandom(1 << 20))
        if not args.no_loopback:
            rows += bench_path(
                "loopback", path, "127.0.0.1", None, args.blocks, env, [], [], args.loop_rate_mbit
            )
        if not args.no_netns:
            from tests.netlab import Lab, lab_unavailable

            reason = lab_unavailable()
            if reason:
                print(f"netns skipped: {reason}", file=sys.stderr)
            else:
                with Lab("swudpb") as lab:
                    mbit = args.link_mbit
                    srv = lab.host("srv", up_mbit=mbit, down_mbit=10 * mbit)
                    cli = lab.host("cli", up_mbit=10 * mbit, down_mbit=mbit)
                    rows += bench_path(
                        f"netns tbf {mbit:g} Mbit",
                        path,
                        srv.ip,
                        mbit,
                        args.blocks,
                        env,
                        srv.command([]),
                        cli.command([]),
                        args.rate_mbit,
                    )
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
        sp.add_argument("--block-size", type=int, default=32768)
        sp.add_argument("--rate-mbit", type=float, default=1000)
        sp.add_argument("--cap-mbit", type=float, default=10000)
        sp.add_argument("--count", type=int, default=0, help="exit after N sessions (0: never)")
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--link-mbit", type=float, default=500)
    parser.add_argument(
        "--rate-mbit", type=float, default=1000, help="UDP ask on the shaped link (the NIC)"
    )
    parser.add_argument("--loop-rate-mbit", type=float, default=4000)
    parser.add_argument("--blocks", type=int, nargs="+", default=[8192, 32768, 61440])
    parser.add_argument("--no-netns", action="store_true")
    parser.add_argument("--no-loopback", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
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
