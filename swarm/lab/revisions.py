"""Another commit's ``swarm`` package, for the fleet bench's ``swarm@REV`` systems.

A change to the fleet path is judged against the code before it, and this machine's
runs of one shape spread by more than most changes move them (mixed at a quarter of its
rates: 35-40 s). So the two are best run in one invocation, alternating
(``bench/fleet.py --systems swarm,swarm@HEAD~1 --repeat 4``), rather than a toggle in
the code or a checkout between runs. :func:`checkout` extracts a commit's package from
this repository's git history once per commit (``git archive``), byte-compiled as an
install has it (see :func:`swarm.lab.fleet.compile_swarm`); a system's nodes, seeders
and coordinator then run it first on ``PYTHONPATH`` (ahead of the venv's editable
install of the working tree). Only ``swarm/`` is taken from the commit: the lab, the
venv's libraries and the baselines are the working tree's.
"""

from __future__ import annotations

import compileall
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import swarm

REVISIONS = Path.home() / ".cache" / "swarm" / "revisions"
"""Where extracted commits are kept, one directory per commit (never changed once made)."""

GIT_TIMEOUT = 60.0


def repository() -> Path:
    """The checkout this ``swarm`` package is imported from."""
    return Path(swarm.__file__).resolve().parents[1]


def _git(*args: str) -> bytes:
    try:
        done = subprocess.run(
            ["git", "-C", str(repository()), *args],
            capture_output=True,
            timeout=GIT_TIMEOUT,
            check=True,
        )
    except FileNotFoundError:
        raise ValueError("git is not installed: swarm@REV needs it") from None
    except subprocess.TimeoutExpired:
        raise ValueError(f"git {args[0]} took over {GIT_TIMEOUT:g} s") from None
    except subprocess.CalledProcessError as error:
        message = error.stderr.decode(errors="replace").strip() or f"exit {error.returncode}"
        raise ValueError(f"git {args[0]}: {message}") from None
    return done.stdout


def commit_of(rev: str) -> str:
    """The full hash of the commit ``rev`` names; ValueError if it names none."""
    try:
        return _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").decode().strip()
    except ValueError:
        raise ValueError(f"{rev!r} is not a commit of {repository()}") from None


def checkout(rev: str) -> Path:
    """A directory whose ``swarm`` is commit ``rev``'s package, byte-compiled: put it first
    on ``PYTHONPATH``. Extracted on first use, then reused."""
    commit = commit_of(rev)
    target = REVISIONS / commit
    if (target / "swarm" / "__init__.py").exists():
        return target
    REVISIONS.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{commit[:12]}-", dir=REVISIONS))
    try:
        archive = _git("archive", "--format=tar", commit, "swarm")
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(staging, filter="data")
        compileall.compile_dir(staging / "swarm", quiet=1)
        try:
            os.rename(staging, target)  # whole or not at all
        except OSError:
            if not (target / "swarm" / "__init__.py").exists():
                raise  # (else another bench extracted it meanwhile)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def python_path(code: Path) -> str:
    """``PYTHONPATH`` with ``code`` first (and this process's own after it)."""
    return os.pathsep.join(part for part in (str(code), os.environ.get("PYTHONPATH")) if part)
