from __future__ import annotations

import subprocess

import pytest

from swarm.bootstrap.userdata import render
from swarm.errors import ManifestError, UsageError


def test_script_is_valid_bash_and_quotes_operator_values():
    script = render(
        "index.db",
        "/var/lib/my app/index.db",
        catalog="s3://b/cat/",
        coordinator="http://10.0.0.5:7070",
        deadline=120,
    )
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert "'/var/lib/my app/index.db'" in script
    assert "X-aws-ec2-metadata-token-ttl-seconds" in script  # IMDSv2: token first
    assert script.index("api/token") < script.index("md placement/region")
    assert "--deadline 120" in script and "exit $rc" in script


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"artifact": "index.db", "dest": "/x", "catalog": None}, UsageError),
        ({"artifact": "../etc", "dest": "/x", "catalog": "s3://b/"}, ManifestError),
        ({"artifact": "index.db", "dest": "relative/x", "catalog": "s3://b/"}, UsageError),
    ],
)
def test_bad_input_is_refused(kwargs, error):
    with pytest.raises(error):
        render(coordinator=None, **kwargs)
