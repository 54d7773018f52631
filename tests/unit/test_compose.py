"""compose/ stays in step with the code: every swarm command in docker-compose.yml parses
with the real click CLI, every variable the containers get is one the code (or botocore)
reads, the node service can be scaled, and the Dockerfile runs our console scripts.

No Docker engine needed: the file is interpolated the way Compose does (defaults only, so
`docker compose up` works without a .env) and validated against the Compose
Specification's JSON schema when check-jsonschema (which ships it) is installed.
"""

from __future__ import annotations

import configparser
import importlib
import importlib.util
import json
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore.configprovider
import botocore.credentials
import click
import pytest
import yaml
from packaging.specifiers import SpecifierSet

from swarm import config
from swarm.cli import cli as swarm_cli
from swarm.coordinator.app import make_app, parse_listen
from swarm.seeders.cli import cli as seeder_cli

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = ROOT / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
DOCKERFILE = COMPOSE_DIR / "Dockerfile"

CLIS: dict[str, click.Group] = {"swarm": swarm_cli, "swarm-seeder": seeder_cli}
SHELLS = ("sh", "bash", "/bin/sh", "/bin/bash")
SHELL_KEYWORDS = frozenset({"exec", "until", "while", "if", "elif", "then", "else", "do", "!"})
PUNCTUATION = ";&|()"

EXPECTED_SUBCOMMANDS = {
    "coordinator": {("swarm", "coordinator")},
    "publish": {("swarm", "publish")},
    "seeder": {("swarm-seeder", "origin")},
    "node": {("swarm", "fetch"), ("swarm", "daemon")},
}
"""What each of our services runs; a service that stops running it fails here."""


# -- Compose interpolation (compose-spec "Interpolation"), with an empty environment --------

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)"
    r"|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


def interpolate(text: str) -> str:
    """Resolve ``${VAR:-default}`` to its default and ``$$`` to ``$``; a variable with no
    default would make `docker compose up` depend on the caller's environment: fail."""

    def resolve(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        if match["op"] in (":-", "-"):
            return match["arg"]
        name = match["braced"] or match["bare"]
        raise AssertionError(f"${{{name}}} in {text!r} needs a default: ${{{name}:-VALUE}}")

    return _VARIABLE.sub(resolve, text)


def resolved(node: Any) -> Any:
    if isinstance(node, str):
        return interpolate(node)
    if isinstance(node, list):
        return [resolved(item) for item in node]
    if isinstance(node, dict):
        return {key: resolved(value) for key, value in node.items()}
    return node


def load_compose() -> dict[str, Any]:
    return resolved(yaml.safe_load(COMPOSE_FILE.read_text()))


COMPOSE = load_compose()
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
OURS = sorted(name for name, s in SERVICES.items() if "build" in s)


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # ["KEY=value", ...]
        env = dict(item.partition("=")[::2] for item in env)
    return {key: "" if value is None else str(value) for key, value in env.items()}


# -- commands: argv, `sh -c` scripts, and the swarm invocations in them -------------------


def argv(command: str | list[str]) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def simple_commands(script: str) -> Iterator[list[str]]:
    """Split a shell script into simple commands (words between ; && || | & ( ) and
    newlines), dropping leading keywords such as ``exec`` and ``until``."""
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=PUNCTUATION)
        lexer.whitespace_split = True
        words: list[str] = []
        for token in [*lexer, ";"]:
            if token and all(char in PUNCTUATION for char in token):
                while words and words[0] in SHELL_KEYWORDS:
                    words.pop(0)
                if words:
                    yield words
                words = []
            else:
                words.append(token)


def script(service: dict[str, Any]) -> str | None:
    """The script of a ``sh -c SCRIPT`` command, else None."""
    args = argv(service.get("command") or [])
    return args[2] if len(args) >= 3 and args[0] in SHELLS and args[1] == "-c" else None


def invocations(service: dict[str, Any]) -> list[list[str]]:
    """Every ``swarm``/``swarm-seeder`` command line a service runs, shell variables
    expanded from its environment."""
    text = script(service)
    commands = list(simple_commands(text)) if text else [argv(service.get("command") or [])]
    env = environment(service)
    found = []
    for words in commands:
        if words and words[0] in CLIS:
            found.append([expand(word, env) for word in words])
    return found


def expand(word: str, env: dict[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        name = match["braced"] or match["bare"]
        assert name in env, f"{word!r} uses ${name}, which the service's environment lacks"
        return env[name]

    return _VARIABLE.sub(value, word)


def parse(words: list[str]) -> tuple[str, dict[str, Any]]:
    """Parse a command line with the real click command: an unknown option, a missing
    argument or a bad value raises ``click.UsageError``. Returns (subcommand, params)."""
    group = CLIS[words[0]]
    name, *rest = words[1:]
    assert not name.startswith("-"), f"put {words[0]}'s group options out of {words}"
    parent = click.Context(group, info_name=words[0])
    command = group.get_command(parent, name)
    assert command is not None, f"{words[0]} has no command {name!r}"
    ctx = command.make_context(name, rest, parent=parent, resilient_parsing=False)
    return name, ctx.params


def in_container(words: list[str], service: dict[str, Any], tmp_path: Path) -> list[str]:
    """Point paths inside the service's mounted volumes at placeholder files, so that an
    argument that must exist (``publish FILE``) parses here as it would in the container."""
    targets = [str(volume).rsplit(":", 2)[1] for volume in service.get("volumes") or []]
    out = []
    for word in words:
        for target in targets:
            if word.startswith(target.rstrip("/") + "/"):
                local = tmp_path / word.lstrip("/")
                local.parent.mkdir(parents=True, exist_ok=True)
                local.touch()
                word = str(local)
        out.append(word)
    return out


# -- what the code reads ---------------------------------------------------------------------


def source_literals(prefix: str) -> set[str]:
    pattern = re.compile(rf"[\"']({prefix}[A-Z0-9_]+)[\"']")
    return {
        match
        for path in (ROOT / "swarm").rglob("*.py")
        for match in pattern.findall(path.read_text())
    }


def botocore_variables() -> set[str]:
    names: set[str] = set()
    for spec in botocore.configprovider.BOTOCORE_DEFAUT_SESSION_VARIABLES.values():
        env = spec[1]
        names.update(env if isinstance(env, list) else [env] if env else [])
    provider = botocore.credentials.EnvProvider
    return names | {provider.ACCESS_KEY, provider.SECRET_KEY, *provider.TOKENS}


def console_scripts() -> dict[str, str]:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    lines = setup["options.entry_points"]["console_scripts"].strip().splitlines()
    return {name.strip(): target.strip() for name, _, target in (x.partition("=") for x in lines)}


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


# -- tests -----------------------------------------------------------------------------------


def test_compose_file_follows_the_compose_specification() -> None:
    spec = importlib.util.find_spec("check_jsonschema")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("check-jsonschema (which ships the Compose schema) is not installed")
    import jsonschema

    package = Path(next(iter(spec.submodule_search_locations)))
    schema = json.loads((package / "builtin_schemas/vendor/compose-spec.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(COMPOSE)
    ]
    assert not errors, "\n".join(errors)


def test_services_and_image() -> None:
    assert set(SERVICES) >= {"minio", "coordinator", "publish", "seeder", "node"}
    assert set(OURS) == set(EXPECTED_SUBCOMMANDS)
    for name in OURS:
        build = SERVICES[name]["build"]
        assert (COMPOSE_DIR / build["context"]).resolve() == ROOT, name
        assert (COMPOSE_DIR / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    assert SERVICES["minio"]["image"].startswith("quay.io/minio/minio:RELEASE.")


@pytest.mark.parametrize("name", sorted(EXPECTED_SUBCOMMANDS))
def test_commands_parse_with_the_real_cli(name: str, tmp_path: Path) -> None:
    service = SERVICES[name]
    lines = invocations(service)
    assert {tuple(words[:2]) for words in lines} == EXPECTED_SUBCOMMANDS[name]
    for words in lines:
        try:
            parse(in_container(words, service, tmp_path))
        except click.ClickException as error:
            pytest.fail(f"service {name}: `{shlex.join(words)}` does not parse: {error}")


def test_commands_agree_with_each_other(tmp_path: Path) -> None:
    lines = {(name, words[1]): words for name in OURS for words in invocations(SERVICES[name])}
    parsed = {
        key: parse(in_container(words, SERVICES[key[0]], tmp_path))[1]
        for key, words in lines.items()
    }
    env = environment(SERVICES["node"])
    coordinator = parsed[("coordinator", "coordinator")]
    host, port = parse_listen(coordinator["listen"])
    assert host == "0.0.0.0", "the coordinator must listen beyond the container's loopback"
    assert env["SWARM_COORDINATOR"] == f"http://coordinator:{port}"
    assert any(str(p).startswith(f"{port}:") for p in SERVICES["coordinator"]["ports"])
    words = lines[("coordinator", "coordinator")]
    db = words[words.index("--db") + 1]  # as the container sees it
    assert any(db.startswith(v.split(":")[1] + "/") for v in SERVICES["coordinator"]["volumes"])
    catalog = env["SWARM_CATALOG"]
    assert parsed[("seeder", "origin")]["catalog"] == catalog
    publish = parsed[("publish", "publish")]
    fetch = parsed[("node", "fetch")]
    assert publish["name"] == fetch["source"], "nodes fetch what publish names"
    assert publish["dest"].split("/")[2] == catalog.split("/")[2], "one bucket"
    # The healthcheck waits for the fetched file.
    assert str(fetch["dest"]) in SERVICES["node"]["healthcheck"]["test"]
    # The coordinator's healthcheck asks a route the app serves.
    routes = {r.resource.canonical for r in make_app().router.routes() if r.method == "GET"}
    assert "/healthz" in routes
    assert "/healthz" in " ".join(SERVICES["coordinator"]["healthcheck"]["test"])


def test_environment_is_read_by_the_code() -> None:
    swarm_vars = set(config.ENV.values()) | source_literals("SWARM_")
    aws_vars = botocore_variables() | source_literals("AWS_")
    for name in OURS:
        for var in environment(SERVICES[name]):
            if var.startswith("SWARM_"):
                assert var in swarm_vars, f"{name}: nothing in swarm/ reads {var}"
            elif var.startswith("AWS_"):
                assert var in aws_vars, f"{name}: neither swarm/ nor botocore reads {var}"
            else:
                pytest.fail(f"{name}: {var} is neither a SWARM_ nor an AWS_ variable")
        assert environment(SERVICES[name])["SWARM_HOME"] == "/var/lib/swarm"
    # The swarm services' S3 credentials are MinIO's root credentials.
    minio, node = environment(SERVICES["minio"]), environment(SERVICES["node"])
    assert node["AWS_ACCESS_KEY_ID"] == minio["MINIO_ROOT_USER"]
    assert node["AWS_SECRET_ACCESS_KEY"] == minio["MINIO_ROOT_PASSWORD"]
    assert node["AWS_ENDPOINT_URL"] == "http://minio:9000"


def test_node_service_scales() -> None:
    node = SERVICES["node"]
    # `--scale node=N` fails on a fixed name or host port, and replicas sharing a volume
    # would share SWARM_HOME (one daemon lock) or DEST.
    for key in ("container_name", "hostname", "ports", "volumes", "network_mode"):
        assert key not in node, f"node.{key} breaks `docker compose up --scale node=N`"
    assert node.get("init") is True, "the node's background fetch job needs an init to reap it"
    assert "exec swarm daemon" in (script(node) or ""), (
        "the daemon must be the container's main process"
    )


@pytest.mark.parametrize("name", [name for name in sorted(SERVICES) if script(SERVICES[name])])
def test_shell_scripts_parse(name: str) -> None:
    # dash, as /bin/sh in python:3.13-slim (Debian): -n reads without running.
    result = subprocess.run(
        ["sh", "-n", "-c", script(SERVICES[name])], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"{name}'s script: {result.stderr}"


def test_dockerfile_runs_our_console_scripts() -> None:
    scripts = console_scripts()
    for name, target in scripts.items():
        module, _, func = target.partition(":")
        assert callable(getattr(importlib.import_module(module), func)), f"{name} = {target}"
    instructions = dockerfile_instructions()
    stages = [rest for kind, rest in instructions if kind == "FROM"]
    # a wheel stage, then the image: a Python setup.cfg allows, installing that wheel
    assert stages == ["python:3.13-slim AS wheel", "python:3.13-slim"]
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    assert "3.13" in SpecifierSet(setup["options"]["python_requires"])
    for kind, rest in instructions:
        if kind == "COPY":
            *sources, _ = rest.split()
            if sources[0].startswith("--from="):
                continue  # from the wheel stage, not the context
            for source in sources:
                assert (ROOT / source).exists(), f"Dockerfile copies missing {source}"
        if kind in ("CMD", "ENTRYPOINT"):
            program = json.loads(rest)
            assert program[0] in scripts, f"{kind} {program[0]} is not a console script"
            parse(program)
    runs = "\n".join(rest for kind, rest in instructions if kind == "RUN")
    assert "pip wheel --no-deps --wheel-dir /wheels ." in runs
    # installed as `swarm userdata` installs it: a venv in /opt/swarm-artifacts, on PATH
    assert "python -m venv /opt/swarm-artifacts" in runs
    assert "pip install /wheels/swarm_artifacts-*.whl" in runs
    assert "PATH=/opt/swarm-artifacts/bin:$PATH" in "\n".join(
        r for k, r in instructions if k == "ENV"
    )
    for name in OURS:
        for words in invocations(SERVICES[name]):
            assert words[0] in scripts
