"""The origin: an S3 server on a lab host, a bucket, and an artifact published to it.

One way to start S3 for the demo (loopback, moto with a paced origin link), the fleet
tests (a namespace, moto) and the fleet bench (a namespace, MinIO or moto)::

    s3 = S3Server(host, "minio", port=9000, work=work, env=env)
    s3.start()
    s3.create_bucket("fleet", public_read=True)       # waits until it answers
    summary = publish(host, env, source, "s3://fleet/a.bin", name="a.bin")
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from swarm.lab.hosts import LabHost

S3Kind = Literal["minio", "moto", "demo"]
S3_KINDS: tuple[S3Kind, ...] = ("minio", "moto", "demo")
BIN = Path(sys.executable).parent
MINIO_BIN_DIR = Path.home() / ".cache" / "swarm" / "bin"
MINIO_BIN = MINIO_BIN_DIR / "minio"
"""MinIO as :func:`build_minio` builds it (the benches' origin: fast enough for 1500 Mbit;
moto reads the whole object on every ranged GET, wrong for anything timed)."""
MINIO_MODULE = "github.com/minio/minio@v0.0.0-20260212201848-7aac2a2c5b7c"
MINIO_BUILD_TIMEOUT = 1800.0
READY_TIMEOUT = 60.0
PUBLISH_TIMEOUT = 300.0

SWARM: list[str] = (
    [str(BIN / "swarm")] if (BIN / "swarm").exists() else [sys.executable, "-m", "swarm"]
)
"""How the lab runs ``swarm``: the venv's console script, else this Python's module."""

CREATE_BUCKET = """\
import json, sys, time, urllib.request, boto3
from botocore.config import Config
endpoint, bucket, deadline = sys.argv[1], sys.argv[2], time.monotonic() + float(sys.argv[3])
public_read = sys.argv[4] == "1"
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
if public_read:
    s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"AWS": ["*"]},
                       "Action": ["s3:GetObject"], "Resource": ["arn:aws:s3:::%s/*" % bucket]}],
    }))
"""
"""Run on the S3 server's host (a namespace's address is reachable only from the lab)."""


class S3Error(RuntimeError):
    """The S3 server cannot start, or the publish failed."""


def build_minio(log: Callable[[str], None]) -> Path:
    """The pinned MinIO server, built with ``go install`` into the cache on first use
    (a few minutes, once); ``log`` tells the operator why the wait."""
    if MINIO_BIN.is_file() and os.access(MINIO_BIN, os.X_OK):
        return MINIO_BIN
    go = shutil.which("go")
    if not go:
        raise S3Error(
            f"MinIO is not built ({MINIO_BIN} missing) and `go` is not on PATH: install Go "
            f"(https://go.dev/dl/), or build it yourself with "
            f"GOBIN={MINIO_BIN_DIR} go install {MINIO_MODULE}"
        )
    log(
        f"building MinIO once into {MINIO_BIN_DIR} (go install {MINIO_MODULE}); this takes "
        "a few minutes and is cached for later runs ..."
    )
    MINIO_BIN_DIR.mkdir(parents=True, exist_ok=True)
    command = [go, "install", MINIO_MODULE]
    env = {**os.environ, "GOBIN": str(MINIO_BIN_DIR)}
    try:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=MINIO_BUILD_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        raise S3Error(f"building MinIO timed out after {MINIO_BUILD_TIMEOUT:g}s") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-2000:]
        raise S3Error(
            f"building MinIO failed (exit {done.returncode}): {' '.join(command)}\n{tail}"
        )
    if not MINIO_BIN.is_file():
        raise S3Error(f"go install finished but {MINIO_BIN} does not exist")
    return MINIO_BIN


class S3Server:
    """An S3 server on ``host``: ``minio`` (MinIO's binary), ``moto`` (``moto_server``)
    or ``demo`` (:mod:`swarm.demo_s3`: moto with fast ranged GETs and object bytes paced
    at ``rate`` bytes/s, counted at ``/_demo/stats``). ``env`` carries the credentials
    (MinIO takes its root user from ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``)."""

    def __init__(
        self,
        host: LabHost,
        kind: S3Kind,
        port: int,
        work: Path,
        env: dict[str, str],
        rate: int = 0,
    ) -> None:
        if kind not in S3_KINDS:
            raise ValueError(f"S3 server kind must be one of {S3_KINDS}, got {kind!r}")
        self.host = host
        self.kind = kind
        self.port = port
        self.work = work
        self.env = env
        self.rate = rate
        self.url = f"http://{host.ip}:{port}"
        self.process: subprocess.Popen[Any] | None = None

    def command(self) -> tuple[list[str], dict[str, str]]:
        ip = self.host.ip
        if self.kind == "minio":
            if not MINIO_BIN.exists():
                raise S3Error(
                    f"MinIO is not built ({MINIO_BIN}): bench/fleet.py builds it on first "
                    "use, or use moto"
                )
            env = {
                **self.env,
                "MINIO_ROOT_USER": self.env["AWS_ACCESS_KEY_ID"],
                "MINIO_ROOT_PASSWORD": self.env["AWS_SECRET_ACCESS_KEY"],
                "MINIO_BROWSER": "off",
                "MINIO_UPDATE": "off",
            }
            data = self.work / "s3-data"
            data.mkdir(parents=True, exist_ok=True)
            return [str(MINIO_BIN), "server", "--quiet", "--address", f"{ip}:{self.port}",
                    "--console-address", f"{ip}:{self.port + 1}", str(data)], env  # fmt: skip
        if self.kind == "moto":
            return [str(BIN / "moto_server"), "-H", ip, "-p", str(self.port)], self.env
        return [sys.executable, "-m", "swarm.demo_s3", "--host", ip, "--port", str(self.port),
                "--rate", str(self.rate)], self.env  # fmt: skip

    def start(self, log: str = "s3.log") -> None:
        """Start the server (returns at once: :meth:`wait_ready` or :meth:`create_bucket`
        wait for it); its output goes to ``work/log``."""
        args, env = self.command()
        with (self.work / log).open("ab") as out:
            self.process = self.host.popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        self.host.wait_http(self.url + "/", timeout, f"the S3 server ({self.kind})")

    def create_bucket(self, bucket: str, public_read: bool = False) -> None:
        """Create ``bucket`` once the server answers; ``public_read``: anyone may GET its
        objects (a BitTorrent client's web seed reads anonymously)."""
        self.host.run(
            [sys.executable, "-c", CREATE_BUCKET, self.url, bucket, str(READY_TIMEOUT),
             "1" if public_read else "0"],
            env={**self.env, "AWS_ENDPOINT_URL": self.url},
            timeout=READY_TIMEOUT + 30,
        )  # fmt: skip


def publish(
    host: LabHost,
    env: dict[str, str],
    source: Path,
    uri: str,
    name: str | None = None,
    piece_size: int | None = None,
    catalog: str | None = None,
    timeout: float = PUBLISH_TIMEOUT,
) -> dict[str, Any]:
    """``swarm publish SOURCE URI`` on ``host``; returns its JSON summary (sha256, pieces)."""
    args = [*SWARM, "publish", str(source), uri, "--json"]
    if name:
        args += ["--name", name]
    if piece_size:
        args += ["--piece-size", str(piece_size)]
    if catalog:
        args += ["--catalog", catalog]
    done = host.run(args, env=env, timeout=timeout)
    summary: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return summary
