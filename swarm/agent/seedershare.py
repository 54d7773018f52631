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

Before its connections show it any other new node (no share can be dealt yet), a node
pulls one piece, by an order of its own, from one seeder (:func:`first_pull`).

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
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from http.client import HTTPException
from itertools import compress

import libtorrent as lt

from swarm.agent.pieceserver import PieceClient
from swarm.agent.registry import Artifact
from swarm.agent.udpchoice import piece_ranks, udp_wanted
from swarm.sources.peers import TorrentSession

log = logging.getLogger(__name__)

SHARE_INTERVAL = 0.25
"""Seconds between looks at the peers' bitfields: a piece's owner announces it, and the
others may ask for it at once (a piece takes ~0.2 s at a quarter of existing seeders'
rates from a peer)."""

RETAKE_SECONDS = 10.0
"""A piece pulled and still not held this long after is pulled again (a bad copy fails
libtorrent's SHA-1 check and is dropped; without this the node would hold the seeders
off for it for ever). A piece takes ~1.3 s at a quarter of existing seeders' rates."""


@dataclass(frozen=True)
class Share:
    """This node's part of the pieces only the seeders hold (:func:`split`)."""

    left: set[int]
    """Pieces it leaves to the other new nodes whose share they are."""
    own: set[int]
    """Its own share of them (those it lacks)."""


def split(
    missing: Iterable[int],
    new_nodes: Mapping[str, Sequence[bool]],
    own_address: str,
) -> Share:
    """Of ``missing``, the pieces no new node holds (``new_nodes``: a connected new node's
    address -> its bitfield), dealt by rank: piece ``i`` is this node's when ``i % count
    == rank``. Both parts empty when it sees no other new node, or when its own share is
    all in and no new node holds anything it lacks (it then takes everything it lacks
    from whoever has it: an owner it does not see, or one gone, would leave it waiting)."""
    addresses = sorted({*new_nodes, own_address})
    count, rank = len(addresses), addresses.index(own_address)
    if count < 2:
        return Share(set(), set())
    # one pass per bitfield, in C (the loop runs every SHARE_INTERVAL, on every piece)
    at_new_nodes = set().union(*(compress(range(len(b)), b) for b in new_nodes.values()))
    missing = list(missing)
    seeders_only = [i for i in missing if i not in at_new_nodes]
    others = {i for i in seeders_only if i % count != rank}
    if len(others) == len(seeders_only) == len(missing):  # own share in, nothing at nodes
        return Share(set(), set())
    return Share(others, set(seeders_only) - others)


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


def own_order(pieces: Iterable[int], own_address: str, count: int) -> list[int]:
    """``pieces`` (of ``count``) in an order of this node's own: by the hash of address and
    piece that deals UDP pulls among a region (:func:`.udpchoice.piece_ranks`). Not
    sorted by a CRC of address and piece: CRC-32 is linear, so nodes whose addresses
    differ in a few bits got nearly the same order (in one run two of eight nodes made the
    same first pulls, and three shared a piece)."""
    ranks = piece_ranks(own_address, count)
    return sorted(pieces, key=ranks.__getitem__)


def to_pull(share: Share, nodes: int, own_address: str, count: int) -> list[int]:
    """What this node pulls from the seeders, in order: its own share; once that is in,
    the last of the others' (``left``: no more than one a node), each node in an order of
    its own. A share comes in at what its owner's downlink leaves beside its peer
    connections: at a quarter of existing seeders' rates most were in 11-12 s into the
    fetch and one 17 s (its last eight pieces at ~1 a second, the seeders' uplinks idle
    meanwhile), and every new node waited on it."""
    if share.own:
        return sorted(share.own)
    if len(share.left) > nodes:
        return []
    return own_order(share.left, own_address, count)


def first_pull(
    missing: Iterable[int], seeders: Iterable[str], own_address: str, count: int
) -> tuple[str, int] | None:
    """What a node pulls before it sees any other new node, when no share can be dealt
    yet: one piece, the first of its own order (:func:`own_order`), from one seeder that
    piece's rank picks (None: nothing missing, or no seeder). Once: a node that sees no
    other (the only new one) leaves the rest to libtorrent, which is not held off the
    seeders meanwhile.

    The first view comes with the node's connections to the other new nodes, 0.4-0.6 s
    after the plan that named the seeders in existing seeders' runs, and the seeders'
    uplinks idled until then. Existing seeders at a quarter of the rates, alternating
    with the code before (session 47, a temporary toggle; one piece per seeder then, in
    the CRC order of :func:`own_order`'s docstring, and no test of S3's distance): 26.71,
    26.77, 27.16, 26.08, 26.13, 26.95 s (mean 26.63) against 26.42, 27.64, 26.79, 27.70,
    27.44, 27.34 (27.22), the nodes' first MB 1.02-1.13 s after the launch against
    1.12-1.53. One piece from one seeder rather than one from each: each seeder's uplink
    is shared by half the new nodes' first GETs (two seeders), so a first piece is whole
    sooner and relayed sooner; three alternating pairs against one from each: 26.09,
    26.08, 26.36 s (median nodes 25.11-25.52) against 26.70, 25.90, 26.49 (25.69-25.85).
    (Those pairs ordered pieces and picked the seeder by a shuffle seeded by the address;
    :func:`own_order` uses the UDP source's hash since, not measured in a fleet apart.)

    Only where S3 is near (the round trip the S3 reader measured before its first GET;
    a seeder's own is known only once connected). In far-region the seeders sit beside
    S3, 100 ms and 0.5% loss away, where UDP carries the WAN and a TCP pull runs at a
    lossy long-RTT flow's rate: with the first pulls there, 8.10, 9.90, 8.26, 8.58 s
    against 7.77, 7.77, 8.24, 8.99 (four alternating pairs)."""
    ranks, choices = piece_ranks(own_address, count), sorted(seeders)
    piece = min(missing, key=ranks.__getitem__, default=None)
    if piece is None or not choices:
        return None
    return choices[ranks[piece] % len(choices)], piece


def seeders_held(share: Share, released: bool) -> bool:
    """Whether libtorrent is kept off the seeders: while this node's own share comes in
    from them, and never again once it came (``released``).

    While shares are pulled the seeders' uplinks carry pieces no new node holds, not
    libtorrent's picks. Once its own share is in, a node lets libtorrent at the seeders
    for any piece some new node holds (the others' shares stay left to their owners):
    holding them off until every share was in left them idle. Existing seeders at a
    quarter, one kept run: the seeders sent 0.7-4 MB/s each of their 6.1 from 11 to 18
    s while the last shares came in at their owners' downlinks, and the nodes behind
    got 4-5 MB/s of 6.1 from their peers. Alternating runs (session 45): existing
    seeders at a quarter 27.0 s mean against 27.5 (ten pairs, seven of them without the
    rule below), at full rates 8.41 against 8.57 (three, without it); far-region 8.12
    against 7.88 (eight, five without it; one run at 9.17).
    Not held again for a piece dealt to it later (who is connected changed): a hold
    closes its libtorrent connections to the seeders, and in far-region's logs nodes
    were held off again for two pieces 1.3-1.8 s after they had let the seeders back."""
    return bool(share.own) and not released


@dataclass(frozen=True)
class PieceAccess:
    """The fleet's piece servers (:mod:`swarm.agent.pieceserver`): their port (every
    node's) and the fleet token."""

    port: int
    token: str


class SharePuller:
    """Pulls this node's share of the seeders-only pieces from the seeders' piece servers:
    a thread per seeder, one GET at a time on one connection, each taking the next piece
    of the share nobody took (a piece is taken once: handed to libtorrent, which checks
    its SHA-1 and shares it, it is not held at once, and the share is looked at again
    only every :data:`SHARE_INTERVAL`)."""

    def __init__(self, artifact: Artifact, access: PieceAccess) -> None:
        self.artifact = artifact
        self.access = access
        self.seeders: set[str] = set()
        self.wanted: list[int] = []
        self.taken: dict[int, float] = {}
        """Pieces a GET was sent for, and when: taken again after :data:`RETAKE_SECONDS`
        if still not held (libtorrent found a bad one, or dropped it)."""
        self.gone: set[str] = set()
        """Seeders that could not serve (no server, refused, gone): pulled from no more."""
        self._lock = threading.Lock()
        self._changed = threading.Event()

    @property
    def failed(self) -> bool:
        """No seeder serves: libtorrent takes the share (the seeders are given back)."""
        return bool(self.seeders) and self.gone >= self.seeders

    def add_seeders(self, seeders: Iterable[str]) -> None:
        """Pull from these seeders too (a thread each)."""
        for seeder in sorted(set(seeders) - self.seeders):
            self.seeders.add(seeder)
            threading.Thread(
                target=self._run, args=(seeder,), daemon=True, name=f"seeder-pull-{seeder}"
            ).start()

    def want(self, pieces: Iterable[int]) -> None:
        """Pull ``pieces`` from now on, in their order."""
        with self._lock:
            self.wanted = list(pieces)
        self._changed.set()

    def _take(self) -> int | None:
        now = time.monotonic()
        with self._lock:
            for index in self.wanted:
                taken = self.taken.get(index)
                if taken is not None and now - taken < RETAKE_SECONDS:
                    continue
                if not self.artifact.sink.have(index):
                    self.taken[index] = now
                    return index
        return None

    def _run(self, seeder: str) -> None:
        artifact = self.artifact
        info_hash = artifact.manifest.info_hash
        client = PieceClient(seeder, self.access.port, self.access.token)
        index: int | None = None
        try:
            while artifact.fetching and not artifact.cancel.is_set():
                index = self._take()
                if index is None:
                    self._changed.clear()
                    self._changed.wait(SHARE_INTERVAL)
                    continue
                data = client.get(info_hash, index)
                if data is None or not artifact.sink.offer(index, data, "peers"):
                    raise OSError(f"piece {index} not served")
        except (OSError, HTTPException) as error:
            with self._lock:
                self.gone.add(seeder)
                if index is not None:
                    self.taken.pop(index, None)  # another seeder's thread takes it now
            log.warning("%s: seeder %s serves no pieces over TCP (%s): %s",
                        artifact.manifest.name, seeder, error,
                        "libtorrent takes the share" if self.failed
                        else "the other seeders' threads pull its pieces")  # fmt: skip
        finally:
            client.close()


def share_seeders(
    session: TorrentSession,
    artifact: Artifact,
    own_address: str,
    access: PieceAccess | None = None,
) -> None:
    """Keep libtorrent to this node's share of the pieces only seeders hold and, with the
    fleet's piece servers (``access``), pull that share from the seeders with libtorrent
    held off them, until the fetch ends (a thread of its own, started when a plan first
    names seeders)."""
    try:
        _share(session, artifact, own_address, access)
    except (KeyError, RuntimeError):  # the torrent went meanwhile
        return
    finally:
        with contextlib.suppress(KeyError, RuntimeError):
            session.hold_off(artifact.info_hash, ())
    with contextlib.suppress(KeyError, RuntimeError):
        session.leave_to_owners(artifact.info_hash, set())


def _share(
    session: TorrentSession, artifact: Artifact, own_address: str, access: PieceAccess | None
) -> None:
    state = session.torrents[artifact.info_hash]
    seeders = set(artifact.seeders)
    puller = SharePuller(artifact, access) if access is not None else None
    kept, holding, released, first_decided = 0, False, False, False
    while artifact.fetching and not state.all_held():
        seeders.update(artifact.seeders)
        peers = [
            (peer.ip[0], bool(peer.flags & lt.peer_info.seed), peer.pieces)
            for peer in state.handle.get_peer_info()
        ]
        new_nodes = new_nodes_among(peers, seeders, own_address)
        missing = artifact.sink.missing()
        share = split(missing, new_nodes, own_address)
        left = share.left
        session.leave_to_owners(artifact.info_hash, left)
        hold, pending = False, len(left) + len(share.own)
        if puller is not None and not puller.failed and not new_nodes:
            hold = holding  # no view of the fleet for now (connections come and go)
            if not first_decided:  # no share yet, and the seeders' uplinks idle until one
                first_decided = True
                first = first_pull(missing, seeders, own_address, state.count)
                if first is not None and not udp_wanted(artifact.s3_round_trip()):  # S3 near
                    seeder, piece = first
                    log.info("%s: piece %d from seeder %s before a share is dealt",
                             artifact.manifest.name, piece, seeder)  # fmt: skip
                    puller.add_seeders([seeder])
                    puller.want([piece])
        elif puller is not None and not puller.failed:
            first_decided = True  # a share before any first pulls: none
            puller.add_seeders(seeders)
            puller.want(to_pull(share, len(new_nodes) + 1, own_address, state.count))
            hold = seeders_held(share, released)
            released = released or (holding and not hold)
        if hold != holding:
            holding = hold
            session.hold_off(artifact.info_hash, seeders if holding else ())
            if not holding:  # the filter dropped them from libtorrent's peer list
                port = session.listen_port
                session.dial(artifact.info_hash, tuple((seeder, port) for seeder in seeders))
            log.info("%s: seeders %s (%d pieces at them only)", artifact.manifest.name,
                     "held off for the shares" if holding else "back", pending)  # fmt: skip
        if len(left) != kept:
            log.debug(
                "%s: %d pieces left to %d other new nodes (%d missing)",
                artifact.manifest.name, len(left), len(new_nodes), len(missing),
            )  # fmt: skip
            kept = len(left)
        if artifact.cancel.wait(SHARE_INTERVAL):
            return


def start(
    session: TorrentSession,
    artifact: Artifact,
    own_address: str,
    access: PieceAccess | None = None,
) -> None:
    threading.Thread(
        target=share_seeders,
        args=(session, artifact, own_address, access),
        daemon=True,
        name=f"seeder-share-{artifact.manifest.name}",
    ).start()
