"""Record of completed fetches, in SQLite (stdlib ``sqlite3``).

Unlike the fleet's soft state this survives a restart: it answers "how long did the
last rollout take, and where did the bytes come from". One row per (artifact, node):
a node that reports the same completion again, or after a coordinator restart, is not
counted twice. PostgreSQL would replace this module alone (ARCHITECTURE, "Scale").

Writes are one small transaction per completion and happen on the event loop; a
completion is rare (once per node per artifact), so that is cheaper than a thread hop.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Final

from swarm.coordinator.reports import Completion
from swarm.errors import SwarmError

SCHEMA_VERSION: Final = 1

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS completions (
    info_hash       TEXT NOT NULL,
    name            TEXT NOT NULL,
    node            TEXT NOT NULL,
    completed_at    REAL NOT NULL,   -- seconds since the epoch
    seconds         REAL,            -- fetch duration; NULL when unknown (see Completion)
    bytes_by_source TEXT NOT NULL,   -- JSON object: source name -> bytes
    PRIMARY KEY (info_hash, node)
);
"""


class History:
    """Completed fetches. ``path=None`` keeps them in memory (lost on exit).

    Raises:
        SwarmError: the database cannot be opened or is from a newer swarm.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        target = ":memory:" if path is None else str(path)
        try:
            if path is not None:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            # check_same_thread=False: the app opens the database where it is built (so a
            # bad --db fails before binding) and uses it from its event loop thread, one
            # call at a time; sqlite3's own serialized mode covers the hand-over.
            self._db = sqlite3.connect(target, isolation_level=None, check_same_thread=False)
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise SwarmError(
                    f"history database {target} has schema version {version}, newer than "
                    f"this coordinator's {SCHEMA_VERSION}: upgrade swarm or pass another --db"
                )
            self._db.executescript(_SCHEMA)
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except (sqlite3.Error, OSError) as error:
            raise SwarmError(
                f"cannot open history database {target} ({error}): "
                "check that --db names a writable SQLite file"
            ) from error

    def record(self, completion: Completion) -> bool:
        """Store ``completion`` unless this node's completion of it is already recorded.
        Returns whether a row was added."""
        cursor = self._db.execute(
            "INSERT OR IGNORE INTO completions VALUES (?, ?, ?, ?, ?, ?)",
            (
                completion.info_hash,
                completion.name,
                completion.node,
                completion.completed_at,
                completion.seconds,
                json.dumps(dict(completion.bytes_by_source), sort_keys=True),
            ),
        )
        return cursor.rowcount == 1

    def counts(self) -> dict[str, dict[str, object]]:
        """Per artifact (hex info_hash): ``name``; ``completed`` (nodes); ``mean_seconds``,
        ``median_seconds``, ``p99_seconds`` and ``max_seconds`` over the completions whose
        duration is known (``None`` if none); ``last_completed_at`` (epoch seconds);
        ``bytes_by_source`` summed over the completions."""
        rows = self._db.execute(
            "SELECT info_hash, name, seconds, completed_at, bytes_by_source FROM completions"
        )
        grouped: dict[str, list[tuple[float | None, float, str]]] = {}
        names: dict[str, str] = {}
        for info_hash, name, seconds, completed_at, sources in rows:
            grouped.setdefault(info_hash, []).append((seconds, completed_at, sources))
            names[info_hash] = name
        result: dict[str, dict[str, object]] = {}
        for info_hash, items in grouped.items():
            durations = sorted(s for s, _, _ in items if s is not None)
            totals: dict[str, int] = {}
            for _, _, sources in items:
                for source, count in json.loads(sources).items():
                    totals[source] = totals.get(source, 0) + int(count)
            result[info_hash] = {
                "name": names[info_hash],
                "completed": len(items),
                "mean_seconds": _round(sum(durations) / len(durations)) if durations else None,
                "median_seconds": _round(percentile(durations, 50)),
                "p99_seconds": _round(percentile(durations, 99)),
                "max_seconds": _round(durations[-1]) if durations else None,
                "last_completed_at": max(at for _, at, _ in items),
                "bytes_by_source": totals,
            }
        return result

    def completions(self, info_hash: str) -> list[Completion]:
        """Every recorded completion of one artifact, oldest first."""
        rows = self._db.execute(
            "SELECT info_hash, name, node, completed_at, seconds, bytes_by_source"
            " FROM completions WHERE info_hash = ? ORDER BY completed_at, node",
            (info_hash,),
        )
        return [
            Completion(ih, name, node, at, seconds, json.loads(sources))
            for ih, name, node, at, seconds, sources in rows
        ]

    def close(self) -> None:
        self._db.close()


def percentile(values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile of sorted ``values`` (None for none): p99 of 10 values is
    the largest, as an operator reading "p99" of a small fleet would expect."""
    if not values:
        return None
    rank = max(1, -(-len(values) * pct // 100))
    return values[int(rank) - 1]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
