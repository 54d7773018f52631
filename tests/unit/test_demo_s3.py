from __future__ import annotations

import pytest

from swarm.demo_s3 import BURST_SECONDS, Pacer, parse_range

MB = 1_000_000


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_pacer_holds_the_rate_over_all_senders_after_a_short_burst():
    time = FakeTime()
    pacer = Pacer(10 * MB, clock=time.clock, sleep=time.sleep)
    pacer.take(MB // 2)  # 50 ms of the rate: within the burst, no wait
    assert time.slept == []
    for _ in range(19):  # 9.5 MB more, from any thread: they queue behind each other
        pacer.take(MB // 2)
    assert time.now - 100.0 == pytest.approx(1.0 - BURST_SECONDS)
    assert pacer.sent == 10 * MB


def test_pacer_without_a_rate_only_counts():
    time = FakeTime()
    pacer = Pacer(0, clock=time.clock, sleep=time.sleep)
    pacer.take(10**12)
    assert time.slept == [] and pacer.sent == 10**12
    with pytest.raises(ValueError, match="rate"):
        Pacer(-1)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("bytes=0-1048575", (0, 1048575)),
        ("bytes=4194304-", (4194304, None)),
        ("bytes = 5-5", (5, 5)),
        ("bytes=-500", None),  # suffix: moto's
        ("bytes=0-1,5-9", None),  # several ranges: moto's
        ("bytes=9-5", None),
        ("items=0-5", None),
        ("bytes=a-b", None),
        ("", None),
    ],
)
def test_only_plain_byte_ranges_take_the_fast_path(header, expected):
    assert parse_range(header) == expected
