"""A new node's share of the pieces only the seeders hold.

Beside nodes that hold the whole artifact (existing seeders, named in the coordinator's
first plans), the seeders' uplinks are how a piece first enters the new fleet, and each
new node's libtorrent asks them for the rarest pieces: the same pieces, since to each node
every piece no other new node has announced is equally rare. In existing seeders at full
rates the seeders sent ~3 F; at a quarter, from the middle of the fetch on, the new
nodes' uplinks idled (15-20 of their 50 MB/s sent) while every node waited for the pieces
only the seeders held.

So each new node takes from the seeders only its share of those pieces: piece ``i`` is
this node's when ``i % count == rank``, its rank among the ``count`` new nodes it sees
(itself and its connected peers that are not seeders, by address). Libtorrent is kept
from the others (priority 0) until some new node holds one; then it comes from whichever
peer libtorrent picks. A node whose share is all in, with nothing it lacks held by a new
node, takes the rest too: an owner it does not see (views of who is connected differ) or
one gone would otherwise leave it waiting.

Nodes behind one address count once (on loopback every node is one new node: nothing is
kept back).

Existing seeders at a quarter of the rates, alternating with the code before: 28.85-29.46
s against 31.95-34.43 (three pairs). The seeders still send pieces some new node holds:
libtorrent picks by piece, not by peer, and once a node has more partial pieces than 1.5x
its peers it finishes those first from any peer, seeders too (traced with the priority-7
trial below: a node's share waited 10 s while its seeder connections brought others'
pieces). Tried, not kept: its
own share at priority 7 (libtorrent halves availability at 4-6, so a piece one new node
holds ties with one only seeders hold), 29.76-29.81 s against 29.40-31.32 (two pairs);
libtorrent's ``whole_pieces_threshold`` at 0 besides, 28.5-31.9 s (four runs).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from itertools import compress

import libtorrent as lt

from swarm.agent.registry import Artifact
from swarm.sources.peers import TorrentSession

log = logging.getLogger(__name__)

SHARE_INTERVAL = 0.25
"""Seconds between looks at the peers' bitfields: a piece's owner announces it, and the
others may ask for it at once (a piece takes ~0.2 s at a quarter of existing seeders'
rates from a peer)."""


def left_to_owners(
    missing: Iterable[int],
    new_nodes: Mapping[str, Sequence[bool]],
    own_address: str,
) -> set[int]:
    """The pieces this node leaves to other new nodes: of ``missing``, those no new node
    holds (``new_nodes``: a connected new node's address -> its bitfield) and that are
    another's share. Empty when its own share is all in and no new node holds anything
    it lacks (it then takes everything it lacks from whoever has it)."""
    addresses = sorted({*new_nodes, own_address})
    count, rank = len(addresses), addresses.index(own_address)
    if count < 2:
        return set()
    # one pass per bitfield, in C (the loop runs every SHARE_INTERVAL, on every piece)
    at_new_nodes = set().union(*(compress(range(len(b)), b) for b in new_nodes.values()))
    missing = list(missing)
    seeders_only = [i for i in missing if i not in at_new_nodes]
    others = {i for i in seeders_only if i % count != rank}
    if len(others) == len(seeders_only) == len(missing):  # own share in, nothing at nodes
        return set()
    return others


def new_nodes_among(
    peers: Iterable[tuple[str, bool, Sequence[bool]]], seeders: set[str], own_address: str
) -> dict[str, Sequence[bool]]:
    """The connected new nodes' bitfields, by address, of ``peers`` (address, holds every
    piece, bitfield). ``seeders`` (the plans' holders) gains every peer that holds every
    piece: a first plan may name one seeder of two, and the other, counted as a new node
    holding every piece, left no piece at the seeders only (existing seeders at a quarter
    of the rates, a log line per second: 8 "new nodes" with 7 connected, nothing dealt
    for the whole fetch)."""
    peers = list(peers)
    seeders.update(address for address, complete, _ in peers if complete)
    return {
        address: pieces
        for address, _, pieces in peers
        if address not in seeders and address != own_address
    }


def share_seeders(session: TorrentSession, artifact: Artifact, own_address: str) -> None:
    """Keep libtorrent to this node's share of the pieces only seeders hold, until the
    fetch ends (a thread of its own, started when a plan first names seeders)."""
    try:
        _share(session, artifact, own_address)
    except (KeyError, RuntimeError):  # the torrent went meanwhile
        return
    with contextlib.suppress(KeyError, RuntimeError):
        session.leave_to_owners(artifact.info_hash, set())


def _share(session: TorrentSession, artifact: Artifact, own_address: str) -> None:
    state = session.torrents[artifact.info_hash]
    seeders = set(artifact.seeders)
    kept = 0
    while artifact.fetching and not state.all_held():
        seeders.update(artifact.seeders)
        peers = [
            (peer.ip[0], bool(peer.flags & lt.peer_info.seed), peer.pieces)
            for peer in state.handle.get_peer_info()
        ]
        new_nodes = new_nodes_among(peers, seeders, own_address)
        missing = artifact.sink.missing()
        left = left_to_owners(missing, new_nodes, own_address)
        session.leave_to_owners(artifact.info_hash, left)
        if len(left) != kept:
            log.debug(
                "%s: %d pieces left to %d other new nodes (%d missing)",
                artifact.manifest.name, len(left), len(new_nodes), len(missing),
            )  # fmt: skip
            kept = len(left)
        if artifact.cancel.wait(SHARE_INTERVAL):
            return


def start(session: TorrentSession, artifact: Artifact, own_address: str) -> None:
    threading.Thread(
        target=share_seeders,
        args=(session, artifact, own_address),
        daemon=True,
        name=f"seeder-share-{artifact.manifest.name}",
    ).start()
