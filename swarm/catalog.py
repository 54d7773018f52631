"""The catalog: artifact names -> S3 locations, so user data can say `swarm fetch index.db`.

Layout: one small JSON object per name at ``{SWARM_CATALOG}{name}.json``::

    {"name": "index.db", "url": "s3://bucket/builds/index.db", "size": 1234,
     "sha256": "...", "published_at": "2026-11-21T09:00:00Z"}

One object per name (not one shared index) so that concurrent publishes of different
artifacts never race on a read-modify-write, and a reader needs one GET.

Writers (publish) pass a botocore client; readers (a node) a :class:`~swarm.s3http.S3Client`,
so that a node never imports botocore.
"""

from __future__ import annotations

import json
import time
from typing import Any

from swarm.errors import NotFoundError, UsageError
from swarm.manifest import Manifest, check_name, manifest_key
from swarm.s3http import S3Client, S3Error, S3ResponseError, S3Url, raise_for

ENTRY_SUFFIX = ".json"


def entry_url(catalog: str, name: str) -> S3Url:
    return S3Url.parse(catalog).child(check_name(name) + ENTRY_SUFFIX)


def check_writable(client: Any, catalog: str | None) -> None:
    """Fail before an upload if the catalog's bucket does not exist or cannot be reached
    (a publish found out only after uploading gigabytes)."""
    if not catalog:
        return
    from swarm import objectstore

    prefix = S3Url.parse(catalog)
    try:
        client.head_bucket(Bucket=prefix.bucket)
    except objectstore.S3_ERRORS as error:
        objectstore.raise_for(error, prefix, "write")


def record(client: Any, catalog: str, manifest: Manifest) -> S3Url:
    """Write (or replace) the catalog entry for ``manifest.name``."""
    from swarm import objectstore

    url = entry_url(catalog, manifest.name)
    entry = {
        "name": manifest.name,
        "url": manifest.s3_url,
        "size": manifest.size,
        "sha256": manifest.sha256,
        "published_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        client.put_object(
            Bucket=url.bucket,
            Key=url.key,
            Body=json.dumps(entry, indent=1).encode(),
            ContentType="application/json",
        )
    except objectstore.S3_ERRORS as error:
        objectstore.raise_for(error, url, "write")
    return url


def resolve(client: S3Client, source: str, catalog: str | None) -> S3Url:
    """``s3://BUCKET/KEY`` as is; a bare NAME through the catalog."""
    if source.startswith("s3://"):
        url = S3Url.parse(source)
        if not url.key or url.key == "/":
            raise UsageError(
                f"swarm: {source} names no object: use s3://BUCKET/KEY (the published file) "
                "or s3://BUCKET/PREFIX/ (a published directory)"
            )
        return url
    if not catalog:
        raise UsageError(
            f"swarm: {source!r} is a name, but no catalog is configured: set SWARM_CATALOG "
            "(e.g. s3://bucket/artifacts/) or pass s3://BUCKET/KEY"
        )
    url = entry_url(catalog, source)
    try:
        body = _read(client, url)
    except S3ResponseError as error:
        if error.code in {"NoSuchKey", "404"}:
            raise NotFoundError(
                f"swarm: no artifact named {source!r} in the catalog {catalog} ({url} is "
                f"missing): publish it with `swarm publish FILE s3://BUCKET/KEY --name {source}`"
            ) from error
        raise_for(error, url)
    except S3Error as error:
        raise_for(error, url)
    try:
        return S3Url.parse(json.loads(body)["url"])
    except (ValueError, KeyError, TypeError, UsageError) as error:
        raise NotFoundError(
            f"swarm: catalog entry {url} is unreadable ({error}): republish {source!r}"
        ) from error


def load_manifest(client: S3Client, url: S3Url, secret: str | None = None) -> Manifest:
    """Read and check ``url.swarm`` (for a directory's ``PREFIX/``: ``PREFIX.swarm``)."""
    return read_manifest(client, url, secret)[0]


def read_manifest(
    client: S3Client, url: S3Url, secret: str | None = None
) -> tuple[Manifest, bytes]:
    """:func:`load_manifest`, and the bytes it was read from."""
    target = S3Url(url.bucket, manifest_key(url.key))
    try:
        data = _read(client, target)
    except S3Error as error:
        raise_for(error, target)
    manifest = Manifest.loads(data, secret, origin=str(target))
    if url.key.endswith("/") and not manifest.is_tree:
        raise NotFoundError(
            f"swarm: {url} names a directory, but {target} is a single file's manifest: "
            f"fetch s3://{url.bucket}/{url.key[:-1]} instead"
        )
    return manifest, data


def _read(client: S3Client, url: S3Url) -> bytes:
    """A small object's bytes (its connection goes back to the pool)."""
    body = client.get_object(Bucket=url.bucket, Key=url.key)["Body"]
    try:
        data: bytes = body.read()
    finally:
        body.close()
    return data
