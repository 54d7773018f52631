"""The daemon's reports to its coordinator: counters out, origin plans and members in."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from aiohttp import ClientError, ClientSession, ClientTimeout

if TYPE_CHECKING:
    from swarm.agent.daemon import Daemon

log = logging.getLogger(__name__)

REPORT_INTERVAL = 1.0
"""Seconds between reports unless the coordinator's reply names another ``interval``."""

FAILOVER_WAIT = 0.25
"""Seconds before a failed report goes to the next coordinator of the list."""

MIN_INTERVAL, MAX_INTERVAL = 0.2, 30.0
"""Bounds on the interval a coordinator may ask for (a bad reply cannot silence a node
or make it flood)."""


class Membership:
    """The fleet's members as this node last heard them, and the coordinator's epoch of
    that list: a reply carries nothing when it is current, a delta when it is behind
    (``"+ip"`` / ``"-ip"`` in order) or the whole list (see swarm.coordinator.app)."""

    def __init__(self) -> None:
        self.epoch: str | None = None
        self.ips: set[str] = set()

    def apply(self, reply: dict[str, object]) -> bool:
        """Take a reply's membership; True if the list changed."""
        whole, delta = reply.get("members"), reply.get("members_delta")
        changed = False
        if isinstance(whole, list):
            self.ips, changed = {str(ip) for ip in whole}, True
        elif isinstance(delta, list):
            for change in delta:
                if isinstance(change, str) and change[:1] in "+-" and len(change) > 1:
                    (self.ips.add if change[0] == "+" else self.ips.discard)(change[1:])
                    changed = True
        epoch = reply.get("members_epoch")
        if isinstance(epoch, str):
            self.epoch = epoch
        return changed


async def report_loop(daemon: Daemon, wake: asyncio.Event) -> None:
    """Post this node's counters to the coordinator (soft state) at the interval it asks
    for, and take the origin plans of its reply. ``wake`` sends a report at once."""
    urls = [f"{url}/v1/report" for url in daemon.coordinators]
    current = 0
    headers = {"Authorization": f"Bearer {daemon.token}"} if daemon.token else {}
    interval = REPORT_INTERVAL
    members = Membership()
    async with ClientSession(timeout=ClientTimeout(total=2), headers=headers) as http:
        while True:
            url = urls[current]
            report = daemon.snapshot()
            if daemon.token:  # members filter peer connections: keep the list current
                report["members_epoch"] = members.epoch
            else:
                report["want_members"] = False  # an open fleet filters no peers
            try:
                async with http.post(url, json=report) as response:
                    if response.status >= 500:  # overloaded or failing: try the next one
                        raise OSError(f"HTTP {response.status}")
                    reply = await response.json() if response.status == 200 else {}
                if isinstance(reply, dict):
                    asked = reply.get("interval")
                    if isinstance(asked, int | float) and asked > 0:
                        interval = min(MAX_INTERVAL, max(MIN_INTERVAL, float(asked)))
                    daemon.take_plans(reply.get("plans") or {}, interval)
                    if members.apply(reply):
                        daemon.take_members(sorted(members.ips))
                wait = interval
            except (TimeoutError, OSError, ValueError, ClientError) as error:
                log.debug("report to %s failed: %s", url, error)
                current = (current + 1) % len(urls)  # the next coordinator, soon
                wait = min(interval, FAILOVER_WAIT) if len(urls) > 1 else interval
            wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wake.wait(), wait)
