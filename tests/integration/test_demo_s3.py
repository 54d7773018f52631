"""The demo's S3 server (moto behind :mod:`swarm.demo_s3`) on loopback, driven by boto3:
its fast ranged GETs answer what moto answers, moto still answers everything else, and
object bytes leave at the capped rate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import boto3
import pytest
from botocore.exceptions import ClientError

from swarm.demo_s3 import STATS_PATH
from tests.servers import _answers, free_port, wait_until

SIZE = 12 << 20
RATE = 16 << 20


@pytest.fixture(scope="module")
def demo_s3() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "swarm.demo_s3", "--port", str(port), "--rate", str(RATE)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(url + "/moto-api/"), 30, "the demo's S3 server")
        yield url
    finally:
        process.kill()
        process.wait(10)


@pytest.fixture(scope="module")
def client(demo_s3: str):
    s3 = boto3.client(
        "s3",
        endpoint_url=demo_s3,
        aws_access_key_id="demo",
        aws_secret_access_key="demo-secret",
        region_name="us-east-1",
    )
    s3.create_bucket(Bucket="demo-s3-test")
    s3.put_object(Bucket="demo-s3-test", Key="dir/obj ect", Body=DATA)
    return s3


DATA = os.urandom(SIZE)


def sent(url: str) -> int:
    with urllib.request.urlopen(url + STATS_PATH, timeout=5) as response:
        return json.loads(response.read())["bytes_out"]


@pytest.mark.parametrize(
    ("header", "start", "stop"),
    [("bytes=0-1048575", 0, 1 << 20), ("bytes=5242880-", 5 << 20, SIZE), ("bytes=7-7", 7, 8),
     ("bytes=12000000-99999999", 12000000, SIZE)],
)  # fmt: skip
def test_ranged_gets_answer_the_bytes_and_headers_moto_would(client, header, start, stop):
    got = client.get_object(Bucket="demo-s3-test", Key="dir/obj ect", Range=header)
    head = client.head_object(Bucket="demo-s3-test", Key="dir/obj ect")  # moto's answer
    assert got["Body"].read() == DATA[start:stop]
    assert got["ContentRange"] == f"bytes {start}-{stop - 1}/{SIZE}"
    assert got["ContentLength"] == stop - start
    assert got["ETag"] == head["ETag"] and got["LastModified"] == head["LastModified"]


def test_moto_still_answers_the_rest(client):
    with pytest.raises(ClientError, match="NoSuchKey"):
        client.get_object(Bucket="demo-s3-test", Key="missing", Range="bytes=0-9")
    with pytest.raises(ClientError, match="NoSuchBucket"):
        client.get_object(Bucket="no-such-bucket", Key="k", Range="bytes=0-9")
    with pytest.raises(ClientError, match="InvalidRange"):
        client.get_object(Bucket="demo-s3-test", Key="dir/obj ect", Range=f"bytes={SIZE}-")
    suffix = client.get_object(Bucket="demo-s3-test", Key="dir/obj ect", Range="bytes=-10")
    assert suffix["Body"].read() == DATA[-10:]
    listed = client.list_objects_v2(Bucket="demo-s3-test", Prefix="dir/")
    assert [o["Key"] for o in listed["Contents"]] == ["dir/obj ect"]


def test_object_bytes_leave_at_the_capped_rate_and_are_counted(client, demo_s3):
    before = sent(demo_s3)
    started = time.monotonic()
    whole = client.get_object(Bucket="demo-s3-test", Key="dir/obj ect")["Body"].read()
    ranged = client.get_object(Bucket="demo-s3-test", Key="dir/obj ect", Range="bytes=0-")
    assert ranged["Body"].read() == whole == DATA
    elapsed = time.monotonic() - started
    assert sent(demo_s3) - before >= 2 * SIZE  # both paths count what they send
    assert elapsed >= 2 * SIZE / RATE - 0.1  # 24 MiB at 16 MiB/s: 1.5 s at least
