"""The fleet bench's ``swarm@REV`` systems: a commit's swarm package, extracted from git and
run ahead of the working tree's (swarm.lab.revisions)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from swarm.lab import revisions
from swarm.lab.systems import Swarm, SwarmSolo, system

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _revisions_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(revisions, "REVISIONS", tmp_path / "revisions")


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
    ).stdout


def test_a_commits_package_runs_ahead_of_the_working_tree() -> None:
    chosen = system("swarm@HEAD")
    assert isinstance(chosen, Swarm) and chosen.name == "swarm@HEAD"
    code = chosen.code
    assert code is not None and code.parent == revisions.REVISIONS
    assert code.name == _git("rev-parse", "HEAD").strip()
    assert (code / "swarm" / "manifest.py").read_text() == _git("show", "HEAD:swarm/manifest.py")
    assert list(code.glob("swarm/__pycache__/*.pyc")), "byte-compiled, as an install is"
    env = {**os.environ, **chosen.env()}
    shown = subprocess.run(
        [sys.executable, "-c", "import swarm; print(swarm.__file__)"],
        env=env, capture_output=True, text=True, check=True, cwd="/",
    ).stdout.strip()  # fmt: skip
    assert Path(shown) == code / "swarm" / "__init__.py"
    # the second time it is the same directory, and nothing is left half-made beside it
    again = system("swarm-solo@HEAD")
    assert isinstance(again, SwarmSolo) and again.code == code
    assert sorted(p.name for p in revisions.REVISIONS.iterdir()) == [code.name]


def test_the_working_trees_swarm_sets_nothing() -> None:
    assert system("swarm").env() == {}


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("swarm@no-such-revision-anywhere", "is not a commit"),
        ("aria2c@HEAD", "only swarm@REV and swarm-solo@REV"),
        ("swarm@", "only swarm@REV and swarm-solo@REV"),
        ("rsync@HEAD", "unknown system"),
    ],
)
def test_what_names_no_system_is_refused(name: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        system(name)
    assert not revisions.REVISIONS.exists() or not list(revisions.REVISIONS.iterdir())


def test_the_bench_refuses_a_revision_before_it_builds_anything() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "fleet.py"), "--systems",
         "swarm,swarm@no-such-revision-anywhere"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--systems" in done.stderr and "is not a commit" in done.stderr
