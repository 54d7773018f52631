"""The daemon's allocator settings (swarm.agent.memory), checked in fresh interpreters:
a piece-sized buffer comes from the heap instead of a mapping of its own (which the
kernel faults in and zeroes afresh for every piece)."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

PROBE = """
import sys
if sys.argv[1] == "tuned":
    from swarm.agent import memory
    assert memory.keep_piece_buffers()
size = 8 << 20  # a piece of 8 MiB (pieces go up to 16 MiB)

def big_anonymous_maps():
    count = 0
    for line in open("/proc/self/maps"):
        fields = line.split()
        if len(fields) == 5:  # no path: an anonymous mapping ([heap] is named)
            low, high = (int(x, 16) for x in fields[0].split("-"))
            count += high - low >= size
    return count

before = big_anonymous_maps()
buffer = bytearray(size)
print(big_anonymous_maps() - before)
"""


def new_mappings(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    )
    return int(done.stdout)


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallopt"), reason="not glibc")
def test_piece_buffers_come_from_the_heap_once_tuned() -> None:
    assert new_mappings("default") == 1  # glibc's own threshold: a mapping per buffer
    assert new_mappings("tuned") == 0
