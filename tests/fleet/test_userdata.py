"""`swarm userdata` for real: the generated script runs as root in a namespace host,
reads its identity and its role's credentials from an IMDSv2 stand-in, installs
swarm-artifacts into /opt with a Python other than the tests' (from a wheelhouse: the
project's wheel and its dependencies' wheels), fetches from the local stack, keeps seeding.

The host has no route off the lab, so the install can only succeed from the wheelhouse.
The dependencies' wheels are downloaded once and cached in ~/.cache/swarm/wheelhouse/
(keyed by the pins in setup.cfg); the project's wheel is built fresh by every run.
"""

from __future__ import annotations

import configparser
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from swarm.bootstrap.userdata import render_origin
from swarm.lab.netlab import Lab, wait_for
from tests.conftest import CREDENTIALS
from tests.fleet.conftest import REPO
from tests.fleet.conftest import STACK_SIZE as SIZE
from tests.servers import BIN

STANDIN = Path(__file__).with_name("imds_standin.py")
PREFIX = "/opt/swarm-artifacts"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "swarm" / "wheelhouse"
INSTANCE_TIMEOUT = 150
"""Seconds for a whole instance bootstrap: venv, offline pip install of ~30 wheels, fetch."""


def instance_python() -> Path | None:
    """A Python 3.12 or 3.13 that is not the one running the tests (pyenv's, or on PATH)."""
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for version in ("3.12", "3.13"):
        if version == mine:
            continue
        candidates = sorted((Path.home() / ".pyenv" / "versions").glob(f"{version}.*/bin"))
        candidates = [c / f"python{version}" for c in candidates]
        on_path = shutil.which(f"python{version}")
        candidates += [Path(on_path)] if on_path else []
        for candidate in candidates:
            if subprocess.run([candidate, "-V"], capture_output=True).returncode == 0:
                return candidate
    return None


def pinned_requirements() -> list[str]:
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    lines = parser["options"]["install_requires"].splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def dependency_wheels(python_version: str) -> Path:
    """The pinned dependencies' wheels for ``python_version`` on this machine's arch,
    downloaded once (binary wheels only: what a fleet's wheelhouse must hold)."""
    requirements = pinned_requirements()
    arch = platform.machine()
    key = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:12]
    tag = python_version.replace(".", "")
    target = CACHE / f"cp{tag}-{arch}-{key}"
    if (target / ".complete").exists():
        return target
    partial = target.with_name(target.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    platforms = [
        f"--platform={p}_{arch}"
        for p in ("manylinux_2_28", "manylinux_2_27", "manylinux_2_17", "manylinux2014")
    ]
    subprocess.run(
        [
            BIN / "pip",
            "download",
            "--quiet",
            "--only-binary=:all:",
            f"--python-version={python_version}",
            "--implementation=cp",
            *platforms,
            "--dest",
            partial,
            *requirements,
        ],
        check=True,
        timeout=600,
    )
    (partial / ".complete").touch()
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    for stale in CACHE.glob(f"cp{tag}-{arch}-*"):  # wheels of pins that changed since
        if stale != target and (stale / ".complete").exists():
            shutil.rmtree(stale, ignore_errors=True)
    return target


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``(directory of wheels, the instances' Python)``: the dependencies (cached) and the
    project's wheel built from this checkout."""
    python = instance_python()
    if python is None:
        pytest.skip("needs a Python 3.12 or 3.13 besides the tests' (pyenv or PATH)")
    version = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    house = tmp_path_factory.mktemp("wheelhouse")
    for wheel in dependency_wheels(version).glob("*.whl"):
        os.link(wheel, house / wheel.name)
    subprocess.run(
        [BIN / "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", house, REPO],
        check=True,
        timeout=300,
        capture_output=True,
    )
    assert any(house.glob("swarm_artifacts-*.whl"))
    return house, python


def start_imds(host, region: str = "eu-west-1") -> None:
    host.run(["ip", "addr", "add", "169.254.169.254/32", "dev", "lo"])
    host.run(["ip", "link", "set", "lo", "up"])
    # the stand-in serves the test credentials as the instance profile's
    host.popen(
        [sys.executable, STANDIN, region, f"i-{host.name}", host.ip],
        env={"PATH": os.environ["PATH"], **CREDENTIALS},
    )
    wait_for(
        lambda: (
            host.run(
                [
                    "curl",
                    "-s",
                    "-o",
                    "/dev/null",
                    "-X",
                    "PUT",
                    "-H",
                    "X-aws-ec2-metadata-token-ttl-seconds: 60",
                    "http://169.254.169.254/latest/api/token",
                ],
                check=False,
            ).returncode
            == 0
        ),
        15,
        "the IMDS stand-in",
    )


def userdata(env: dict[str, str], origin, deadline: float, wheelhouse: str) -> str:
    return subprocess.run(
        [
            BIN / "swarm",
            "userdata",
            "--artifact",
            "index.db",
            "--dest",
            "/srv/app/index.db",
            "--catalog",
            "s3://fleet/catalog/",
            "--coordinator",
            f"http://{origin.ip}:7070",
            "--endpoint-url",
            env["AWS_ENDPOINT_URL"],
            "--deadline",
            str(deadline),
            "--wheelhouse",
            wheelhouse,
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout


def run_instance(
    lab: Lab,
    name: str,
    script: str,
    python: Path,
    tmp_path: Path,
    up: float = 200,
    down: float = 200,
):
    """Run ``script`` as an instance's user data: its own network namespace (IMDS on
    169.254.169.254), and a private mount namespace in which /srv, /opt and
    /usr/local/bin are directories of ``tmp_path`` (nothing on the host changes). Its
    PATH holds the system's directories and ``python`` (no swarm, no venv)."""
    host = lab.host(name, up, down)
    start_imds(host)
    root = tmp_path / name
    mounts = {"srv": "/srv", "opt": "/opt", "usr-local-bin": "/usr/local/bin"}
    for directory in mounts:
        (root / directory).mkdir(parents=True)
    (root / "user-data.sh").write_text(script)
    pybin = root / "pybin"
    pybin.mkdir()
    (pybin / python.name).symlink_to(python)
    instance_env = {
        "PATH": f"{pybin}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(root),
        "SWARM_HOME": str(root / "swarm-home"),
        "SWARM_BOOTSTRAP_LOG": str(root / "bootstrap.log"),
        "SWARM_NO_SYSTEMD": "1",
        "SWARM_CONFIG": str(root / "none.toml"),
    }
    binds = " && ".join(f"mount --bind {root / d} {target}" for d, target in mounts.items())
    wrapped = f"{binds} && exec bash {root / 'user-data.sh'}"
    done = host.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", wrapped],
        env=instance_env,
        timeout=INSTANCE_TIMEOUT,
        check=False,
    )
    return host, root, done, instance_env


def test_userdata_installs_from_an_s3_wheelhouse_fetches_and_seeds(
    lab: Lab, stack, wheelhouse, tmp_path: Path
):
    origin, env, src = stack
    house, python = wheelhouse
    origin.run(  # the S3 server is only reachable inside the lab
        [
            sys.executable,
            "-c",
            "import boto3, pathlib, sys; s3 = boto3.client('s3')\n"
            "for w in pathlib.Path(sys.argv[1]).glob('*.whl'):\n"
            "    s3.upload_file(str(w), 'fleet', 'wheels/' + w.name)",
            house,
        ],
        env=env,
    )
    script = userdata(env, origin, 60, "s3://fleet/wheels/")
    host, root, done, instance_env = run_instance(lab, "i1", script, python, tmp_path)
    log = (root / "bootstrap.log").read_text()
    assert done.returncode == 0, log + done.stderr[-3000:]
    assert "instance i-i1 in eu-west-1 at " + host.ip in log  # identity came from IMDSv2
    version = subprocess.run([python, "-V"], capture_output=True, text=True).stdout.strip()
    assert f"installing swarm-artifacts 0.1.0 into {PREFIX} with " in log
    assert "from s3://fleet/wheels/" in log
    wheels = len(list(house.glob("*.whl")))
    assert f"{wheels} wheels read from s3://fleet/wheels/" in log
    assert version in log  # the venv is the instance's Python's, not the tests'
    venv_python = root / "opt" / "swarm-artifacts" / "bin" / "python"
    assert os.readlink(venv_python).endswith(python.name) or venv_python.resolve() == python
    assert (root / "usr-local-bin" / "swarm").is_symlink()
    placed = root / "srv" / "app" / "index.db"
    assert hashlib.sha256(placed.read_bytes()).digest() == hashlib.sha256(src.read_bytes()).digest()
    # the daemon outlives the script and seeds: a second instance gets it from peers only
    status = host.run(
        [
            BIN / "python",
            "-c",
            (
                "import json; from pathlib import Path;"
                "from swarm.agent.client import DaemonClient;"
                f"print(json.dumps(DaemonClient(Path({str(root / 'swarm-home')!r})).call('GET',"
                "'/v1/artifacts')))"
            ),
        ],
        env=instance_env,
    )
    (artifact,) = json.loads(status.stdout)["artifacts"]
    assert artifact["state"] == "seeding"
    peer_env = {
        **env,
        "SWARM_HOME": str(tmp_path / "peer-home"),
        "SWARM_COORDINATOR": f"http://{origin.ip}:7070",
        "SWARM_CATALOG": "s3://fleet/catalog/",
    }
    peer = lab.host("i2", 200, 200)
    fetched = peer.run(
        [
            BIN / "swarm",
            "fetch",
            "index.db",
            tmp_path / "peer.db",
            "--listen",
            peer.ip,
            "--source",
            "peers",
            "--json",
        ],
        env=peer_env,
        timeout=90,
    )
    assert json.loads(fetched.stdout.splitlines()[-1])["bytes_by_source"]["peers"] >= SIZE


def test_userdata_deadline_exits_7_and_logs_why(lab: Lab, stack, wheelhouse, tmp_path: Path):
    origin, env, _ = stack
    house, python = wheelhouse
    origin.set_rates(1, 1000)  # the origin crawls: 8 MiB at 1 Mbit takes over a minute
    script = userdata(env, origin, 3, str(house))  # a wheelhouse on the instance's disk
    _, root, done, _ = run_instance(lab, "slow", script, python, tmp_path)
    log = (root / "bootstrap.log").read_text()
    assert done.returncode == 7, log
    assert f"installing swarm-artifacts 0.1.0 into {PREFIX}" in log
    assert "deadline of 3s passed" in log


def test_origin_seeder_user_data_installs_and_seeds_the_catalog(
    lab: Lab, stack, wheelhouse, tmp_path: Path
):
    """seeders/origin-user-data.sh's kind of script (rendered for this stack): install,
    then `swarm-seeder origin` pulls the catalog from S3 and seeds it to new nodes."""
    origin, env, _ = stack
    house, python = wheelhouse
    script = render_origin(
        "s3://fleet/catalog/",
        coordinator=f"http://{origin.ip}:7070",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        wheelhouse=str(house),
    )
    _, root, done, _ = run_instance(lab, "seeder", script, python, tmp_path)
    log = (root / "bootstrap.log").read_text()
    assert done.returncode == 0, log + done.stderr[-3000:]
    assert "origin seeder started: seeding the catalog s3://fleet/catalog/" in log
    peer_env = {
        **env,
        "SWARM_HOME": str(tmp_path / "peer-home"),
        "SWARM_COORDINATOR": f"http://{origin.ip}:7070",
        "SWARM_CATALOG": "s3://fleet/catalog/",
    }
    peer = lab.host("new", 200, 200)
    fetched = peer.run(
        [BIN / "swarm", "fetch", "index.db", tmp_path / "new.db", "--listen", peer.ip,
         "--source", "peers", "--json"],
        env=peer_env,
        timeout=90,
    )  # fmt: skip
    assert json.loads(fetched.stdout.splitlines()[-1])["bytes_by_source"]["peers"] >= SIZE
