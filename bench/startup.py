"""A node's start on a shared CPU: N fresh nodes run ``swarm fetch`` at once, against
N ``aria2c`` processes fetching the same object over plain HTTP.

Why: in the s3-fast fleet (six nodes and MinIO on two cores) a lone swarm node reads S3
at its link's rate once it has started, and what it loses to aria2c is its start: the
CLI's interpreter and imports, the fork, the daemon's imports and libtorrent session,
the fetch request, the S3 round trip, all on CPU the other nodes share. This measures
that start alone, in seconds, with an object of one piece (``--size``, default 1 MiB)
from MinIO on loopback, every node with a fresh SWARM_HOME and its own 127.0.0.x.

Per swarm node, from its daemon's log (its clock, as this process reads it): when the
daemon listened and when its S3 reader started its first batch, counted from the
node's launch; then its ``done`` event. CPU is the node's processes' (the CLI and its
daemon, read before the daemon is stopped). aria2c's row is its processes' exit and
CPU. Rounds alternate the order; the table gives the median over rounds of each
round's mean over nodes, and swarm's done time over aria2c's (each round's ratio, the
median of them).

    .venv/bin/python bench/startup.py [--nodes 6] [--rounds 3] [--size 1M] [--json]

MinIO is built once into ``~/.cache/swarm/bin`` if it is not there; it, the homes and
every output are removed at the end, on failure too (``--keep`` keeps the logs).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from swarm.lab.fleet import compile_swarm
from swarm.lab.hosts import LocalHost, free_port
from swarm.lab.jobs import Job, wait_jobs
from swarm.lab.procs import cpu_seconds, daemon_pid, stop_daemons
from swarm.lab.s3 import SWARM, S3Server, build_minio, publish
from swarm.pieces import parse_size, write_random_file

BUCKET = "startup"
NAME = "artifact.bin"
USER, PASSWORD = "swarmbench", "swarmbench-secret"
SECRET = "startup-bench-fleet-secret"
RUN_TIMEOUT = 120.0
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
MARKS = {"listening": " listening on ", "first_get": "S3 reads: "}
"""Daemon log lines whose first appearance is a start's milestone."""


@dataclass
class NodeStart:
    system: str
    round: int
    done: float
    """Seconds from launch to the command's ``done`` event (aria2c: its exit)."""
    cpu: float
    """CPU-seconds of the node's processes."""
    listening: float | None = None
    first_get: float | None = None


def log(message: str) -> None:
    print(f"[startup {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def milestones(daemon_log: Path, launched: float) -> dict[str, float]:
    """Seconds from ``launched`` (wall clock) to each of :data:`MARKS`' first line."""
    found: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for line in daemon_log.read_text().splitlines():
            stamp = LOG_TIME.match(line)
            if stamp is None:
                continue
            for key, text in MARKS.items():
                if key not in found and text in line:
                    at = datetime.datetime.strptime(stamp[1], "%Y-%m-%d %H:%M:%S,%f")
                    found[key] = round(at.timestamp() - launched, 3)
    return found


def run_swarm(
    host: LocalHost, nodes: int, round_no: int, work: Path, env: dict[str, str]
) -> list[NodeStart]:
    """N fresh nodes fetch at once; each one's milestones, done time and CPU."""
    jobs, homes = [], []
    for n in range(nodes):
        home, dest = work / f"home-{n}", work / f"dest-{n}"
        dest.mkdir()
        args = [*SWARM, "fetch", NAME, str(dest / NAME), "--listen", f"127.0.0.{n + 2}", "--json"]
        node_env = {**env, "SWARM_HOME": str(home)}
        jobs.append(
            Job(f"swarm-{n}", host, args, node_env, work / f"home-{n}.err", time.monotonic())
        )
        homes.append(home)
    wall_offset = time.time() - time.monotonic()  # the daemons' logs are on the wall clock
    results = []
    try:
        wait_jobs(jobs, RUN_TIMEOUT, "swarm fetch")
        for job, home in zip(jobs, homes, strict=True):
            pid = daemon_pid(home)  # read before it is stopped
            cpu = job.cpu_seconds() + ((cpu_seconds(pid, children=False) or 0.0) if pid else 0.0)
            marks = milestones(home / "daemon.log", wall_offset + job.started)
            results.append(
                NodeStart("swarm", round_no, round(job.seconds, 3), round(cpu, 3), **marks)
            )
    finally:  # the CLIs are the host's (LocalHost.stop); their daemons detached from them
        stop_daemons(homes)
    return results


def run_aria2c(host: LocalHost, nodes: int, round_no: int, work: Path, url: str) -> list[NodeStart]:
    """N ``aria2c`` processes fetch the object over HTTP at once (done: their exit)."""
    exe = shutil.which("aria2c")
    assert exe is not None
    jobs = []
    for n in range(nodes):
        dest = work / f"aria-{n}"
        dest.mkdir()
        args = [exe, "--quiet=true", "--allow-overwrite=true", "--file-allocation=none",
                "--dir", str(dest), "--out", NAME, url]  # fmt: skip
        jobs.append(Job(f"aria2c-{n}", host, args, dict(os.environ), work / f"aria-{n}.err",
                        time.monotonic(), done_on_exit=True))  # fmt: skip
    wait_jobs(jobs, RUN_TIMEOUT, "aria2c")  # on a failure, LocalHost.stop ends them
    return [
        NodeStart("aria2c", round_no, round(job.seconds, 3), round(job.cpu_seconds(), 3))
        for job in jobs
    ]


def summarize(runs: list[NodeStart]) -> dict[str, dict[str, float | None]]:
    """Per system and field: the median over rounds of each round's mean over nodes."""
    table: dict[str, dict[str, float | None]] = {}
    for system in ("swarm", "aria2c"):
        rows = [r for r in runs if r.system == system]
        fields: dict[str, float | None] = {}
        for name in ("listening", "first_get", "done", "cpu"):
            means = []
            for round_no in sorted({r.round for r in rows}):
                values = [getattr(r, name) for r in rows if r.round == round_no]
                if values and None not in values:
                    means.append(statistics.mean(values))
            fields[name] = round(statistics.median(means), 3) if means else None
        table[system] = fields
    ratios = []
    for round_no in sorted({r.round for r in runs}):
        done = {s: [r.done for r in runs if r.round == round_no and r.system == s]
                for s in ("swarm", "aria2c")}  # fmt: skip
        if done["swarm"] and done["aria2c"]:
            ratios.append(statistics.mean(done["swarm"]) / statistics.mean(done["aria2c"]))
    table["swarm"]["done_vs_aria2c"] = round(statistics.median(ratios), 2) if ratios else None
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="N fresh nodes start a fetch at once: swarm's start against aria2c's.",
        epilog="Times are seconds from each node's launch (the daemon's log gives when it "
        "listened and when its S3 reader began); CPU is the node's processes'.",
    )
    parser.add_argument("--nodes", type=int, default=6, help="nodes starting at once (6)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (3)")
    parser.add_argument("--size", default="1M", help="object size (1M: one piece)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args(argv)
    if not 1 <= args.nodes <= 200 or args.rounds < 1:
        parser.error("--nodes must be 1-200 and --rounds at least 1")
    if shutil.which("aria2c") is None:
        parser.error("aria2c is not installed (apt-get install aria2)")
    size = parse_size(args.size)
    build_minio(log)
    compile_swarm()  # as an install has it: a checkout's stale modules compiled at each start
    work = Path(tempfile.mkdtemp(prefix="swarm-startup-"))
    host = LocalHost()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SWARM_"))},
        "AWS_ACCESS_KEY_ID": USER, "AWS_SECRET_ACCESS_KEY": PASSWORD,
        "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "SWARM_CONFIG": str(work / "no-config.toml"),
        "SWARM_CATALOG": f"s3://{BUCKET}/catalog/",
        "SWARM_SECRET": SECRET,  # as in the fleet bench: UDP on, its server started
    }  # fmt: skip
    runs: list[NodeStart] = []
    try:
        s3 = S3Server(host, "minio", free_port(), work, env)
        env["AWS_ENDPOINT_URL"] = s3.url
        s3.start()
        s3.create_bucket(BUCKET, public_read=True)
        source = work / NAME
        write_random_file(source, size)
        publish(host, env, source, f"s3://{BUCKET}/{NAME}", name=NAME)
        for round_no in range(args.rounds):
            order = ("swarm", "aria2c") if round_no % 2 == 0 else ("aria2c", "swarm")
            for system in order:
                run_dir = work / f"{system}-{round_no}"
                run_dir.mkdir()
                if system == "swarm":
                    runs += run_swarm(host, args.nodes, round_no, run_dir, env)
                else:
                    url = f"{s3.url}/{BUCKET}/{NAME}"
                    runs += run_aria2c(host, args.nodes, round_no, run_dir, url)
            log(f"round {round_no + 1} of {args.rounds} done")
    finally:
        host.stop()
        if args.keep:
            log(f"kept {work} (each node's home-N/daemon.log and home-N.err)")
        else:
            shutil.rmtree(work, ignore_errors=True)
    table = summarize(runs)
    if args.json:
        print(json.dumps({"summary": table, "runs": [asdict(r) for r in runs]}, indent=2))
        return 0
    print(f"{args.nodes} nodes starting at once, {args.size} object, {args.rounds} rounds "
          f"(median of the rounds' node means; seconds from launch)")  # fmt: skip
    print(f"{'system':<8} {'listening':>9} {'first GET':>9} {'done':>7} {'CPU-s':>7}")
    for system, row in table.items():
        cells = [row.get(k) for k in ("listening", "first_get", "done", "cpu")]
        shown = [f"{c:.3f}" if isinstance(c, float) else "-" for c in cells]
        print(f"{system:<8} {shown[0]:>9} {shown[1]:>9} {shown[2]:>7} {shown[3]:>7}")
    print(f"swarm done / aria2c done = {table['swarm']['done_vs_aria2c']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
