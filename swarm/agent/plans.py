"""The coordinator's plans taken into the artifacts held (:func:`take_plans`): how long
a plan stays fresh, the seeders it names (the fetch's tuning among them and its share of
what only they hold, :mod:`.seedershare`) and the peers it has this node dial.

Separate from :mod:`.daemon` because it is what the daemon does with the coordinator's
decisions, one reply at a time from the reporter (:mod:`.reporter`); the sources read
the plan where they need it (:mod:`.origin`).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from swarm.agent import seedershare
from swarm.agent.origin import PLAN_TTL
from swarm.messages import OriginPlan
from swarm.sources.ltsettings import AMONG_SEEDERS_SETTINGS

if TYPE_CHECKING:
    from swarm.agent.daemon import Daemon

log = logging.getLogger("swarm.agent.daemon")  # the daemon's log, as before the split


def take_plans(daemon: Daemon, plans: dict[str, Any], interval: float = 1.0) -> None:
    """Take the coordinator's plans; one stays fresh for three report intervals (the
    coordinator stretches the interval as the fleet grows)."""
    now = time.monotonic()
    for info_hash, body in plans.items():
        artifact = daemon.artifacts.get(info_hash)
        plan = OriginPlan.from_json(body)
        if artifact is not None and plan is not None:
            if artifact.plan is None or artifact.plan.mode != plan.mode:
                log.info("%s: the coordinator's plan is now %s",
                         artifact.manifest.name, plan.mode)  # fmt: skip
            artifact.plan, artifact.plan_at = plan, now
            if plan.holders:
                started_beside = not artifact.seeders and artifact.fetching
                artifact.seeders = plan.holders
                if started_beside:
                    artifact.tune_while_fetching(daemon.session.tuned(AMONG_SEEDERS_SETTINGS))
                    seedershare.start(
                        daemon.session, artifact, daemon.listen_ip, daemon.piece_access()
                    )
                artifact.seeders_named.set()
            if plan.peers:
                daemon.session.dial(info_hash, plan.peers)
            artifact.plan_ttl = max(PLAN_TTL, 3 * interval)
            artifact.plan_updated.set()
