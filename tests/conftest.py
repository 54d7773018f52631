from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from swarm.manifest import Manifest
from swarm.pieces import write_random_file
from tests.servers import moto_server

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """One real S3 server (moto_server) on loopback for the whole session."""
    os.environ.update(CREDENTIALS)
    with moto_server() as url:
        yield url


@pytest.fixture
def env(s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment for swarm processes: S3 endpoint, credentials, a node home, no secret."""
    values = {
        **CREDENTIALS,
        "AWS_ENDPOINT_URL": s3_endpoint,
        "SWARM_HOME": str(tmp_path / "home"),
        "SWARM_CONFIG": str(tmp_path / "no-such-swarm.toml"),
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    for key in ("SWARM_SECRET", "SWARM_CATALOG", "SWARM_COORDINATOR", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    return {**os.environ, **values}


SIZE = 24 * (1 << 20)
"""Size of the shared published artifact: 24 pieces of 1 MiB (the default piece size)."""


@pytest.fixture
def artifact(env: dict[str, str], bucket: str, tmp_path: Path) -> Path:
    """A published artifact named ``index.db`` with a catalog entry (SWARM_CATALOG set in
    ``env``); returns the local file."""
    import subprocess

    from tests.servers import BIN

    src = make_artifact(tmp_path / "index.db", SIZE, seed=3)
    catalog = f"s3://{bucket}/catalog/"
    subprocess.run(
        [
            str(BIN / "swarm"),
            "publish",
            str(src),
            f"s3://{bucket}/b/index.db",
            "--name",
            "index.db",
            "--catalog",
            catalog,
        ],
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    env["SWARM_CATALOG"] = catalog
    return src


@pytest.fixture
def bucket(env: dict[str, str]) -> str:
    name = f"test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"]).create_bucket(Bucket=name)
    return name


def make_artifact(path: Path, size: int, seed: int = 0) -> Path:
    """A file of pseudo-random bytes (incompressible, repeatable by seed)."""
    write_random_file(path, size, seed)
    return path


def put_artifact(
    env: dict[str, str], bucket: str, tmp_path: Path, size: int, piece_size: int
) -> Manifest:
    """An artifact ``a.bin`` of ``size`` bytes in ``bucket`` (key ``a.bin``) and its
    manifest, for a test that drives a daemon's sources directly."""
    src = make_artifact(tmp_path / "a.bin", size)
    manifest = Manifest.from_file(
        src, name="a.bin", piece_size=piece_size, bucket=bucket, key="a.bin", web_seed=None
    )
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"]).put_object(
        Bucket=bucket, Key="a.bin", Body=src.read_bytes()
    )
    return manifest
