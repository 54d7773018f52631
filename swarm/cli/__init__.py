"""The `swarm` command line. Thin: parse, call, print, exit code (README "Exit codes").
``fetch`` lives in :mod:`swarm.cli.fetch`, what the commands share in
:mod:`swarm.cli.common`."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import click

from swarm import __version__, config
from swarm.cli.common import EXIT_HELP, parse_size, reports_errors
from swarm.cli.fetch import fetch
from swarm.pieces import validate_piece_size


@click.group(epilog=EXIT_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="swarm")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def cli(verbose: int) -> None:
    """Distribute large artifacts to a fleet: peers, S3 and UDP at once.

    \b
    Quick use:
      swarm publish index.db s3://bucket/builds/index.db --name index.db
      swarm fetch index.db /var/lib/app/index.db
    """
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("botocore").setLevel(max(level, logging.WARNING))


cli.add_command(fetch)


@cli.command(epilog=EXIT_HELP)
@click.argument("file", type=click.Path(exists=True, path_type=Path))
@click.argument("dest")
@click.option("--name", help="Record the artifact under NAME in the catalog (SWARM_CATALOG).")
@click.option(
    "--piece-size",
    callback=lambda _c, _p, v: v and parse_size(v),
    help="Piece size, a power of two >= 16K (default: about 2048 pieces, 1M-16M).",
)
@click.option("--catalog", help="Catalog prefix, e.g. s3://bucket/artifacts/ [SWARM_CATALOG].")
@click.option("--endpoint-url", help="S3 endpoint [AWS_ENDPOINT_URL].")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@reports_errors
def publish(
    file: Path,
    dest: str,
    name: str | None,
    piece_size: int | None,
    catalog: str | None,
    endpoint_url: str | None,
    as_json: bool,
) -> None:
    """Upload FILE to s3://BUCKET/KEY with its manifest (KEY.swarm) and torrent (KEY.torrent).

    FILE may be a directory: its files go to s3://BUCKET/PREFIX/<relative path>, as one
    multi-file torrent, with PREFIX.swarm and PREFIX.torrent beside the prefix."""
    from swarm.manifest import manifest_key
    from swarm.objectstore import S3Url, make_client
    from swarm.publish import publish as do_publish

    if piece_size:
        try:
            validate_piece_size(piece_size)
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--piece-size") from error
    settings = config.load(catalog=catalog, endpoint_url=endpoint_url)
    client = make_client(settings.endpoint_url, transfers=True)
    manifest = do_publish(
        client,
        file,
        S3Url.parse(dest),
        name=name,
        piece_size=piece_size,
        catalog_url=settings.catalog,
        secret=settings.secret,
    )
    summary = {
        "name": manifest.name,
        "url": manifest.s3_url,
        "manifest": f"s3://{manifest.bucket}/{manifest_key(manifest.key)}",
        "files": len(manifest.files) if manifest.files is not None else 1,
        "size": manifest.size,
        "sha256": manifest.sha256,
        "piece_size": manifest.piece_size,
        "pieces": manifest.layout.count,
        "info_hash": manifest.info_hash,
        "catalog": bool(name),
    }
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(
            f"published {manifest.name} ({manifest.size} bytes, {manifest.layout.count} "
            f"pieces of {manifest.piece_size}) to {manifest.s3_url}"
        )
        click.echo(f"  manifest {summary['manifest']}  info-hash {manifest.info_hash}")


@cli.command()
@click.option(
    "--listen",
    default="0.0.0.0",
    show_default=True,
    help="IP address for the BitTorrent socket (one per node on a shared host).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=6881,
    show_default=True,
    help="BitTorrent listen port (0 = any free port).",
)
@click.option("--coordinator", help="Coordinator URL [SWARM_COORDINATOR].")
@click.option(
    "--peers-from-asg",
    metavar="GROUP",
    help="Also dial the running instances of this Auto Scaling group as peers.",
)
@click.option(
    "--udp-port",
    type=click.IntRange(0, 65535),
    default=7881,
    show_default=True,
    help="Serve held pieces over UDP here (needs SWARM_SECRET; 0 = off).",
)
@click.option(
    "--upload-limit",
    default="0",
    callback=lambda _c, _p, v: parse_size(v),
    help="Cap uploads, bytes/s (e.g. 50M): BitTorrent's, LAN peers too, and the UDP "
    "server's, shared among its sessions. 0 = none.",
)
@reports_errors
def daemon(
    listen: str,
    port: int,
    coordinator: str | None,
    peers_from_asg: str | None,
    udp_port: int,
    upload_limit: int,
) -> None:
    """Run the node daemon in the foreground (for systemd): fetch and keep seeding.

    SIGTERM stops it (resume data saved); SIGUSR1 writes every thread's stack to its
    log (daemon.log in SWARM_HOME when `swarm fetch` started it) and it goes on."""
    import asyncio
    import faulthandler
    import gc
    import signal

    faulthandler.enable()  # a crash in libtorrent's native code leaves its stack in the log
    # `kill -USR1 <pid in daemon.pid>`: every thread's stack into the log, the daemon going
    # on (what a wedged daemon waits on; the fleet harness asks for it on a timeout)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # Its imports (botocore, libtorrent, the UDP package: ~0.4 CPU-s) allocate objects that live
    # as long as the process; collecting during them only re-scans them. Freeze them out
    # of later collections too.
    gc.disable()
    from swarm.agent.serve import serve
    from swarm.fleetauth import install_redactor

    gc.freeze()
    gc.enable()

    settings = config.load(coordinator=coordinator)
    config.check_listen_ip(listen)
    config.coordinator_urls(settings.coordinator)
    install_redactor(settings.secret)
    asyncio.run(
        serve(
            settings,
            listen,
            port,
            peers_from_asg=peers_from_asg,
            udp_port=udp_port,
            upload_limit=upload_limit,
        )
    )


@cli.command()
@click.option("--listen", default="0.0.0.0:7070", show_default=True, help="HOST:PORT to serve on.")
@click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    help="SQLite file for completed-fetch history (default: in memory).",
)
@click.option(
    "--store",
    metavar="redis://HOST:PORT/DB",
    help="Keep peers, reports and stripes in Redis, shared by every coordinator given "
    "the same URL (default: in this process).",
)
@click.option(
    "--origin-rate",
    default="auto",
    show_default=True,
    callback=lambda _c, _p, v: parse_origin_rate(v),
    help="S3's aggregate rate to the fleet, bytes/s (e.g. 12M): 'auto' measures it from "
    "the nodes' reads; 'unlimited' (a bucket in the fleet's region) has every node read "
    "all of an artifact from S3 from its first second.",
)
@reports_errors
def coordinator(listen: str, db: Path | None, store: str | None, origin_rate: float | None) -> None:
    """Run the coordinator: BitTorrent tracker, fleet view, reports, metrics."""
    from swarm.coordinator.app import run
    from swarm.fleetauth import fleet_token, install_redactor

    settings = config.load()
    install_redactor(settings.secret)
    run(
        listen,
        db,
        token=fleet_token(settings.secret) if settings.secret else None,
        store_url=store,
        origin_rate=origin_rate,
    )


def parse_origin_rate(value: str) -> float | None:
    """``--origin-rate``: None for auto, ``math.inf`` for unlimited, else bytes/s > 0."""
    try:
        return config.origin_rate(value)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None


@cli.command()
@click.option("--coordinator", help="Coordinator URL [SWARM_COORDINATOR].")
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout (default when not a TTY).")
@click.option("--watch", is_flag=True, help="Refresh every second until interrupted.")
@reports_errors
def status(coordinator: str | None, as_json: bool, watch: bool) -> None:
    """Show the fleet: artifacts (sources, S3 saved, times) and nodes (progress, rates)."""
    import time

    from rich.console import Console
    from rich.live import Live

    from swarm.status import fetch_fleet, render, summarize

    settings = config.load(coordinator=coordinator)
    if not settings.coordinator:
        raise click.UsageError("no coordinator: pass --coordinator URL or set SWARM_COORDINATOR")
    settings.coordinator = config.coordinator_urls(settings.coordinator)[0]
    from swarm.fleetauth import fleet_token

    token = fleet_token(settings.secret) if settings.secret else None
    use_json = as_json or not sys.stdout.isatty()
    view = summarize(fetch_fleet(settings.coordinator, token))
    if use_json:
        click.echo(json.dumps(view))
        while watch:
            time.sleep(1.0)
            click.echo(json.dumps(summarize(fetch_fleet(settings.coordinator, token))))
        return
    console = Console()
    if not watch:
        console.print(render(view))
        return
    with Live(render(view), console=console, refresh_per_second=2) as live:
        while True:
            time.sleep(1.0)
            live.update(render(summarize(fetch_fleet(settings.coordinator, token))))


@cli.command()
@click.option("--artifact", required=True, help="Catalog NAME (or s3://BUCKET/KEY) to fetch.")
@click.option("--dest", required=True, help="Absolute path on the instance.")
@click.option("--catalog", help="Catalog prefix [SWARM_CATALOG].")
@click.option("--coordinator", help="Coordinator URL [SWARM_COORDINATOR].")
@click.option(
    "--deadline",
    type=float,
    default=900,
    show_default=True,
    help="Seconds before the bootstrap gives up (exit 7, logged).",
)
@click.option("--install", "install_cmd", help="Shell command that installs swarm if missing.")
@click.option("--endpoint-url", help="S3 endpoint for the instances (MinIO, a VPC endpoint).")
@click.option(
    "--wheelhouse",
    help="Install from these wheels, not PyPI: s3://BUCKET/PREFIX/, an http(s) page of links, "
    "or a directory on the instance.",
)
@reports_errors
def userdata(
    artifact: str,
    dest: str,
    catalog: str | None,
    coordinator: str | None,
    deadline: float,
    install_cmd: str | None,
    endpoint_url: str | None,
    wheelhouse: str | None,
) -> None:
    """Print a cloud-init user-data script: IMDSv2 identity, install into /opt, fetch, seed."""
    from swarm.bootstrap.userdata import DEFAULT_INSTALL, render

    settings = config.load(catalog=catalog, coordinator=coordinator)
    click.echo(
        render(
            artifact,
            dest,
            catalog=settings.catalog,
            coordinator=settings.coordinator,
            deadline=deadline,
            install=install_cmd or DEFAULT_INSTALL,
            endpoint_url=endpoint_url,
            wheelhouse=wheelhouse,
        ),
        nl=False,
    )


@cli.command()
@click.option(
    "--size",
    default="128M",
    show_default=True,
    callback=lambda _c, _p, v: parse_size(v),
    help="Size of the generated artifact.",
)
@click.option("--nodes", type=click.IntRange(1, 20), default=4, show_default=True)
@click.option("--keep", is_flag=True, help="Keep the work directory (logs, node homes).")
@reports_errors
def demo(size: int, nodes: int, keep: bool) -> None:
    """Run S3, a coordinator and NODES nodes on loopback; fetch one artifact on all at once."""
    from swarm.demo import run_demo

    sys.exit(run_demo(size, nodes, keep))


def main() -> None:
    try:
        cli(prog_name="swarm")
    except SystemExit as done:
        client = sys.modules.get("swarm.agent.client")  # loaded only by commands that fork
        if client is None or not client.forked_a_daemon():
            raise
        # Tearing the interpreter down deallocates and collects every object, a write
        # to each page it shares with the daemon it forked: 0.04-0.08 CPU-s of copied
        # pages per node at the end of a fleet's fetch, while other nodes still fetch.
        # Nothing is left to run (click has returned; threads are daemons), so flush
        # what is buffered and leave.
        code = done.code if isinstance(done.code, int) else int(done.code is not None)
        try:
            if isinstance(done.code, str):
                print(done.code, file=sys.stderr)
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:  # a reader gone (EPIPE) must not cost the exit code
            os._exit(code)
