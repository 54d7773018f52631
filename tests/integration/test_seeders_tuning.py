"""A fetch that starts beside nodes holding the whole artifact asks its peers for less
at a time (swarm/agent/daemon.py, ``Daemon.take_plans``; ``AMONG_SEEDERS_SETTINGS``) until
it ends, and a fetch among other new nodes keeps libtorrent's own settings."""

from __future__ import annotations

from pathlib import Path

import libtorrent as lt

from swarm.agent.daemon import Daemon
from swarm.config import Settings
from swarm.manifest import Manifest
from swarm.sources.ltsettings import AMONG_SEEDERS_SETTINGS
from tests.servers import free_port

MiB = 1 << 20
OWN = lt.default_settings()["request_queue_time"]
BESIDE_SEEDERS = AMONG_SEEDERS_SETTINGS["request_queue_time"]


def _daemon(tmp_path: Path) -> tuple[Daemon, Manifest]:
    source = tmp_path / "a.bin"
    source.write_bytes(bytes(range(256)) * (4 * MiB // 256))
    manifest = Manifest.from_file(
        source, name="a.bin", piece_size=MiB, bucket="b", key="k", web_seed=None
    )
    return Daemon(Settings(home=tmp_path / "home"), "127.0.0.1", free_port()), manifest


def _queue_time(daemon: Daemon) -> int:
    return int(daemon.session.session.get_settings()["request_queue_time"])


def test_a_fetch_beside_seeders_asks_for_less_until_it_ends(tmp_path: Path) -> None:
    daemon, manifest = _daemon(tmp_path)
    try:
        artifact = daemon._add(manifest, tmp_path / "data" / "a.bin", None, {"peers"})
        assert BESIDE_SEEDERS < OWN
        daemon.take_plans({manifest.info_hash: {"stripe": [0]}})  # other new nodes only
        assert _queue_time(daemon) == OWN
        daemon.take_plans({manifest.info_hash: {"stripe": [], "holders": ["127.0.0.9"]}})
        assert _queue_time(daemon) == BESIDE_SEEDERS
        daemon.take_plans({manifest.info_hash: {"stripe": [], "holders": ["127.0.0.9"]}})
        # every report brings a plan: a later one naming holders adds no tuning (the
        # session's list of them would grow by one a second)
        assert len(daemon.session._tunings) == 1
        daemon._drop(artifact, "the test is over")
        assert _queue_time(daemon) == OWN
    finally:
        daemon.close()


def test_a_plan_naming_holders_after_the_fetch_ended_tunes_nothing(tmp_path: Path) -> None:
    daemon, manifest = _daemon(tmp_path)
    try:
        artifact = daemon._add(manifest, tmp_path / "data" / "a.bin", None, {"peers"})
        artifact.failure = ("swarm: gave up", 1)  # as Completion ends a failed fetch
        artifact.end_tunings()
        daemon.take_plans({manifest.info_hash: {"stripe": [], "holders": ["127.0.0.9"]}})
        assert _queue_time(daemon) == OWN
    finally:
        daemon.close()
