"""``swarm fetch`` reads the manifest while the daemon it starts comes up, and hands it
over (ManifestPreread): against a real S3 server (moto) and a real daemon."""

from __future__ import annotations

import json
from pathlib import Path

import boto3

from swarm.agent.preread import ManifestPreread
from swarm.catalog import entry_url
from swarm.manifest import manifest_key
from swarm.s3http import S3Url
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
    # the manifest beside the object the catalog entry names, as S3 holds it
    s3 = boto3.client("s3", endpoint_url=endpoint)
    entry = entry_url(catalog, "index.db")
    body = s3.get_object(Bucket=entry.bucket, Key=entry.key)["Body"].read()
    published = S3Url.parse(json.loads(body)["url"])
    key = manifest_key(published.key)
    assert key in {o["Key"] for o in s3.list_objects_v2(Bucket=published.bucket)["Contents"]}
    assert text == s3.get_object(Bucket=published.bucket, Key=key)["Body"].read().decode()
