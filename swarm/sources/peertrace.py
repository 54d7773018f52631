"""A trace of every torrent's peer connections, a line per torrent a second: for finding
why one node of a fleet downloads slower than the others.

Off unless the daemon's environment sets ``SWARM_TRACE_PEERS=1`` (``swarm fetch``
passes its environment to the daemon it starts; ``bench/fleet.py --trace-peers`` sets
it on every node). The lines go to the daemon's log, on the logger ``swarm.trace.peers``:

    trace 0213e8ec: held 37/128 down 2350 up 4909 kB/s peers' payload 15.5 MB, 11 pieces
    asked (279 blocks in) | 10.0.0.6:6881 45p useful 15 down 803 up 811 reqs 102 asked 0
    I-i- | ...

(the torrent by the first characters of its info-hash; what peers have sent it so far,
and libtorrent's download queue: the pieces asked of peers and their blocks received,
which S3 tops up rather than reads again: :mod:`swarm.agent.topup`)

per peer: its address, ``seed`` or the pieces it holds (``Np``), how many of those this
node lacks (``useful``), libtorrent's payload rates from and to it (kB/s), the block
requests this node has outstanding at it (``reqs``: libtorrent sizes that queue by
``request_queue_time`` of the peer's rate, at least two) and those it asked of this node
(``asked``), and four flags, a dash where one is not set (libtorrent's ``peer_info``
flags): ``I`` this node is interested in the peer's pieces, ``C`` this node chokes the
peer, ``i`` the peer is interested in this node's, ``c`` the peer chokes this node.
Session 42 found so that a late node's queues to three of its peers had stayed at two
blocks for 20 s, every peer unchoking it.

With each round of lines comes one for the session, what libtorrent counted of the
payload it received for nothing (bytes since the daemon began, :data:`WASTE_COUNTERS`):

    session: waste redundant 6455296 unknown 5505024 end_game 507904 seed 442368 ...
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, Final

import libtorrent as lt

from swarm.sources.blocks import BLOCK_WRITING

log = logging.getLogger("swarm.trace.peers")

TRACE_ENV: Final = "SWARM_TRACE_PEERS"
TRACE_INTERVAL: Final = 1.0
"""Seconds between two lines of one torrent."""


WASTE_COUNTERS: Final = (
    ("redundant", "net.recv_redundant_bytes"),
    ("unknown", "ses.waste_piece_unknown"),
    ("end_game", "ses.waste_piece_end_game"),
    ("seed", "ses.waste_piece_seed"),
    ("timed_out", "ses.waste_piece_timed_out"),
    ("cancelled", "ses.waste_piece_cancelled"),
    ("closing", "ses.waste_piece_closing"),
)
"""libtorrent's session counters of payload received for nothing: ``redundant`` in all,
then by reason. ``unknown``: blocks that came for a request this node no longer had
(libtorrent cancelled it when another peer, or S3 through ``add_piece``, completed the
piece first, and the peer had sent the block already); ``end_game``: a block another
peer had already sent while the piece was still downloading (end game's duplicate
requests); ``seed``: blocks that came once the node held everything. Session 56 read so
what the swarm-bound fleet's redundant bytes at full rates are: 25-65 MB a run (eight
nodes, fourteen runs), 73-95% of them ``unknown``, more where the nodes read more from
S3 (29 MB with the origin at 1.9 F, 61-65 MB at 3.2-3.4 F), a node's last second among
them; ``end_game`` 2-4 MB."""


def enabled() -> bool:
    """Whether this process's environment asks for the trace."""
    return os.environ.get(TRACE_ENV, "").strip() not in ("", "0")


def _flags(flags: int) -> str:
    marks = (
        (lt.peer_info.interesting, "I"),
        (lt.peer_info.choked, "C"),
        (lt.peer_info.remote_interested, "i"),
        (lt.peer_info.remote_choked, "c"),
    )
    return "".join(mark if flags & bit else "-" for bit, mark in marks)


def describe(handle: Any) -> str:
    """One torrent's line (see the module docstring): its status and its peers'."""
    status = handle.status()
    mine = status.pieces
    queue = handle.get_download_queue()
    received = sum(
        1 for piece in queue for block in piece["blocks"] if block["state"] >= BLOCK_WRITING
    )
    parts = [
        f"held {status.num_pieces}/{len(mine)} down {status.download_payload_rate / 1e3:.0f} "
        f"up {status.upload_payload_rate / 1e3:.0f} kB/s peers' payload "
        f"{status.total_payload_download / 1e6:.1f} MB, {len(queue)} pieces asked "
        f"({received} blocks in)"
    ]
    for peer in handle.get_peer_info():
        theirs = peer.pieces
        useful = sum(1 for have, held in zip(theirs, mine, strict=False) if have and not held)
        holds = "seed" if peer.flags & lt.peer_info.seed else f"{peer.num_pieces}p"
        parts.append(
            f"{peer.ip[0]}:{peer.ip[1]} {holds} useful {useful} "
            f"down {peer.down_speed / 1e3:.0f} up {peer.up_speed / 1e3:.0f} "
            f"reqs {peer.download_queue_length} asked {peer.upload_queue_length} "
            f"{_flags(peer.flags)}"
        )
    return " | ".join(parts)


def describe_waste(values: Mapping[str, int]) -> str:
    """The session's line (see the module docstring) from a ``session_stats_alert``'s
    values (counter name to value, as the binding gives them)."""
    return "waste " + " ".join(f"{label} {values.get(name, 0)}" for label, name in WASTE_COUNTERS)
