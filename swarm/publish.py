"""`swarm publish`: upload a file, then its manifest and torrent, then its catalog entry.

Order matters: a manifest never points at an object that is not there yet, and a catalog
entry never points at a manifest that is not there yet.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig

from swarm import catalog
from swarm.errors import UsageError
from swarm.manifest import MANIFEST_SUFFIX, TORRENT_SUFFIX, Manifest
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
    size = path.stat().st_size
    manifest = Manifest.from_file(
        path,
        name=name or Path(dest.key).name,
        piece_size=piece_size or default_piece_size(size),
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
    for suffix, body in (
        (MANIFEST_SUFFIX, manifest.dumps(secret)),
        (TORRENT_SUFFIX, manifest.torrent),
    ):
        target = S3Url(dest.bucket, dest.key + suffix)
        try:
            client.put_object(Bucket=target.bucket, Key=target.key, Body=body)
        except S3_ERRORS as error:
            raise_for(error, target, "write")
    if name:
        catalog.record(client, catalog_url, manifest)
    return manifest
