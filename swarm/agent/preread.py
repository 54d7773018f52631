"""The artifact's manifest, read by ``swarm fetch`` while the daemon it has just started
comes up (:class:`ManifestPreread`), and handed to the daemon with the fetch request."""

from __future__ import annotations

import json
import logging
import threading
from typing import Final

# imported by `swarm fetch` before it forks its daemon, which needs the catalog and the S3
# client for its own reads: see swarm.agent.earlyread's imports
from swarm import catalog as catalogs
from swarm.s3http import S3Client

log = logging.getLogger(__name__)


PREREAD_WAIT: Final = 1.0
"""Seconds ``swarm fetch`` waits, once its daemon answers, for the manifest it is reading
(:class:`ManifestPreread`); then the daemon reads it itself."""

MAX_PREREAD_BYTES: Final = 512 << 10
"""A manifest larger than this in the request (JSON-quoted) is left to the daemon: a
request body holds at most 1 MiB (:data:`swarm.agent.api.MAX_BODY`)."""

PREREAD_READS: Final = 2
"""Reads of the manifest side by side (:class:`ManifestPreread`): two GETs of a small
object cost nothing beside a fetch, and two lost packets at once are rare."""


class ManifestPreread:
    """The artifact's manifest, read from S3 by ``swarm fetch`` while the daemon it has
    just started comes up (0.3-0.4 s on a fleet node), so that the daemon need not read
    it after: across a WAN the catalog entry and the manifest were four round trips (0.38
    s of far-region's start), three since the entry holds the manifest
    (:func:`swarm.catalog.lookup`): far-region's daemons now have it 0.01-0.05 s after
    they listen, not 0.08-0.2. Read :data:`PREREAD_READS` times at once, on connections of
    their own, and the first answer taken: on a lossy path one lost SYN or segment holds
    a read for a retransmission timeout (one far-region node had its manifest 0.6 s after
    the others, at 0.5% loss). No retries: on any failure the daemon reads it itself,
    retrying, and says what is wrong. Only for a daemon this command starts (it has the
    same settings and credentials)."""

    def __init__(
        self, source: str, catalog: str | None, endpoint_url: str | None, secret: str | None
    ) -> None:
        self._text: str | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._left = PREREAD_READS  # reads not finished yet
        for n in range(PREREAD_READS):
            threading.Thread(
                target=self._read,
                args=(source, catalog, endpoint_url, secret),
                name=f"manifest-preread-{n}",
                daemon=True,
            ).start()

    def _read(
        self, source: str, catalog: str | None, endpoint_url: str | None, secret: str | None
    ) -> None:
        text: str | None = None
        try:
            text = self._read_once(source, catalog, endpoint_url, secret)
        finally:
            with self._lock:
                self._left -= 1
                if text is not None and self._text is None:
                    self._text = text
                if self._text is not None or not self._left:
                    self._done.set()

    @staticmethod
    def _read_once(
        source: str, catalog: str | None, endpoint_url: str | None, secret: str | None
    ) -> str | None:
        try:
            client = S3Client(endpoint_url, max_attempts=1)
            try:
                url, inline = catalogs.lookup(client, source, catalog)
                _, data = catalogs.read_manifest(client, url, secret, inline)
            finally:
                client.close()
        except Exception as error:  # the daemon reads it, and reports what is wrong
            log.debug("manifest of %s not read ahead: %s", source, error)
            return None
        text = data.decode()
        return text if len(json.dumps(text)) <= MAX_PREREAD_BYTES else None  # as it travels

    def result(self, timeout: float = PREREAD_WAIT) -> str | None:
        """The manifest's text, or None (not read within ``timeout``, failed, or large)."""
        self._done.wait(timeout)
        with self._lock:
            return self._text
