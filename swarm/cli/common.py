"""What every command of the `swarm` command line shares: sizes as click parameters, and
a SwarmError turned into its message and exit code (README "Exit codes")."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from swarm import pieces
from swarm.errors import EXIT_CODES, SwarmError

F = TypeVar("F", bound=Callable[..., Any])


def parse_size(text: str) -> int:
    """:func:`swarm.pieces.parse_size` as a click parameter."""
    try:
        return pieces.parse_size(text)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None


def reports_errors(func: F) -> F:
    """Turn a SwarmError into its message on stderr and its exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except SwarmError as error:
            message = str(error)
            if kwargs.get("as_json"):
                click.echo(
                    json.dumps({"event": "error", "exit_code": error.exit_code, "message": message})
                )
            click.echo(message if message.startswith("swarm:") else f"swarm: {message}", err=True)
            sys.exit(error.exit_code)
        except KeyboardInterrupt:
            click.echo("swarm: interrupted; rerun the same command to resume", err=True)
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


EXIT_HELP = "\b\nExit codes:\n" + "\n".join(
    f"  {code}  {text}" for code, text in EXIT_CODES.items()
)
