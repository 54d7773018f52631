from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from swarm.bootstrap.userdata import ORIGIN_EXAMPLE, PREFIX, render, render_origin, unit
from swarm.errors import ManifestError, UsageError

REPO = Path(__file__).resolve().parents[2]
SEEDERS = REPO / "seeders"


def node_script(**kwargs) -> str:
    values = {
        "artifact": "index.db",
        "dest": "/var/lib/my app/index.db",
        "catalog": "s3://b/cat/",
        "coordinator": "http://10.0.0.5:7070",
        "deadline": 120,
    }
    return render(**{**values, **kwargs})


def test_script_is_valid_bash_and_quotes_operator_values():
    script = node_script(wheelhouse="s3://b/my wheels/")
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert "'/var/lib/my app/index.db'" in script
    assert "WHEELHOUSE='s3://b/my wheels/'" in script
    assert "X-aws-ec2-metadata-token-ttl-seconds" in script  # IMDSv2: token first
    assert script.index("api/token") < script.index("md placement/region")
    assert "--deadline 120" in script and "exit $rc" in script
    # swarm runs from its own venv; the install pins this very version
    assert f"PREFIX={PREFIX}" in script and "swarm-artifacts==0.1.0" in script
    assert "$" not in PREFIX and "swarm ==" not in script


def test_default_install_is_pypi_and_install_can_be_replaced():
    script = node_script()
    assert "WHEELHOUSE=''" in script and "\n  install_swarm ||" in script
    custom = node_script(install="dnf install -y my-swarm-rpm")
    assert "\n  dnf install -y my-swarm-rpm ||" in custom


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"artifact": "index.db", "dest": "/x", "catalog": None}, UsageError),
        ({"artifact": "../etc", "dest": "/x", "catalog": "s3://b/"}, ManifestError),
        ({"artifact": "index.db", "dest": "relative/x", "catalog": "s3://b/"}, UsageError),
        (
            {"artifact": "x", "dest": "/x", "catalog": "s3://b/", "wheelhouse": "wheels/"},
            UsageError,
        ),
        ({"artifact": "x", "dest": "/x", "catalog": "s3://b/", "wheelhouse": "s3://"}, UsageError),
        (
            {"artifact": "x", "dest": "/x", "catalog": "s3://b/", "wheelhouse": "ftp://h/"},
            UsageError,
        ),
    ],
)
def test_bad_input_is_refused(kwargs, error):
    with pytest.raises(error):
        render(coordinator=None, **kwargs)


def test_the_node_script_installs_the_packaged_daemon_unit():
    script = node_script()
    assert unit("swarm-daemon").rstrip("\n") in script
    assert f"ExecStart={PREFIX}/bin/swarm daemon $SWARM_DAEMON_ARGS" in unit("swarm-daemon")
    assert f"ExecStart={PREFIX}/bin/swarm-seeder origin" in unit("swarm-seeder")


@pytest.mark.parametrize("name", ["swarm-daemon.service", "swarm-seeder.service"])
def test_seeders_units_are_the_packaged_ones(name):
    """seeders/ holds the deployables; the package holds the same files (the user-data
    writes them on instances). Regenerate: python -m swarm.bootstrap.userdata unit NAME."""
    assert (SEEDERS / name).read_text() == unit(name.removesuffix(".service"))


def test_seeders_origin_user_data_is_rendered_and_valid():
    """Regenerate: python -m swarm.bootstrap.userdata origin CATALOG COORDINATOR."""
    script = (SEEDERS / "origin-user-data.sh").read_text()
    assert script == render_origin(
        ORIGIN_EXAMPLE["catalog"],
        coordinator=ORIGIN_EXAMPLE["coordinator"],
        wheelhouse=ORIGIN_EXAMPLE["wheelhouse"],
    )
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert "swarm-seeder origin" in script and "swarm fetch" not in script


@pytest.mark.skipif(not shutil.which("shellcheck"), reason="shellcheck not installed")
def test_scripts_pass_shellcheck(tmp_path: Path):
    node = tmp_path / "node.sh"
    node.write_text(node_script(wheelhouse="s3://b/wheels/"))
    done = subprocess.run(
        ["shellcheck", "-S", "warning", node, SEEDERS / "origin-user-data.sh"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout


# -- the install step's choice of Python, with stand-in package managers ----------------


def install_functions() -> str:
    """The script's install helpers (no IMDS, no install run), with a quiet ``log``."""
    script = node_script()
    start, end = script.index("usable_python() {"), script.index("install_swarm() {")
    return 'log() { echo "log: $*"; }\n' + script[start:end]


def run_install(tmp_path: Path, tools: dict[str, str], body: str) -> subprocess.CompletedProcess:
    """Run ``body`` after the install functions with PATH = a directory holding only
    ``tools`` (name -> shell script): no system Python is visible."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in tools.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + text)
        (bin_dir / name).chmod(0o755)
    return subprocess.run(
        ["/bin/bash", "-c", install_functions() + body],
        env={"PATH": str(bin_dir), "BIN": str(bin_dir), "REAL": sys.executable},
        capture_output=True,
        text=True,
        timeout=60,
    )


OLD_PYTHON = "exit 1  # a python3 that is 3.9 (or lacks venv): unusable\n"
LINKS = (  # a package manager's install: python3.X packages put a python3.X on PATH
    'for p in "$@"; do case $p in\n'
    "  python3*-*) ;;\n"
    '  python3*) /bin/ln -s "$REAL" "$BIN/$p" ;;\n'
    "esac; done\n"
)


def test_finds_the_newest_usable_python(tmp_path: Path):
    done = run_install(
        tmp_path, {"python3": OLD_PYTHON}, "/bin/ln -s $REAL $BIN/python3.12; find_python"
    )
    assert done.stdout.strip() == f"{tmp_path}/bin/python3.12"


def test_amazon_linux_installs_python_with_dnf(tmp_path: Path):
    dnf = 'echo "dnf $*" >> "$BIN/calls"\nshift 3\n' + LINKS
    done = run_install(
        tmp_path,
        {"python3": OLD_PYTHON, "dnf": dnf},
        "find_python || { install_python && find_python; }",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{tmp_path}/bin/python3.12"
    assert (
        tmp_path / "bin" / "calls"
    ).read_text() == "dnf install -y -q python3.12 python3.12-pip\n"


def test_ubuntu_22_04_installs_a_newer_python_with_apt(tmp_path: Path):
    """apt's python3 is 3.10 there: the script goes on to python3.12."""
    apt = (
        'echo "apt-get $*" >> "$BIN/calls"\n'
        '[ "$1" = update ] && exit 0\nshift 3\n'
        '[ "$1" = python3 ] && exit 0  # the distro python3 stays 3.10\n' + LINKS
    )
    done = run_install(
        tmp_path,
        {"python3": OLD_PYTHON, "apt-get": apt},
        "find_python || { install_python && find_python; }",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{tmp_path}/bin/python3.12"
    calls = (tmp_path / "bin" / "calls").read_text().splitlines()
    assert calls == [
        "apt-get update -qq",
        "apt-get install -y -qq python3 python3-venv",
        "apt-get install -y -qq python3.12 python3.12-venv",
    ]


def test_no_python_and_no_package_manager_is_said(tmp_path: Path):
    done = run_install(tmp_path, {"python3": OLD_PYTHON}, "find_python || install_python")
    assert done.returncode == 1
    assert "neither dnf nor apt-get" in done.stdout
