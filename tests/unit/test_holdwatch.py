"""When a held batch's S3 has fallen behind its plan (swarm.agent.holdwatch.behind)."""

from __future__ import annotations

from collections import deque

from swarm.agent.holdwatch import BEHIND_SHARE, WINDOW, behind

MB = 1_000_000


def _samples(rate: float, seconds: float, step: float = 0.25) -> deque[tuple[float, int]]:
    """(time, total bytes) every ``step`` seconds of S3 giving ``rate`` bytes/s."""
    count = int(seconds / step) + 1
    return deque((i * step, int(rate * i * step)) for i in range(count))


def test_not_judged_before_a_window_has_passed() -> None:
    samples = deque([(0.0, 0), (1.0, 0), (1.5, 0)])  # nothing at all yet
    assert not behind(samples, 10 * MB, 1.5)


def test_s3_on_plan_or_a_little_short_of_it_is_not_behind() -> None:
    samples = _samples(0.5 * 10 * MB, 5.0)  # half the plan: a downlink shared with peers
    assert not behind(samples, 10 * MB, 5.0)


def test_s3_well_short_of_the_plan_is_behind() -> None:
    samples = _samples(0.9 * BEHIND_SHARE * 10 * MB, 3.0)
    assert behind(samples, 10 * MB, 3.0)


def test_judged_on_the_last_window_only() -> None:
    # on plan for 10 s, then nothing for a window: behind, though the average is not
    samples = _samples(10 * MB, 10.0)
    total = samples[-1][1]
    samples.extend((10.0 + t, total) for t in (0.5, 1.0, 1.5, WINDOW))
    assert behind(samples, 10 * MB, 10.0 + WINDOW)
    assert samples[0][0] == 10.0  # older samples dropped: the newest a window old stays


def test_no_plan_rate_is_never_behind() -> None:
    assert not behind(_samples(0.0, 5.0), 0.0, 5.0)
