"""bench/fleet.py --env: a setting for every process of a run, past the lab's clean
environment (which drops the caller's SWARM_* and AWS_*), never one the lab sets."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from swarm.lab.fleet import LAB_ENV_NAMES, clean_env

BENCH = Path(__file__).resolve().parents[2] / "bench" / "fleet.py"


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_fleet", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_env_settings_reach_the_run_and_the_lab_drops_the_shells(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SWARM_TRACE_PEERS", "1")  # this shell's: the lab drops it
    assert "SWARM_TRACE_PEERS" not in clean_env()
    _, args = bench().parse_args(
        ["--systems", "swarm", "--env", "SWARM_TRACE_PEERS=1", "--env", "TOGGLE=a=b"]
    )
    assert args.extra_env == {"SWARM_TRACE_PEERS": "1", "TOGGLE": "a=b"}
    # --trace-peers is that same variable, set through the same environment
    _, traced = bench().parse_args(["--systems", "swarm", "--keep", "--trace-peers"])
    assert traced.extra_env == {"SWARM_TRACE_PEERS": "1"}


@pytest.mark.parametrize("item", ["NOVALUE", "=1", "BAD NAME=1", "SWARM_SECRET=x"])
def test_env_refuses_what_it_cannot_set(
    item: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["fleet.py"])
    with pytest.raises(SystemExit) as exit_:
        bench().parse_args(["--systems", "swarm", "--env", item])
    assert exit_.value.code == 2
    assert "--env" in capsys.readouterr().err
    assert "SWARM_SECRET" in LAB_ENV_NAMES and "AWS_ENDPOINT_URL" in LAB_ENV_NAMES
