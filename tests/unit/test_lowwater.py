"""The S3 body reads' low-water mark (:class:`swarm.sources.s3.LowWater`): a read never
waits for bytes that will not come, and only the body's last bytes are read unbatched."""

from __future__ import annotations

import pytest

from swarm.sources.s3 import OVERTAKEN_CHECK, READ_BUFFER_SLACK, RECV_LOWAT, LowWater


def reads(body: int, slice_size: int = OVERTAKEN_CHECK) -> list[tuple[int, int, int]]:
    """(body bytes left, asked, mark) for each read of a ``body``-byte body read in
    ``slice_size`` slices, as :func:`swarm.sources.s3.read_exactly` asks them."""
    water, left, out = LowWater(None), body, []
    while left:
        wanted = min(slice_size, left)
        while wanted:
            ask = water.next_read(left, wanted)
            assert 0 < ask <= wanted
            out.append((left, ask, water.mark))
            left, wanted = left - ask, wanted - ask
    return out


@pytest.mark.parametrize("body", [1, 5000, 64 << 10, 300 << 10, 1 << 20, 4 << 20, 16 << 20])
def test_no_read_waits_for_more_than_the_socket_will_still_receive(body):
    """Every receive inside a read (the buffered reader receives until it has all it
    asked) polls for the mark: the kernel must still have the mark to come at the last
    of them, even with a TLS record of the body held in user space."""
    for left, ask, mark in reads(body):
        in_kernel = left - TLS_HELD  # OpenSSL may hold a partly received record
        last_receive_sees = in_kernel - ask + 1  # at least one byte of the ask is left
        assert mark <= max(1, last_receive_sees), (left, ask, mark)


TLS_HELD = 16384 + 256
"""The most body bytes OpenSSL holds out of the kernel's queue: a TLS record less one
byte (16 KiB of plaintext) and its overhead."""


def test_far_from_the_end_reads_ask_whole_slices_at_the_full_mark():
    out = reads(4 << 20)
    far = [(left, ask, mark) for left, ask, mark in out if left >= 3 * RECV_LOWAT]
    assert far and all(ask == OVERTAKEN_CHECK and mark == RECV_LOWAT for _, ask, mark in far)


def test_only_the_last_bytes_are_read_without_a_mark():
    unbatched = sum(ask for _, ask, mark in reads(4 << 20) if mark == 1)
    assert 0 < unbatched <= 2 * READ_BUFFER_SLACK
