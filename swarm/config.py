"""Settings: flags > environment (SWARM_*) > /etc/swarm/swarm.toml > defaults."""

from __future__ import annotations

import ipaddress
import math
import os
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from urllib.parse import urlsplit

from swarm.errors import UsageError
from swarm.pieces import parse_size

DEFAULT_CONFIG_FILE = "/etc/swarm/swarm.toml"
DEFAULT_HOME = Path("/var/lib/swarm") if os.geteuid() == 0 else Path.home() / ".swarm"
DEFAULT_COORDINATOR_PORT = 7070


@dataclass
class Settings:
    """Node-wide settings.

    Attributes:
        home: the node's state directory (SWARM_HOME); one per node.
        coordinator: coordinator URL (SWARM_COORDINATOR), e.g. http://10.0.0.5:7070; None = none.
        catalog: S3 prefix that maps names to artifacts (SWARM_CATALOG), e.g. s3://b/artifacts/.
        secret: the fleet secret (SWARM_SECRET): signs manifests, authenticates the fleet.
        endpoint_url: S3 endpoint override (AWS_ENDPOINT_URL); None = AWS.
    """

    home: Path = DEFAULT_HOME
    coordinator: str | None = None
    catalog: str | None = None
    secret: str | None = None
    endpoint_url: str | None = None


ENV = {
    "home": "SWARM_HOME",
    "coordinator": "SWARM_COORDINATOR",
    "catalog": "SWARM_CATALOG",
    "secret": "SWARM_SECRET",
    "endpoint_url": "AWS_ENDPOINT_URL",
}


def load(**flags: object) -> Settings:
    """Merge the sources of settings; ``flags`` with a None value do not override."""
    values: dict[str, object] = {}
    config_file = Path(os.environ.get("SWARM_CONFIG", DEFAULT_CONFIG_FILE))
    if config_file.is_file():
        try:
            values.update(tomllib.loads(config_file.read_text()))
        except tomllib.TOMLDecodeError as error:
            raise UsageError(f"swarm: {config_file} is not valid TOML: {error}") from error
    for name, var in ENV.items():
        if os.environ.get(var):
            values[name] = os.environ[var]
    values.update({k: v for k, v in flags.items() if v is not None})
    known = {f.name for f in fields(Settings)}
    unknown = set(values) - known
    if unknown:
        raise UsageError(f"swarm: unknown setting(s) {sorted(unknown)} in {config_file}")
    if "home" in values:
        values["home"] = Path(str(values["home"]))
    return Settings(**values)  # type: ignore[arg-type]


def coordinator_urls(value: str | None) -> list[str]:
    """The coordinator setting as a list of URLs (``A,B``: several coordinators sharing
    one fleet's state; a node fails over between them), each checked.

    Raises:
        UsageError: a URL that is not http(s)://HOST[:PORT].
    """
    if not value:
        return []
    urls = [part.strip().rstrip("/") for part in value.split(",") if part.strip()]
    for url in urls:
        parsed = urlsplit(url)
        try:
            port_ok = parsed.port is None or 0 < parsed.port < 65536
        except ValueError:
            port_ok = False
        if parsed.scheme not in ("http", "https") or not parsed.hostname or not port_ok:
            raise UsageError(
                f"swarm: bad coordinator URL {url!r}: use http://HOST:PORT (comma-separated "
                "for several), e.g. http://10.0.0.5:7070"
            )
    return urls


def check_listen_ip(value: str | None, flag: str = "--listen") -> str | None:
    """An IP address to bind to (a hostname or HOST:PORT here is a mistake)."""
    if value is None:
        return None
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise UsageError(
            f"swarm: {flag} {value!r} is not an IP address: give this node's address, "
            "e.g. 10.0.0.12 (or 0.0.0.0 for all)"
        ) from None
    return value


def origin_rate(value: str) -> float | None:
    """The coordinator's ``--origin-rate``: None for ``auto`` (measured), ``math.inf`` for
    ``unlimited``, else bytes/s above 0 (``12M``). ValueError otherwise."""
    text = value.strip().lower()
    if text == "auto":
        return None
    if text == "unlimited":
        return math.inf
    try:
        rate = parse_size(text)
    except ValueError:
        raise ValueError(f"{value!r}: give bytes/s (e.g. 12M), 'auto' or 'unlimited'") from None
    if rate <= 0:
        raise ValueError(f"{value!r}: the rate must be above 0 (or 'auto')")
    return float(rate)
