"""`swarm-seeder`: long-running seeders (origin pre-heating)."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Seed artifacts to the fleet."""


def main() -> None:
    cli(prog_name="swarm-seeder")
