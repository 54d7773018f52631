"""What a fetch's completion line says peers sent for nothing (swarm.agent.completion)."""

from __future__ import annotations

from swarm.agent.completion import peers_for_nothing

MB = 1 << 20


def test_peers_bytes_beyond_the_pieces_they_completed_went_for_nothing() -> None:
    # 128 MiB: S3 kept 100, peers completed the other 28 and sent 31
    assert peers_for_nothing(128 * MB, 31 * MB, 100 * MB, 0) == 3 * MB


def test_udp_pieces_are_not_peers() -> None:
    assert peers_for_nothing(128 * MB, 20 * MB, 100 * MB, 10 * MB) == 2 * MB


def test_exactly_what_peers_completed_wastes_nothing() -> None:
    assert peers_for_nothing(128 * MB, 28 * MB, 100 * MB, 0) == 0


def test_pieces_held_before_the_fetch_never_make_it_negative() -> None:
    # a resumed fetch: 40 MiB were on disk already, counted by no source
    assert peers_for_nothing(128 * MB, 10 * MB, 78 * MB, 0) == 0
