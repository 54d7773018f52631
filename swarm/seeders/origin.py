"""The origin seeder: pull catalog artifacts from S3 at full speed and seed them.

Run one (or a few) per region to pre-heat a fleet: new nodes then find a complete peer
on the LAN at once, and S3 is read about once per artifact per region.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from swarm.agent.daemon import Daemon
from swarm.errors import SwarmError
from swarm.messages import FetchRequest
from swarm.objectstore import S3_ERRORS, S3Url, make_client, raise_for

log = logging.getLogger(__name__)

RESCAN_INTERVAL = 60.0
"""Seconds between catalog scans for newly published artifacts (when none are named)."""


def list_catalog(client: Any, catalog: str) -> list[str]:
    """Names of every artifact in the catalog (``NAME.json`` objects under the prefix)."""
    prefix = S3Url.parse(catalog).child("")
    names: list[str] = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=prefix.bucket, Prefix=prefix.key
        ):
            for item in page.get("Contents", []):
                key = item["Key"][len(prefix.key) :]
                if key.endswith(".json") and "/" not in key:
                    names.append(key.removesuffix(".json"))
    except S3_ERRORS as error:
        raise_for(error, prefix)
    return names


async def preheat(daemon: Daemon, catalog: str, names: list[str]) -> None:
    """Fetch every named artifact (all of the catalog if none) from S3 alone; keep seeding."""
    loop = asyncio.get_running_loop()
    client = make_client(daemon.settings.endpoint_url)
    requested: set[str] = set()
    while True:
        try:
            wanted = names or await loop.run_in_executor(None, list_catalog, client, catalog)
        except SwarmError as error:
            log.error("%s", error)
            wanted = []
        for name in wanted:
            if name in requested:
                continue
            request = FetchRequest(source=name, catalog=catalog, sources=("s3",))
            try:
                artifact = await loop.run_in_executor(None, daemon.fetch, request)
            except SwarmError as error:
                log.error("cannot seed %s: %s", name, error)
                continue
            requested.add(name)
            log.info("seeding %s (%s)", name, artifact.manifest.info_hash)
        if names:
            return
        await asyncio.sleep(RESCAN_INTERVAL)
