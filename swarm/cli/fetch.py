"""`swarm fetch`: through the node's daemon (which keeps seeding), or in this process
from S3 alone (``--no-daemon``)."""

from __future__ import annotations

import math
import re
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from swarm import config, pieces
from swarm.cli.common import EXIT_HELP, reports_errors


@click.command(epilog=EXIT_HELP)
@click.argument("source")
@click.argument("dest", type=click.Path(path_type=Path))
@click.option("--coordinator", help="Coordinator URL [SWARM_COORDINATOR].")
@click.option("--listen", help="IP address the node's sockets bind to.")
@click.option(
    "--source",
    "sources",
    multiple=True,
    help="Restrict sources: s3, peers, udp://HOST:PORT (repeatable; default all).",
)
@click.option(
    "--peers-from-asg",
    metavar="GROUP",
    help="Also dial the running instances of this Auto Scaling group as peers.",
)
@click.option("--no-daemon", is_flag=True, help="Fetch in this process from S3 only; no seeding.")
@click.option(
    "--copy",
    is_flag=True,
    help="Make DEST a private writable copy (reflink where possible); the daemon seeds "
    "its own copy. Default: DEST is the daemon's read-only file (one copy on disk).",
)
@click.option(
    "--deadline",
    type=click.FloatRange(min=0, min_open=True),
    callback=lambda _c, _p, v: _finite(v, "--deadline"),
    help="Give up (exit 7) after this many seconds; a rerun resumes.",
)
@click.option("--catalog", help="Catalog prefix for names [SWARM_CATALOG].")
@click.option("--endpoint-url", help="S3 endpoint [AWS_ENDPOINT_URL].")
@click.option(
    "--concurrency",
    type=click.IntRange(min=1, max=256),
    help="Parallel S3 ranged GETs (--no-daemon only)  [default: 8]",
)
@click.option(
    "--range-size",
    callback=lambda _c, _p, v: _positive_size(v, "--range-size"),
    help="Bytes per S3 ranged GET, rounded down to whole pieces (--no-daemon only)  [default: 16M]",
)
@click.option("--json", "as_json", is_flag=True, help="JSON line events on stdout.")
@reports_errors
def fetch(
    source: str,
    dest: Path,
    coordinator: str | None,
    listen: str | None,
    sources: tuple[str, ...],
    peers_from_asg: str | None,
    no_daemon: bool,
    copy: bool,
    deadline: float | None,
    catalog: str | None,
    endpoint_url: str | None,
    concurrency: int | None,
    range_size: int | None,
    as_json: bool,
) -> None:
    """Fetch SOURCE (s3://BUCKET/KEY or a catalog NAME) to DEST, verified, atomically.

    Unless --no-daemon, the node's daemon (started on demand) fetches from peers and S3
    at once and keeps seeding after DEST is placed.
    """
    from swarm.progress import JsonProgress, RichProgress, emit

    settings = config.load(catalog=catalog, endpoint_url=endpoint_url, coordinator=coordinator)
    config.check_listen_ip(listen)
    config.coordinator_urls(settings.coordinator)
    use_json = as_json or not sys.stderr.isatty()
    for src in sources:
        if src not in ("s3", "peers") and not re.fullmatch(r"udp://[^:/\s]+:\d{1,5}", src):
            raise click.BadParameter(
                f"{src!r}: use s3, peers or udp://HOST:PORT", param_hint="--source"
            )
    if no_daemon:
        if sources and set(sources) != {"s3"}:
            raise click.BadParameter("--no-daemon fetches from S3 only", param_hint="--source")
        for flag, value in (("--listen", listen), ("--peers-from-asg", peers_from_asg)):
            if value:
                raise click.BadParameter("--no-daemon runs no daemon", param_hint=flag)
        if copy:
            raise click.BadParameter(
                "--no-daemon always writes a private copy", param_hint="--copy"
            )
        result = _fetch_in_process(
            source,
            dest,
            settings,
            deadline,
            concurrency or 8,
            range_size or 16 << 20,
            JsonProgress() if use_json else RichProgress(),
        )
    else:
        daemon_sized: tuple[tuple[str, int | None], ...] = (
            ("--concurrency", concurrency),
            ("--range-size", range_size),
        )
        for flag, number in daemon_sized:
            if number is not None:
                raise click.BadParameter(
                    "applies to --no-daemon only (the daemon sizes its S3 reads itself)",
                    param_hint=flag,
                )
        result = _fetch_with_daemon(
            source,
            dest,
            settings,
            listen,
            sources,
            deadline,
            use_json,
            peers_from_asg,
            copy=copy,
            coordinator_flag=coordinator,
        )
    if use_json:
        emit("done", **result)
    else:
        rate = result["size"] / max(result["seconds"], 1e-9) / 2**20
        how = "already present" if result.get("already_present") else f"{rate:.0f} MiB/s"
        by = ", ".join(
            f"{k} {v / 2**20:.0f} MiB" for k, v in result["bytes_by_source"].items() if v
        )
        click.echo(
            f"{result['dest']}: {result['size']} bytes verified in {result['seconds']:.1f}s "
            f"({how}{'; ' + by if by else ''})",
            err=True,
        )


def _fetch_in_process(
    source: str,
    dest: Path,
    settings: config.Settings,
    deadline: float | None,
    concurrency: int,
    range_size: int,
    progress: Any,
) -> dict[str, Any]:
    from swarm.agent.fetch import fetch_in_process
    from swarm.progress import RichProgress
    from swarm.sources.s3 import S3SourceConfig

    try:
        result = fetch_in_process(
            source,
            dest,
            endpoint_url=settings.endpoint_url,
            catalog_url=settings.catalog,
            secret=settings.secret,
            deadline=deadline,
            s3_config=S3SourceConfig(concurrency=concurrency, range_size=range_size),
            progress=progress,
        )
    finally:
        if isinstance(progress, RichProgress):
            progress.stop()
    return asdict(result)


def _fetch_with_daemon(
    source: str,
    dest: Path,
    settings: config.Settings,
    listen: str | None,
    sources: tuple[str, ...],
    deadline: float | None,
    use_json: bool,
    peers_from_asg: str | None = None,
    *,
    copy: bool = False,
    coordinator_flag: str | None = None,
) -> dict[str, Any]:
    from swarm.agent.client import ensure_daemon, fetch_via_daemon
    from swarm.agent.earlyread import EarlyRead
    from swarm.agent.preread import ManifestPreread
    from swarm.agent.store import check_dest
    from swarm.fleetauth import fleet_token
    from swarm.messages import SOURCES, FetchRequest
    from swarm.progress import DaemonProgress

    dest = dest.absolute()
    check_dest(dest, directory_ok=True)  # the daemon checks again once it knows the artifact
    token = fleet_token(settings.secret) if settings.secret else None
    preread: list[ManifestPreread] = []
    early: list[EarlyRead] = []
    sources = tuple(dict.fromkeys(sources)) or SOURCES

    def read_ahead() -> None:  # while the daemon this command starts comes up
        manifest = ManifestPreread(source, settings.catalog, settings.endpoint_url, settings.secret)
        preread.append(manifest)
        if "s3" in sources:
            early.append(EarlyRead(manifest.result, settings.endpoint_url, settings.secret))

    client = ensure_daemon(
        settings.home, listen, settings.coordinator, peers_from_asg, token, read_ahead
    )
    reader = early[0] if early else None
    named = reader.claim() if reader is not None else []  # sets s3_read: before the request
    request = FetchRequest(
        source=source,
        dest=str(dest),
        copy=copy,
        catalog=settings.catalog,
        endpoint_url=settings.endpoint_url,
        sources=sources,
        listen=listen,
        coordinator=coordinator_flag,
        peers_from_asg=peers_from_asg,
        manifest=preread[0].result() if preread else None,
        early=tuple(named),
        s3_rtt=reader.s3_rtt if reader is not None else None,
        s3_read=reader.s3_read if reader is not None else None,
    )
    progress = DaemonProgress(use_json)
    try:
        status = fetch_via_daemon(
            client,
            request,
            dest,
            deadline=deadline,
            on_status=progress.update,
            early=reader,
        )
    finally:
        progress.stop()
    return {
        "name": status["name"],
        "dest": str(dest),
        "size": status["size"],
        "sha256": status["sha256"],
        "seconds": status["seconds"],
        "bytes_by_source": status["bytes_by_source"],
        "info_hash": status["info_hash"],
    }


def _finite(value: float | None, flag: str) -> float | None:
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(
            f"must be a finite number of seconds, not {value}", param_hint=flag
        )
    return value


def _positive_size(value: str | None, flag: str) -> int | None:
    if value is None:
        return None
    try:
        size = pieces.parse_size(value)  # not the click wrapper: the error names the flag
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint=flag) from error
    if size < 1:
        raise click.BadParameter(f"must be at least 1 byte, got {value!r}", param_hint=flag)
    return size
