"""A long fuzz run (``SWARM_FUZZ=long``) outlasts the suite's 300 s per-test timeout
(setup.cfg): one target takes minutes at 20 000 examples on a busy 2-core machine."""

from __future__ import annotations

import pytest

from tests.fuzz import PROFILE

LONG_TIMEOUT = 3600
"""Seconds one target may run in the long profile: a hung parser still fails, eventually."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if PROFILE != "long":
        return
    for item in items:
        item.add_marker(pytest.mark.timeout(LONG_TIMEOUT))
