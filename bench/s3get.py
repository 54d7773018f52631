"""Single-node S3 download throughput: swarm (in process, and through a fresh node's
daemon) vs s5cmd vs boto3.

One object (``--size``, default 1 GiB, random bytes) is published with ``swarm publish``
to a MinIO server on loopback, then each tool downloads it as a fresh process, in
``--rounds`` alternating rounds (the order rotates every round), output deleted after
every run. Tools:

- ``swarm``: ``swarm fetch --no-daemon`` (S3 only, in the calling process);
- ``swarm-daemon``: ``swarm fetch`` on a fresh node (a new SWARM_HOME, its daemon
  started on demand, no coordinator, no peers): what a new instance runs; the time
  includes the daemon's start, and DEST is the daemon's verified, seeded file;
- ``s5cmd`` and ``boto3`` (``download_file``): baselines that verify nothing.

Reported per run: wall-clock MB/s (10^6 bytes/s, process start to exit) and CPU-seconds
per GiB of the client (its processes, the daemon included; MinIO's own share is printed
apart); per tool the median, and each swarm tool's ratio to s5cmd (the median of the
per-round ratios).

    .venv/bin/python bench/s3get.py [--size 1G] [--rounds 5] [--json]

Caveats: the page cache is not dropped (that needs root and is not reliable in
containers), so MinIO serves the object from memory after the first read and every tool
writes into the page cache; the numbers measure the client's CPU and request pipeline,
not a disk. MinIO shares the machine's cores with the client under test.

MinIO is built once into ``~/.cache/swarm/bin`` (``go install``) if it is not there.
It and every temporary file are removed at the end, on failure too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType

from swarm.lab.hosts import free_port
from swarm.lab.procs import daemon_pid, own_cpu_seconds
from swarm.lab.s3 import S3Error, build_minio
from swarm.pieces import file_sha256, parse_size, write_random_file

MINIO_READY_TIMEOUT = 30.0
MINIO_USER = "swarmbench"
MINIO_PASSWORD = "swarmbench-secret"
BUCKET = "bench"
KEY = "artifact.bin"

VENV_BIN = Path(sys.executable).parent
TOOLS = ("swarm", "swarm-daemon", "s5cmd", "boto3")
SWARM_TOOLS = ("swarm", "swarm-daemon")

BOTO3_SCRIPT = """\
import sys, boto3
from botocore.config import Config
client = boto3.client("s3", config=Config(s3={"addressing_style": "path"}))
client.download_file(sys.argv[1], sys.argv[2], sys.argv[3])
"""
"""boto3 with its defaults (s3transfer: 10 threads, 8 MiB parts), as most code calls it."""


class BenchError(Exception):
    """A failure of the benchmark's setup or of one run; printed, exit 1."""


@dataclass
class Run:
    tool: str
    round: int
    seconds: float
    mb_per_s: float
    self_reported_seconds: float | None = None
    cpu_s_per_gib: float = 0.0
    """User + system CPU-seconds of the client's processes per GiB moved."""
    server_cpu_s_per_gib: float = 0.0
    """MinIO's CPU-seconds per GiB during the run (shared by every client alike)."""


@dataclass
class Results:
    size: int
    rounds: int
    piece_size: int
    pieces: int
    runs: list[Run] = field(default_factory=list)

    def rates(self, tool: str) -> list[float]:
        return [r.mb_per_s for r in sorted(self.runs, key=lambda r: r.round) if r.tool == tool]

    def ratios(self, tool: str = "swarm") -> list[float]:
        return [s / c for s, c in zip(self.rates(tool), self.rates("s5cmd"), strict=True)]

    def cpu(self, tool: str) -> list[float]:
        return [r.cpu_s_per_gib for r in sorted(self.runs, key=lambda r: r.round) if r.tool == tool]

    def summary(self) -> dict[str, object]:
        return {
            "size": self.size,
            "rounds": self.rounds,
            "piece_size": self.piece_size,
            "pieces": self.pieces,
            "unit": "MB/s (1e6 bytes/s, wall clock of a fresh process)",
            "median_mb_per_s": {t: statistics.median(self.rates(t)) for t in TOOLS},
            "median_cpu_s_per_gib": {t: statistics.median(self.cpu(t)) for t in TOOLS},
            "to_s5cmd": {t: statistics.median(self.ratios(t)) for t in SWARM_TOOLS},
            "to_s5cmd_per_round": {t: self.ratios(t) for t in SWARM_TOOLS},
            "page_cache_dropped": False,
            "runs": [asdict(r) for r in self.runs],
        }


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run(
    cmd: list[str], env: dict[str, str], timeout: float, what: str
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` to completion within ``timeout`` (killed after it); raise on failure."""
    try:
        done = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise BenchError(f"{what} timed out after {timeout:g}s: {' '.join(cmd)}") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-2000:]
        raise BenchError(f"{what} failed (exit {done.returncode}): {' '.join(cmd)}\n{tail}")
    return done


# -- MinIO --------------------------------------------------------------------------------


def minio_binary() -> Path:
    """The pinned MinIO server (:func:`swarm.lab.s3.build_minio`: built on first use)."""
    try:
        return build_minio(log)
    except S3Error as error:
        raise BenchError(str(error)) from None


@contextlib.contextmanager
def minio_server(data_dir: Path, log_path: Path) -> Iterator[tuple[str, int]]:
    """A MinIO on 127.0.0.1 serving ``data_dir``; yields its endpoint URL; killed at exit."""
    binary = minio_binary()
    port, console_port = free_port(), free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "MINIO_ROOT_USER": MINIO_USER,
        "MINIO_ROOT_PASSWORD": MINIO_PASSWORD,
        "MINIO_BROWSER": "off",
        "MINIO_UPDATE": "off",
    }
    cmd = [
        str(binary),
        "server",
        "--quiet",
        "--address",
        f"127.0.0.1:{port}",
        "--console-address",
        f"127.0.0.1:{console_port}",
        str(data_dir),
    ]
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        wait_ready(proc, endpoint, log_path)
        yield endpoint, proc.pid
    finally:
        stop_process(proc)


def wait_ready(proc: subprocess.Popen[bytes], endpoint: str, log_path: Path) -> None:
    deadline = time.monotonic() + MINIO_READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(
                f"MinIO exited with {proc.returncode} while starting:\n{tail(log_path)}"
            )
        try:
            with urllib.request.urlopen(endpoint + "/minio/health/ready", timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise BenchError(
        f"MinIO not ready at {endpoint} after {MINIO_READY_TIMEOUT:g}s:\n{tail(log_path)}"
    )


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Terminate ``proc`` (by its pid), then kill it if it lingers."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def tail(path: Path, limit: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return "(no log)"


# -- the object ---------------------------------------------------------------------------


def client_env(endpoint: str, home: Path) -> dict[str, str]:
    """The environment every client runs in: MinIO's credentials, no user config."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "SWARM_", "S3_")) and k != "PYTHONPATH"
    }
    env.update(
        {
            "AWS_ACCESS_KEY_ID": MINIO_USER,
            "AWS_SECRET_ACCESS_KEY": MINIO_PASSWORD,
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "SWARM_HOME": str(home / "swarm-home"),
        }
    )
    return env


def create_bucket(endpoint: str) -> None:
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=MINIO_USER,
        aws_secret_access_key=MINIO_PASSWORD,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}),
    )
    client.create_bucket(Bucket=BUCKET)


# -- the runs -----------------------------------------------------------------------------


def tool_command(tool: str, url: str, dest: Path, endpoint: str) -> list[str]:
    if tool == "swarm":
        return [str(VENV_BIN / "swarm"), "fetch", url, str(dest), "--no-daemon", "--json"]
    if tool == "swarm-daemon":
        return [str(VENV_BIN / "swarm"), "fetch", url, str(dest), "--listen", "127.0.0.1", "--json"]
    if tool == "s5cmd":
        s5cmd = VENV_BIN / "s5cmd"
        exe = str(s5cmd) if s5cmd.exists() else (shutil.which("s5cmd") or "s5cmd")
        return [exe, "--endpoint-url", endpoint, "cp", url, str(dest)]
    if tool == "boto3":
        return [sys.executable, "-c", BOTO3_SCRIPT, BUCKET, KEY, str(dest)]
    raise ValueError(tool)


def swarm_seconds(stdout: str) -> float | None:
    """The ``seconds`` of swarm's final ``done`` JSON event, if it printed one."""
    for line in reversed(stdout.splitlines()):
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict) and event.get("event") == "done":
                return float(event["seconds"])
    return None


def one_run(
    tool: str,
    round_no: int,
    dest: Path,
    size: int,
    env: dict[str, str],
    endpoint: str,
    timeout: float,
    expected_sha256: str | None,
    server_pid: int | None = None,
) -> Run:
    url = f"s3://{BUCKET}/{KEY}"
    cmd = tool_command(tool, url, dest, endpoint)
    home = Path(env["SWARM_HOME"]) / f"{tool}-{round_no}"  # a fresh node every run
    env = {**env, "SWARM_HOME": str(home)}
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_before = own_cpu_seconds(server_pid)
    started = time.perf_counter()
    try:
        done = run(cmd, env, timeout, f"{tool} (round {round_no})")
        seconds = time.perf_counter() - started
        server_cpu = own_cpu_seconds(server_pid) - server_before
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
        cpu += stop_daemon(home)  # the daemon is not our child: read it before it goes
    finally:
        stop_daemon(home)
        shutil.rmtree(home, ignore_errors=True)
    try:
        got = dest.stat().st_size if dest.exists() else -1
        if got != size:
            raise BenchError(f"{tool} wrote {got} bytes to {dest}, expected {size}")
        if expected_sha256 and file_sha256(dest) != expected_sha256:
            raise BenchError(f"{tool} wrote a file whose SHA-256 does not match the object")
    finally:
        remove_output(dest)
    reported = swarm_seconds(done.stdout) if tool in SWARM_TOOLS else None
    gib = size / 2**30
    return Run(
        tool,
        round_no,
        round(seconds, 3),
        round(size / seconds / 1e6, 1),
        reported,
        round(cpu / gib, 2),
        round(server_cpu / gib, 2),
    )


def stop_daemon(home: Path) -> float:
    """Stop the node daemon of ``home`` if one runs; return the CPU-seconds it used."""
    pid = daemon_pid(home)
    if pid is None:
        return 0.0
    used = own_cpu_seconds(pid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    (home / "daemon.pid").unlink(missing_ok=True)
    return used


def remove_output(dest: Path) -> None:
    """Delete the output and anything a tool left beside it (swarm's partial/state files)."""
    for path in dest.parent.iterdir():
        if path.is_file():
            path.unlink()


def bench(args: argparse.Namespace, work: Path) -> Results:
    data_dir, out_dir = work / "minio-data", work / "out"
    data_dir.mkdir()
    out_dir.mkdir()
    with minio_server(data_dir, work / "minio.log") as (endpoint, minio_pid):
        log(f"MinIO ready at {endpoint}")
        env = client_env(endpoint, work)
        create_bucket(endpoint)
        source = work / "source.bin"
        log(f"writing {args.size} random bytes ...")
        sha256 = write_random_file(source, args.size)
        published = run(
            [str(VENV_BIN / "swarm"), "publish", str(source), f"s3://{BUCKET}/{KEY}", "--json"],
            env,
            args.timeout,
            "swarm publish",
        )
        manifest = json.loads(published.stdout.strip().splitlines()[-1])
        if manifest["sha256"] != sha256:
            raise BenchError("swarm publish reported a different SHA-256 than the file's")
        source.unlink()  # the clients read from MinIO; keep the disk and cache for them
        results = Results(args.size, args.rounds, manifest["piece_size"], manifest["pieces"])
        dest = out_dir / "artifact.bin"
        for round_no in range(1, args.rounds + 1):
            shift = (round_no - 1) % len(TOOLS)
            order = TOOLS[shift:] + TOOLS[:shift]
            for tool in order:
                check = sha256 if round_no == 1 and not args.no_verify else None
                result = one_run(
                    tool, round_no, dest, args.size, env, endpoint, args.timeout, check, minio_pid
                )
                log(
                    f"round {round_no}: {tool:12s} {result.mb_per_s:8.1f} MB/s  "
                    f"{result.cpu_s_per_gib:5.2f} CPU-s/GiB "
                    f"(MinIO {result.server_cpu_s_per_gib:.2f})"
                )
                results.runs.append(result)
        return results


def print_table(results: Results) -> None:
    summary = results.summary()
    medians = summary["median_mb_per_s"]
    cpu = summary["median_cpu_s_per_gib"]
    ratios = summary["to_s5cmd"]
    assert isinstance(medians, dict) and isinstance(cpu, dict) and isinstance(ratios, dict)
    rounds = range(1, results.rounds + 1)
    print(
        f"object: {results.size / 2**20:.0f} MiB, {results.pieces} pieces of "
        f"{results.piece_size // 2**10} KiB; MinIO on loopback; page cache NOT dropped"
    )
    print("MB/s = 1e6 bytes/s, wall clock of a fresh process (start to exit)")
    header = f"{'tool':13s} {'median':>8s} {'CPU-s/GiB':>9s} " + " ".join(
        f"{'r' + str(n):>7s}" for n in rounds
    )
    print(header)
    print("-" * len(header))
    for tool in TOOLS:
        cells = " ".join(f"{rate:7.1f}" for rate in results.rates(tool))
        print(f"{tool:13s} {medians[tool]:8.1f} {cpu[tool]:9.2f} {cells}")
    print("-" * len(header))
    for tool in SWARM_TOOLS:
        cells = " ".join(f"{ratio:7.3f}" for ratio in results.ratios(tool))
        print(f"{tool + '/s5cmd':22s} {ratios[tool]:9.3f} {cells}")


def raise_on_term(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=parse_size, default=1 << 30, help="object size (default 1G)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds allowed per client run (600)"
    )
    parser.add_argument(
        "--no-verify", action="store_true", help="skip hashing each tool's first output"
    )
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where temp dirs go (default: $TMPDIR)"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if not (VENV_BIN / "swarm").exists():
        parser.error(f"no swarm next to {sys.executable}: run it as .venv/bin/python (make venv)")
    signal.signal(signal.SIGTERM, raise_on_term)
    work = Path(tempfile.mkdtemp(prefix="swarm-s3get-", dir=args.workdir))
    try:
        results = bench(args, work)
    except BenchError as error:
        log(f"bench failed: {error}")
        return 1
    except KeyboardInterrupt:
        log("interrupted; MinIO stopped and temporary files removed")
        return 130
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(results.summary(), indent=2))
    else:
        print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
