"""S3 reads for a node without botocore: ``http.client`` connections, requests signed
with SigV4 (:mod:`swarm.sigv4`), credentials from the environment or else resolved by
awscrt, the AWS SDKs' common runtime.

A node reads three things from S3: a catalog entry, a manifest, and ranges of the
object. botocore cost a fresh daemon 0.25 CPU-s to import and to build its client (it
loads S3's model, endpoint rules and partitions from JSON): half of a node's fixed start,
and in the s3-fast bench six nodes start at once on two cores, so every node's first
byte waited for all six. awscrt is C, yet importing it costs 0.06-0.1 CPU-s (AWS-LC's
jitter-entropy seeding of its random generator): it is imported only where the
environment holds no keys, and then resolves credentials with the SDKs' default chain
(profile files, web identity, ECS container, EC2 instance role over IMDSv2).
Publishing and the seeders' catalog listing keep boto3/botocore (multipart uploads,
paginators): nothing there starts per node.

Only what a node needs: GET of an object or a byte range, path-style addressing (as the
botocore client was configured: it works with AWS and every S3-compatible server), the
endpoint from ``--endpoint-url``, ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, the
region from ``AWS_REGION``, ``AWS_DEFAULT_REGION`` or the profile's config, and the
``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY`` variables. A body is the ``http.client``
response itself, so the S3 source reads it straight into its buffers.
"""

from __future__ import annotations

import configparser
import datetime
import functools
import http.client
import os
import random
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import quote, urlsplit

from swarm import sigv4
from swarm.errors import AccessDeniedError, NotFoundError, SwarmError, UsageError
from swarm.sigv4 import Credentials

DEFAULT_REGION = "us-east-1"
"""Used only when nothing names a region (S3 needs one to sign)."""

CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 60.0
"""Seconds without a byte before a read fails (botocore's default, which the node used)."""

DEFAULT_ATTEMPTS = 3
"""Tries of one call that fails before its body starts (5xx, throttling, a refused or
reset connection), with jittered backoff; the S3 source retries a range on top."""

RETRYABLE_STATUS = frozenset({500, 502, 503, 504})
BACKOFF_BASE = 0.2
BACKOFF_CAP = 5.0
ERROR_BODY_LIMIT = 64 << 10

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


class S3Error(Exception):
    """A failed S3 call (base of this module's errors)."""


class S3ResponseError(S3Error):
    """S3 answered with an error status; ``code`` is S3's error code (``NoSuchKey``,
    ``SlowDown``...) or the status when the answer had no body (a HEAD, a proxy)."""

    def __init__(self, status: int, code: str, message: str = "", region: str = "") -> None:
        super().__init__(f"HTTP {status} {code}: {message}".rstrip(": "))
        self.status = status
        self.code = code
        self.message = message
        self.region = region
        """The bucket's region, where S3 named it (a request to the wrong region)."""


class S3ConnectionError(S3Error, ConnectionError):
    """The endpoint could not be reached, or the connection broke before an answer."""


class NoCredentialsError(S3Error):
    """The credential chain found nothing to sign with."""


def backoff_delay(attempt: int, rng: random.Random) -> float:
    """Full-jitter exponential backoff (AWS Architecture Blog, 'Exponential Backoff And
    Jitter'): uniform in [0, min(cap, base * 2**attempt)]. The client's tries and the S3
    source's range retries both wait so."""
    return rng.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2**attempt))


def error_for(status: int | None, code: str, message: str, url: S3Url, action: str) -> SwarmError:
    """The :class:`SwarmError` for S3's answer about ``url``, with a message that names
    the fix (shared with :func:`swarm.objectstore.raise_for`, botocore's side)."""
    detail = f"{status or ''} {code}".strip()
    if code in NOT_FOUND_CODES or status == 404:
        what = "bucket" if code == "NoSuchBucket" else "object"
        return NotFoundError(
            f"swarm: {url} not found ({detail}): the {what} does not exist; check the "
            "bucket and key, or publish it first with `swarm publish FILE s3://BUCKET/KEY`"
        )
    if code in DENIED_CODES or status == 403:
        verb = "s3:PutObject" if action == "write" else "s3:GetObject"
        return AccessDeniedError(
            f"swarm: cannot {action} {url} ({detail}): the instance role or credentials "
            f"need {verb} on arn:aws:s3:::{url.bucket}/*"
        )
    return SwarmError(f"swarm: S3 error on {url} ({detail}): {message}")


def no_credentials(url: S3Url, action: str) -> AccessDeniedError:
    return AccessDeniedError(
        f"swarm: no AWS credentials found to {action} {url}: set AWS_ACCESS_KEY_ID/"
        "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or attach an instance role"
    )


def unreachable(url: S3Url, error: BaseException) -> SwarmError:
    return SwarmError(
        f"swarm: cannot reach the S3 endpoint for {url} ({error}): check AWS_ENDPOINT_URL "
        "or --endpoint-url and the network"
    )


def raise_for(error: Exception, url: S3Url, action: str = "read") -> NoReturn:
    """Translate an error of this module about ``url`` into a :class:`SwarmError`."""
    if isinstance(error, S3ResponseError):
        raise error_for(error.status, error.code, error.message, url, action) from error
    if isinstance(error, NoCredentialsError):
        raise no_credentials(url, action) from error
    if isinstance(error, ConnectionError):
        raise unreachable(url, error) from error
    raise SwarmError(f"swarm: S3 {action} of {url} failed: {error}") from error


# -- where and as whom --------------------------------------------------------------------


def _profile_config() -> dict[str, str]:
    """The active profile's section of the shared config file (``~/.aws/config``)."""
    profile = os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE") or "default"
    path = Path(os.environ.get("AWS_CONFIG_FILE") or Path.home() / ".aws" / "config")
    parser = configparser.RawConfigParser()
    try:
        parser.read(path)
    except (OSError, configparser.Error):
        return {}
    section = profile if profile == "default" else f"profile {profile}"
    return dict(parser[section]) if parser.has_section(section) else {}


def region_name() -> str:
    """The region to sign for: ``AWS_REGION``, ``AWS_DEFAULT_REGION``, the profile's
    ``region``, else :data:`DEFAULT_REGION` (botocore's order, less its config merging)."""
    return (
        os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or _profile_config().get("region")
        or DEFAULT_REGION
    )


def endpoint_for(endpoint_url: str | None, region: str) -> str:
    """``endpoint_url``, else ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, else the
    region's S3 endpoint."""
    url = (
        endpoint_url
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
        or f"https://s3.{region}.amazonaws.com{'.cn' if region.startswith('cn-') else ''}"
    )
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"swarm: S3 endpoint {url!r} is not an http(s):// URL")
    return url.rstrip("/")


def _credentials() -> Credentials:
    """The credentials to sign with: the environment's (``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``), else what awscrt's default chain
    resolves (it caches them, and refreshes an instance role's before they expire)."""
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:
        return Credentials(key, secret, os.environ.get("AWS_SESSION_TOKEN") or None)
    import awscrt.exceptions

    try:
        found = _credential_chain().get_credentials().result()
    except awscrt.exceptions.AwsCrtError as error:
        if "CREDENTIAL" in error.name:
            raise NoCredentialsError(f"{error.name}: {error.message}") from error
        raise S3Error(f"credentials: {error.name}: {error.message}") from error
    return Credentials(found.access_key_id, found.secret_access_key, found.session_token)


@functools.cache
def _credential_chain() -> Any:
    """awscrt's provider for the SDKs' default chain (made once per process)."""
    import awscrt.auth

    return awscrt.auth.AwsCredentialsProvider.new_default_chain()


# -- connections --------------------------------------------------------------------------


def _connect(conn: http.client.HTTPConnection, connect: Any) -> None:
    """Connect under :data:`CONNECT_TIMEOUT` (and the TLS handshake, and a proxy's
    CONNECT), then read under the connection's own timeout: an endpoint that drops SYNs
    fails in seconds, not in a read timeout per try."""
    read_timeout = conn.timeout
    conn.timeout = CONNECT_TIMEOUT
    try:
        connect()
    finally:
        conn.timeout = read_timeout
    if conn.sock is not None:
        conn.sock.settimeout(read_timeout)


class _Connection(http.client.HTTPConnection):
    def connect(self) -> None:
        _connect(self, super().connect)


class _TLSConnection(http.client.HTTPSConnection):
    def connect(self) -> None:
        _connect(self, super().connect)


def _proxy_for(scheme: str, host: str) -> str | None:
    """The proxy URL the environment names for ``scheme://host``, if any."""
    if not any(k.lower().endswith("_proxy") for k in os.environ):
        return None
    import urllib.request

    if urllib.request.proxy_bypass(host):
        return None
    return urllib.request.getproxies_environment().get(scheme)


class Body:
    """One GET's response body: the ``http.client`` response (``response``), readable with
    :meth:`read`. :meth:`close` gives the connection back to the client's pool when the
    body was read to its end, and drops it otherwise (unread bytes would precede the
    next response)."""

    def __init__(self, response: http.client.HTTPResponse, release: Any) -> None:
        self.response = response
        self._release = release

    def read(self, amt: int | None = None) -> bytes:
        data = self.response.read(amt)
        if amt is not None and amt > 0 and not data and self.response.length:
            raise http.client.IncompleteRead(b"", self.response.length)
        return data

    def close(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release(self.response.isclosed())
        self.response.close()


class _Endpoint:
    """One S3 endpoint as requests see it: where to connect (directly or through the
    proxy's CONNECT tunnel), the ``Host`` header, the region to sign for, and a pool of
    kept-alive connections."""

    def __init__(self, url: str, region: str, max_connections: int) -> None:
        parts = urlsplit(url)
        self.url = url
        self.region = region
        self.scheme = parts.scheme
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if self.scheme == "https" else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 literal
        default_port = self.port == (443 if self.scheme == "https" else 80)
        self.host_header = host if default_port else f"{host}:{self.port}"
        self.base_path = parts.path.rstrip("/")
        self.proxy = _proxy_for(self.scheme, self.host)
        self.max_connections = max_connections
        self._tls: Any = None
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def connect(self) -> http.client.HTTPConnection:
        host, port = self.host, self.port
        if self.proxy is not None:
            proxy = urlsplit(self.proxy)
            host, port = proxy.hostname or "", proxy.port or 80
        conn: http.client.HTTPConnection
        if self.scheme == "https":
            if self._tls is None:
                import ssl

                self._tls = ssl.create_default_context()
            conn = _TLSConnection(host, port, timeout=READ_TIMEOUT, context=self._tls)
        else:
            conn = _Connection(host, port, timeout=READ_TIMEOUT)
        if self.proxy is not None:
            conn.set_tunnel(self.host, self.port)
        return conn

    def take(self) -> tuple[http.client.HTTPConnection, bool]:
        """An idle connection (True: reused) or a new one."""
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self.connect(), False

    def release(self, conn: http.client.HTTPConnection, reusable: bool) -> None:
        if reusable:
            with self._lock:
                if len(self._idle) < self.max_connections:
                    self._idle.append(conn)
                    return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class S3Client:
    """GETs of S3 objects, signed, over pools of kept-alive connections (thread-safe).

    ``get_object(Bucket=, Key=, Range=)`` answers ``{"Body": Body, "ContentLength": n}``,
    the shape botocore's had, and raises :class:`S3ResponseError`,
    :class:`S3ConnectionError` or :class:`NoCredentialsError`. A bucket in another region
    than the one configured is followed there, as botocore did (S3 names the bucket's
    region in its 301 or 400 answer), unless the endpoint was given."""

    def __init__(
        self,
        endpoint_url: str | None = None,
        max_connections: int = 16,
        max_attempts: int = DEFAULT_ATTEMPTS,
        rng: random.Random | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        region = region_name()
        self.follows_regions = not (
            endpoint_url
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
        )
        """No endpoint was given (AWS's own for the region): a bucket elsewhere is read
        from its region's endpoint."""
        self.max_connections = max_connections
        self.endpoint = _Endpoint(endpoint_for(endpoint_url, region), region, max_connections)
        self.max_attempts = max_attempts
        self.rng = rng or random.Random()
        self._buckets: dict[str, _Endpoint] = {}
        """Buckets found in another region, and their region's endpoint."""

    # -- the calls --

    def get_object(self, Bucket: str, Key: str, Range: str | None = None) -> dict[str, Any]:
        headers: list[tuple[str, str]] = [] if Range is None else [("Range", Range)]
        attempt = 0
        while True:
            attempt += 1
            endpoint = self._buckets.get(Bucket, self.endpoint)
            path = f"{endpoint.base_path}/{quote(Bucket)}/{quote(Key, safe='/~')}"
            try:
                conn, response = self._request(endpoint, "GET", path, headers)
            except S3ResponseError as error:
                moved = self._moved(Bucket, endpoint, error)
                if moved:
                    attempt -= 1  # not a failure: S3 said where the bucket is
                    continue
                if error.status not in RETRYABLE_STATUS or attempt >= self.max_attempts:
                    raise
            except S3ConnectionError:
                if attempt >= self.max_attempts:
                    raise
            else:
                body = Body(response, functools.partial(endpoint.release, conn))
                return {"Body": body, "ContentLength": response.length}
            time.sleep(backoff_delay(attempt, self.rng))

    @property
    def endpoint_url(self) -> str:
        """The configured endpoint (a bucket followed to another region aside)."""
        return self.endpoint.url

    def close(self) -> None:
        for endpoint in {self.endpoint, *self._buckets.values()}:
            endpoint.close()

    # -- internals --

    def _moved(self, bucket: str, endpoint: _Endpoint, error: S3ResponseError) -> bool:
        """Remember ``bucket``'s region when S3 says it is another (True: ask there)."""
        region = error.region
        if not self.follows_regions or not region or region == endpoint.region:
            return False
        if error.status not in (301, 307, 400):
            return False
        self._buckets[bucket] = _Endpoint(endpoint_for(None, region), region, self.max_connections)
        return True

    def _sign(
        self, endpoint: _Endpoint, method: str, path: str, headers: list[tuple[str, str]]
    ) -> list[tuple[str, str]]:
        # S3 signs the path as sent (no double encoding, no normalising): see sigv4
        host = [("Host", endpoint.host_header), *headers]
        now = datetime.datetime.now(datetime.UTC)
        return sigv4.sign(method, path, host, _credentials(), endpoint.region, now)

    def _request(
        self, endpoint: _Endpoint, method: str, path: str, headers: list[tuple[str, str]]
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        signed = self._sign(endpoint, method, path, headers)
        while True:
            conn, reused = endpoint.take()
            try:
                conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
                for name, value in signed:
                    conn.putheader(name, value)
                conn.endheaders()
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as error:
                conn.close()
                if reused:  # a kept-alive connection the server had closed: a fresh one
                    continue
                raise S3ConnectionError(f"{endpoint.url}: {error}") from error
            break
        if response.status in (200, 206):
            return conn, response
        raw = response.read(ERROR_BODY_LIMIT)
        endpoint.release(conn, response.isclosed())
        text = raw.decode("utf-8", "replace")
        code, message = _error_fields(text)
        region = response.getheader("x-amz-bucket-region") or _xml_field(text, "Region")
        raise S3ResponseError(response.status, code or str(response.status), message, region)


def _xml_field(xml: str, name: str) -> str:
    found = re.search(f"<{name}>([^<]*)</{name}>", xml)
    return found.group(1) if found else ""


def _error_fields(xml: str) -> tuple[str, str]:
    """``Code`` and ``Message`` of S3's XML error document (empty where absent)."""
    return _xml_field(xml, "Code"), _xml_field(xml, "Message")
