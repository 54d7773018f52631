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
from swarm.manifest import MANIFEST_SUFFIX, TORRENT_SUFFIX, Manifest, check_name
from swarm.objectstore import S3_ERRORS, S3Url, object_http_url, raise_for
from swarm.pieces import MiB, default_piece_size

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
    """Upload ``path`` to ``dest`` and write ``dest.swarm`` (+ ``.torrent``, + catalog entry)."""
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
    try:
        client.upload_file(
            str(path), dest.bucket, dest.key, Config=UPLOAD_CONFIG, Callback=on_bytes
        )
    except S3_ERRORS as error:
        raise_for(error, dest, "write")
    except S3UploadFailedError as error:  # raised while handling the real ClientError
        raise_for(error.__cause__ or error.__context__ or error, dest, "write")
    after = path.stat()
    if _identity(after) != _identity(before):
        # The hash pass and the upload read the file separately: what was uploaded may not
        # be what was hashed. No manifest is written, so no fetch ever sees the mismatch.
        raise SwarmError(
            f"swarm: {path} changed while it was published (size, mtime or inode moved); "
            "nothing was recorded: publish it again once it no longer changes"
        )
    for suffix, body in (
        (MANIFEST_SUFFIX, manifest.dumps(secret)),
        (TORRENT_SUFFIX, manifest.torrent),
    ):
        target = S3Url(dest.bucket, dest.key + suffix)
        try:
            client.put_object(Bucket=target.bucket, Key=target.key, Body=body)
        except S3_ERRORS as error:
            raise_for(error, target, "write")
    if name and catalog_url:
        catalog.record(client, catalog_url, manifest)
    return manifest


def _identity(stat: os.stat_result) -> tuple[int, int, int, int]:
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
