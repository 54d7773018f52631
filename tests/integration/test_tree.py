"""Directory artifacts end to end: publish a tree, fetch it with daemons (real libtorrent,
a real coordinator) and without, DEST swapped atomically, unsafe manifests refused.

The S3 server is moto behind ``swarm.demo_s3`` (ranged GETs answered from the object's
buffer, unthrottled): plain moto copies the whole 300 MiB object for every ranged GET.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import fastbencode
import pytest

from swarm.agent.serve import WATCH_INTERVAL
from swarm.pieces import write_random_file
from tests.servers import _answers, free_port, wait_until
from tests.swarmnet import SWARM, Swarm, done_event

MiB = 1 << 20
BIG = 300 * MiB
FETCH_TIMEOUT = 180


@pytest.fixture(scope="module")
def fast_s3() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "swarm.demo_s3", "--port", str(port), "--rate", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(url + "/moto-api/"), 30, "the S3 server")
        yield url
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture
def s3env(env: dict[str, str], fast_s3: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("AWS_ENDPOINT_URL", fast_s3)
    return {**env, "AWS_ENDPOINT_URL": fast_s3}


@pytest.fixture
def s3(s3env: dict[str, str]):
    return boto3.client("s3", endpoint_url=s3env["AWS_ENDPOINT_URL"])


@pytest.fixture
def tree_bucket(s3) -> str:
    name = f"tree-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


def make_tree(root: Path, *, files: int = 50, big: int = 0, seed: int = 0) -> dict[str, str]:
    """``files`` small random files in nested directories, one empty file, a VERSION
    file, a dotfile and (``big``) one large file; returns {relative path: sha256}."""
    import random

    rng = random.Random(seed)
    sums: dict[str, str] = {}

    def put(rel: str, data: bytes) -> None:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        sums[rel] = hashlib.sha256(data).hexdigest()

    for i in range(files):
        depth = i % 4
        folder = "/".join(f"d{i % (j + 2)}" for j in range(depth))
        put(f"{folder}/f{i:03d}.bin".lstrip("/"), rng.randbytes(rng.randint(1, 96 * 1024)))
    put("empty/zero.bin", b"")
    put(".gitattributes", b"*.bin filter=lfs\n")
    put("VERSION", f"v{seed}\n".encode())
    if big:
        path = root / "weights" / "model.bin"
        path.parent.mkdir(parents=True)
        sums["weights/model.bin"] = write_random_file(path, big, seed)
    return sums


def tree_sums(root: Path) -> dict[str, str]:
    sums = {}
    for path in root.rglob("*"):
        if path.is_file():
            h = hashlib.sha256()
            with path.open("rb") as stream:
                while chunk := stream.read(8 * MiB):
                    h.update(chunk)
            sums[path.relative_to(root).as_posix()] = h.hexdigest()
    return sums


def run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SWARM, *args], env=env, capture_output=True, text=True, timeout=FETCH_TIMEOUT
    )


def publish(src: Path, url: str, env: dict[str, str], *args: str) -> dict:
    done = run("publish", str(src), url, "--json", *args, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


class DestWatcher:
    """Reads DEST/VERSION over and over while a fetch runs: DEST must always be one whole
    tree, the old or the new one, and never missing."""

    def __init__(self, dest: Path) -> None:
        self.dest = dest
        self.seen: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                value = (self.dest / "VERSION").read_text().strip()
            except OSError as error:
                value = f"missing ({error.strerror})"
            if not self.seen or self.seen[-1] != value:
                self.seen.append(value)
            self.stop.wait(0.002)

    def __enter__(self) -> DestWatcher:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)


def test_directory_artifact_fetched_by_four_daemons(s3env, s3, tree_bucket, tmp_path):
    src = tmp_path / "model-src"
    sums = make_tree(src, files=50, big=BIG, seed=1)
    assert len(sums) >= 50
    catalog = f"s3://{tree_bucket}/catalog/"
    env = {**s3env, "SWARM_CATALOG": catalog}
    summary = publish(src, f"s3://{tree_bucket}/models/m1/", env, "--name", "model")
    assert summary["files"] == len(sums) and summary["size"] == sum(
        (src / rel).stat().st_size for rel in sums
    )
    # The objects stay browsable files: one per file (the empty one too), manifest beside.
    listed = s3.list_objects_v2(Bucket=tree_bucket, Prefix="models/m1/")["Contents"]
    assert {o["Key"][len("models/m1/") :] for o in listed} == set(sums)
    s3.head_object(Bucket=tree_bucket, Key="models/m1.swarm")

    with Swarm(tmp_path / "swarm", env) as swarm:
        (tmp_path / "swarm").mkdir()
        swarm.start_coordinator()
        nodes = [swarm.node(i) for i in range(4)]
        dests = [tmp_path / f"{n.name}-model" for n in nodes]
        old = make_tree(dests[0], files=3, seed=0)  # an older version at node 0's DEST
        (dests[0] / "stale.txt").write_text("from the old version")
        with DestWatcher(dests[0]) as watcher:
            fetches = [
                n.fetch("model", d, *(["--copy"] if i == 3 else []))
                for i, (n, d) in enumerate(zip(nodes, dests, strict=True))
            ]
            results = [done_event(p, FETCH_TIMEOUT) for p in fetches]
        # DEST was the whole old tree, then the whole new one; never missing in between.
        assert watcher.seen[0] == "v0" and watcher.seen[-1] == "v1", watcher.seen
        assert set(watcher.seen) == {"v0", "v1"}, watcher.seen
        assert old and not (dests[0] / "stale.txt").exists()
        for dest in dests:
            assert tree_sums(dest) == sums  # every file's SHA-256, nothing more, nothing less
            assert (dest / "empty" / "zero.bin").stat().st_size == 0
            assert not list(dest.parent.glob(f".{dest.name}.swarm-*"))  # no staging left
        # DEST is the daemon's read-only tree (it seeds it); --copy gives a writable one.
        assert (dests[0] / "weights" / "model.bin").stat().st_mode & 0o777 == 0o444
        assert (dests[3] / "weights" / "model.bin").stat().st_mode & 0o222
        total = summary["size"]
        for result in results:
            assert sum(result["bytes_by_source"].values()) >= total
        assert sum(r["bytes_by_source"]["peers"] for r in results) > 0  # a real swarm
        for node, dest in zip(nodes[:3], dests[:3], strict=True):
            (art,) = node.status()["artifacts"]
            assert art["state"] == "seeding" and art["path"] == str(dest)
        # The application's own file in a seeded tree (a cache, a lock) changes the
        # directory, not the artifact: the daemon goes on seeding it.
        (dests[1] / "app.cache").write_text("the application's")
        time.sleep(WATCH_INTERVAL * 1.5)
        (art,) = nodes[1].status()["artifacts"]
        assert art["state"] == "seeding" and art["path"] == str(dests[1])


def test_no_daemon_fetch_replaces_dest_only_when_complete(s3env, s3, tree_bucket, tmp_path):
    env = s3env
    v1 = make_tree(tmp_path / "v1", files=12, seed=1)
    publish(tmp_path / "v1", f"s3://{tree_bucket}/m/", env, "--piece-size", "64K")
    dest = tmp_path / "dest"
    done = run("fetch", f"s3://{tree_bucket}/m/", str(dest), "--no-daemon", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert tree_sums(dest) == v1
    again = run("fetch", f"s3://{tree_bucket}/m/", str(dest), "--no-daemon", "--json", env=env)
    assert json.loads(again.stdout.splitlines()[-1])["already_present"] is True
    # v2 is published, then one of its objects disappears: the fetch fails (not found),
    # and DEST is still the whole of v1.
    v2 = make_tree(tmp_path / "v2", files=12, seed=2)
    publish(tmp_path / "v2", f"s3://{tree_bucket}/m/", env, "--piece-size", "64K")
    victim = max(
        (r for r in v2 if r.startswith("d")), key=lambda r: (tmp_path / "v2" / r).stat().st_size
    )
    s3.delete_object(Bucket=tree_bucket, Key=f"m/{victim}")
    failed = run("fetch", f"s3://{tree_bucket}/m/", str(dest), "--no-daemon", env=env)
    assert failed.returncode == 3, failed.stderr
    assert tree_sums(dest) == v1
    assert not (tmp_path / ".dest.swarm-part").exists()
    # Put it back: now the fetch completes and DEST is v2, swapped in whole.
    s3.upload_file(str(tmp_path / "v2" / victim), tree_bucket, f"m/{victim}")
    done = run("fetch", f"s3://{tree_bucket}/m/", str(dest), "--no-daemon", env=env)
    assert done.returncode == 0, done.stderr
    assert tree_sums(dest) == v2


def test_unsafe_trees_and_manifests_are_refused(s3env, s3, tree_bucket, tmp_path):
    env = s3env
    src = tmp_path / "src"
    make_tree(src, files=4, seed=3)
    # A symlink in the published tree: refused before anything is uploaded (exit 2).
    (src / "link").symlink_to("/etc/passwd")
    refused = run("publish", str(src), f"s3://{tree_bucket}/bad/", env=env)
    assert refused.returncode == 2 and "symlink" in refused.stderr
    assert "Contents" not in s3.list_objects_v2(Bucket=tree_bucket, Prefix="bad/")
    (src / "link").unlink()
    publish(src, f"s3://{tree_bucket}/t/", env)
    body = json.loads(s3.get_object(Bucket=tree_bucket, Key="t.swarm")["Body"].read())
    meta = fastbencode.bdecode(base64.b64decode(body["torrent"]))
    # Traversal in both the manifest's file list and the metainfo (consistent, so only the
    # path rule can refuse it); then a manifest whose metainfo alone names another path.
    for name, in_manifest, in_torrent in (
        ("traversal", "../../evil", [b"..", b"..", b"evil"]),
        ("absolute", "/tmp/evil", [b"", b"tmp", b"evil"]),
        ("metainfo only", None, [b"..", b"evil"]),
    ):
        forged = json.loads(json.dumps(body))
        forged_meta = fastbencode.bdecode(base64.b64decode(body["torrent"]))
        forged_meta[b"info"][b"files"][-1][b"path"] = in_torrent
        if in_manifest is not None:
            forged["files"][-1]["path"] = in_manifest
        forged["torrent"] = base64.b64encode(fastbencode.bencode(forged_meta)).decode()
        forged.pop("info_hash")
        s3.put_object(Bucket=tree_bucket, Key="t.swarm", Body=json.dumps(forged).encode())
        dest = tmp_path / f"dest-{len(name)}"
        done = run("fetch", f"s3://{tree_bucket}/t/", str(dest), "--no-daemon", env=env)
        with Swarm(tmp_path / f"swarm-{len(name)}", env) as swarm:  # and through a daemon
            (tmp_path / f"swarm-{len(name)}").mkdir()
            swarm.start_coordinator()
            process = swarm.node(0).fetch(f"s3://{tree_bucket}/t/", dest)
            _out, err = process.communicate(timeout=FETCH_TIMEOUT)
        for code, stderr in ((done.returncode, done.stderr), (process.returncode, err)):
            assert code == 5, (name, stderr)
            assert "unsafe file path" in stderr or "metainfo files" in stderr, stderr
        assert not dest.exists() and not (tmp_path / "evil").exists()
    assert meta[b"info"][b"files"]  # the genuine metainfo lists the files
    assert not Path("/tmp/evil").exists()


def test_single_file_dest_and_tree_dest_do_not_mix(s3env, s3, tree_bucket, tmp_path):
    env = s3env
    make_tree(tmp_path / "src", files=2, seed=4)
    publish(tmp_path / "src", f"s3://{tree_bucket}/x/", env)
    (tmp_path / "plain").write_text("a file where the directory would go")
    done = run("fetch", f"s3://{tree_bucket}/x/", str(tmp_path / "plain"), "--no-daemon", env=env)
    assert done.returncode == 2 and "is a file" in done.stderr
    assert (tmp_path / "plain").read_text().startswith("a file")
