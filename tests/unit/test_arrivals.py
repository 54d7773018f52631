"""A torrent's arrivals (:meth:`swarm.sources.torrentstate.TorrentState.note_arrival`): what the
whole-file hasher and the end of a fetch wait on instead of polling."""

from __future__ import annotations

import threading

from swarm.sources.torrentstate import TorrentState


def test_a_waiter_wakes_when_a_piece_arrives_not_at_its_timeout():
    state = TorrentState("ab" * 20, handle=None)
    seen = state.arrivals
    woke = threading.Event()

    def wait() -> None:
        state.wait_arrival(seen, 60.0)
        woke.set()

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    assert not woke.wait(0.2)  # nothing arrived: it waits
    state.note_arrival()
    assert woke.wait(10.0)  # woken by the arrival, long before its 60 s
    waiter.join(10.0)


def test_an_arrival_noted_before_the_wait_is_not_missed():
    """The waiter reads the count, looks at the pieces, then waits: a piece stored in
    between must not leave it asleep."""
    state = TorrentState("cd" * 20, handle=None)
    seen = state.arrivals
    state.note_arrival()
    done = threading.Event()

    def wait() -> None:
        state.wait_arrival(seen, 60.0)
        done.set()

    threading.Thread(target=wait, daemon=True).start()
    assert done.wait(10.0)
