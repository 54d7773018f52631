"""The catalog: artifact names -> S3 locations, so user data can say `swarm fetch index.db`.

Layout: one small JSON object per name at ``{SWARM_CATALOG}{name}.json``::

    {"name": "index.db", "url": "s3://bucket/builds/index.db", "size": 1234,
     "sha256": "...", "published_at": "2026-11-21T09:00:00Z", "manifest": "{...}"}

One object per name (not one shared index) so that concurrent publishes of different
artifacts never race on a read-modify-write, and a reader needs one GET. ``manifest``
is the text of ``url``'s manifest object (signed as that one is), when it is at most
:data:`MAX_INLINE_MANIFEST` long: a fetch by name then reads one object, not two (one
WAN round trip of a far node's start); entries without it, or a fetch by URL, read the
manifest object.

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

MAX_INLINE_MANIFEST = 256 << 10
"""Manifest bytes copied into a catalog entry (about 4,000 pieces' hashes); a larger
manifest is read from its own object."""


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


def record(client: Any, catalog: str, manifest: Manifest, text: bytes | None = None) -> S3Url:
    """Write (or replace) the catalog entry for ``manifest.name``, with ``text`` (the
    manifest object's bytes) inline if short enough."""
    from swarm import objectstore

    url = entry_url(catalog, manifest.name)
    entry = {
        "name": manifest.name,
        "url": manifest.s3_url,
        "size": manifest.size,
        "sha256": manifest.sha256,
        "published_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if text is not None and len(text) <= MAX_INLINE_MANIFEST:
        entry["manifest"] = text.decode()
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


def lookup(client: S3Client, source: str, catalog: str | None) -> tuple[S3Url, bytes | None]:
    """``s3://BUCKET/KEY`` as is; a bare NAME through the catalog, with its manifest's
    bytes when the catalog entry holds them."""
    if source.startswith("s3://"):
        url = S3Url.parse(source)
        if not url.key or url.key == "/":
            raise UsageError(
                f"swarm: {source} names no object: use s3://BUCKET/KEY (the published file) "
                "or s3://BUCKET/PREFIX/ (a published directory)"
            )
        return url, None
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
        entry = json.loads(body)
        inline = entry.get("manifest")
        return S3Url.parse(entry["url"]), inline.encode() if isinstance(inline, str) else None
    except (ValueError, KeyError, TypeError, AttributeError, UsageError) as error:
        raise NotFoundError(
            f"swarm: catalog entry {url} is unreadable ({error}): republish {source!r}"
        ) from error


def manifest_for(
    client: S3Client, source: str, catalog: str | None, secret: str | None = None
) -> Manifest:
    """The checked manifest of ``source`` (a URL or a catalog name): :func:`lookup`, then
    :func:`read_manifest`."""
    url, inline = lookup(client, source, catalog)
    return read_manifest(client, url, secret, inline)[0]


def read_manifest(
    client: S3Client, url: S3Url, secret: str | None = None, inline: bytes | None = None
) -> tuple[Manifest, bytes]:
    """Read and check ``url.swarm`` (for a directory's ``PREFIX/``: ``PREFIX.swarm``), or
    ``inline``, its bytes as the catalog entry holds them (:func:`lookup`); the manifest
    and the bytes it was read from."""
    target = S3Url(url.bucket, manifest_key(url.key))
    if inline is not None:
        data = inline
    else:
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
