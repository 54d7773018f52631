"""How often nodes report, and how the coordinator tells it is behind.

The report interval (:func:`report_interval`) spreads the fleet's reports so that each
coordinator gets at most its budget a second; the load governor (:func:`watch_lag`,
:func:`govern`) stretches it while the event loop lags (a busy or shared machine).
Pure but for :func:`watch_lag`, which reads the event loop's clock.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Final

from swarm.coordinator.fleet import REPORT_INTERVAL

log = logging.getLogger(__name__)

REPORT_BUDGET: Final = 2000.0
"""Reports per second one coordinator is asked to take (:func:`report_interval`). At
this rate one process used about 0.6 core on the 2-core benchmark machine
(bench/coordinator.py), leaving room for announces, the fleet view and bursts."""

REDIS_REPORT_BUDGET: Final = 1000.0
"""Reports per second per coordinator with a Redis store: each report then also costs a
few Redis round trips. Coordinators sharing a store share the fleet's reports: the
interval is ``nodes / (budget x coordinators alive)``."""

MAX_REPORT_INTERVAL: Final = 15.0
"""Longest interval a reply asks for: past ``MAX_REPORT_INTERVAL x budget`` nodes
(30,000 at the default budget) the load exceeds the budget instead of the plans going
stale; more coordinators (``--store redis://``) share such a fleet."""

INTERVAL_STEP: Final = 0.5
"""Intervals are rounded up to this step, so that the value nodes are told changes
only when the fleet's size has really changed."""

LAG_HIGH: Final = 0.05
"""Event-loop lag (seconds, an EMA) above which the coordinator is behind: it lengthens
the report interval (:func:`govern`). A loop that runs a 0.25 s timer 50 ms late has a
queue of requests at least that deep."""

LAG_LOW: Final = 0.01
"""Lag below which the coordinator has room again: the interval shortens."""

MAX_LOAD_FACTOR: Final = 8.0
"""Most the load governor stretches the budget's interval (still within
``MAX_REPORT_INTERVAL``)."""

LAG_PERIOD: Final = 0.25
"""Seconds between event-loop lag probes."""


def govern(factor: float, lag: float) -> float:
    """The next stretch of the report interval from the event loop's lag: x1.5 while the
    loop lags more than ``LAG_HIGH`` (the budget is more than this process gets: a busy
    or shared machine), /1.1 while it lags less than ``LAG_LOW``, within [1,
    ``MAX_LOAD_FACTOR``]. Faster up than down (AIMD-like): a node hears a new interval
    only at its next report, so the load answers a change one interval later."""
    if lag > LAG_HIGH:
        return min(MAX_LOAD_FACTOR, factor * 1.5)
    if lag < LAG_LOW:
        return max(1.0, factor / 1.1)
    return factor


def report_interval(nodes: int, budget: float, coordinators: int = 1) -> float:
    """Seconds between a node's reports so that ``nodes`` nodes send at most ``budget``
    reports a second to each of ``coordinators``: ``nodes / (budget x coordinators)``,
    rounded up to ``INTERVAL_STEP``, within [``REPORT_INTERVAL``, ``MAX_REPORT_INTERVAL``].
    1 s up to 2,000 nodes at the default budget; 2.5 s at 5,000."""
    wanted = nodes / (budget * max(1, coordinators))
    stepped = math.ceil(wanted / INTERVAL_STEP) * INTERVAL_STEP
    return min(MAX_REPORT_INTERVAL, max(REPORT_INTERVAL, stepped))


MEMBERS_CHANGED_INTERVAL: Final = 0.25
"""Seconds until the next report of a node whose member list a reply has just changed
(:func:`members_changed_interval`), against ``REPORT_INTERVAL``'s 1 s: while nodes are
joining, each node's list lags the fleet by up to an interval, and its peer filter
refuses the newer nodes until then. Existing seeders at a quarter of the rates: six of
the eight new nodes' lists were complete only 1.9-2.1 s into the run with a 1 s interval
(each node refused the nodes that reported after it, until its own next report), the
new nodes' connections to each other waited on it, and so did each node's share of the
seeders' pieces (:mod:`swarm.agent.seedershare` deals them among the nodes it sees).
With this and the daemon dialling newly admitted members (``Membership.take``),
alternating runs against both undone (``bench/fleet.py --systems swarm``, session 46):
swarm-bound 7.61 s mean against 7.81 (four pairs, all faster; first MB 0.83-1.06 s
against 0.94-1.14), existing seeders 8.02 against 8.24 (three, two faster); mixed 10.58
against 10.42 (three, one faster) and existing seeders at a quarter 27.63 against 27.50
(four, two faster): within their noise."""


def members_changed_interval(nodes: int, budget: float, coordinators: int = 1) -> float:
    """The report interval for a node whose member list just changed: at least
    ``MEMBERS_CHANGED_INTERVAL``, and long enough that the whole fleet reporting so would
    take at most half the coordinators' budget (``2 x nodes / (budget x coordinators)``,
    unrounded: a node hears it for one report). Half, because in a large fleet that
    scales all the time every reply may carry a change: 1,000 nodes at the default
    budget keep :func:`report_interval`'s 1 s."""
    return max(MEMBERS_CHANGED_INTERVAL, 2 * nodes / (budget * max(1, coordinators)))


def stretched_interval(base: float, factor: float) -> float:
    """``base`` stretched by the governor's ``factor``, rounded up to ``INTERVAL_STEP``,
    at most ``MAX_REPORT_INTERVAL`` (never below ``base``)."""
    stretched = math.ceil(base * factor / INTERVAL_STEP) * INTERVAL_STEP
    return min(MAX_REPORT_INTERVAL, max(base, stretched))


@dataclass
class Load:
    """The load governor's state: the interval stretch and the lag it follows."""

    factor: float = 1.0
    lag: float = 0.0
    decided_at: float = 0.0


async def watch_lag(load: Load) -> None:
    """Probe the event loop's lag every ``LAG_PERIOD`` s (an EMA of how late a timer
    fires) and let :func:`govern` stretch the interval once a second."""
    loop = asyncio.get_running_loop()
    while True:
        expected = loop.time() + LAG_PERIOD
        await asyncio.sleep(LAG_PERIOD)
        now = loop.time()
        load.lag += 0.3 * (max(0.0, now - expected) - load.lag)
        if now - load.decided_at >= 1.0:
            factor = govern(load.factor, load.lag)
            if factor != load.factor:
                log.info("event loop lags %.0f ms: report interval x%.2f", load.lag * 1e3, factor)
            load.factor, load.decided_at = factor, now
