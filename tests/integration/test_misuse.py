"""Nothing wrong at DEST, ever: concurrent fetches to one DEST, deadlines against an S3
endpoint that never answers, a file rewritten while it is published, clean stops, and
every bad value a usage error (issue "Nothing wrong at DEST"). Real daemons, moto."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SIZE, make_artifact
from tests.integration.test_publish_fetch import MiB, run
from tests.servers import BIN, FaultProxy, Faults, wait_until
from tests.swarmnet import SWARM, Node, Swarm, done_event, running

ROUNDS = 10


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def swarm_cli(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SWARM, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture
def two_artifacts(env, bucket, tmp_path) -> dict[str, str]:
    """Two artifacts of different sizes: s3 URL -> SHA-256."""
    shas = {}
    for name, size, seed in (("a32.bin", 3 * MiB, 1), ("b48.bin", 5 * MiB, 2)):
        src = make_artifact(tmp_path / name, size, seed=seed)
        url = f"s3://{bucket}/{name}"
        code, _, err = run("publish", str(src), url, "--piece-size", "256K")
        assert code == 0, err
        shas[url] = sha256(src)
    return shas


def fetch_process(
    node: Node, source: str, dest: Path, *args: str, no_daemon: bool = False
) -> subprocess.Popen[str]:
    """``swarm fetch`` as ``node`` (through its daemon, or ``--no-daemon``), JSON events."""
    if not no_daemon:
        return node.fetch(source, dest, *args)
    process = subprocess.Popen(
        [SWARM, "fetch", source, str(dest), "--no-daemon", "--json", *args],
        env=node.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    node.fetches.append(process)
    return process


def events(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("mode", ["same-home", "two-homes", "no-daemon"])
def test_concurrent_fetches_to_one_dest_never_lie(env, two_artifacts, tmp_path, mode):
    dest = tmp_path / "out" / "r"
    dest.parent.mkdir()
    with Swarm(tmp_path / "nodes", env) as swarm:
        (tmp_path / "nodes").mkdir()
        nodes = [swarm.node(0), swarm.node(0 if mode == "same-home" else 1)]
        for node in nodes:
            node.env.pop("SWARM_COORDINATOR", None)
        for _ in range(ROUNDS):
            procs = [
                fetch_process(node, url, dest, no_daemon=mode == "no-daemon")
                for node, url in zip(nodes, two_artifacts, strict=True)
            ]
            results = [(p, *p.communicate(timeout=120)) for p in procs]
            finished = []
            for (proc, out, err), url in zip(results, two_artifacts, strict=True):
                assert "Traceback" not in err, err
                assert proc.returncode in (0, 8), err  # done, or DEST busy
                if proc.returncode == 8:  # refused at the start, or overtaken at the end
                    assert "by another swarm fetch" in err, err
                else:
                    done = events(out)[-1]
                    assert done["event"] == "done"
                    finished.append((done["ts"], url))
            assert finished, "one of the two fetches must finish"
            # The last fetch to say `done` is what DEST holds.
            _, last = max(finished)
            assert sha256(dest) == two_artifacts[last]
            dest.chmod(0o644)
            dest.unlink()
        leftovers = [p.name for p in dest.parent.iterdir()]
        assert leftovers == [], leftovers


@contextlib.contextmanager
def silent_endpoint() -> Iterator[str]:
    """An 'S3 endpoint' that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(2)
        for conn in held:
            conn.close()
        server.close()


@pytest.mark.parametrize("path", ["no-daemon", "daemon"])
def test_deadline_holds_against_an_endpoint_that_never_answers(env, tmp_path, path):
    deadline = 4.0
    with silent_endpoint() as endpoint, Swarm(tmp_path / "nodes", env) as swarm:
        (tmp_path / "nodes").mkdir()
        node = swarm.node(0)
        node.env.pop("SWARM_COORDINATOR", None)
        node.env["AWS_ENDPOINT_URL"] = endpoint
        started = time.monotonic()
        proc = fetch_process(
            node,
            "s3://bkt/x.bin",
            tmp_path / "x.bin",
            "--deadline",
            str(deadline),
            no_daemon=path == "no-daemon",
        )
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - started
        assert proc.returncode == 7, err
        assert "deadline" in err and "Traceback" not in err
        assert took < deadline + 2 + (1.5 if path == "daemon" else 0.5), took  # + process start
        pid = node.daemon_pid()
        if pid:  # its daemon still waits on the endpoint: a stop must not wait for it
            os.kill(pid, signal.SIGTERM)
            wait_until(lambda: not running(pid), 10, "the daemon to stop within 10 s")


def test_data_deleted_under_a_seeder_is_no_longer_advertised(fleet, artifact, tmp_path):
    seeder = fleet.node(0)
    dest = tmp_path / "seeded.db"
    done_event(seeder.fetch("index.db", dest), 120)
    dest.unlink()  # rm under a seeding daemon
    wait_until(lambda: seeder.artifacts() == [], 15, "the seeder to stop advertising it")
    fresh = fleet.node(1)
    started = time.monotonic()
    done_event(fresh.fetch("index.db", tmp_path / "fresh.db"), 60)
    assert time.monotonic() - started < 60
    assert sha256(tmp_path / "fresh.db") == sha256(artifact)


def test_file_rewritten_during_publish_is_refused(env, bucket, tmp_path):
    src = make_artifact(tmp_path / "moving.bin", 16 * MiB, seed=9)
    faults = Faults(throttle_bps=4 * MiB)  # a slow upload: the rewrite lands inside it
    with FaultProxy(env["AWS_ENDPOINT_URL"], faults) as proxy:
        proc = subprocess.Popen(
            [SWARM, "publish", str(src), f"s3://{bucket}/moving.bin"],
            env={**env, "AWS_ENDPOINT_URL": proxy.url},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_until(lambda: faults.requests >= 2, 30, "the upload to start")
        with src.open("r+b") as f:  # the build rewrites its output meanwhile
            f.write(b"\xff" * 4096)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "changed while it was published" in err
    code, _, err = run("fetch", f"s3://{bucket}/moving.bin", str(tmp_path / "m"), "--no-daemon")
    assert code == 3, err  # no manifest was recorded: nothing a fetch would reject


def test_sigterm_mid_fetch_stops_the_daemon_within_10s_and_the_rerun_resumes(
    fleet, artifact, env, tmp_path
):
    with FaultProxy(env["AWS_ENDPOINT_URL"], Faults(throttle_bps=3 * MiB)) as proxy:
        node = fleet.node(0)
        node.env["AWS_ENDPOINT_URL"] = proxy.url
        node.env.pop("SWARM_COORDINATOR", None)
        dest = tmp_path / "dest.db"
        proc = node.fetch("index.db", dest)
        wait_until(
            lambda: any(a["have_bytes"] >= 4 * MiB for a in node.artifacts()), 60, "progress"
        )
        pid = node.daemon_pid()
        assert pid
        sent = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not running(pid), 10, "the daemon to stop")
        assert time.monotonic() - sent < 10
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 1 and "daemon stopped answering" in err, err
        assert "Traceback" not in err
        assert not dest.exists()
        done = done_event(node.fetch("index.db", dest), 120)
    assert done["bytes_by_source"]["s3"] < SIZE  # resumed, not started over
    assert sha256(dest) == sha256(artifact)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["fetch", "s3://bkt", "DEST", "--no-daemon"], "names no object"),
        (["fetch", "s3://bkt/k", "DEST", "--listen", "notanip"], "not an IP address"),
        (["fetch", "s3://bkt/k", "DEST", "--deadline", "nan"], "finite"),
        (["fetch", "s3://bkt/k", "DEST", "--no-daemon", "--range-size", "0"], "at least 1"),
        (["fetch", "s3://bkt/k", "DEST", "--concurrency", "4"], "--no-daemon only"),
        (["status", "--coordinator", "garbage"], "bad coordinator URL"),
        (["daemon", "--listen", "notanip"], "not an IP address"),
    ],
)
def test_bad_values_are_usage_errors(env, tmp_path, args, needle):
    args = [str(tmp_path / "d") if a == "DEST" else a for a in args]
    result = swarm_cli(*args, env=env)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("make", "extra", "needle"),
    [
        (lambda p: p.write_bytes(b""), [], "is empty"),
        (lambda p: p.write_bytes(b"x" * 1024), ["--piece-size", "512M"], "power of two"),
        (lambda p: p.write_bytes(b"x" * 1024), ["--piece-size", "1G"], "power of two"),
        (lambda p: p.write_bytes(b"x" * 1024), ["--name", "../evil"], "--name"),
    ],
)
def test_publish_refuses_what_a_fetch_cannot_take(env, bucket, tmp_path, make, extra, needle):
    src = tmp_path / "f.bin"
    make(src)
    env = {**env, "SWARM_CATALOG": f"s3://{bucket}/catalog/"}
    result = swarm_cli("publish", str(src), f"s3://{bucket}/f.bin", *extra, env=env)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr and "Traceback" not in result.stderr


def test_publish_to_a_key_that_makes_a_bad_name_is_a_usage_error(env, bucket, tmp_path):
    src = tmp_path / "f.bin"
    src.write_bytes(b"x" * 1024)
    result = swarm_cli("publish", str(src), f"s3://{bucket}/a key/..", env=env)
    assert result.returncode == 2, result.stderr


def test_publish_checks_the_catalog_before_uploading(env, bucket, tmp_path):
    src = tmp_path / "f.bin"
    src.write_bytes(b"x" * 1024)
    env = {**env, "SWARM_CATALOG": "s3://no-such-catalog-bucket/c/"}
    result = swarm_cli("publish", str(src), f"s3://{bucket}/f.bin", "--name", "f", env=env)
    assert result.returncode == 3, result.stderr
    code, _, _ = run("fetch", f"s3://{bucket}/f.bin", str(tmp_path / "x"), "--no-daemon")
    assert code == 3  # nothing was uploaded first


@contextlib.contextmanager
def taken_port(ip: str) -> Iterator[int]:
    """A TCP port on ``ip`` that something else listens on, for as long as the block runs."""
    taken = socket.socket()
    taken.bind((ip, 0))
    taken.listen()
    try:
        yield taken.getsockname()[1]
    finally:
        taken.close()


def test_busy_port_is_an_error_not_a_silent_move(env, tmp_path):
    home = tmp_path / "home"
    with taken_port("127.0.0.77") as port:
        result = swarm_cli(
            "daemon",
            "--listen",
            "127.0.0.77",
            "--port",
            str(port),
            "--udp-port",
            "0",
            env={**env, "SWARM_HOME": str(home)},
        )
    assert result.returncode == 2, result.stderr
    assert f"cannot listen on 127.0.0.77:{port}" in result.stderr


def test_busy_udp_port_is_an_error_before_the_daemon_serves(env, tmp_path):
    """The UDP server starts a second after the daemon listens, but its port is the
    daemon's from the start: a busy one is refused then, exit code 2, with what to do."""
    home = tmp_path / "home"
    secret = "misuse-fleet-secret-0123456789"
    with taken_port("127.0.0.78") as port:
        result = swarm_cli(
            "daemon",
            "--listen",
            "127.0.0.78",
            "--udp-port",
            str(port),
            env={**env, "SWARM_HOME": str(home), "SWARM_SECRET": secret},
        )
    assert result.returncode == 2, result.stderr
    assert f"cannot serve UDP on 127.0.0.78:{port}" in result.stderr
    assert "--udp-port 0" in result.stderr
    assert "listening on" not in result.stderr


assert BIN.exists()
