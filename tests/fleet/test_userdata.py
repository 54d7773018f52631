"""`swarm userdata` for real: the generated script runs as root in a namespace host,
reads its identity from an IMDSv2 stand-in, fetches from the local stack, keeps seeding."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import CREDENTIALS
from tests.fleet.conftest import STACK_SIZE as SIZE
from tests.netlab import Lab, wait_for
from tests.servers import BIN

STANDIN = Path(__file__).with_name("imds_standin.py")


def start_imds(host, region: str = "eu-west-1") -> None:
    host.run(["ip", "addr", "add", "169.254.169.254/32", "dev", "lo"])
    host.run(["ip", "link", "set", "lo", "up"])
    host.popen([sys.executable, STANDIN, region, f"i-{host.name}", host.ip])
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


def userdata(env: dict[str, str], origin, deadline: float) -> str:
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
    env: dict[str, str],
    tmp_path: Path,
    up: float = 200,
    down: float = 200,
):
    host = lab.host(name, up, down)
    start_imds(host)
    root = tmp_path / name
    root.mkdir()
    (root / "user-data.sh").write_text(script)
    # /srv/app/index.db inside the script lands under ROOT: the test runs it in a
    # private mount namespace with ROOT bind-mounted on /srv (nothing on the host changes).
    (root / "srv").mkdir()
    instance_env = {
        "PATH": f"{BIN}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(root),
        "SWARM_HOME": str(root / "swarm-home"),
        "SWARM_BOOTSTRAP_LOG": str(root / "bootstrap.log"),
        "SWARM_NO_SYSTEMD": "1",
        "SWARM_CONFIG": str(root / "none.toml"),
        **CREDENTIALS,
    }
    wrapped = f"mount --bind {root / 'srv'} /srv && exec bash {root / 'user-data.sh'}"
    done = host.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", wrapped],
        env=instance_env,
        timeout=120,
        check=False,
    )
    return host, root, done, instance_env


def test_userdata_bootstraps_an_instance_and_it_seeds(lab: Lab, stack, tmp_path: Path):
    origin, env, src = stack
    host, root, done, instance_env = run_instance(
        lab, "i1", userdata(env, origin, 60), env, tmp_path
    )
    log = (root / "bootstrap.log").read_text()
    assert done.returncode == 0, log
    assert "instance i-i1 in eu-west-1 at " + host.ip in log  # identity came from IMDSv2
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


def test_userdata_deadline_exits_7_and_logs_why(lab: Lab, stack, tmp_path: Path):
    origin, env, _ = stack
    origin.set_rates(1, 1000)  # the origin crawls: 8 MiB at 1 Mbit takes over a minute
    _, root, done, _ = run_instance(lab, "slow", userdata(env, origin, 3), env, tmp_path)
    log = (root / "bootstrap.log").read_text()
    assert done.returncode == 7, log
    assert "deadline of 3s passed" in log
