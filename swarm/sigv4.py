"""AWS Signature Version 4 for a node's S3 GETs, in Python (``hmac`` and ``hashlib``).

A node signs a handful of requests: a catalog entry, a manifest, ranges of the object.
awscrt signed them before, but importing it costs a fresh process 0.06-0.1 CPU-s (most
of it AWS-LC seeding its random generator from CPU jitter, aws/aws-lc#3180, which a
signature does not need) and its default credential chain 0.02 more (it builds a TLS
context for STS and the container endpoints): in the s3-fast bench six nodes start at
once on two cores, so each node's first byte waited for six of those. Credentials in
the environment, the first link of every SDK's chain, are read here; any other source
(profile files, web identity, ECS, an instance role) is awscrt's chain, imported then.

The signature is the same as awscrt's for the same request and time (the unit test
compares them): S3's flavour, with the path signed as sent (no double encoding, no
normalising), the SHA-256 of an empty body as the payload hash (a GET has none), and
the headers given plus ``x-amz-date``, ``x-amz-content-sha256`` and, with a session
token, ``x-amz-security-token``.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote, unquote

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
ALGORITHM = "AWS4-HMAC-SHA256"


@dataclass(frozen=True)
class Credentials:
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode(), hashlib.sha256).digest()


def signing_key(secret: str, day: str, region: str, service: str) -> bytes:
    key = _hmac(("AWS4" + secret).encode(), day)
    return _hmac(_hmac(_hmac(key, region), service), "aws4_request")


def _canonical_query(query: str) -> str:
    pairs = []
    for part in query.split("&") if query else []:
        name, _, value = part.partition("=")
        pairs.append((quote(unquote(name), safe="-_.~"), quote(unquote(value), safe="-_.~")))
    return "&".join(f"{n}={v}" for n, v in sorted(pairs))


def sign(
    method: str,
    path: str,
    headers: Sequence[tuple[str, str]],
    credentials: Credentials,
    region: str,
    now: datetime.datetime,
    service: str = "s3",
) -> list[tuple[str, str]]:
    """The request's headers, signed: ``headers`` (``Host`` among them) with the date,
    the payload hash, the session token if any, and ``Authorization``. ``path`` is sent
    as is (already percent-encoded), with its query string if it has one."""
    stamp = now.astimezone(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    day = stamp[:8]
    signed = [
        *headers,
        ("x-amz-date", stamp),
        ("x-amz-content-sha256", EMPTY_SHA256),
    ]
    if credentials.session_token:
        signed.append(("x-amz-security-token", credentials.session_token))
    canonical_headers = sorted((name.lower(), " ".join(value.split())) for name, value in signed)
    names = ";".join(name for name, _ in canonical_headers)
    uri, _, query = path.partition("?")
    canonical = "\n".join(
        [
            method,
            uri or "/",
            _canonical_query(query),
            "".join(f"{name}:{value}\n" for name, value in canonical_headers),
            names,
            EMPTY_SHA256,
        ]
    )
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join([ALGORITHM, stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = signing_key(credentials.secret_access_key, day, region, service)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    authorization = (
        f"{ALGORITHM} Credential={credentials.access_key_id}/{scope}, "
        f"SignedHeaders={names}, Signature={signature}"
    )
    return [*signed, ("Authorization", authorization)]
