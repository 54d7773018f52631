"""`swarm-seeder`: long-running seeders (origin pre-heating)."""

from __future__ import annotations

import asyncio
import logging
import sys

import click

from swarm import config
from swarm.errors import SwarmError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More log output.")
def cli(verbose: int) -> None:
    """Seed artifacts to the fleet."""
    level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@cli.command()
@click.option("--catalog", help="Catalog prefix, e.g. s3://bucket/artifacts/ [SWARM_CATALOG].")
@click.option(
    "--artifact",
    "artifacts",
    multiple=True,
    help="Artifact name to seed (repeatable; default: the whole catalog, rescanned).",
)
@click.option("--listen", default="0.0.0.0", show_default=True, help="IP for BitTorrent.")
@click.option("--port", type=click.IntRange(0, 65535), default=6881, show_default=True)
@click.option("--coordinator", help="Coordinator URL [SWARM_COORDINATOR].")
def origin(
    catalog: str | None, artifacts: tuple[str, ...], listen: str, port: int, coordinator: str | None
) -> None:
    """Pull artifacts from S3 at full speed and seed them (pre-heat a fleet)."""
    from swarm.agent.serve import serve
    from swarm.seeders.origin import preheat

    try:
        settings = config.load(catalog=catalog, coordinator=coordinator)
        if not settings.catalog:
            raise click.UsageError("--catalog (or SWARM_CATALOG) is required")
        names = list(artifacts)
        cat = settings.catalog
        asyncio.run(serve(settings, listen, port, on_ready=lambda d: preheat(d, cat, names)))
    except SwarmError as error:
        click.echo(str(error), err=True)
        sys.exit(error.exit_code)


def main() -> None:
    cli(prog_name="swarm-seeder")
