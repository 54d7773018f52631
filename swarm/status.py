"""`swarm status`: the fleet at a glance, from the coordinator's `/v1/fleet`.

Rendering is separate from fetching so tests can feed a fleet document straight in.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from rich.console import Group
from rich.table import Table

from swarm.errors import AccessDeniedError, SwarmError

FETCH_TIMEOUT = 5.0
ACTIVE_RATE = 1024.0
"""A source counts as "in use" by a node above this many bytes/s."""


def fetch_fleet(coordinator: str, token: str | None = None) -> dict[str, Any]:
    url = coordinator.rstrip("/") + "/v1/fleet"
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        if error.code == 403:
            raise AccessDeniedError(
                f"swarm: the coordinator at {coordinator} refused the fleet view (403): set "
                "SWARM_SECRET to the fleet's secret"
            ) from error
        raise SwarmError(
            f"swarm: the coordinator at {coordinator} answered {error.code}"
        ) from error
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise SwarmError(
            f"swarm: cannot reach the coordinator at {coordinator} ({reason}): check "
            "--coordinator / SWARM_COORDINATOR, and that `swarm coordinator` runs there"
        ) from error


def summarize(fleet: dict[str, Any]) -> dict[str, Any]:
    """The status view: per artifact and per node, with derived figures."""
    artifacts = []
    for art in fleet.get("artifacts", []):
        size = art.get("size") or 0
        by = art.get("bytes_by_source") or {}
        history = art.get("history") or {}
        nodes = art.get("nodes", 0)
        complete = art.get("nodes_complete", 0)
        s3 = int(by.get("s3", 0))
        artifacts.append(
            {
                "name": art.get("name") or art["info_hash"][:12],
                "info_hash": art["info_hash"],
                "size": size,
                "nodes_complete": complete,
                "nodes_in_progress": nodes - complete,
                "bytes_by_source": by,
                "s3_bytes_saved": max(0, nodes * size - s3) if size else None,
                "completed_total": history.get("completed", 0),
                "median_seconds": history.get("median_seconds"),
                "p99_seconds": history.get("p99_seconds"),
            }
        )
    live = {a["info_hash"] for a in artifacts}
    for info_hash, history in (fleet.get("history") or {}).items():
        if info_hash in live:
            continue
        # Known only from history (e.g. just after a coordinator restart): completions.
        artifacts.append(
            {
                "name": history.get("name") or info_hash[:12],
                "info_hash": info_hash,
                "size": None,
                "nodes_complete": 0,
                "nodes_in_progress": 0,
                "bytes_by_source": history.get("bytes_by_source") or {},
                "s3_bytes_saved": None,
                "completed_total": history.get("completed", 0),
                "median_seconds": history.get("median_seconds"),
                "p99_seconds": history.get("p99_seconds"),
            }
        )
    nodes = []
    for node in fleet.get("nodes", []):
        for item in node.get("artifacts", []):
            rates = item.get("rates") or {}
            down = float(item.get("down_rate") or 0.0) + float(rates.get("s3", 0.0))
            left = item["size"] - item["have_bytes"]
            nodes.append(
                {
                    "node": node["node"],
                    "addr": node.get("addr"),
                    "artifact": item.get("name"),
                    "state": "complete" if item.get("complete") else "fetching",
                    "progress": item.get("progress"),
                    "down_rate": round(down, 1),
                    "up_rate": item.get("up_rate", 0.0),
                    "sources": sorted(s for s, r in rates.items() if r > ACTIVE_RATE),
                    "mode": item.get("mode"),
                    "eta_seconds": None
                    if item.get("complete") or down <= 0
                    else round(left / down, 1),
                }
            )
    return {"artifacts": artifacts, "nodes": nodes}


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:,.1f} MiB"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def render(view: dict[str, Any]) -> Group:
    arts = Table(title="artifacts", expand=False)
    for column in (
        "artifact",
        "complete",
        "fetching",
        "from peers",
        "from S3",
        "from UDP",
        "S3 saved",
        "done (total)",
        "median",
        "p99",
    ):
        arts.add_column(column, justify="left" if column == "artifact" else "right")
    for a in view["artifacts"]:
        by = a["bytes_by_source"]
        arts.add_row(
            a["name"],
            str(a["nodes_complete"]),
            str(a["nodes_in_progress"]),
            _mib(by.get("peers", 0)),
            _mib(by.get("s3", 0)),
            _mib(by.get("udp", 0)),
            _mib(a["s3_bytes_saved"]),
            str(a["completed_total"]),
            _secs(a["median_seconds"]),
            _secs(a["p99_seconds"]),
        )
    nodes = Table(title="nodes", expand=False)
    for column in ("node", "addr", "artifact", "state", "progress", "down", "up", "sources", "ETA"):
        nodes.add_column(
            column, justify="right" if column in {"progress", "down", "up", "ETA"} else "left"
        )
    for n in view["nodes"]:
        share = n["progress"] or 0.0
        bar = "█" * int(share * 10) + "·" * (10 - int(share * 10))
        colour = "green" if n["state"] == "complete" else "yellow"
        nodes.add_row(
            n["node"],
            n["addr"] or "-",
            n["artifact"] or "-",
            f"[{colour}]{n['state']}[/]",
            f"{bar} {share:4.0%}",
            f"{_mib(n['down_rate'])}/s",
            f"{_mib(n['up_rate'])}/s",
            ",".join(n["sources"]) or "-",
            _secs(n["eta_seconds"]),
        )
    return Group(arts, nodes)
