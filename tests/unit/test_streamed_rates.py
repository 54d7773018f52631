"""The coordinator measures a node's S3 rate from the bytes its reader received as they
streamed in (``s3_streamed``), not from ``bytes_by_source``, which moves a whole piece
at a time (swarm/coordinator/handlers.py, ``plan_origin``)."""

from __future__ import annotations

import base64

import pytest

from swarm.coordinator.handlers import plan_origin
from swarm.coordinator.origin import StripePlanner
from swarm.coordinator.rates import update_rates
from swarm.coordinator.reports import parse_report

MiB = 1 << 20
PIECES = 128


def _report(at: float, stored: int, streamed: int | None) -> dict[str, object]:
    artifact: dict[str, object] = {
        "info_hash": "ab" * 20,
        "name": "x",
        "size": PIECES * MiB,
        "have_bytes": stored,
        "complete": False,
        "bytes_by_source": {"s3": stored, "peers": 0},
        "down_rate": 0,
        "up_rate": 0,
        "elapsed": at,
        "piece_size": MiB,
        "piece_count": PIECES,
        "pieces": base64.b64encode(bytes(PIECES // 8)).decode(),
    }
    if streamed is not None:
        artifact["s3_streamed"] = streamed
    return {"node": "n1", "addr": "10.0.0.1:6881", "artifacts": [artifact]}


@pytest.mark.parametrize(
    ("streamed", "rate"),
    [
        # two GETs completed four pieces each within the second: 8 MiB stored, of which
        # 1.5 MiB had come over the link in the second before
        ((int(1.5 * MiB), 8 * MiB), 6.5 * MiB),
        ((None, None), 8.0 * MiB),  # a node that sends no streamed counter: whole pieces
    ],
)
def test_s3_rates_follow_the_bytes_as_they_streamed(
    streamed: tuple[int | None, int | None], rate: float
) -> None:
    planner = StripePlanner()
    plan_origin(planner, parse_report(_report(0.0, 0, streamed[0])), 0.0, 1.0)
    second = parse_report(_report(1.0, 8 * MiB, streamed[1]))
    _, (rates,), _ = plan_origin(planner, second, 1.0, 1.0)
    assert rates.s3_now == pytest.approx(rate)
    assert rates.down_peak == pytest.approx(rate)


@pytest.mark.parametrize("counter", ["s3_streamed", "s3_early"])
def test_a_streamed_counter_is_a_non_negative_integer(counter: str) -> None:
    body = _report(0.0, 0, 0)
    body["artifacts"][0][counter] = -1  # type: ignore[index]
    with pytest.raises(ValueError, match=counter):
        parse_report(body)
    body["artifacts"][0][counter] = 3 * MiB  # type: ignore[index]
    assert getattr(parse_report(body).artifacts[0], counter) == 3 * MiB


@pytest.mark.parametrize(
    ("busy", "sample"),
    [
        (0.4, 6 * MiB / 0.4),  # swarm fetch's early GET: 6 MiB in 0.4 s, a sample
        (0.05, 0.0),  # too short to tell
        (None, 0.0),  # a node that sends no busy seconds
    ],
)
def test_a_first_report_with_s3_bytes_over_reading_seconds_is_a_sample(
    busy: float | None, sample: float
) -> None:
    first = update_rates(None, {"s3": 6 * MiB, "peers": 0}, 0.0, 10.0, s3_busy=busy)
    assert first.s3_now == pytest.approx(sample)
    assert first.s3_peak == pytest.approx(sample)
    assert first.down_peak == pytest.approx(sample)
    # the next interval counts from it, as before
    after = update_rates(first, {"s3": 14 * MiB, "peers": 0}, 0.0, 11.0, s3_busy=(busy or 0) + 1)
    assert after.s3_now == pytest.approx(8 * MiB)
