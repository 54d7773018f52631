"""S3 through botocore, for what writes or lists: publish, the catalog's entries, the
origin seeder's listing.

One way to build a client (endpoint from ``--endpoint-url`` or ``AWS_ENDPOINT_URL``,
credentials from boto3's normal chain), and the translation of botocore errors into
:mod:`swarm.errors` with messages that name bucket, key and fix. A node's reads go
through :mod:`swarm.s3http` instead (no botocore to import at a node's start).
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any, NoReturn

import botocore.exceptions
import botocore.session
from botocore.config import Config

from swarm.errors import SwarmError
from swarm.s3http import DEFAULT_REGION, S3Url, error_for, no_credentials, unreachable

__all__ = ["S3_ERRORS", "S3Url", "make_client", "object_http_url", "raise_for"]

SDK_MAX_ATTEMPTS = 8
"""botocore's own retries (``standard`` mode: capped, jittered exponential backoff on
throttling, 5xx and connection errors), before our per-range retry takes over."""

S3_ERRORS = (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError)
"""Everything boto3 raises for a failed S3 call (catch these, then :func:`raise_for`)."""

_session_lock = threading.Lock()
"""A botocore session is not safe for clients made from it at once."""


@functools.cache
def _botocore_session() -> Any:
    """The process's botocore session, made once: a session loads S3's model, its
    endpoint rules and the partitions from JSON for its first client (0.12 of the 0.15-0.2
    CPU-s a client cost), and a daemon made a new one for every fetch. Its credentials
    are resolved once too; an instance role's refresh by themselves."""
    return botocore.session.get_session()


def make_client(
    endpoint_url: str | None = None,
    max_connections: int = 16,
    max_attempts: int = SDK_MAX_ATTEMPTS,
    transfers: bool = False,
) -> Any:
    """An S3 client; ``endpoint_url`` overrides ``AWS_ENDPOINT_URL`` (botocore reads it
    itself). ``max_attempts`` bounds botocore's silent retries of one call (the daemon
    keeps them few and retries under its supervisor, where the reason shows on the
    progress line). ``transfers``: a boto3 client, with its managed ``upload_file``
    (publish); otherwise plain botocore, which a node needs alone: importing boto3 and
    s3transfer was a fifth of a fresh daemon's CPU on a 128 MiB fetch (py-spy)."""
    if transfers:
        import boto3

        session: Any = boto3.session.Session()
        region = session.region_name
    else:
        session = _botocore_session()
        region = session.get_config_variable("region")
    region = region or os.environ.get("AWS_REGION") or DEFAULT_REGION
    config = Config(
        retries={"mode": "standard", "max_attempts": max_attempts},
        max_pool_connections=max_connections,
        connect_timeout=10,
        read_timeout=60,
        # Path-style works with every S3-compatible server (MinIO, moto) and with AWS.
        s3={"addressing_style": "path"},
    )
    if transfers:
        return session.client(
            "s3", endpoint_url=endpoint_url or None, region_name=region, config=config
        )
    with _session_lock:
        return session.create_client(
            "s3", endpoint_url=endpoint_url or None, region_name=region, config=config
        )


def object_http_url(client: Any, url: S3Url) -> str:
    """Plain HTTP(S) URL of an object, for the torrent's web seed (BEP 19 ``url-list``).

    Works as a web seed when the object is readable anonymously; a private bucket's
    fleet uses swarm's own signed S3 source instead.
    """
    base = client.meta.endpoint_url.rstrip("/")
    return f"{base}/{url.bucket}/{url.key}"


def raise_for(error: Exception, url: S3Url, action: str = "read") -> NoReturn:
    """Translate a botocore error about ``url`` into a :class:`SwarmError` and raise it
    (the messages are :mod:`swarm.s3http`'s, the node's S3 client's)."""
    if isinstance(error, botocore.exceptions.NoCredentialsError):
        raise no_credentials(url, action) from error
    if isinstance(error, botocore.exceptions.ClientError):
        err = error.response.get("Error", {})
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        raise error_for(
            status, str(err.get("Code", "")), str(err.get("Message", "")), url, action
        ) from error
    if isinstance(error, botocore.exceptions.EndpointConnectionError | ConnectionError):
        raise unreachable(url, error) from error
    raise SwarmError(f"swarm: S3 {action} of {url} failed: {error}") from error
