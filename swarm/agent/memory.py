"""The daemon's allocator settings: piece-sized buffers reused, not mapped afresh.

Every piece a daemon reads from S3 is copied into buffers of a piece's size on its way
into libtorrent (``add_piece``: the binding's ``std::string`` and ``std::vector``), one
allocation each per piece. glibc serves such sizes with ``mmap`` (its threshold starts at
128 KiB) and gives them back on free, and trims its thread arenas' free tops back to the
kernel at 128 KiB: each piece then touched fresh pages, which the kernel faults in and
zeroes. In the swarm-bound fleet (``perf record -a``), page faults were 11% of the
daemons' CPU samples (``clear_page_erms`` 4.9%), most under ``add_piece_bytes``. With
the settings below they were 2.3%; in alternating runs the swarm-bound fleet's CPU per
node and GiB fell 13% (12.6 against 14.4 CPU-s, five pairs), s3-fast's 5% (seven pairs),
and a daemon's peak RSS on a 2 GiB fetch was 83 MiB against 115 (fewer arenas).
"""

from __future__ import annotations

import ctypes
import logging
from typing import Final

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD: Final = -1
M_MMAP_THRESHOLD: Final = -3
M_ARENA_MAX: Final = -8
"""``mallopt`` parameters (glibc's ``malloc.h``)."""

MMAP_THRESHOLD: Final = 32 << 20
"""Allocations up to this size come from the arenas, reused once freed: twice the largest
piece (``swarm.pieces.MAX_PIECE_SIZE``), within glibc's largest threshold on 64-bit."""
TRIM_THRESHOLD: Final = 32 << 20
"""Free memory an arena keeps at its top before giving it back: a few pieces' buffers."""
ARENA_MAX: Final = 4
"""Arenas at most (glibc's default: eight per core), which bounds what they keep free
together to ``ARENA_MAX * TRIM_THRESHOLD`` (128 MiB) on top of what is in use."""


def keep_piece_buffers() -> bool:
    """Apply the settings to this process's glibc allocator; False where there is none
    (musl, another libc: its defaults stand)."""
    try:
        # the process's own symbols (the interpreter links libc), not find_library's
        # ldconfig subprocess at every daemon start
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    applied = all(
        mallopt(param, value) == 1
        for param, value in (
            (M_MMAP_THRESHOLD, MMAP_THRESHOLD),
            (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
            (M_ARENA_MAX, ARENA_MAX),
        )
    )
    if not applied:
        log.info("malloc settings not applied (not glibc?): the allocator's defaults stand")
    return applied
