"""The stuck-piece detector (swarm.agent.stuck), on libtorrent's download-queue format."""

from __future__ import annotations

from swarm.agent.stuck import StuckPieces

NONE, REQUESTED, WRITING, FINISHED = 0, 1, 2, 3


def piece(index: int, *states: int) -> dict[str, object]:
    """One entry of ``torrent_handle.get_download_queue()`` as the Python binding gives it."""
    blocks = [{"state": s, "num_peers": 0, "block_size": 16384} for s in states]
    return {"piece_index": index, "blocks_in_piece": len(states), "blocks": blocks}


def test_a_piece_all_written_or_writing_for_the_whole_delay_is_stuck_and_said_once() -> None:
    stuck = StuckPieces(after=10.0)
    queue = [piece(90, WRITING, WRITING), piece(91, FINISHED, WRITING), piece(5, REQUESTED, NONE)]
    assert stuck.update(queue, held=set(), now=0.0) == []
    assert stuck.update(queue, held=set(), now=9.9) == []
    assert stuck.update(queue, held=set(), now=10.0) == [90, 91]
    assert stuck.update(queue, held=set(), now=30.0) == []  # reported once


def test_a_piece_that_moves_on_or_is_kept_is_not_stuck() -> None:
    stuck = StuckPieces(after=10.0)
    assert stuck.update([piece(7, WRITING, WRITING)], held=set(), now=0.0) == []
    # a block asked again (libtorrent reset it): the clock starts over
    assert stuck.update([piece(7, WRITING, REQUESTED)], held=set(), now=5.0) == []
    assert stuck.update([piece(7, WRITING, WRITING)], held=set(), now=6.0) == []
    assert stuck.update([piece(7, WRITING, WRITING)], held=set(), now=15.0) == []
    assert stuck.update([piece(7, WRITING, WRITING)], held=set(), now=16.0) == [7]
    # held pieces (the reader wrote them, or libtorrent kept them) are never stuck
    other = StuckPieces(after=1.0)
    assert other.update([piece(8, FINISHED, FINISHED)], held={8}, now=0.0) == []
    assert other.update([piece(8, FINISHED, FINISHED)], held={8}, now=5.0) == []
