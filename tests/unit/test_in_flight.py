"""The S3 reader's view of the pieces libtorrent is downloading from peers
(swarm.agent.downloadqueue.InFlight): reused for a second, asked afresh when told to."""

from __future__ import annotations

from typing import Any

from swarm.agent.downloadqueue import InFlight


class DownloadQueue:
    """libtorrent's answer to ``get_download_queue`` (a dict per piece in flight), with
    a count of the times it was asked."""

    def __init__(self) -> None:
        self.pieces: list[int] = []
        self.asked = 0

    def get_download_queue(self) -> list[dict[str, Any]]:
        self.asked += 1
        return [{"piece_index": p, "blocks": []} for p in self.pieces]


def test_the_answer_is_reused_unless_a_fresh_one_is_asked_for() -> None:
    handle = DownloadQueue()
    in_flight = InFlight(handle)
    handle.pieces = [3]
    assert in_flight() == {3}
    handle.pieces = [3, 7]
    assert in_flight() == {3}  # a second's reuse: fill reads ask for each piece
    assert handle.asked == 1
    assert in_flight(0.0) == {3, 7}  # a batch for this node alone: the pieces of now
    assert handle.asked == 2
