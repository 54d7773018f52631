"""The node's S3 client (swarm.s3http) against a real S3 server (moto) on loopback, and
behind the fault proxy."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import boto3
import pytest

from swarm.errors import AccessDeniedError, NotFoundError
from swarm.s3http import (
    NoCredentialsError,
    S3Client,
    S3ConnectionError,
    S3ResponseError,
    S3Url,
    raise_for,
)
from tests.servers import FaultProxy, Faults

DATA = os.urandom(300_000)


@pytest.fixture
def stored(env: dict[str, str], bucket: str) -> str:
    """A key holding ``DATA``, with a name that needs escaping in a path."""
    key = "dir/a b+c=d~e.bin"
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"]).put_object(
        Bucket=bucket, Key=key, Body=DATA
    )
    return key


def _read(client: S3Client, bucket: str, key: str, byte_range: str | None = None) -> bytes:
    body = client.get_object(Bucket=bucket, Key=key, Range=byte_range)["Body"]
    try:
        return body.read()
    finally:
        body.close()


def test_a_whole_object_and_a_range_are_read_signed(env, bucket, stored):
    client = S3Client(env["AWS_ENDPOINT_URL"])
    assert _read(client, bucket, stored) == DATA
    assert _read(client, bucket, stored, "bytes=1000-1999") == DATA[1000:2000]


def test_a_missing_key_is_not_found_and_says_how_to_publish(env, bucket):
    client = S3Client(env["AWS_ENDPOINT_URL"])
    with pytest.raises(S3ResponseError) as caught:
        _read(client, bucket, "no-such-key")
    assert caught.value.status == 404 and caught.value.code == "NoSuchKey"
    url = S3Url(bucket, "no-such-key")
    with pytest.raises(NotFoundError, match="swarm publish"):
        raise_for(caught.value, url)


def test_access_denied_is_final_and_names_the_permission(env, bucket, stored):
    """S3's 403 AccessDenied (from the fault proxy, as S3 words it) is not retried."""
    faults = Faults(fail_every=1, fail_status=403)
    with FaultProxy(env["AWS_ENDPOINT_URL"], faults) as proxy:
        client = S3Client(proxy.url)
        with pytest.raises(S3ResponseError) as caught:
            _read(client, bucket, stored)
    assert caught.value.status == 403 and caught.value.code == "AccessDenied"
    assert faults.failed == 1
    with pytest.raises(AccessDeniedError, match="s3:GetObject"):
        raise_for(caught.value, S3Url(bucket, stored))


def test_slowdown_is_retried_before_the_caller_sees_it(env, bucket, stored):
    """Every other request answers 503 SlowDown: each call succeeds on its second try."""
    faults = Faults(fail_every=2, fail_status=503)
    with FaultProxy(env["AWS_ENDPOINT_URL"], faults) as proxy:
        client = S3Client(proxy.url, max_attempts=3)
        for _ in range(3):
            assert _read(client, bucket, stored, "bytes=0-99") == DATA[:100]
    assert faults.failed >= 2


def test_an_outage_longer_than_the_tries_is_reported(env, bucket, stored):
    faults = Faults(fail_every=1, fail_status=503)
    with FaultProxy(env["AWS_ENDPOINT_URL"], faults) as proxy:
        client = S3Client(proxy.url, max_attempts=2)
        with pytest.raises(S3ResponseError) as caught:
            _read(client, bucket, stored)
    assert caught.value.status == 503 and caught.value.code == "SlowDown"
    assert faults.failed == 2


def test_a_refused_endpoint_is_a_connection_error(bucket, stored):
    client = S3Client("http://127.0.0.1:9", max_attempts=1)
    with pytest.raises(S3ConnectionError):
        _read(client, bucket, stored)


def test_no_credentials_anywhere_is_reported_as_such(env, tmp_path, bucket, stored):
    """No keys in the environment, no profile files, no instance role (IMDS disabled)."""
    home = tmp_path / "nohome"
    home.mkdir()
    clean = {k: v for k, v in env.items() if not k.startswith("AWS_")}
    clean.update(
        HOME=str(home),
        AWS_ENDPOINT_URL=env["AWS_ENDPOINT_URL"],
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=str(home / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(home / "none"),
    )
    code = (
        "import sys\n"
        "from swarm.s3http import S3Client, NoCredentialsError\n"
        "try:\n"
        f"    S3Client().get_object(Bucket={bucket!r}, Key={stored!r})\n"
        "except NoCredentialsError:\n"
        "    sys.exit(42)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=clean, timeout=60, check=False)
    assert done.returncode == 42
    with pytest.raises(AccessDeniedError, match="no AWS credentials"):
        raise_for(NoCredentialsError("none"), S3Url(bucket, stored))


def _loaded_after(imports: str, watched: tuple[str, ...]) -> tuple[list[str], int]:
    """Which of ``watched`` a fresh interpreter holds after ``import IMPORTS``, and how
    many threads it runs."""
    code = (
        f"import sys, threading\nimport {imports}\n"
        f"print(sorted(m for m in {watched!r} if m in sys.modules), threading.active_count())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    loaded, threads = done.stdout.strip().rsplit(" ", 1)
    return ast.literal_eval(loaded), int(threads)


def test_a_node_never_imports_botocore():
    """The daemon's and the --no-daemon fetch's modules leave botocore (0.25 CPU-s at a
    node's start, its import and client) to publish and the seeders."""
    node = "swarm.agent.serve, swarm.agent.fetch, swarm.cli.fetch"
    assert _loaded_after(node, ("botocore", "boto3", "urllib3"))[0] == []


def test_swarm_fetch_runs_no_native_threads_before_it_forks_the_daemon():
    """`swarm fetch` forks its node's daemon (swarm.agent.client.fork_daemon): a fork
    carries only the calling thread, so nothing that starts threads of its own (awscrt's
    event loops, libtorrent's session) may be loaded in the CLI before it. The S3 client
    and the early read's modules are (the daemon shares them): importing them loads
    neither awscrt (only resolving credentials without keys in the environment does)."""
    cli = (
        "swarm.cli, swarm.cli.fetch, swarm.agent.client, swarm.agent.earlyread, "
        "swarm.agent.store, swarm.progress"
    )
    loaded = _loaded_after(cli, ("awscrt", "libtorrent", "swarm.s3http", "swarm.sources.s3"))
    assert loaded == (["swarm.s3http", "swarm.sources.s3"], 1)
