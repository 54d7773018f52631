"""Peer ranking: which peers an announce hands back, best first (pure, deterministic).

:func:`rank_peers` ranks a swarm exactly for one requester; a large swarm is ranked once
per ``RANK_PERIOD`` (:func:`build_ranking`) and each announce served a window of it
(:func:`serve_ranking`, :func:`pick_candidates`), so an announce costs O(numwant) however
large the swarm (issue 12). The peer stores (:mod:`swarm.coordinator.memorystore`,
:mod:`swarm.coordinator.redisstore`) call these.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from swarm.coordinator.reports import PeerRecord
from swarm.coordinator.tracker import Announce

SPARE_BUCKET: Final = 1 << 20
"""Spare upload capacities within the same MiB/s rank equal (see :func:`rank_peers`)."""


def rank_peers(
    candidates: Iterable[PeerRecord],
    requester: bytes,
    limit: int,
    requester_addr: tuple[str, int] | None = None,
    spare: Mapping[tuple[str, int], float] | None = None,
) -> list[PeerRecord]:
    """Choose up to ``limit`` peers to hand to ``requester``. Pure; deterministic.

    Order, by sort key ``(not seeder, -spare_bucket, left, spread(requester, peer_id))``:

    1. seeders (``left == 0``) first: they can serve every piece;
    2. then by spare upload capacity (``spare``: bytes/s of headroom per ``(ip, port)``
       from the nodes' reports, peak upload EMA minus current; unknown peers count as
       0), in buckets of ``SPARE_BUCKET`` bytes/s so that noise between two similar
       peers does not decide; a peer with idle upload serves a newcomer sooner;
    3. then leechers by fewest bytes ``left``: the most progress, so the most pieces to
       share. ``left`` rather than ``downloaded``: ``downloaded`` restarts at zero when a
       client resumes and counts discarded bytes, ``left`` does neither;
    4. ties by ``spread``, a hash of the requester's and the candidate's peer ids: each
       requester sees its own stable order, so a hundred new nodes do not all dial the
       same first five seeders.

    ``uploaded`` is deliberately not a key: favouring the biggest uploader sends every
    requester to the peer that is already busiest.

    Edge cases: the requester itself (same peer id, or same ``requester_addr``, as after
    a client restart with a new id) is never returned; ``limit <= 0`` returns ``[]``.
    """
    if limit <= 0:
        return []
    eligible = [
        peer
        for peer in candidates
        if peer.peer_id != requester
        and (requester_addr is None or (peer.ip, peer.port) != requester_addr)
    ]
    headroom = spare or {}

    def key(peer: PeerRecord) -> tuple[bool, int, int, bytes]:
        bucket = int(headroom.get((peer.ip, peer.port), 0.0) // SPARE_BUCKET)
        return (not peer.seeder, -bucket, peer.left, _spread(requester, peer.peer_id))

    eligible.sort(key=key)
    return eligible[:limit]


def _spread(requester: bytes, candidate: bytes) -> bytes:
    return hashlib.blake2b(requester + candidate, digest_size=8).digest()


def pick_candidates(
    ranked: Sequence[PeerRecord],
    runs: Sequence[tuple[int, int]],
    requester: bytes,
    want: int,
) -> list[PeerRecord]:
    """Up to ``want`` peers from ``ranked`` (a swarm sorted by :func:`class_key`, with
    ``runs`` the ``[start, end)`` spans of equal keys): whole classes from the best down,
    then, from the first class that does not fit, a window of it that starts at an
    offset given by the requester's id. So each requester still gets its own stable
    slice of a thousand equal seeders (the spread of :func:`rank_peers`) without the
    whole swarm being sorted for it."""
    out: list[PeerRecord] = []
    for start, end in runs:
        size = end - start
        room = want - len(out)
        if size <= room:
            out.extend(ranked[start:end])
        else:
            offset = int.from_bytes(_spread(requester, b"window"), "big") % size
            picked = [ranked[start + (offset + k) % size] for k in range(room)]
            out.extend(picked)
        if len(out) >= want:
            break
    return out


def class_key(peer: PeerRecord, spare: Mapping[tuple[str, int], float]) -> tuple[bool, int, int]:
    """:func:`rank_peers`' order without its per-requester tie-break."""
    bucket = int(spare.get((peer.ip, peer.port), 0.0) // SPARE_BUCKET)
    return (not peer.seeder, -bucket, peer.left)


def build_ranking(
    peers: Iterable[PeerRecord], spare: Mapping[tuple[str, int], float]
) -> tuple[list[PeerRecord], list[tuple[int, int]]]:
    """A swarm sorted by :func:`class_key` (then peer id), and the spans of equal keys."""
    ranked = sorted(peers, key=lambda p: (*class_key(p, spare), p.peer_id))
    keys = [class_key(p, spare) for p in ranked]
    runs: list[tuple[int, int]] = []
    start = 0
    for index in range(1, len(ranked) + 1):
        if index == len(ranked) or keys[index] != keys[start]:
            runs.append((start, index))
            start = index
    return ranked, runs


def serve_ranking(
    ranked: Sequence[PeerRecord],
    runs: Sequence[tuple[int, int]],
    live: Mapping[bytes, PeerRecord],
    a: Announce,
    ip: str,
) -> list[PeerRecord]:
    """``a.numwant`` peers for ``a``'s sender from a ranking (:func:`pick_candidates`),
    each as its current record in ``live`` (the ranking may be a second old), never the
    sender itself (by id or by address)."""
    out = []
    for peer in pick_candidates(ranked, runs, a.peer_id, a.numwant + 2):
        record = live.get(peer.peer_id)
        if (
            record is None
            or record.peer_id == a.peer_id
            or (record.ip, record.port)
            == (
                ip,
                a.port,
            )
        ):
            continue
        out.append(record)
        if len(out) == a.numwant:
            break
    return out
