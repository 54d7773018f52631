"""The fleet bench's lower bound T* (swarm.lab.fleetdata.FleetConfig.bound), with an
origin that slows partway (the s3-slows scenario) worked out by hand."""

from __future__ import annotations

import pytest

from swarm.lab.fleetdata import FleetConfig
from swarm.lab.scenarios import scenario

F_MBIT = (128 << 20) * 8 / 1e6  # the artifact, in Mbit


def test_a_steady_origin_gives_kumar_and_ross_s_formula() -> None:
    config = FleetConfig(**scenario("mixed", 0.25))  # N F / (u_s + N u) binds
    assert config.bound() == pytest.approx(8 * F_MBIT / (100 + 8 * 25))
    assert config.origin_slows_after() is None


def test_an_origin_that_slows_counts_what_it_sent_before_and_after() -> None:
    config = FleetConfig(**scenario("s3-slows", 0.25))
    steady = 8 * F_MBIT / (100 + 8 * 25)
    slows = 0.35 * steady
    assert config.origin_slows_after() == pytest.approx(slows)
    # the servers' bits by T (100 Mbit until ``slows``, 12.5 after) and the nodes'
    # uploads (8 x 25 Mbit) carry the N F bits: 100 s + 12.5 (T - s) + 200 T = 8 F
    expected = (8 * F_MBIT - 100 * slows + 12.5 * slows) / (12.5 + 200)
    assert config.bound() == pytest.approx(expected, rel=1e-6)
    assert config.bound() > steady


def test_an_origin_that_slows_to_nearly_nothing_binds_on_its_own_bits() -> None:
    # one node, a fast link: only the origin's bits matter, F at 100 Mbit until it
    # slows at half the steady T*, then 1 Mbit
    config = FleetConfig(
        nodes=1, origin_up=100, node_up=100, node_down=1000, origin_slows_at=0.5,
        origin_slow_up=1,
    )  # fmt: skip
    steady = F_MBIT / 100
    assert config.bound() == pytest.approx(steady / 2 + (F_MBIT - 100 * steady / 2) / 1)


def test_a_slowing_origin_needs_its_slowed_rate() -> None:
    with pytest.raises(ValueError, match="origin_slow_up"):
        FleetConfig(origin_slows_at=0.3)


@pytest.mark.parametrize("rate", ["auto", "unlimited", "12M", "1500000"])
def test_the_coordinator_s_origin_rate_takes_what_its_flag_takes(rate: str) -> None:
    assert FleetConfig(origin_rate=rate).origin_rate == rate


@pytest.mark.parametrize("rate", ["fast", "0", "-5M", ""])
def test_a_bad_origin_rate_is_refused_before_any_lab_starts(rate: str) -> None:
    with pytest.raises(ValueError, match=r"give bytes/s|must be above 0"):
        FleetConfig(origin_rate=rate)
