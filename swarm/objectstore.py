"""S3 access shared by publish, the catalog and the S3 source.

URL parsing, one way to build a client (endpoint from ``--endpoint-url`` or
``AWS_ENDPOINT_URL``, credentials from boto3's normal chain), and the translation of
botocore errors into :mod:`swarm.errors` with messages that name bucket, key and fix.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass
from typing import Any, NoReturn

import botocore.exceptions
import botocore.session
from botocore.config import Config

from swarm.errors import AccessDeniedError, NotFoundError, SwarmError, UsageError

DEFAULT_REGION = "us-east-1"
"""Used only when the credential chain names no region (S3 needs one to sign)."""

SDK_MAX_ATTEMPTS = 8
"""botocore's own retries (``standard`` mode: capped, jittered exponential backoff on
throttling, 5xx and connection errors), before our per-range retry takes over."""

S3_ERRORS = (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError)
"""Everything boto3 raises for a failed S3 call (catch these, then :func:`raise_for`)."""

NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "404", "NotFound"})
DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "403",
        "Forbidden",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
    }
)


@dataclass(frozen=True)
class S3Url:
    """``s3://bucket/key``; ``key`` may end with ``/`` for a prefix."""

    bucket: str
    key: str

    @classmethod
    def parse(cls, url: str) -> S3Url:
        if not url.startswith("s3://"):
            raise UsageError(f"not an S3 URL: {url!r} (expected s3://BUCKET/KEY)")
        bucket, _, key = url[len("s3://") :].partition("/")
        if not bucket:
            raise UsageError(f"S3 URL has no bucket: {url!r} (expected s3://BUCKET/KEY)")
        return cls(bucket, key)

    def child(self, name: str) -> S3Url:
        prefix = self.key if not self.key or self.key.endswith("/") else self.key + "/"
        return S3Url(self.bucket, prefix + name)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


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
    """Translate a botocore error about ``url`` into a :class:`SwarmError` and raise it."""
    if isinstance(error, botocore.exceptions.NoCredentialsError):
        raise AccessDeniedError(
            f"swarm: no AWS credentials found to {action} {url}: set AWS_ACCESS_KEY_ID/"
            "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or attach an instance role"
        ) from error
    if isinstance(error, botocore.exceptions.ClientError):
        err = error.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        detail = f"{status} {code}".strip()
        if code in NOT_FOUND_CODES or status == 404:
            what = "bucket" if code == "NoSuchBucket" else "object"
            raise NotFoundError(
                f"swarm: {url} not found ({detail}): the {what} does not exist; check the "
                "bucket and key, or publish it first with `swarm publish FILE s3://BUCKET/KEY`"
            ) from error
        if code in DENIED_CODES or status == 403:
            verb = "s3:PutObject" if action == "write" else "s3:GetObject"
            raise AccessDeniedError(
                f"swarm: cannot {action} {url} ({detail}): the instance role or credentials "
                f"need {verb} on arn:aws:s3:::{url.bucket}/*"
            ) from error
        raise SwarmError(
            f"swarm: S3 error on {url} ({detail}): {err.get('Message', '')}"
        ) from error
    if isinstance(error, botocore.exceptions.EndpointConnectionError | ConnectionError):
        raise SwarmError(
            f"swarm: cannot reach the S3 endpoint for {url} ({error}): check AWS_ENDPOINT_URL "
            "or --endpoint-url and the network"
        ) from error
    raise SwarmError(f"swarm: S3 {action} of {url} failed: {error}") from error
