from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.swarmnet import Swarm


@pytest.fixture
def fleet(env: dict[str, str], tmp_path: Path, artifact: Path) -> Iterator[Swarm]:
    """A coordinator on loopback and the published ``index.db``; nodes via ``fleet.node(i)``."""
    with Swarm(tmp_path / "fleet", env) as swarm:
        (tmp_path / "fleet").mkdir()
        swarm.start_coordinator()
        yield swarm
