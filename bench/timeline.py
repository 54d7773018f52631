"""One kept fleet run, second by second: each host's link rates from the bridge's counters,
beside what each swarm daemon logged when.

``bench/fleet.py --keep`` leaves, per system, ``links.json`` (the bridge's counters every
0.1 s, :func:`swarm.lab.linkuse.save_samples`) and the nodes' logs. Where a system loses
to T* (a start, a handover, an idle downlink, a tail) is a question of when; every
session before this tool wrote a throwaway sampler to answer it.

    .venv/bin/python bench/timeline.py RUN/SYSTEM [--step 0.1] [--from 0] [--until 3]
        [--up] [--marks PATTERN]

RUN is the directory ``--keep`` printed, SYSTEM a system's folder in it (``swarm``).
Rows: seconds from the launch (each row's window ends there), then each node's received
MB/s (``--up``: sent), then the origin's and the seeders' sent MB/s. Below the table, each
node's daemon log lines that match ``--marks`` (a regular expression; by default its
start, its plans, its S3 reads and its verified file), timed from the launch.
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.lab.linkuse import load_samples, rates

MARKS = r"listening on|plan is now|S3 reads:|pieces from peers|verified at"
LOG_LINE = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ [\w.]+: (.*)")


def log_marks(log: Path, wall_at_start: float, pattern: str) -> list[tuple[float, str]]:
    """The log's lines that match ``pattern``, timed from the run's launch."""
    marks = []
    wanted = re.compile(pattern)
    for line in log.read_text(errors="replace").splitlines():
        match = LOG_LINE.match(line)
        if match is None or not wanted.search(match.group(2)):
            continue
        stamp = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
        at = stamp.replace(tzinfo=datetime.UTC).timestamp() - wall_at_start
        marks.append((at, match.group(2)))
    return marks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a kept run's system folder (RUN/swarm)")
    parser.add_argument("--step", type=float, default=0.1, help="seconds per row (0.1)")
    parser.add_argument("--from", dest="start", type=float, default=0.0, help="first second")
    parser.add_argument("--until", type=float, default=3.0, help="last second (3)")
    parser.add_argument("--up", action="store_true", help="the nodes' sent rates, not received")
    parser.add_argument("--marks", default=MARKS, help="log lines to list (a regex)")
    args = parser.parse_args()
    links = args.run / "links.json"
    if not links.is_file():
        parser.error(f"{links} not found: give a system's folder of a run kept by --keep")
    if args.step <= 0 or args.until <= args.start:
        parser.error("--step must be positive and --until after --from")
    wall, ports, samples = load_samples(links)
    senders = [name for name in ports if name == "origin" or name.startswith("seed")]
    nodes = sorted(name for name in ports if name not in senders)
    print(
        "s      "
        + " ".join(f"{n:>7}" for n in nodes)
        + "  | "
        + " ".join(f"{s:>7}" for s in senders)
    )
    side = 1 if args.up else 0
    for at, row in rates(samples, ports, args.step):
        if not args.start < at <= args.until + 1e-9:
            continue
        cells = [f"{row[n][side] / 1e6:7.1f}" if n in row else "      -" for n in nodes]
        sent = [f"{row[s][1] / 1e6:7.1f}" if s in row else "      -" for s in senders]
        print(f"{at:5.2f}  " + " ".join(cells) + "  | " + " ".join(sent))
    print(f"MB/s {'sent' if args.up else 'received'} per node; origin and seeders: sent")
    for node in nodes:
        log = args.run / node / "home" / "daemon.log"
        if not log.is_file():
            continue
        for at, text in log_marks(log, wall, args.marks):
            if args.start <= at <= args.until:
                print(f"{node} {at:6.2f}  {text[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
