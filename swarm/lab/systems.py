"""The systems the fleet bench compares, one class each.

A system says what a node runs to get the artifact (:meth:`System.command`), how that
command says it is done, and whether it keeps seeding afterwards. Everything else (hosts,
origin, timing, verification, CPU accounting) is :class:`swarm.lab.fleet.Fleet`'s and the
same for every system. Adding a system is one subclass and one entry in :data:`SYSTEMS`.

``swarm@REV`` (and ``swarm-solo@REV``) is swarm as commit ``REV`` has it
(:mod:`swarm.lab.revisions`), to run beside the working tree's in one invocation.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from swarm.lab import revisions
from swarm.lab.s3 import BIN, SWARM

if TYPE_CHECKING:
    from swarm.lab.fleet import Fleet
    from swarm.lab.netlab import Host

BT_PORT = 6881
SEEDER_TIMEOUT = 600.0
"""Seconds a seeder may take to be ready; also how long baselines seed past the run."""

ARIA2_HOOK = """#!/bin/sh
# aria2c --on-bt-download-complete: GID, number of files, path. Runs before seeding; its
# stdout is aria2c's, which the fleet reads.
echo '{"event": "done", "path": "'"$3"'"}'
"""


class System:
    """One way to put the artifact on a node."""

    name: str
    """How the bench names it (a class's default; ``swarm@REV`` names its instance)."""
    done_on_exit: ClassVar[bool] = False
    """Done = the command exits 0 (it prints no JSON ``{"event": "done"}`` line)."""
    seeds_after: ClassVar[bool] = True
    """Its nodes keep uploading once done; False: pre-existing seeders cannot help it
    (they are not started for it)."""
    seeder_fetches: ClassVar[bool] = False
    """A pre-existing seeder gets its copy by fetching (alone, from S3) rather than
    finding the file in place."""

    def unavailable(self) -> str | None:
        """Why this system cannot run here (a missing binary), or None."""
        return None

    def env(self) -> dict[str, str]:
        """Environment its nodes, seeders and coordinator get on top of the fleet's."""
        return {}

    def command(self, fleet: Fleet, host: Host, dest_dir: Path, seed: bool) -> list[str]:
        """What a node runs to put the artifact into ``dest_dir`` (``seed``: a seeder,
        holding the file, or fetching it alone before the run)."""
        raise NotImplementedError


class Swarm(System):
    """``swarm fetch NAME DEST --listen IP --coordinator URL --json``; the daemon it starts
    keeps seeding."""

    name = "swarm"
    seeder_fetches = True  # a swarm seeder is a node that fetched before

    def __init__(self, rev: str | None = None) -> None:
        """``rev``: run that commit's swarm package (:func:`swarm.lab.revisions.checkout`;
        ValueError if it names no commit), named ``<name>@<rev>``."""
        self.code: Path | None = None
        if rev is not None:
            self.code = revisions.checkout(rev)
            self.name = f"{type(self).name}@{rev}"

    def env(self) -> dict[str, str]:
        return {} if self.code is None else {"PYTHONPATH": revisions.python_path(self.code)}

    def command(self, fleet: Fleet, host: Host, dest_dir: Path, seed: bool) -> list[str]:
        return [*SWARM, "fetch", fleet.artifact_name, str(dest_dir / fleet.artifact_name),
                "--listen", host.ip, "--coordinator", fleet.coordinator.url, "--json"]  # fmt: skip


class SwarmSolo(Swarm):
    """``swarm fetch`` with no coordinator (down, or never configured): each node decides
    alone (not in the default set; ``--systems swarm-solo``)."""

    name = "swarm-solo"

    def command(self, fleet: Fleet, host: Host, dest_dir: Path, seed: bool) -> list[str]:
        return [*SWARM, "fetch", fleet.artifact_name, str(dest_dir / fleet.artifact_name),
                "--listen", host.ip, "--json"]  # fmt: skip


class Libtorrent(System):
    """Stock libtorrent 2.1 (:mod:`swarm.lab.baseline_libtorrent`) with the published
    .torrent (S3 object as web seed) and the coordinator as tracker; seeds after."""

    name = "libtorrent"

    def command(self, fleet: Fleet, host: Host, dest_dir: Path, seed: bool) -> list[str]:
        return [sys.executable, "-m", "swarm.lab.baseline_libtorrent", str(fleet.torrent),
                str(dest_dir), "--listen", host.ip, "--port", str(BT_PORT), "--tracker",
                fleet.coordinator.tracker_url, "--sha256", fleet.sha256, "--seed",
                "--timeout", str(fleet.config.timeout() + SEEDER_TIMEOUT)]  # fmt: skip


class Aria2c(System):
    """aria2c with the same torrent and tracker, seeding until every node is done."""

    name = "aria2c"

    def unavailable(self) -> str | None:
        return None if shutil.which("aria2c") else "aria2c is not installed (apt-get install aria2)"

    def command(self, fleet: Fleet, host: Host, dest_dir: Path, seed: bool) -> list[str]:
        hook = fleet.work / "aria2-hook.sh"
        if not hook.exists():
            hook.write_text(ARIA2_HOOK)
            hook.chmod(0o755)
        return [shutil.which("aria2c") or "aria2c", "--quiet=true",
                "--enable-dht=false", "--enable-dht6=false", "--bt-enable-lpd=false",
                "--enable-peer-exchange=false", f"--bt-tracker={fleet.coordinator.tracker_url}",
                f"--listen-port={BT_PORT}", f"--interface={host.ip}",
                "--seed-time=1440", "--seed-ratio=0.0", f"--dir={dest_dir}",
                "--file-allocation=none", "--check-integrity=true",
                "--bt-hash-check-seed=true", f"--on-bt-download-complete={hook}",
                "--allow-overwrite=true", "--auto-save-interval=0",
                "--bt-save-metadata=false", "--rpc-save-upload-metadata=false",
                str(fleet.torrent)]  # fmt: skip


class S5cmd(System):
    """``s5cmd cp s3://BUCKET/KEY DEST`` on every node: S3 only, what a fleet without
    swarm does."""

    name = "s5cmd"
    done_on_exit = True
    seeds_after = False

    def command(self, fleet: Fleet, host: Host, dest_dir: Path, seed: bool) -> list[str]:
        s5cmd = BIN / "s5cmd"
        exe = str(s5cmd) if s5cmd.exists() else (shutil.which("s5cmd") or "s5cmd")
        return [exe, "--endpoint-url", fleet.s3.url, "cp", fleet.object_uri,
                str(dest_dir / fleet.artifact_name)]  # fmt: skip


SYSTEMS: dict[str, type[System]] = {
    s.name: s for s in (Swarm, Libtorrent, Aria2c, S5cmd, SwarmSolo)
}
"""Every system by name."""

DEFAULT_SYSTEMS: tuple[str, ...] = ("swarm", "libtorrent", "aria2c", "s5cmd")
"""What the bench runs unless told (swarm against every baseline)."""


def base_name(name: str) -> str:
    """The system a name runs, whatever commit it names (``swarm@REV``: ``swarm``)."""
    return name.partition("@")[0]


def system(name: str) -> System:
    """The system called ``name`` (``swarm@REV``: swarm as commit ``REV`` has it);
    ValueError listing the known ones otherwise."""
    base, at, rev = name.partition("@")
    kind = SYSTEMS.get(base)
    if kind is None:
        raise ValueError(f"unknown system {name!r}; choose from {', '.join(SYSTEMS)}")
    if not at:
        return kind()
    if not issubclass(kind, Swarm) or not rev:
        raise ValueError(f"{name!r}: only swarm@REV and swarm-solo@REV name a commit")
    return kind(rev)
