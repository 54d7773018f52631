"""One fleet in a network lab: an origin (the S3 server), the coordinator's host, N new
nodes and k pre-existing seeders, each a namespace with tbf-shaped links
(:mod:`swarm.lab.netlab`); then one system (:mod:`swarm.lab.systems`) at a time on fresh
node state.

The origin runs the S3 server (MinIO, or moto); ``swarm coordinator`` (the tracker of
every system) runs on a host of its own (:data:`COORDINATOR_MBIT`); the artifact (random
bytes) is published once with ``swarm publish``.
For each system, :meth:`Fleet.run_system` restarts the coordinator, starts the seeders'
clients (if the system seeds), starts every node's client at once and waits until all
say they are done. Measured: each node's time from the common start, the bytes the
origin host sent, the machine's CPU (/proc/stat), and each node's CPU seconds (every
process in its namespace, the exited client's by wait4) at the moment all are done.
Every node's file is checked against the artifact's SHA-256. Then every process of the
system is stopped.

    with Lab("fl") as lab:
        fleet = Fleet(FleetConfig(**scenario("origin-bound")), lab, work)
        fleet.start_origin()
        result = fleet.run_system("swarm")

``bench/fleet.py`` is the command line (scenarios, the table); tests/fleet drives this
on a small setup. The config and result dataclasses are :mod:`swarm.lab.fleetdata`'s.
"""

from __future__ import annotations

import compileall
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from swarm.lab.coordinator import Coordinator
from swarm.lab.fleetdata import FleetConfig, NodeResult, SystemResult
from swarm.lab.jobs import CpuSampler, FleetError, Job, wait_jobs
from swarm.lab.linkuse import LinkSampler, LinkUse, link_use, save_samples
from swarm.lab.netlab import Host, Lab, LabError, lab_unavailable
from swarm.lab.procs import cpu_seconds, daemon_pid
from swarm.lab.s3 import S3Error, S3Server, publish
from swarm.lab.systems import SEEDER_TIMEOUT, System, base_name, system
from swarm.lab.wan import Shape, Wan, split_regions
from swarm.pieces import file_sha256, write_random_file

S3_PORT = 9000
BUCKET = "fleet"
KEY = "artifacts/artifact.bin"
NAME = "artifact.bin"
CATALOG = f"s3://{BUCKET}/catalog/"
ACCESS_KEY = "swarmfleet"
SECRET_KEY = "swarmfleet-secret"
FLEET_SECRET = "swarm-lab-fleet-secret-0123456789"
COORDINATOR_MBIT: Final = 1000.0
"""Each way, the coordinator's host's link (not scaled with the fleet's: its traffic is
reports, plans and announces, KB/s). A fleet's coordinator runs on an instance of its
own, not behind S3's bandwidth; until session 57 the lab ran it on the origin host, where
its answers queued behind the S3 bytes in the origin's uplink (existing seeders at a
quarter of the rates, 12.5 Mbit: a node's first plan came 0.22-1.19 s after its daemon
listened, 0.04-0.65 on a host of its own). Every system's tracker is this one."""

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

TRACE_FLEET = """\
import json, sys, time, urllib.request
url, out, token = sys.argv[1], open(sys.argv[2], "a"), sys.argv[3]
headers = {"Authorization": "Bearer " + token} if token else {}
for _ in range(7200):  # at most an hour at 2 Hz; killed when the run ends
    t = time.time()
    try:
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=2) as reply:
            out.write(json.dumps({"t": t, "fleet": json.load(reply)}) + "\\n")
            out.flush()
    except OSError:
        pass
    time.sleep(max(0.0, 0.5 - (time.time() - t)))
"""


def log(message: str) -> None:
    print(f"[fleet {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _wan_delta(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> str:
    """The WAN's frames during a run, per direction (near to far ``ab``, back ``ba``):
    in, lost at random, dropped by its queue, overflowed."""
    parts = []
    for direction, now in sorted(after.items()):
        then = before.get(direction, {})
        counts = {
            key: int(now.get(key, 0)) - int(then.get(key, 0))
            for key in ("frames", "lost", "dropped", "overflow")
        }
        parts.append(direction + " " + " ".join(f"{k} {v}" for k, v in counts.items()))
    return "; ".join(parts)


# -- the clients' environment (their processes: swarm.lab.jobs) ---------------------------


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


def lab_env(s3_url: str, work: Path) -> dict[str, str]:
    """What the lab itself sets on every process of a run, on top of :func:`clean_env`:
    the origin's S3 server and its credentials, the catalog, no config file, the fleet's
    secret. A run's ``extra_env`` may not name these."""
    return {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": s3_url,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "SWARM_CATALOG": CATALOG,
        "SWARM_CONFIG": str(work / "no-swarm.toml"),
        # a fleet's secret, as in production: authenticated reports, signed manifests,
        # and each daemon's UDP server (what far nodes pull from when TCP is slow)
        "SWARM_SECRET": FLEET_SECRET,
    }


LAB_ENV_NAMES: Final = frozenset(lab_env("", Path()))


# -- the fleet ----------------------------------------------------------------------------


class Fleet:
    """The lab's hosts, the origin (S3), the coordinator, the published artifact and the runs."""

    artifact_name = NAME
    bucket = BUCKET
    object_uri = f"s3://{BUCKET}/{KEY}"

    def __init__(
        self,
        config: FleetConfig,
        lab: Lab,
        work: Path,
        keep: bool = False,
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        """``extra_env``: set on every process of the run (nodes, seeders, coordinator, S3
        server) on top of the lab's environment, which drops the caller's ``SWARM_*`` and
        ``AWS_*`` (:func:`clean_env`); not any of :data:`LAB_ENV_NAMES` (ValueError). The
        peers trace is one (``SWARM_TRACE_PEERS=1``, :mod:`swarm.sources.peertrace`: every
        swarm daemon logs its peers once a second into the node logs ``keep`` leaves)."""
        clash = sorted(LAB_ENV_NAMES & set(extra_env or {}))
        if clash:
            raise ValueError(f"the lab sets {', '.join(clash)} itself")
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
        # (added last: the other hosts' addresses are as they were before it had its own)
        self.coordinator_host = lab.host("coord", COORDINATOR_MBIT, COORDINATOR_MBIT)
        self.node_env: dict[str, str] = {}
        """Environment the new nodes get on top of the fleet's (e.g. another S3 endpoint)."""
        self.wan: Wan | None = None
        if config.far:
            # the new nodes in another region: every packet between them and the origin or
            # the seeders crosses the emulated WAN (their own links still apply)
            self.wan = split_regions(
                lab, far=self.node_hosts, shape=Shape.path(config.far_rtt_ms, config.far_loss)
            )
        self.tracer: subprocess.Popen[Any] | None = None
        self.sha256 = ""
        self.torrent = work / "artifact.torrent"
        self.source = work / "source" / NAME
        s3_url = f"http://{self.origin.ip}:{S3_PORT}"
        self.env = {**clean_env(), **lab_env(s3_url, work), **(extra_env or {})}
        self.s3 = S3Server(self.origin, config.s3, S3_PORT, work, self.env)  # type: ignore[arg-type]
        # kept runs log each allocation's inputs (the capacity book's debug lines)
        self.coordinator = Coordinator(
            self.coordinator_host,
            self.env,
            work / "coordinator.log",
            args=() if config.origin_rate == "auto" else ("--origin-rate", config.origin_rate),
            verbose=2 if keep else 0,
        )

    # -- origin -----------------------------------------------------------------------------

    def start_origin(self) -> None:
        """Start the S3 server on the origin host and publish the artifact."""
        try:
            self.s3.start()
            self.s3.create_bucket(BUCKET, public_read=True)  # the baselines' web seed
        except S3Error as error:
            raise FleetError(str(error)) from None
        self.source.parent.mkdir()
        log(f"writing a {self.config.size}-byte artifact")
        self.sha256 = write_random_file(self.source, self.config.size)
        started = time.monotonic()
        summary = publish(
            self.origin, self.env, self.source, self.object_uri, name=NAME,
            piece_size=self.config.piece_size,
        )  # fmt: skip
        if summary["sha256"] != self.sha256:
            raise FleetError("swarm publish reported another SHA-256 than the file's")
        log(f"published in {time.monotonic() - started:.1f}s: {summary['pieces']} pieces")
        self.origin.run(
            [sys.executable, "-c", GET_TORRENT, self.s3.url, BUCKET, KEY, str(self.torrent)],
            env=self.env,
            timeout=60,
        )

    # -- one system ---------------------------------------------------------------------------

    def run_system(self, which: System | str) -> SystemResult:
        """Run ``which`` on every node at once (after its seeders); its result. Raises
        FleetError (or LabError) on a timeout, a client's failure or a wrong file."""
        sys_ = system(which) if isinstance(which, str) else which
        name = sys_.name
        config = self.config
        root = self.work / name.replace("/", "_")  # (swarm@REV: a branch may hold a slash)
        root.mkdir()
        # every system gets a tracker with no stale state (swarm@REV: that commit's)
        self.coordinator.env = {**self.env, **sys_.env()}
        self.coordinator.start()
        notes: list[str] = []
        jobs: list[Job] = []
        cpu_by_node: dict[str, float] = {}
        slowing: threading.Timer | None = None  # the origin slows (config.origin_slows_at)
        try:
            if self.seeder_hosts and sys_.seeds_after:
                self._start_seeders(sys_, root)
            elif self.seeder_hosts:
                notes.append(f"{name} does not seed: the seeders do not help it")
            drops_before = self.lab.qdisc_drops()
            wan_before = self.wan.stats() if self.wan is not None else {}
            if base_name(name) == "swarm" and self.keep:
                trace = root / "fleet-trace.jsonl"  # the coordinator's view, for --keep
                self.tracer = self.coordinator_host.popen(
                    [sys.executable, "-c", TRACE_FLEET, self.coordinator.url + "/v1/fleet",
                     str(trace), self.coordinator.token or ""], env=self.env)  # fmt: skip
            received_before = {host.name: host.rx_bytes() for host in self.node_hosts}
            started = time.monotonic()
            origin_before = self.origin.tx_bytes()
            slows_after = config.origin_slows_after()
            if slows_after is not None:
                slow_up = config.origin_slow_up or config.origin_up
                slowing = threading.Timer(
                    slows_after, self.origin.set_rates, (slow_up, config.origin_down)
                )
                slowing.start()
            with CpuSampler() as cpu, LinkSampler(self.lab.switch) as links:
                for host in self.node_hosts:
                    node_dir = root / host.name
                    dest = node_dir / "dest"
                    dest.mkdir(parents=True)
                    env = {**self.env, **self.node_env, **sys_.env()}
                    env["SWARM_HOME"] = str(node_dir / "home")
                    jobs.append(
                        Job(
                            host.name,
                            host,
                            sys_.command(self, host, dest, seed=False),
                            env,
                            node_dir / "client.log",
                            started,
                            done_on_exit=sys_.done_on_exit,
                        )
                    )
                try:
                    wait_jobs(jobs, config.timeout(), name)
                except FleetError as error:  # what a wedged node waits on
                    raise FleetError(f"{error}{self._dump_stacks(root, jobs)}") from None
            all_done = max(j.seconds for j in jobs)
            use = self._link_use(links, started, all_done)
            if self.keep:  # for bench/timeline.py
                hosts = [self.origin, *self.seeder_hosts, *self.node_hosts]
                ports = {host.name: host.port for host in hosts}
                save_samples(root / "links.json", links.samples, started, ports)
            received = {
                host.name: host.rx_bytes() - received_before[host.name] for host in self.node_hosts
            }
            origin_tx = self.origin.tx_bytes() - origin_before
            cpu_by_node = {
                job.name: self._node_cpu(job, host)
                for job, host in zip(jobs, self.node_hosts, strict=True)
            }
        finally:
            if slowing is not None:
                slowing.cancel()
                slowing.join()
                self.origin.set_rates(config.origin_up, config.origin_down)  # for the next
            if self.tracer:
                os.killpg(self.tracer.pid, signal.SIGTERM)
                self.tracer.wait(10)
                self.tracer = None
            self._stop_nodes(root)
            self.coordinator.stop()
        nodes = []
        for job in jobs:
            path = root / job.name / "dest" / NAME
            ok = path.exists() and file_sha256(path) == self.sha256
            by_source = (job.done_event or {}).get("bytes_by_source")
            nodes.append(
                NodeResult(job.name, round(job.seconds, 3), ok, by_source,
                           round(cpu_by_node[job.name], 3), received[job.name])
            )  # fmt: skip
        bad = [n.node for n in nodes if not n.sha256_ok]
        if bad:
            raise FleetError(f"{name}: wrong or missing file (SHA-256 mismatch) on {bad}")
        drops = {
            k: v - drops_before.get(k, 0)
            for k, v in self.lab.qdisc_drops().items()
            if v > drops_before.get(k, 0)
        }
        if drops:
            notes.append(f"tbf drops (packets) during the run: {drops}")
        if self.wan is not None:
            notes.append(f"WAN during the run: {_wan_delta(wan_before, self.wan.stats())}")
        if links.error:
            notes.append(links.error)
        if not self.keep:
            shutil.rmtree(root, ignore_errors=True)
        return SystemResult(
            name, all_done, nodes, origin_tx, config.bound(), config.size,
            cpu.average, cpu.saturated, notes, use,
        )  # fmt: skip

    def _link_use(self, links: LinkSampler, started: float, all_done: float) -> LinkUse | None:
        """The run's links as :mod:`swarm.lab.linkuse` sums them, every capacity at the
        configured rate (s3-slows' origin counts its first rate throughout: the host's
        own is the slowed one until the run's cleanup restores it)."""
        config, byte_rate = self.config, 1e6 / 8
        link = (config.node_down * byte_rate, config.node_up * byte_rate)
        nodes = {host.port: link for host in self.node_hosts}
        origin = (self.origin.port, config.origin_up * byte_rate)
        return link_use(links.samples, started, started + all_done, nodes, origin)

    def _node_cpu(self, job: Job, host: Host) -> float:
        """CPU seconds of ``job``'s node (``host``) so far: every process in its namespace
        (a daemon, a seeding client) and the client, alive or exited."""
        others = [pid for pid in host.pids() if pid != job.process.pid]
        return sum(cpu_seconds(pid) or 0.0 for pid in others) + job.cpu_seconds()

    def _start_seeders(self, sys_: System, root: Path) -> None:
        """Give every seeder host the complete artifact, seeded by the system's client."""
        jobs = []
        for host in self.seeder_hosts:
            node_dir = root / host.name
            dest = node_dir / "dest"
            dest.mkdir(parents=True)
            env = {**self.env, **sys_.env(), "SWARM_HOME": str(node_dir / "home")}
            if not sys_.seeder_fetches:  # it finds the complete file and seeds it
                shutil.copyfile(self.source, dest / NAME)
            jobs.append(
                Job(f"{sys_.name}-{host.name}", host,
                    sys_.command(self, host, dest, seed=True), env,
                    node_dir / "client.log", time.monotonic())
            )  # fmt: skip
        wait_jobs(jobs, SEEDER_TIMEOUT, f"{sys_.name} seeders")
        log(f"{sys_.name}: {len(jobs)} seeders ready")

    def _dump_stacks(self, root: Path, jobs: list[Job]) -> str:
        """Have every node's daemon write its threads' stacks to its log (SIGUSR1:
        faulthandler, at once); the stacks of the clients not done yet (py-spy, where
        installed), for the error to say."""
        for host in self.node_hosts:
            pid = daemon_pid(root / host.name / "home")
            if pid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGUSR1)
        spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which(
            "py-spy"
        )
        if spy is None:
            return ""
        stacks = []
        for job in jobs:
            if job.settled.is_set():
                continue
            try:
                done = subprocess.run(
                    [spy, "dump", "--pid", str(job.process.pid)],
                    capture_output=True, text=True, timeout=20, check=False,
                )  # fmt: skip
                stacks.append(f"{job.name}'s client: {(done.stdout or done.stderr).strip()}")
            except subprocess.TimeoutExpired:
                stacks.append(f"{job.name}'s client: py-spy did not answer")
        return "\n" + "\n".join(stacks)

    def _stop_nodes(self, root: Path) -> None:
        """Kill every client and daemon of this system (daemons by their pid file first)."""
        for host in self.seeder_hosts + self.node_hosts:
            pid = daemon_pid(root / host.name / "home")
            if pid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)
        self.lab.stop_processes([h.netns for h in self.seeder_hosts + self.node_hosts])


@contextlib.contextmanager
def started_fleet(
    config: FleetConfig,
    keep: bool = False,
    lab_name: str = "fl",
    extra_env: Mapping[str, str] | None = None,
) -> Iterator[Fleet]:
    """A fleet in a fresh work directory and lab, its origin started and the artifact
    published; the directory goes on exit unless ``keep`` (the bench's and the tests'
    one way to set a fleet up). ``extra_env``: see :class:`Fleet`."""
    work = Path(tempfile.mkdtemp(prefix="swarm-fleet-"))
    try:
        with Lab(lab_name, tcp_cc=config.tcp_cc) as lab:
            fleet = Fleet(config, lab, work, keep, extra_env)
            fleet.start_origin()
            yield fleet
    finally:
        if keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def compile_swarm() -> None:
    """Byte-compile the swarm package, as installing it does (pip compiles a wheel's
    modules). A checkout run with ``PYTHONDONTWRITEBYTECODE`` (CI images, this machine)
    has no bytecode, and every client and daemon then compiled its modules from source
    at start: a fifth of a daemon's Python samples in an s3-fast fleet, on CPU the
    baselines do not spend."""
    import swarm

    compileall.compile_dir(Path(swarm.__file__).parent, quiet=1)


def run_fleet(
    config: FleetConfig,
    systems: Sequence[System | str],
    keep: bool = False,
    extra_env: Mapping[str, str] | None = None,
) -> tuple[list[SystemResult], dict[str, str]]:
    """Run ``systems`` (or the systems so named) one after the other; returns their
    results and, per system that failed (a timeout, a client error, a wrong file), why. A
    failed system does not stop the others; the setup failing does (FleetError).
    ``extra_env``: see :class:`Fleet`."""
    reason = lab_unavailable()
    if reason:
        raise FleetError(f"cannot build the network lab: {reason}")
    chosen = [system(each) if isinstance(each, str) else each for each in systems]
    for each in chosen:
        why = each.unavailable()
        if why:
            raise FleetError(why)
    compile_swarm()
    results: list[SystemResult] = []
    failures: dict[str, str] = {}
    with started_fleet(config, keep=keep, extra_env=extra_env) as fleet:
        for each in chosen:
            log(f"{each.name}: {config.nodes} nodes, {config.seeders} seeders")
            try:
                result = fleet.run_system(each)
            except (FleetError, LabError) as error:
                log(f"{each.name}: FAILED: {error}")
                failures[each.name] = str(error)
                continue
            log(
                f"{each.name}: all done in {result.all_done:.1f}s "
                f"({result.all_done / result.bound:.2f} x T*)"
            )
            results.append(result)
    return results, failures
