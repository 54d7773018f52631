"""`swarm userdata`: render the cloud-init user-data scripts from their templates.

A node's script installs swarm-artifacts if missing, starts the seeding daemon and
fetches one artifact; an origin seeder's script (``seeders/origin-user-data.sh`` is one,
rendered by :func:`render_origin`) installs it and starts the seeder. Both install into a
venv of their own under :data:`PREFIX`, from PyPI or from the operator's wheelhouse.
"""

from __future__ import annotations

import shlex
import sys
from importlib import resources
from string import Template

from swarm import __version__
from swarm.errors import UsageError
from swarm.manifest import check_name

DISTRIBUTION = "swarm-artifacts"
"""The name on PyPI (``swarm`` there is an unrelated game)."""

PREFIX = f"/opt/{DISTRIBUTION}"
"""Where the script installs swarm: a venv of its own, so no distro package is touched."""

DEFAULT_DEADLINE = 900
"""Seconds a new instance may spend on its artifact before the bootstrap gives up."""

DEFAULT_INSTALL = "install_swarm"
"""The install step: the script's own function (find or install a Python 3.11-3.13, make
the venv, pip install from PyPI or the wheelhouse). ``--install CMD`` replaces it."""

DEFAULT_HOME = "/var/lib/swarm"
ORIGIN_HOME = "/var/lib/swarm-seeder"

WHEELHOUSE_SCHEMES = ("s3://", "http://", "https://", "/")
"""A wheelhouse is an S3 prefix (read with the AWS CLI, or curl's SigV4 with the instance
role), a page of links pip's ``--find-links`` reads, or a directory on the instance."""


def _text(name: str) -> str:
    return resources.files("swarm.bootstrap").joinpath(name).read_text()


def unit(name: str) -> str:
    """A packaged systemd unit (``swarm-daemon`` or ``swarm-seeder``); the copies in the
    repository's ``seeders/`` are these files."""
    return _text(f"{name}.service")


def check_wheelhouse(wheelhouse: str | None) -> str | None:
    if wheelhouse is None:
        return None
    if not wheelhouse.startswith(WHEELHOUSE_SCHEMES):
        raise UsageError(
            f"swarm: --wheelhouse must be s3://BUCKET/PREFIX/, an http(s):// page of "
            f"links or an absolute directory, got {wheelhouse!r}"
        )
    if wheelhouse.startswith("s3://") and len(wheelhouse) <= len("s3://"):
        raise UsageError(f"swarm: --wheelhouse {wheelhouse!r} names no bucket")
    return wheelhouse


def _exports(values: dict[str, str | None]) -> str:
    return "\n".join(f"export {var}={shlex.quote(v)}" for var, v in values.items() if v)


def _common(
    role: str,
    summary: str,
    *,
    exports: str,
    home: str,
    install: str,
    wheelhouse: str | None,
) -> str:
    return Template(_text("common.sh.tmpl")).substitute(
        role=role,
        summary=summary,
        version=__version__,
        home=shlex.quote(home),
        exports=exports,
        prefix=shlex.quote(PREFIX),
        wheelhouse=shlex.quote(check_wheelhouse(wheelhouse) or ""),
        install=install,
    )


def render(
    artifact: str,
    dest: str,
    *,
    catalog: str | None,
    coordinator: str | None,
    deadline: float = DEFAULT_DEADLINE,
    install: str = DEFAULT_INSTALL,
    home: str = DEFAULT_HOME,
    endpoint_url: str | None = None,
    wheelhouse: str | None = None,
) -> str:
    """A node's user-data script. Every value is shell-quoted: names and paths come from
    the operator, but a script run as root on every instance is no place for surprises."""
    if not artifact.startswith("s3://"):
        check_name(artifact)
        if not catalog:
            raise UsageError(
                "swarm: --artifact NAME needs --catalog (or SWARM_CATALOG): the instance "
                "resolves the name there; or pass --artifact s3://BUCKET/KEY"
            )
    if not dest.startswith("/"):
        raise UsageError(f"swarm: --dest must be an absolute path, got {dest!r}")
    if deadline <= 0:
        raise UsageError(f"swarm: --deadline must be positive, got {deadline}")
    exports = _exports(
        {
            "SWARM_CATALOG": catalog,
            "SWARM_COORDINATOR": coordinator,
            "AWS_ENDPOINT_URL": endpoint_url,
        }
    )
    head = _common(
        "node",
        f"# Fetches {artifact} to {dest} from the fleet's swarm, then keeps seeding it.",
        exports=exports,
        home=home,
        install=install,
        wheelhouse=wheelhouse,
    )
    return head + Template(_text("node.sh.tmpl")).substitute(
        artifact=shlex.quote(artifact),
        dest=shlex.quote(dest),
        deadline=f"{deadline:g}",
        daemon_unit=unit("swarm-daemon").rstrip("\n"),
    )


def render_origin(
    catalog: str,
    *,
    coordinator: str | None,
    install: str = DEFAULT_INSTALL,
    home: str = ORIGIN_HOME,
    endpoint_url: str | None = None,
    wheelhouse: str | None = None,
) -> str:
    """An origin seeder's user-data script: install, then seed the whole catalog."""
    if not catalog.startswith("s3://"):
        raise UsageError(f"swarm: the catalog must be s3://BUCKET/PREFIX/, got {catalog!r}")
    exports = _exports(
        {
            "SWARM_CATALOG": catalog,
            "SWARM_COORDINATOR": coordinator,
            "AWS_ENDPOINT_URL": endpoint_url,
        }
    )
    head = _common(
        "origin seeder",
        "# Installs swarm, then pulls every artifact of the catalog from S3 and seeds it.",
        exports=exports,
        home=home,
        install=install,
        wheelhouse=wheelhouse,
    )
    return head + Template(_text("origin.sh.tmpl")).substitute(
        seeder_unit=unit("swarm-seeder").rstrip("\n")
    )


ORIGIN_EXAMPLE = {
    "catalog": "s3://my-bucket/artifacts/",
    "coordinator": "http://10.0.0.5:7070",
    "wheelhouse": None,
}
"""The values ``seeders/origin-user-data.sh`` is rendered with (edit them there, or
render your own: ``python -m swarm.bootstrap.userdata origin CATALOG [COORDINATOR]``)."""


def main(argv: list[str]) -> int:
    """``python -m swarm.bootstrap.userdata origin CATALOG [COORDINATOR [WHEELHOUSE]]``
    prints an origin seeder's user-data; ``unit NAME`` prints a packaged systemd unit."""
    if len(argv) >= 2 and argv[0] == "unit":
        sys.stdout.write(unit(argv[1]))
        return 0
    if argv and argv[0] == "origin" and 2 <= len(argv) <= 4:
        catalog, coordinator, wheelhouse = (*argv[1:], None, None)[:3]
        assert catalog is not None  # argv has 2 to 4 items
        sys.stdout.write(render_origin(catalog, coordinator=coordinator, wheelhouse=wheelhouse))
        return 0
    sys.stderr.write(main.__doc__ or "")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
