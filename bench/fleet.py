"""Fleet benchmark: time to put one artifact on N new nodes, vs the P2P bound and baselines.

Every host is a network namespace on one bridge (tests/netlab.py) with tbf-shaped upload
and download. One "origin" host runs the S3 server (MinIO, or moto) and ``swarm
coordinator`` (the tracker of every system below); N node hosts fetch; k optional
"seeder" hosts hold the artifact beforehand (existing instances). The artifact (random
bytes) is published once with ``swarm publish``; then each system runs on fresh node
state (homes, destinations; every process of the previous system killed, the coordinator
restarted):

    swarm       ``swarm fetch NAME DEST --listen IP --coordinator URL --json`` on all nodes
    libtorrent  bench/baseline_libtorrent.py: stock libtorrent 2.1 with the published
                .torrent (S3 object as web seed) + the coordinator as tracker; seeds on
                after it is done, until every node is done
    aria2c      aria2c with the same torrent and tracker, seeding until every node is done
    s5cmd       ``s5cmd cp s3://BUCKET/KEY DEST`` on all nodes (S3 only; no seeders)

Reported per system: all-done seconds (the last node's completion, from the common
start), each node's time, the ratio to the Kumar-Ross lower bound

    T* = max(F / (u_s + k u_k), F / d, N F / (u_s + k u_k + N u))

(F bits, u_s origin upload, u_k a seeder's upload, u/d a node's upload/download, bit/s),
the ratio to swarm, and the bytes the origin host sent (its veth, headers included) / F.
Every node's file is checked against the artifact's SHA-256; a mismatch fails the run.
The machine's CPU use during each system is sampled (/proc/stat): a saturated CPU means
the numbers measure the CPU, not the links.

    .venv/bin/python bench/fleet.py --scenario origin-bound [--systems swarm,s5cmd] [--json]

Needs root (network namespaces), aria2c, and MinIO (built as in bench/s3get.py) or
``--s3 moto``. Every process and namespace is removed at the end, on failure too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from swarm.pieces import file_sha256, parse_size, write_random_file  # noqa: E402
from tests.netlab import Host, Lab, LabError, lab_unavailable  # noqa: E402

VENV_BIN = Path(sys.executable).parent
SWARM = str(VENV_BIN / "swarm")
BASELINE_LT = str(REPO / "bench" / "baseline_libtorrent.py")
MINIO_BIN = Path.home() / ".cache" / "swarm" / "bin" / "minio"
SYSTEMS = ("swarm", "libtorrent", "aria2c", "s5cmd")

S3_PORT = 9000
COORDINATOR_PORT = 7070
BT_PORT = 6881
BUCKET = "fleet"
KEY = "artifacts/artifact.bin"
NAME = "artifact.bin"
CATALOG = f"s3://{BUCKET}/catalog/"
ACCESS_KEY = "swarmfleet"
SECRET_KEY = "swarmfleet-secret"
READY_TIMEOUT = 60.0
SETUP_TIMEOUT = 300.0
SEEDER_TIMEOUT = 600.0
CPU_SAMPLE = 1.0
"""Seconds between /proc/stat samples; a sample >= 95% busy counts as saturated."""

SCENARIOS: dict[str, dict[str, Any]] = {
    "origin-bound": {"origin_up": 100, "node_up": 200, "node_down": 200},
    "swarm-bound": {"origin_up": 1000, "node_up": 200, "node_down": 200},
    "slow-uploads": {"origin_up": 1000, "node_up": 20, "node_down": 400},
    # S3 in the same region: every node can read it at link speed (issue 11).
    "s3-fast": {"origin_up": 1500, "node_up": 250, "node_down": 250, "nodes": 6},
    # Both halves useful: S3 alone feeds 8 nodes at 50 Mbit each, peers alone carry
    # 8 x 100 Mbit of uploads; the bound needs both (T* = N*F/(u_s + sum u)).
    "mixed": {"origin_up": 400, "node_up": 100, "node_down": 300},
    "existing-seeders": {
        "origin_up": 50,
        "node_up": 200,
        "node_down": 200,
        "seeders": 2,
        "seeder_up": 200,
    },
}
DEFAULTS: dict[str, Any] = {
    "nodes": 8,
    "size": 128 << 20,
    "piece_size": 1 << 20,
    "origin_up": 100,
    "origin_down": 1000,
    "node_up": 200,
    "node_down": 200,
    "seeders": 0,
    "seeder_up": None,  # = node_up
}

SETUP_S3 = """\
import json, sys, time, urllib.request, boto3
from botocore.config import Config
endpoint, bucket, deadline = sys.argv[1], sys.argv[2], time.monotonic() + float(sys.argv[3])
while True:
    try:
        urllib.request.urlopen(endpoint + "/", timeout=2).close()
        break
    except OSError as error:
        if getattr(error, "code", None) is not None:
            break  # an HTTP error is an answer
        if time.monotonic() > deadline:
            sys.exit("S3 server not ready: %s" % error)
        time.sleep(0.2)
s3 = boto3.client("s3", endpoint_url=endpoint, config=Config(s3={"addressing_style": "path"}))
s3.create_bucket(Bucket=bucket)
s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps({
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Principal": {"AWS": ["*"]},
                   "Action": ["s3:GetObject"], "Resource": ["arn:aws:s3:::%s/*" % bucket]}],
}))
"""

GET_TORRENT = """\
import sys, urllib.request, boto3
from botocore.config import Config
endpoint, bucket, key, out = sys.argv[1:5]
s3 = boto3.client("s3", endpoint_url=endpoint, config=Config(s3={"addressing_style": "path"}))
with open(out, "wb") as f:
    f.write(s3.get_object(Bucket=bucket, Key=key + ".torrent")["Body"].read())
# the web seed must work anonymously, as BitTorrent clients fetch it
req = urllib.request.Request("%s/%s/%s" % (endpoint, bucket, key), headers={"Range": "bytes=0-15"})
with urllib.request.urlopen(req, timeout=10) as reply:
    assert len(reply.read()) == 16, "anonymous ranged GET of the web seed failed"
"""

HTTP_READY = """\
import sys, time, urllib.request
url, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
while True:
    try:
        urllib.request.urlopen(url, timeout=2).close()
        break
    except OSError as error:
        if time.monotonic() > deadline:
            sys.exit("%s not ready: %s" % (url, error))
        time.sleep(0.1)
"""

TRACE_FLEET = """\
import json, sys, time, urllib.request
url, out = sys.argv[1], open(sys.argv[2], "a")
for _ in range(7200):  # at most an hour at 2 Hz; killed when the run ends
    t = time.time()
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            out.write(json.dumps({"t": t, "fleet": json.load(reply)}) + "\\n")
            out.flush()
    except OSError:
        pass
    time.sleep(max(0.0, 0.5 - (time.time() - t)))
"""

ARIA2_HOOK = """#!/bin/sh
# aria2c --on-bt-download-complete: GID, number of files, path. Runs before seeding; its
# stdout is aria2c's, which bench/fleet.py reads.
echo '{"event": "done", "path": "'"$3"'"}'
"""


class BenchError(Exception):
    """A failure of the setup or of one system's run; printed, exit 1."""


def log(message: str) -> None:
    print(f"[fleet {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- configuration ------------------------------------------------------------------------


@dataclass
class FleetConfig:
    """One benchmark setup. Rates in Mbit/s (10^6 bit/s), sizes in bytes."""

    nodes: int = 8
    size: int = 128 << 20
    piece_size: int = 1 << 20
    origin_up: float = 100
    origin_down: float = 1000
    node_up: float = 200
    node_down: float = 200
    seeders: int = 0
    seeder_up: float | None = None
    """Upload of each pre-existing seeder; None = ``node_up``."""
    s3: str = "minio"
    """S3 server on the origin host: ``minio`` or ``moto``."""
    system_timeout: float | None = None
    """Seconds one system may take; None = see :meth:`timeout`."""
    scenario: str | None = None

    def __post_init__(self) -> None:
        for name in ("origin_up", "origin_down", "node_up", "node_down"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0 Mbit/s, got {getattr(self, name)}")
        if self.nodes < 1 or self.seeders < 0:
            raise ValueError(f"need nodes >= 1 and seeders >= 0, got {self.nodes}/{self.seeders}")
        if self.s3 not in ("minio", "moto"):
            raise ValueError(f"s3 must be minio or moto, got {self.s3!r}")

    @property
    def seeder_rate(self) -> float:
        return self.seeder_up if self.seeder_up is not None else self.node_up

    def bound(self) -> float:
        """Kumar & Ross's minimum distribution time T* in seconds."""
        f = self.size * 8
        mbit = 1e6
        server = (self.origin_up + self.seeders * self.seeder_rate) * mbit
        total = server + self.nodes * self.node_up * mbit
        return max(f / server, f / (self.node_down * mbit), self.nodes * f / total)

    def timeout(self) -> float:
        """Seconds one system may take: the explicit setting, else 60 s plus the larger of
        10 x T* and twice the time for every node to read the whole object from the origin
        (so an S3-only client on a slow origin is slow, not failed)."""
        if self.system_timeout:
            return self.system_timeout
        origin_only = self.nodes * self.size * 8 / (self.origin_up * 1e6)
        return 60.0 + max(10.0 * self.bound(), 2.0 * origin_only)


# -- results ------------------------------------------------------------------------------


@dataclass
class NodeResult:
    node: str
    seconds: float
    sha256_ok: bool
    bytes_by_source: dict[str, int] | None = None


@dataclass
class SystemResult:
    system: str
    all_done: float
    nodes: list[NodeResult]
    origin_tx_bytes: int
    bound: float
    size: int
    cpu_busy_avg: float
    cpu_saturated_fraction: float
    notes: list[str] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(n.seconds for n in self.nodes)

    def row(self, swarm_all_done: float | None) -> dict[str, Any]:
        return {
            "system": self.system,
            "all_done_s": round(self.all_done, 2),
            "median_s": round(self.median, 2),
            "vs_bound": round(self.all_done / self.bound, 2),
            "vs_swarm": round(self.all_done / swarm_all_done, 2) if swarm_all_done else None,
            "origin_bytes_per_F": round(self.origin_tx_bytes / self.size, 2),
            "cpu_busy_avg": round(self.cpu_busy_avg, 2),
            "cpu_saturated": round(self.cpu_saturated_fraction, 2),
        }


# -- processes ----------------------------------------------------------------------------


class Job:
    """One client process on one host; a thread reads its stdout for a ``done`` event.

    ``settled`` is set once the client is done (a JSON ``done`` line, or a clean exit when
    ``done_on_exit``) or has failed (exit without ``done``).
    """

    def __init__(
        self,
        name: str,
        host: Host,
        args: list[str],
        env: dict[str, str],
        log_path: Path,
        started: float,
        done_on_exit: bool = False,
    ) -> None:
        self.name = name
        self.host = host
        self.started = started
        self.done_on_exit = done_on_exit
        self.done_at: float | None = None
        self.done_event: dict[str, Any] | None = None
        self.error: str | None = None
        self.settled = threading.Event()
        self.tail: deque[str] = deque(maxlen=40)
        self.log_path = log_path
        with log_path.open("ab") as stderr:
            self.process = host.popen(
                args, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True
            )
        self._thread = threading.Thread(target=self._read, name=f"job-{name}", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.tail.append(line.rstrip())
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if event.get("event") == "done" and self.done_at is None:
                        self.done_at = time.monotonic()
                        self.done_event = event
                        self.settled.set()
                    elif event.get("event") == "error":
                        self.error = event.get("message", line)
        code = self.process.wait()
        if self.done_at is None:
            if code == 0 and self.done_on_exit:
                self.done_at = time.monotonic()
            else:
                self.error = self.error or f"exited with {code} before it was done"
        self.settled.set()

    @property
    def seconds(self) -> float:
        assert self.done_at is not None
        return self.done_at - self.started

    def describe_failure(self) -> str:
        stderr = ""
        with contextlib.suppress(OSError):
            stderr = self.log_path.read_text(errors="replace")[-1500:]
        out = "\n".join(self.tail)[-1500:]
        return f"{self.name}: {self.error}\n--- stdout tail:\n{out}\n--- stderr tail:\n{stderr}"


def wait_jobs(jobs: list[Job], timeout: float, what: str) -> None:
    """Wait until every job is settled; raise on the first failure or at ``timeout``."""
    deadline = time.monotonic() + timeout
    pending = list(jobs)
    while pending:
        job = pending[0]
        if not job.settled.wait(max(0.0, min(1.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                left = ", ".join(j.name for j in pending)
                raise BenchError(f"{what}: timed out after {timeout:.0f}s; not done: {left}")
            # check the others for an early failure meanwhile
            for other in pending:
                if other.settled.is_set() and other.error:
                    raise BenchError(f"{what} failed:\n{other.describe_failure()}")
            continue
        if job.error:
            raise BenchError(f"{what} failed:\n{job.describe_failure()}")
        pending.pop(0)


class CpuSampler:
    """Samples the machine's CPU use from /proc/stat once a second in a thread."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu", daemon=True)

    @staticmethod
    def _read() -> tuple[int, int]:
        with open("/proc/stat") as stat:
            values = [int(v) for v in stat.readline().split()[1:]]
        idle = values[3] + values[4]  # idle + iowait
        return sum(values) - idle, sum(values)

    def _run(self) -> None:
        busy0, total0 = self._read()
        stopped = False
        while not stopped:
            stopped = self._stop.wait(CPU_SAMPLE)  # the last sample is the partial second
            busy, total = self._read()
            if total > total0:
                self.samples.append((busy - busy0) / (total - total0))
            busy0, total0 = busy, total

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    @property
    def average(self) -> float:
        return statistics.fmean(self.samples) if self.samples else 0.0

    @property
    def saturated(self) -> float:
        if not self.samples:
            return 0.0
        return sum(s >= 0.95 for s in self.samples) / len(self.samples)


def clean_env() -> dict[str, str]:
    """Our environment without anything that could send traffic elsewhere (proxies) or
    change a client's behaviour (AWS profiles, SWARM_* settings)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.lower().endswith("_proxy")
        and not k.startswith(("AWS_", "SWARM_", "S3_", "MINIO_"))
        and k != "PYTHONPATH"
    }
    env["NO_PROXY"] = env["no_proxy"] = "*"
    return env


# -- the fleet ----------------------------------------------------------------------------


class Fleet:
    """The lab, the origin (S3 + coordinator), the published artifact and the runs."""

    def __init__(self, config: FleetConfig, lab: Lab, work: Path, keep: bool = False) -> None:
        self.config = config
        self.keep = keep  # leave each system's node logs and files in ``work``
        self.lab = lab
        self.work = work
        self.origin = lab.host("origin", config.origin_up, config.origin_down)
        self.seeder_hosts = [
            lab.host(f"seed{i}", config.seeder_rate, config.node_down)
            for i in range(config.seeders)
        ]
        self.node_hosts = [
            lab.host(f"node{i}", config.node_up, config.node_down) for i in range(config.nodes)
        ]
        self.s3_url = f"http://{self.origin.ip}:{S3_PORT}"
        self.coordinator_url = f"http://{self.origin.ip}:{COORDINATOR_PORT}"
        self.tracker_url = self.coordinator_url + "/announce"
        self.coordinator: subprocess.Popen[Any] | None = None
        self.tracer: subprocess.Popen[Any] | None = None
        self.sha256 = ""
        self.torrent = work / "artifact.torrent"
        self.source = work / "source" / NAME
        self.env = {
            **clean_env(),
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.s3_url,
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "SWARM_CATALOG": CATALOG,
            "SWARM_CONFIG": str(work / "no-swarm.toml"),
        }

    # -- origin -----------------------------------------------------------------------------

    def start_origin(self) -> None:
        """Start the S3 server on the origin host and publish the artifact."""
        data = self.work / "s3-data"
        data.mkdir()
        logf = (self.work / "s3.log").open("ab")
        if self.config.s3 == "minio":
            if not MINIO_BIN.exists():
                raise BenchError(
                    f"MinIO is not built ({MINIO_BIN}): run bench/s3get.py once, or use --s3 moto"
                )
            env = {
                **self.env,
                "MINIO_ROOT_USER": ACCESS_KEY,
                "MINIO_ROOT_PASSWORD": SECRET_KEY,
                "MINIO_BROWSER": "off",
                "MINIO_UPDATE": "off",
            }
            args = [str(MINIO_BIN), "server", "--quiet", "--address",
                    f"{self.origin.ip}:{S3_PORT}", "--console-address",
                    f"{self.origin.ip}:{S3_PORT + 1}", str(data)]  # fmt: skip
        else:
            env = self.env
            args = [str(VENV_BIN / "moto_server"), "-H", self.origin.ip, "-p", str(S3_PORT)]
        self.origin.popen(args, env=env, stdout=logf, stderr=subprocess.STDOUT)
        logf.close()
        self.origin.run(
            [sys.executable, "-c", SETUP_S3, self.s3_url, BUCKET, str(READY_TIMEOUT)],
            env=self.env,
            timeout=READY_TIMEOUT + 30,
        )
        self.source.parent.mkdir()
        log(f"writing a {self.config.size}-byte artifact")
        self.sha256 = write_random_file(self.source, self.config.size)
        started = time.monotonic()
        done = self.origin.run(
            [SWARM, "publish", str(self.source), f"s3://{BUCKET}/{KEY}", "--name", NAME,
             "--piece-size", str(self.config.piece_size), "--json"],
            env=self.env,
            timeout=SETUP_TIMEOUT,
        )  # fmt: skip
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        if summary["sha256"] != self.sha256:
            raise BenchError("swarm publish reported another SHA-256 than the file's")
        log(f"published in {time.monotonic() - started:.1f}s: {summary['pieces']} pieces")
        self.origin.run(
            [sys.executable, "-c", GET_TORRENT, self.s3_url, BUCKET, KEY, str(self.torrent)],
            env=self.env,
            timeout=60,
        )

    def start_coordinator(self) -> None:
        """(Re)start the coordinator: every system gets a tracker with no stale state."""
        self.stop_coordinator()
        logf = (self.work / "coordinator.log").open("ab")
        self.coordinator = self.origin.popen(
            [SWARM, "coordinator", "--listen", f"{self.origin.ip}:{COORDINATOR_PORT}"],
            env=self.env,
            stdout=logf,
            stderr=subprocess.STDOUT,
        )
        logf.close()
        self.origin.run(
            [sys.executable, "-c", HTTP_READY, self.coordinator_url + "/healthz", "30"],
            env=self.env,
            timeout=45,
        )

    def stop_coordinator(self) -> None:
        if self.coordinator and self.coordinator.poll() is None:
            os.killpg(self.coordinator.pid, signal.SIGTERM)
            try:
                self.coordinator.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.coordinator.pid, signal.SIGKILL)
                self.coordinator.wait(10)
        self.coordinator = None

    # -- one system ---------------------------------------------------------------------------

    def client_args(self, system: str, host: Host, dest_dir: Path, seed: bool) -> list[str]:
        """The command a node (or, ``seed``, a seeder holding the file) runs."""
        if system == "swarm":
            return [SWARM, "fetch", NAME, str(dest_dir / NAME), "--listen", host.ip,
                    "--coordinator", self.coordinator_url, "--json"]  # fmt: skip
        if system == "libtorrent":
            return [sys.executable, BASELINE_LT, str(self.torrent), str(dest_dir),
                    "--listen", host.ip, "--port", str(BT_PORT), "--tracker",
                    self.tracker_url, "--sha256", self.sha256, "--seed",
                    "--timeout", str(self.config.timeout() + SEEDER_TIMEOUT)]  # fmt: skip
        if system == "aria2c":
            hook = self.work / "aria2-hook.sh"
            if not hook.exists():
                hook.write_text(ARIA2_HOOK)
                hook.chmod(0o755)
            return [shutil.which("aria2c") or "aria2c", "--quiet=true",
                    "--enable-dht=false", "--enable-dht6=false", "--bt-enable-lpd=false",
                    "--enable-peer-exchange=false", f"--bt-tracker={self.tracker_url}",
                    f"--listen-port={BT_PORT}", f"--interface={host.ip}",
                    "--seed-time=1440", "--seed-ratio=0.0", f"--dir={dest_dir}",
                    "--file-allocation=none", "--check-integrity=true",
                    "--bt-hash-check-seed=true", f"--on-bt-download-complete={hook}",
                    "--allow-overwrite=true", "--auto-save-interval=0",
                    "--bt-save-metadata=false", "--rpc-save-upload-metadata=false",
                    str(self.torrent)]  # fmt: skip
        if system == "s5cmd":
            s5cmd = VENV_BIN / "s5cmd"
            exe = str(s5cmd) if s5cmd.exists() else (shutil.which("s5cmd") or "s5cmd")
            return [exe, "--endpoint-url", self.s3_url, "cp", f"s3://{BUCKET}/{KEY}",
                    str(dest_dir / NAME)]  # fmt: skip
        raise ValueError(f"unknown system {system!r}")

    def run_system(self, system: str) -> SystemResult:
        config = self.config
        root = self.work / system
        root.mkdir()
        self.start_coordinator()
        notes: list[str] = []
        jobs: list[Job] = []
        try:
            if self.seeder_hosts and system != "s5cmd":
                self._start_seeders(system, root)
            elif self.seeder_hosts:
                notes.append("s5cmd reads S3 only: the seeders do not help it")
            drops_before = self.lab.qdisc_drops()
            if system == "swarm" and self.keep:  # the coordinator's view, for --keep
                trace = root / "fleet-trace.jsonl"
                self.tracer = self.origin.popen(
                    [sys.executable, "-c", TRACE_FLEET, self.coordinator_url + "/v1/fleet",
                     str(trace)], env=self.env)  # fmt: skip
            started = time.monotonic()
            origin_before = self.origin.tx_bytes()
            with CpuSampler() as cpu:
                for host in self.node_hosts:
                    node_dir = root / host.name
                    dest = node_dir / "dest"
                    dest.mkdir(parents=True)
                    env = {**self.env, "SWARM_HOME": str(node_dir / "home")}
                    jobs.append(
                        Job(
                            host.name,
                            host,
                            self.client_args(system, host, dest, seed=False),
                            env,
                            node_dir / "client.log",
                            started,
                            done_on_exit=system == "s5cmd",
                        )
                    )
                wait_jobs(jobs, config.timeout(), system)
            all_done = max(j.seconds for j in jobs)
            origin_tx = self.origin.tx_bytes() - origin_before
        finally:
            if self.tracer:
                os.killpg(self.tracer.pid, signal.SIGTERM)
                self.tracer.wait(10)
                self.tracer = None
            self._stop_nodes(root)
            self.stop_coordinator()
        nodes = []
        for job in jobs:
            path = root / job.name / "dest" / NAME
            ok = path.exists() and file_sha256(path) == self.sha256
            by_source = (job.done_event or {}).get("bytes_by_source")
            nodes.append(NodeResult(job.name, round(job.seconds, 3), ok, by_source))
        bad = [n.node for n in nodes if not n.sha256_ok]
        if bad:
            raise BenchError(f"{system}: wrong or missing file (SHA-256 mismatch) on {bad}")
        drops = {
            k: v - drops_before.get(k, 0)
            for k, v in self.lab.qdisc_drops().items()
            if v > drops_before.get(k, 0)
        }
        if drops:
            notes.append(f"tbf drops (packets) during the run: {drops}")
        if not self.keep:
            shutil.rmtree(root, ignore_errors=True)
        return SystemResult(
            system, all_done, nodes, origin_tx, config.bound(), config.size,
            cpu.average, cpu.saturated, notes,
        )  # fmt: skip

    def _start_seeders(self, system: str, root: Path) -> None:
        """Give every seeder host the complete artifact, seeded by ``system``'s client."""
        jobs = []
        for host in self.seeder_hosts:
            node_dir = root / host.name
            dest = node_dir / "dest"
            dest.mkdir(parents=True)
            env = {**self.env, "SWARM_HOME": str(node_dir / "home")}
            if system != "swarm":  # baselines find the complete file and seed it
                shutil.copyfile(self.source, dest / NAME)
            # swarm seeders are nodes that fetched before (from S3, being alone) and whose
            # daemons keep seeding
            jobs.append(
                Job(f"{system}-{host.name}", host,
                    self.client_args(system, host, dest, seed=True), env,
                    node_dir / "client.log", time.monotonic())
            )  # fmt: skip
        wait_jobs(jobs, SEEDER_TIMEOUT, f"{system} seeders")
        log(f"{system}: {len(jobs)} seeders ready")

    def _stop_nodes(self, root: Path) -> None:
        """Kill every client and daemon of this system (daemons by their pid file first)."""
        for host in self.seeder_hosts + self.node_hosts:
            pid_file = root / host.name / "home" / "daemon.pid"
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
        self.lab.stop_processes([h.netns for h in self.seeder_hosts + self.node_hosts])


# -- the command --------------------------------------------------------------------------


def run_fleet(
    config: FleetConfig, systems: list[str], keep: bool = False
) -> tuple[list[SystemResult], dict[str, str]]:
    """Run ``systems`` one after the other; returns their results and, per system that
    failed (a timeout, a client error, a wrong file), why. A failed system does not stop
    the others; the setup failing does (BenchError)."""
    reason = lab_unavailable()
    if reason:
        raise BenchError(f"cannot build the network lab: {reason}")
    for tool in systems:
        if tool == "aria2c" and not shutil.which("aria2c"):
            raise BenchError("aria2c is not installed (apt-get install aria2)")
    work = Path(tempfile.mkdtemp(prefix="swarm-fleet-"))
    results: list[SystemResult] = []
    failures: dict[str, str] = {}
    try:
        with Lab("fl") as lab:
            fleet = Fleet(config, lab, work, keep)
            fleet.start_origin()
            for system in systems:
                log(f"{system}: {config.nodes} nodes, {config.seeders} seeders")
                try:
                    result = fleet.run_system(system)
                except (BenchError, LabError) as error:
                    log(f"{system}: FAILED: {error}")
                    failures[system] = str(error)
                    continue
                log(
                    f"{system}: all done in {result.all_done:.1f}s "
                    f"({result.all_done / result.bound:.2f} x T*)"
                )
                results.append(result)
    finally:
        if keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return results, failures


def table(config: FleetConfig, results: list[SystemResult], failures: dict[str, str]) -> str:
    swarm = next((r.all_done for r in results if r.system == "swarm"), None)
    rows = [r.row(swarm) for r in results]
    lines = [
        f"scenario {config.scenario or 'custom'}: N={config.nodes} new nodes, "
        f"k={config.seeders} seeders (up {config.seeder_rate:g}), "
        f"F={config.size / 2**20:g} MiB, piece {config.piece_size >> 10} KiB, "
        f"origin up {config.origin_up:g} Mbit, nodes up/down {config.node_up:g}/"
        f"{config.node_down:g} Mbit, S3 {config.s3}",
        f"T* (Kumar-Ross bound) = {config.bound():.2f} s",
        "",
        f"{'system':<11} {'all-done s':>10} {'median s':>9} {'x T*':>6} {'x swarm':>8} "
        f"{'origin B/F':>10} {'cpu avg':>8} {'cpu sat':>8}",
    ]
    for r in rows:
        vs = f"{r['vs_swarm']:.2f}" if r["vs_swarm"] is not None else "-"
        lines.append(
            f"{r['system']:<11} {r['all_done_s']:>10.2f} {r['median_s']:>9.2f} "
            f"{r['vs_bound']:>6.2f} {vs:>8} {r['origin_bytes_per_F']:>10.2f} "
            f"{r['cpu_busy_avg']:>8.0%} {r['cpu_saturated']:>8.0%}"
        )
    for r in results:
        per_node = " ".join(f"{n.seconds:.1f}" for n in sorted(r.nodes, key=lambda n: n.node))
        lines.append(f"  {r.system} per node (s): {per_node}")
        for note in r.notes:
            lines.append(f"  {r.system}: {note}")
        if r.system == "swarm":
            total: dict[str, int] = {}
            for n in r.nodes:
                for k, v in (n.bytes_by_source or {}).items():
                    total[k] = total.get(k, 0) + int(v)
            shares = ", ".join(f"{k} {v / (r.size * len(r.nodes)):.0%}" for k, v in total.items())
            lines.append(f"  swarm bytes by source (share of N*F): {shares}")
    for system, why in failures.items():
        # the header and the failing job's own reason (its log tails are in the run's log)
        lines.append(f"{system:<11} FAILED: {' '.join(why.splitlines()[:2])}")
    lines.append(
        "cpu avg: mean machine CPU use during the run (2 cores); cpu sat: share of 1-s "
        "samples >= 95% busy"
    )
    return "\n".join(lines)


@contextlib.contextmanager
def run_deadline(seconds: float) -> Iterator[None]:
    """Raise BenchError in the main thread after ``seconds`` (SIGALRM)."""

    def expired(signum: int, frame: FrameType | None) -> None:
        raise BenchError(f"the whole run timed out after {seconds:.0f}s (--run-timeout)")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def parse_args(argv: list[str] | None = None) -> tuple[FleetConfig, argparse.Namespace]:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="scenarios:\n"
        + "\n".join(f"  {name}: {preset}" for name, preset in SCENARIOS.items()),
    )
    parser.add_argument(
        "--scenario", choices=sorted(SCENARIOS), help="preset (listed below); flags override it"
    )
    parser.add_argument("--nodes", type=int, help=f"new nodes N ({DEFAULTS['nodes']})")
    parser.add_argument("--size", type=parse_size, help="artifact size (128M)")
    parser.add_argument("--piece-size", type=parse_size, help="piece size (1M)")
    parser.add_argument("--node-up", type=float, help="node upload, Mbit/s (200)")
    parser.add_argument("--node-down", type=float, help="node download, Mbit/s (200)")
    parser.add_argument("--origin-up", type=float, help="origin upload u_s, Mbit/s (100)")
    parser.add_argument("--seeders", type=int, help="pre-existing complete instances k (0)")
    parser.add_argument("--seeder-up", type=float, help="a seeder's upload, Mbit/s (node-up)")
    parser.add_argument(
        "--rate-scale",
        type=float,
        default=1.0,
        help="multiply every link rate (after the preset and flags): 0.25 runs a scenario "
        "at a quarter of its rates, so that on a small machine the network, not the CPU, "
        "limits every system (1)",
    )
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma list")
    parser.add_argument("--s3", choices=("minio", "moto"), help="S3 server (minio if built)")
    parser.add_argument(
        "--timeout", type=float, help="seconds per system (60 + max(10 T*, 2 N F / u_s))"
    )
    parser.add_argument("--run-timeout", type=float, default=3600.0, help="whole run (3600)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    values = dict(DEFAULTS)
    if args.scenario:
        values.update(SCENARIOS[args.scenario])
    for key in DEFAULTS:
        if getattr(args, key, None) is not None:
            values[key] = getattr(args, key)
    if args.rate_scale <= 0:
        parser.error("--rate-scale must be positive")
    for key in ("node_up", "node_down", "origin_up", "origin_down", "seeder_up"):
        if values.get(key) is not None:
            values[key] = values[key] * args.rate_scale
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        parser.error(f"--systems: unknown {unknown}; choose from {', '.join(SYSTEMS)}")
    args.systems = systems
    try:
        config = FleetConfig(
            **values,
            s3=args.s3 or ("minio" if MINIO_BIN.exists() else "moto"),
            system_timeout=args.timeout,
            scenario=args.scenario,
        )
    except ValueError as error:
        parser.error(str(error))
    return config, args


def main(argv: list[str] | None = None) -> int:
    config, args = parse_args(argv)
    try:
        with run_deadline(args.run_timeout):
            results, failures = run_fleet(config, args.systems, keep=args.keep)
    except (BenchError, LabError) as error:
        log(f"FAILED: {error}")
        return 1
    if args.json:
        swarm = next((r.all_done for r in results if r.system == "swarm"), None)
        print(
            json.dumps(
                {
                    "config": asdict(config),
                    "bound_s": config.bound(),
                    "rows": [r.row(swarm) for r in results],
                    "results": [asdict(r) for r in results],
                    "failures": failures,
                },
                indent=2,
            )
        )
    else:
        print(table(config, results, failures))
    if failures:
        log(f"FAILED systems: {', '.join(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
