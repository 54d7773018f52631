"""`swarm userdata`: render the cloud-init user-data script from its template."""

from __future__ import annotations

import shlex
from importlib import resources
from string import Template

from swarm import __version__
from swarm.errors import UsageError
from swarm.manifest import check_name

DEFAULT_DEADLINE = 900
"""Seconds a new instance may spend on its artifact before the bootstrap gives up."""

DEFAULT_INSTALL = f"python3 -m pip install --quiet swarm=={__version__}"
DEFAULT_HOME = "/var/lib/swarm"


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
) -> str:
    """The user-data script. Every value is shell-quoted: names and paths come from the
    operator, but a script run as root on every instance is no place for surprises."""
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
    exports = []
    for var, value in (
        ("SWARM_CATALOG", catalog),
        ("SWARM_COORDINATOR", coordinator),
        ("AWS_ENDPOINT_URL", endpoint_url),
    ):
        if value:
            exports.append(f"export {var}={shlex.quote(value)}")
    template = Template(
        resources.files("swarm.bootstrap").joinpath("user-data.sh.tmpl").read_text()
    )
    return template.substitute(
        version=__version__,
        artifact=shlex.quote(artifact),
        dest=shlex.quote(dest),
        deadline=f"{deadline:g}",
        home=shlex.quote(home),
        exports="\n".join(exports),
        install=install,
    )
