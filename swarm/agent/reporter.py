"""The daemon's reports to its coordinator: counters out, origin plans and members in."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from aiohttp import ClientSession, ClientTimeout

if TYPE_CHECKING:
    from swarm.agent.daemon import Daemon

log = logging.getLogger(__name__)

REPORT_INTERVAL = 1.0
"""Seconds between reports unless the coordinator's reply names another ``interval``."""

MIN_INTERVAL, MAX_INTERVAL = 0.2, 30.0
"""Bounds on the interval a coordinator may ask for (a bad reply cannot silence a node
or make it flood)."""


async def report_loop(daemon: Daemon, wake: asyncio.Event) -> None:
    """Post this node's counters to the coordinator (soft state) at the interval it asks
    for, and take the origin plans of its reply. ``wake`` sends a report at once."""
    url = daemon.settings.coordinator.rstrip("/") + "/v1/report"  # type: ignore[union-attr]
    headers = {"Authorization": f"Bearer {daemon.token}"} if daemon.token else {}
    interval = REPORT_INTERVAL
    async with ClientSession(timeout=ClientTimeout(total=2), headers=headers) as http:
        while True:
            try:
                async with http.post(url, json=daemon.snapshot()) as response:
                    reply = await response.json() if response.status == 200 else {}
                if isinstance(reply, dict):
                    daemon.take_plans(reply.get("plans") or {})
                    if isinstance(reply.get("members"), list):
                        daemon.take_members(reply["members"])
                    asked = reply.get("interval")
                    if isinstance(asked, int | float) and asked > 0:
                        interval = min(MAX_INTERVAL, max(MIN_INTERVAL, float(asked)))
            except (TimeoutError, OSError, ValueError) as error:
                log.debug("report to %s failed: %s", url, error)
            wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wake.wait(), interval)
