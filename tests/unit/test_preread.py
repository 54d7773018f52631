"""The handover rule of swarm fetch's preread: which pieces on their way it waits for."""

from __future__ import annotations

from swarm.agent.preread import _Flight

MiB = 1 << 20


def _flight(got: int, since: float) -> _Flight:
    flight = _Flight(MiB)
    flight.got, flight.since = got, since
    return flight


def test_a_piece_is_waited_for_only_if_it_lands_by_the_deadline_at_its_rate() -> None:
    # half of it in 0.2 s: the rest takes 0.2 s more
    assert _flight(MiB // 2, since=0.0).lands_by(deadline=0.5, now=0.2)
    assert not _flight(MiB // 2, since=0.0).lands_by(deadline=0.3, now=0.2)
    # a slow origin's piece, a tenth in a second: dropped at once, not read on for 9 s
    assert not _flight(MiB // 10, since=0.0).lands_by(deadline=1.5, now=1.0)
    assert _flight(MiB, since=0.0).lands_by(deadline=0.0, now=1.0)  # in, being written
    assert not _flight(0, since=0.0).lands_by(deadline=10.0, now=0.1)  # no byte yet


def test_a_piece_slower_than_slow_piece_ends_the_preread() -> None:
    """Existing seeders at a quarter: sixteen reads on a 12.5 Mbit origin, 10 s a piece."""
    assert _flight(MiB // 40, since=0.0).too_slow(now=0.25)  # 10 s for the piece
    assert not _flight(MiB // 2, since=0.0).too_slow(now=0.25)  # 0.5 s for it
    assert not _flight(0, since=0.0).too_slow(now=0.1)  # too soon to judge
