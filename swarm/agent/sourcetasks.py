"""A fetch's sources beside libtorrent's peers, each run as a supervised task
(:class:`~swarm.agent.supervisor.SourceTask`: retried with backoff, its state on the
progress line): the S3 reader (:mod:`.origin`), the automatic UDP source
(:mod:`.udpauto`) and a UDP source the fetch names (``udp://HOST:PORT``,
:mod:`.udpsource`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from swarm.agent.origin import read_origin
from swarm.agent.registry import Artifact
from swarm.agent.supervisor import SourceTask
from swarm.agent.udpauto import auto_udp
from swarm.agent.udpsource import read_udp
from swarm.messages import parse_udp_source

if TYPE_CHECKING:
    from swarm.agent.daemon import Daemon

AUTO_UDP: Final = "udp-auto"
"""The task name of the automatic UDP source (:mod:`.udpauto`), beside ``s3`` and
``udp://HOST:PORT``."""


def start_source(daemon: Daemon, artifact: Artifact, name: str) -> None:
    """Start the artifact's source ``name`` (``s3``, :data:`AUTO_UDP` or
    ``udp://HOST:PORT``) as a task of its own, unless one runs already."""
    task = artifact.tasks.get(name)
    if task is not None and task.alive:
        return
    body: Callable[[], None]
    if name == "s3":

        def note(reason: str | None) -> None:
            task = artifact.tasks.get("s3")
            if task is not None:
                task.detail = reason

        def body() -> None:
            read_origin(
                daemon.session,
                artifact,
                daemon.node_id,
                bool(daemon.trackers),
                daemon.wake_reporter,
                note,
                expect_peers=bool(daemon.trackers or daemon.extra_peers or daemon.asg_groups),
            )

        def progress() -> int:
            return artifact.sink.bytes_by_source.get("s3", 0)
    elif name == AUTO_UDP:
        assert daemon.udp_secret is not None
        udp_port, key = daemon.udp_port, daemon.udp_secret

        def body() -> None:
            auto_udp(daemon.session, artifact, daemon.node_id, daemon.listen_ip, udp_port, key)

        def progress() -> int:
            return artifact.sink.bytes_by_source.get("udp", 0)
    else:
        host, port = parse_udp_source(name)
        secret = daemon.udp_secret
        assert secret is not None

        def body() -> None:
            read_udp(daemon.session, artifact, host, port, secret)

        def progress() -> int:
            return artifact.sink.bytes_by_source.get("udp", 0)

    artifact.tasks[name] = SourceTask(name, body, artifact.cancel, progress).start()
