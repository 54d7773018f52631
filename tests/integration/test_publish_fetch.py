"""`swarm publish` and `swarm fetch --no-daemon` against a real S3 server on loopback."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
from pathlib import Path

import boto3
import pytest
from click.testing import CliRunner

from swarm.cli import cli
from swarm.manifest import Manifest
from tests.conftest import make_artifact
from tests.servers import BIN, FaultProxy, Faults, wait_until

MiB = 1 << 20


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def published(tmp_path: Path, bucket: str, size: int = 5 * MiB, *args: str) -> tuple[Path, str]:
    src = make_artifact(tmp_path / "src.bin", size)
    url = f"s3://{bucket}/builds/src.bin"
    code, _out, err = run("publish", str(src), url, "--piece-size", "256K", *args)
    assert code == 0, err
    return src, url


def pieces_claimed(state: Path) -> int:
    """How many pieces a fetch's resume state file says are on disk."""
    try:
        bits = base64.b64decode(json.loads(state.read_text())["have"])
    except (FileNotFoundError, ValueError):
        return 0
    return sum(bin(b).count("1") for b in bits)


def events(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_publish_writes_object_manifest_torrent_and_catalog(env, bucket, tmp_path):
    src = make_artifact(tmp_path / "index.db", 3 * MiB + 123)
    catalog = f"s3://{bucket}/artifacts/"
    code, out, err = run(
        "publish",
        str(src),
        f"s3://{bucket}/b/index.db",
        "--name",
        "index.db",
        "--catalog",
        catalog,
        "--json",
    )
    assert code == 0, err
    summary = json.loads(out)
    s3 = boto3.client("s3")
    manifest = Manifest.loads(s3.get_object(Bucket=bucket, Key="b/index.db.swarm")["Body"].read())
    assert manifest.sha256 == sha256(src) == summary["sha256"]
    assert manifest.size == src.stat().st_size
    assert manifest.piece_size == 1 * MiB  # default rule: at least 1 MiB
    assert s3.get_object(Bucket=bucket, Key="b/index.db.torrent")["Body"].read() == manifest.torrent
    assert s3.get_object(Bucket=bucket, Key="b/index.db")["Body"].read() == src.read_bytes()
    entry = json.loads(s3.get_object(Bucket=bucket, Key="artifacts/index.db.json")["Body"].read())
    assert entry["url"] == f"s3://{bucket}/b/index.db"
    # the manifest's own bytes, so that a fetch by name reads one object
    assert (
        entry["manifest"].encode()
        == s3.get_object(Bucket=bucket, Key="b/index.db.swarm")["Body"].read()
    )

    dest = tmp_path / "out" / "index.db"
    dest.parent.mkdir()
    code, out, err = run(
        "fetch", "index.db", str(dest), "--no-daemon", "--catalog", catalog, "--json"
    )
    assert code == 0, err
    assert sha256(dest) == manifest.sha256
    done = events(out)[-1]
    assert done["event"] == "done" and done["bytes_by_source"] == {"s3": manifest.size}


def test_a_fetch_by_name_reads_the_manifest_the_catalog_entry_holds(env, bucket, tmp_path):
    """One GET for the entry and its manifest; an entry written before manifests were
    inlined (or for one too large) sends the fetch to the manifest object; a manifest
    edited in the entry fails its checks like one edited in its object."""
    from swarm import catalog
    from swarm.s3http import S3Client

    src = make_artifact(tmp_path / "index.db", 2 * MiB + 7)
    cat = f"s3://{bucket}/artifacts/"
    code, _out, err = run(
        "publish", str(src), f"s3://{bucket}/b/index.db", "--name", "index.db", "--catalog", cat
    )
    assert code == 0, err
    s3 = boto3.client("s3")
    key = "artifacts/index.db.json"
    entry = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    client = S3Client(os.environ.get("AWS_ENDPOINT_URL"))
    url, inline = catalog.lookup(client, "index.db", cat)
    assert url.key == "b/index.db" and inline == entry["manifest"].encode()
    assert catalog.manifest_for(client, "index.db", cat).sha256 == sha256(src)
    # an older entry: no manifest in it
    s3.put_object(Bucket=bucket, Key=key, Body=json.dumps({"url": entry["url"]}).encode())
    assert catalog.lookup(client, "index.db", cat)[1] is None
    assert catalog.manifest_for(client, "index.db", cat).sha256 == sha256(src)
    dest = tmp_path / "old-entry.bin"
    code, _out, err = run("fetch", "index.db", str(dest), "--no-daemon", "--catalog", cat)
    assert code == 0, err
    assert sha256(dest) == sha256(src)
    # an entry whose manifest was edited: refused, nothing written
    edited = json.loads(entry["manifest"])
    edited["size"] += 1
    entry["manifest"] = json.dumps(edited)
    s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(entry).encode())
    dest = tmp_path / "edited.bin"
    code, _out, err = run("fetch", "index.db", str(dest), "--no-daemon", "--catalog", cat)
    assert code != 0 and not dest.exists()
    # refused by the manifest's own checks, naming it, as an edited manifest object is
    assert "index.db.swarm is inconsistent" in err and "republish" in err
    client.close()


def test_fetch_subprocess_json_events_and_rerun_is_noop(env, bucket, tmp_path):
    src, url = published(tmp_path, bucket)
    dest = tmp_path / "dest.bin"
    cmd = [str(BIN / "swarm"), "fetch", url, str(dest), "--no-daemon", "--json"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    kinds = [e["event"] for e in events(proc.stdout)]
    assert kinds[0] == "start" and "progress" in kinds and kinds[-1] == "done"
    assert sha256(dest) == sha256(src)
    assert not list(tmp_path.glob(".dest.bin.swarm-part*"))
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and events(again.stdout)[-1]["already_present"] is True


def test_corrupted_range_is_detected_and_refetched(env, bucket, tmp_path):
    src, url = published(tmp_path, bucket)
    with FaultProxy(env["AWS_ENDPOINT_URL"], Faults(corrupt_ranged_gets=2)) as proxy:
        dest = tmp_path / "dest.bin"
        code, out, err = run(
            "fetch", url, str(dest), "--no-daemon", "--json", "--endpoint-url", proxy.url
        )
    assert code == 0, err
    assert proxy.faults.corrupted == 2
    done = events(out)[-1]
    assert done["hash_failures"] == 2 and done["retries"] >= 1
    assert sha256(dest) == sha256(src)


@pytest.mark.parametrize("status", [503, 500])
def test_s3_faults_are_retried(env, bucket, tmp_path, status):
    """20% of requests answered with 503 SlowDown or 500, plus connection resets
    mid-body: every fetch completes and the retries show in the log."""
    src, url = published(tmp_path, bucket, 8 * MiB)
    faults = Faults(fail_every=5, fail_status=status, reset_every=7)
    with FaultProxy(env["AWS_ENDPOINT_URL"], faults) as proxy:
        dest = tmp_path / "dest.bin"
        # small ranges -> many requests -> many injected faults
        env2 = {**env, "AWS_ENDPOINT_URL": proxy.url}
        proc = subprocess.run(
            [
                str(BIN / "swarm"),
                "-v",
                "fetch",
                url,
                str(dest),
                "--no-daemon",
                "--json",
                "--concurrency",
                "4",
                "--range-size",
                "512K",
            ],
            env=env2,
            capture_output=True,
            text=True,
            timeout=180,
        )
    assert proc.returncode == 0, proc.stderr
    assert faults.failed > 0 and faults.resets > 0
    assert sha256(dest) == sha256(src)
    assert "retry" in proc.stderr.lower()


def test_kill_9_then_resume_fetches_only_missing_pieces(env, bucket, tmp_path):
    size = 16 * MiB
    src, url = published(tmp_path, bucket, size)
    dest = tmp_path / "dest.bin"
    state = tmp_path / ".dest.bin.swarm-part.state"
    with FaultProxy(env["AWS_ENDPOINT_URL"], Faults(throttle_bps=4 * MiB)) as proxy:
        proc = subprocess.Popen(
            [
                str(BIN / "swarm"),
                "fetch",
                url,
                str(dest),
                "--no-daemon",
                "--json",
                "--concurrency",
                "2",
            ],
            env={**env, "AWS_ENDPOINT_URL": proxy.url},
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            wait_until(lambda: pieces_claimed(state) >= 4, 60, "some pieces on disk")
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait(10)
    assert not dest.exists()  # nothing half-written at DEST
    code, out, err = run("fetch", url, str(dest), "--no-daemon", "--json")
    assert code == 0, err
    done = events(out)[-1]
    assert 0 < done["resumed_bytes"] < size
    assert done["bytes_by_source"]["s3"] == size - done["resumed_bytes"]
    assert sha256(dest) == sha256(src)
