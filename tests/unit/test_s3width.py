"""The S3 reader's GET width: doubled while doubling raises what the node receives."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from swarm.sources.s3width import (
    GAP_SECONDS,
    REPROBE_SECONDS,
    START_WIDTH,
    WARMUP_SECONDS,
    GetWidth,
)

STEP = 0.05


class Reader:
    """A node's S3 reader on a fake clock: keeps ``width.width`` GETs in flight and
    receives ``rate(width)`` pieces a second, ticking every :data:`STEP` seconds."""

    def __init__(self, rate: Callable[[int], float], cap: int = 8) -> None:
        self.now = 0.0
        self.held = 0.0
        self.rate = rate
        self.width = GetWidth(lambda: int(self.held), cap, clock=lambda: self.now)
        self.in_flight = 0
        self.widths: list[int] = []

    def run(self, seconds: float) -> None:
        for _ in range(round(seconds / STEP)):
            while self.in_flight < self.width.width:  # a thread per range, as S3Source's
                assert self.width.acquire(lambda: False)
                self.in_flight += 1
            while self.in_flight > self.width.width:  # a GET ends; no new one may start
                self.width.release()
                self.in_flight -= 1
            self.now += STEP
            self.held += self.rate(self.in_flight) * STEP
            self.width.tick()
            self.widths.append(self.width.width)

    def pause(self, seconds: float) -> None:
        """Every GET ends (a batch is done) and the reader waits for the next batch."""
        while self.in_flight:
            self.width.release()
            self.in_flight -= 1
        self.now += seconds


def test_flows_limited_each_by_themselves_grow_to_the_cap():
    """S3 gives each connection 10 pieces a second (AWS's per-connection rate, a WAN's
    loss): every doubling pays, up to the cap."""
    reader = Reader(lambda flows: 10.0 * flows, cap=8)
    reader.run(5)
    assert reader.width.width == 8
    assert reader.widths[0] == START_WIDTH


def test_a_full_link_keeps_the_narrow_width_until_the_reprobe():
    """The node's link carries 30 pieces a second however many flows share it (what it
    receives counts every source, so flows that take the link from peers add nothing):
    doubling does not pay, the width goes back to START_WIDTH and stays, then doubles again
    once REPROBE_SECONDS have gone by."""
    reader = Reader(lambda flows: 30.0)
    reader.run(2)
    assert max(reader.widths) == 2 * START_WIDTH
    assert reader.width.width == START_WIDTH
    settled = len(reader.widths)
    reader.run(REPROBE_SECONDS - 1.5)
    assert set(reader.widths[settled:]) == {START_WIDTH}
    reader.run(3)
    assert reader.widths[-1] == START_WIDTH
    assert 2 * START_WIDTH in reader.widths[settled:]


def test_a_gap_between_batches_ends_the_measure():
    """A measure spans only time with every GET in flight: a pause longer than
    GAP_SECONDS (the reader between batches) starts it over, so what peers brought
    meanwhile is not put down to the width under test."""
    reader = Reader(lambda flows: 30.0)
    reader.run(0.75)  # measured at the start width; now at twice it, its measure under way
    assert reader.width.width == 2 * START_WIDTH
    reader.run(WARMUP_SECONDS + 0.1)
    reader.pause(GAP_SECONDS * 3)
    reader.held += 100  # peers filled the node meanwhile
    reader.run(1.0)
    assert reader.width.width == START_WIDTH
    assert max(reader.widths) == 2 * START_WIDTH


def test_a_short_gap_between_two_gets_of_a_thread_does_not():
    """A thread's GET ends and its next starts a moment later: the measure goes on."""
    width = GetWidth(lambda: int(held[0]), 8, clock=lambda: now[0])
    now, held = [0.0], [0.0]
    for _ in range(START_WIDTH):
        width.acquire(lambda: False)
    for step in range(30):
        now[0] += STEP
        held[0] += 1.0
        if step % 5 == 0:  # one GET ends and the next takes its slot at once
            width.release()
            width.acquire(lambda: False)
        width.tick()
    assert width.width == 2 * START_WIDTH


def test_slots_go_in_the_order_they_were_asked_for():
    """The reader's ranges are submitted in the file's order and its whole-file hash
    follows the file's prefix: waiting GETs start in the order they came."""
    width = GetWidth(lambda: 0, 1)
    assert width.acquire(lambda: False)
    started: list[int] = []
    threads = []
    for n in range(4):
        thread = threading.Thread(
            target=lambda n=n: (width.acquire(lambda: False), started.append(n), width.release())
        )
        thread.start()
        threads.append(thread)
        time.sleep(0.05)  # each waits before the next asks
    width.release()
    for thread in threads:
        thread.join(5)
    assert started == [0, 1, 2, 3]


@pytest.mark.parametrize("give_up_after", [0.0, 0.15])
def test_a_waiting_get_gives_up_when_told(give_up_after):
    """A GET waiting for a slot returns False once its fetch stops (no slot taken), and
    the next waiter is not held behind it."""
    width = GetWidth(lambda: 0, 1)
    assert width.acquire(lambda: False)
    deadline = time.monotonic() + give_up_after
    assert not width.acquire(lambda: time.monotonic() >= deadline)
    width.release()
    assert width.acquire(lambda: False)
