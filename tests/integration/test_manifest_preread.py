"""``swarm fetch`` reads the manifest while the daemon it starts comes up, and hands it
over (ManifestPreread): against a real S3 server (moto) and a real daemon."""

from __future__ import annotations

from pathlib import Path

import boto3

from swarm.agent.client import ManifestPreread
from swarm.manifest import manifest_key
from tests.swarmnet import Swarm, done_event

READ_AHEAD = "manifest as swarm fetch read it while this daemon started"


def test_a_fresh_daemon_takes_the_manifest_swarm_fetch_read(fleet: Swarm, tmp_path: Path) -> None:
    node = fleet.node(0)
    done_event(node.fetch("index.db", tmp_path / "a"), timeout=60)
    log = (node.home / "daemon.log").read_text()
    assert log.count(READ_AHEAD) == 1, log[-2000:]
    # a daemon already up reads for itself (it may have other settings than this command)
    done_event(node.fetch("index.db", tmp_path / "b"), timeout=60)
    assert (node.home / "daemon.log").read_text().count(READ_AHEAD) == 1
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


def test_a_read_that_fails_leaves_it_to_the_daemon(env: dict[str, str], artifact: Path) -> None:
    """No exception and no text: the daemon then reads, retries and reports for itself."""
    catalog, endpoint = env["SWARM_CATALOG"], env["AWS_ENDPOINT_URL"]
    assert ManifestPreread("no-such-name", catalog, endpoint, None).result(10) is None
    text = ManifestPreread("index.db", catalog, endpoint, None).result(10)
    bucket = catalog.removeprefix("s3://").split("/")[0]
    s3 = boto3.client("s3", endpoint_url=endpoint)
    key = next(
        o["Key"]
        for o in s3.list_objects_v2(Bucket=bucket)["Contents"]
        if o["Key"].endswith(".swarm")
    )
    assert text == s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode()
    assert key == manifest_key(key.removesuffix(".swarm"))
