"""Each bad input gets a clear message and its documented exit code; nothing lands at DEST."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import boto3
import pytest

from swarm.errors import (
    AccessDeniedError,
    IntegrityError,
    NoSpaceError,
    NotFoundError,
    UsageError,
)
from tests.conftest import make_artifact
from tests.integration.test_publish_fetch import MiB, published, run
from tests.servers import moto_server

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tmpfs")


def test_missing_object_exit_3_names_bucket_and_key(env, bucket, tmp_path):
    code, _, err = run("fetch", f"s3://{bucket}/nope.bin", str(tmp_path / "x"), "--no-daemon")
    assert code == NotFoundError.exit_code == 3
    assert f"s3://{bucket}/nope.bin.swarm" in err and "swarm publish" in err
    assert not (tmp_path / "x").exists()


def test_unknown_catalog_name_exit_3(env, bucket, tmp_path):
    code, _, err = run(
        "fetch",
        "ghost.db",
        str(tmp_path / "x"),
        "--no-daemon",
        "--catalog",
        f"s3://{bucket}/artifacts/",
    )
    assert code == 3 and "ghost.db" in err


def test_name_without_catalog_is_usage_error(env, tmp_path):
    code, _, err = run("fetch", "index.db", str(tmp_path / "x"), "--no-daemon")
    assert code == UsageError.exit_code == 2 and "SWARM_CATALOG" in err


def test_access_denied_exit_4_names_permission(tmp_path, monkeypatch):
    # A second S3 server that enforces authentication: our key is unknown there -> 403.
    with moto_server(env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWN")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        code, _, err = run("fetch", "s3://private/index.db", str(tmp_path / "x"), "--no-daemon")
    assert code == AccessDeniedError.exit_code == 4
    assert "s3:GetObject" in err and "arn:aws:s3:::private/*" in err


def test_missing_dest_directory_exit_2(env, bucket, tmp_path):
    _, url = published(tmp_path, bucket, MiB)
    code, _, err = run("fetch", url, str(tmp_path / "no" / "such" / "dir" / "f"), "--no-daemon")
    assert code == 2 and "mkdir -p" in err


@root_only
def test_read_only_dest_exit_2(env, bucket, tmp_path):
    _, url = published(tmp_path, bucket, MiB)
    mnt = tmp_path / "ro"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=4m", "tmpfs", str(mnt)], check=True)
    try:
        code, _, err = run("fetch", url, str(mnt / "f"), "--no-daemon")
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    assert code in (1, 2) and "ro" in err


@root_only
def test_too_little_space_exit_6_before_download(env, bucket, tmp_path):
    _, url = published(tmp_path, bucket, 6 * MiB)
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], check=True)
    try:
        code, out, err = run("fetch", url, str(mnt / "f"), "--no-daemon", "--json")
        leftovers = os.listdir(mnt)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    assert code == NoSpaceError.exit_code == 6
    assert "ENOSPC" in err
    assert json.loads(out.splitlines()[-1])["exit_code"] == 6
    assert "f" not in leftovers


def _rewrite_manifest(bucket: str, key: str, change) -> None:
    s3 = boto3.client("s3")
    body = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    change(body)
    s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(body).encode())


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda m: m.update(size=m["size"] + 1), id="size"),
        pytest.param(lambda m: m.update(sha256="0" * 64, info_hash="f" * 40), id="info-hash"),
        pytest.param(lambda m: m.update(name="../../etc/passwd"), id="traversal-name"),
        pytest.param(lambda m: m.update(torrent="bm90IGJlbmNvZGU="), id="bad-metainfo"),
        pytest.param(lambda m: m.update(version=99), id="version"),
    ],
)
def test_tampered_manifest_is_refused_exit_5(env, bucket, tmp_path, tamper):
    _, url = published(tmp_path, bucket, MiB)
    _rewrite_manifest(bucket, "builds/src.bin.swarm", tamper)
    dest = tmp_path / "dest"
    code, _, err = run("fetch", url, str(dest), "--no-daemon")
    assert code == IntegrityError.exit_code == 5, err
    assert "manifest" in err or "unsafe" in err
    assert not dest.exists()


def test_unparsable_manifest_exit_5(env, bucket, tmp_path):
    _, url = published(tmp_path, bucket, MiB)
    boto3.client("s3").put_object(Bucket=bucket, Key="builds/src.bin.swarm", Body=b"{not json")
    code, _, err = run("fetch", url, str(tmp_path / "d"), "--no-daemon")
    assert code == 5 and "not a valid swarm manifest" in err


def test_signed_manifest_needs_the_same_secret(env, bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("SWARM_SECRET", "fleet-secret-1")
    _src, url = published(tmp_path, bucket, MiB)
    code, _, err = run("fetch", url, str(tmp_path / "ok"), "--no-daemon")
    assert code == 0, err

    # A bucket writer without the secret swaps a piece hash and recomputes the info-hash:
    # consistent, but unsigned by the fleet -> refused.
    def swap(m):
        m["sha256"] = "1" * 64

    _rewrite_manifest(bucket, "builds/src.bin.swarm", swap)
    code, _, err = run("fetch", url, str(tmp_path / "bad"), "--no-daemon")
    assert code == 5 and "signature" in err
    monkeypatch.setenv("SWARM_SECRET", "another-secret")
    code, _, err = run("publish", str(make_artifact(tmp_path / "b", MiB)), url)
    assert code == 0
    monkeypatch.setenv("SWARM_SECRET", "fleet-secret-1")
    code, _, err = run("fetch", url, str(tmp_path / "other"), "--no-daemon")
    assert code == 5 and "signature" in err


def test_bad_piece_size_is_usage_error(env, bucket, tmp_path):
    src = make_artifact(tmp_path / "f", 1000)
    code, _, err = run("publish", str(src), f"s3://{bucket}/f", "--piece-size", "100K")
    assert code == 2 and "power of two" in err


def test_publish_to_missing_bucket_exit_3(env, tmp_path):
    src = make_artifact(tmp_path / "f", 1000)
    code, _, err = run("publish", str(src), "s3://no-such-bucket-xyz/f")
    assert code == 3 and "no-such-bucket-xyz" in err


def test_dest_path_is_unchanged_when_fetch_fails(env, bucket, tmp_path):
    _, url = published(tmp_path, bucket, MiB)
    dest = tmp_path / "dest"
    dest.write_bytes(b"old version")
    _rewrite_manifest(bucket, "builds/src.bin.swarm", lambda m: m.update(size=1))
    code, _, _ = run("fetch", url, str(dest), "--no-daemon")
    assert code == 5 and dest.read_bytes() == b"old version"
    assert Path(dest).exists()
