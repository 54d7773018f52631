"""`swarm publish`: upload a file, then its manifest and torrent, then its catalog entry.

Order matters: a manifest never points at an object that is not there yet, and a catalog
entry never points at a manifest that is not there yet.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig

from swarm import catalog
from swarm.errors import ManifestError, SwarmError, UsageError
from swarm.manifest import Manifest, check_name, manifest_key, torrent_key
from swarm.objectstore import S3_ERRORS, S3Url, object_http_url, raise_for
from swarm.pieces import MiB, default_piece_size
from swarm.tree import scan_dir

UPLOAD_CONFIG = TransferConfig(
    multipart_threshold=16 * MiB, multipart_chunksize=16 * MiB, max_concurrency=8
)
"""Parallel multipart upload in 16 MiB parts (AWS: 8-16 MiB parts, 8+ in flight)."""


def publish(
    client: Any,
    path: Path,
    dest: S3Url,
    *,
    name: str | None = None,
    piece_size: int | None = None,
    catalog_url: str | None = None,
    secret: str | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> Manifest:
    """Upload ``path`` to ``dest`` and write ``dest.swarm`` (+ ``.torrent``, + catalog entry).

    A directory ``path`` is a directory artifact (:func:`publish_tree`)."""
    if path.is_dir():
        return publish_tree(
            client,
            path,
            dest,
            name=name,
            piece_size=piece_size,
            catalog_url=catalog_url,
            secret=secret,
            on_bytes=on_bytes,
        )
    if not path.is_file():
        raise UsageError(f"swarm: {path} is not a readable file")
    if not dest.key or dest.key.endswith("/"):
        raise UsageError(f"swarm: {dest} names no object key; use s3://BUCKET/path/to/file")
    if name and not catalog_url:
        raise UsageError(
            "swarm: --name needs a catalog: set SWARM_CATALOG (e.g. s3://bucket/artifacts/)"
        )
    artifact_name = name or Path(dest.key).name
    try:
        check_name(artifact_name)
    except ManifestError as error:
        hint = "--name" if name else "the key's last part (or give --name)"
        raise UsageError(f"{error}; choose another {hint}") from error
    before = path.stat()
    if before.st_size == 0:
        raise UsageError(
            f"swarm: {path} is empty: an artifact needs at least one byte (BitTorrent has no "
            "piece for an empty file)"
        )
    if name:
        catalog.check_writable(client, catalog_url)  # before the upload, not after it
    manifest = Manifest.from_file(
        path,
        name=artifact_name,
        piece_size=piece_size or default_piece_size(before.st_size),
        bucket=dest.bucket,
        key=dest.key,
        web_seed=object_http_url(client, dest),
    )
    _upload(client, path, dest, on_bytes)
    after = path.stat()
    if _identity(after) != _identity(before):
        # The hash pass and the upload read the file separately: what was uploaded may not
        # be what was hashed. No manifest is written, so no fetch ever sees the mismatch.
        raise SwarmError(
            f"swarm: {path} changed while it was published (size, mtime or inode moved); "
            "nothing was recorded: publish it again once it no longer changes"
        )
    _record(client, manifest, secret, name, catalog_url)
    return manifest


def _record(
    client: Any, manifest: Manifest, secret: str | None, name: str | None, catalog_url: str | None
) -> None:
    """The manifest and torrent beside the data, then the catalog entry (in that order)."""
    text = manifest.dumps(secret)
    for key, body in (
        (manifest_key(manifest.key), text),
        (torrent_key(manifest.key), manifest.torrent),
    ):
        target = S3Url(manifest.bucket, key)
        try:
            client.put_object(Bucket=target.bucket, Key=target.key, Body=body)
        except S3_ERRORS as error:
            raise_for(error, target, "write")
    if name and catalog_url:
        catalog.record(client, catalog_url, manifest, text)


def _upload(client: Any, path: Path, dest: S3Url, on_bytes: Callable[[int], None] | None) -> None:
    try:
        client.upload_file(
            str(path), dest.bucket, dest.key, Config=UPLOAD_CONFIG, Callback=on_bytes
        )
    except S3_ERRORS as error:
        raise_for(error, dest, "write")
    except S3UploadFailedError as error:  # raised while handling the real ClientError
        raise_for(error.__cause__ or error.__context__ or error, dest, "write")


def publish_tree(
    client: Any,
    root: Path,
    dest: S3Url,
    *,
    name: str | None = None,
    piece_size: int | None = None,
    catalog_url: str | None = None,
    secret: str | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> Manifest:
    """Publish the directory ``root`` under the prefix ``dest`` as one multi-file torrent.

    Each file stays a browsable object (``PREFIX/<relative path>``); the manifest and the
    torrent go beside the prefix (``PREFIX.swarm``, ``PREFIX.torrent``). Symlinks and
    special files are refused (:func:`swarm.tree.scan_dir`)."""
    prefix = dest.key.rstrip("/")
    if not prefix:
        raise UsageError(
            f"swarm: {dest} names no prefix for the directory: use s3://BUCKET/PREFIX/"
        )
    if name and not catalog_url:
        raise UsageError(
            "swarm: --name needs a catalog: set SWARM_CATALOG (e.g. s3://bucket/artifacts/)"
        )
    artifact_name = name or prefix.rsplit("/", 1)[-1]
    try:
        check_name(artifact_name)
    except ManifestError as error:
        hint = "--name" if name else "the prefix's last part (or give --name)"
        raise UsageError(f"{error}; choose another {hint}") from error
    files = scan_dir(root)
    total = sum(size for _rel, _path, size in files)
    if total == 0:
        raise UsageError(
            f"swarm: every file in {root} is empty: an artifact needs at least one byte "
            "(BitTorrent has no piece for empty files)"
        )
    if name:
        catalog.check_writable(client, catalog_url)
    before = {rel: _identity(path.stat()) for rel, path, _size in files}
    prefix_url = S3Url(dest.bucket, prefix + "/")
    manifest = Manifest.from_tree(
        files,
        name=artifact_name,
        piece_size=piece_size or default_piece_size(total),
        bucket=dest.bucket,
        prefix=prefix_url.key,
        web_seed=_tree_web_seed(client, prefix_url, artifact_name),
    )
    for rel, path, _size in files:
        _upload(client, path, S3Url(dest.bucket, prefix_url.key + rel), on_bytes)
    changed = [rel for rel, path, _size in files if _identity(path.stat()) != before[rel]]
    if changed or scan_dir(root) != files:
        raise SwarmError(
            f"swarm: {root} changed while it was published ({(changed or ['its file list'])[0]} "
            "moved); nothing was recorded: publish it again once it no longer changes"
        )
    _record(client, manifest, secret, name, catalog_url)
    return manifest


def _tree_web_seed(client: Any, prefix: S3Url, name: str) -> str | None:
    """BEP 19 for a multi-file torrent: a URL ending in '/' gets the torrent's name and
    each file's path appended, so the seed is the prefix's parent, and only when the
    name is the prefix's last part (otherwise no plain client could find the files)."""
    parent, _, last = prefix.key[:-1].rpartition("/")
    if last != name:
        return None
    return object_http_url(client, S3Url(prefix.bucket, f"{parent}/" if parent else ""))


def _identity(stat: os.stat_result) -> tuple[int, int, int, int]:
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
