"""The daemon's S3 reader for one artifact: reads what the plan says, batch by batch.

Its body runs under a :class:`~swarm.agent.supervisor.SourceTask`; it returns when the
artifact is complete and raises what S3 answered otherwise (the supervisor decides
whether to try again). The batch choice is pure (:mod:`swarm.batch`,
:class:`~swarm.agent.hybrid.LocalOriginPolicy`); this module only moves bytes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable

from swarm.agent.direct import DirectSink
from swarm.agent.downloadqueue import IN_FLIGHT_TTL, InFlight, partly_received, queued
from swarm.agent.holdwatch import BEHIND_SHARE, BehindWatch
from swarm.agent.hybrid import LocalOriginPolicy, TorrentSink, stripe_offset
from swarm.agent.registry import Artifact
from swarm.agent.topup import TopUps
from swarm.agent.udpchoice import s3_far
from swarm.batch import (
    TAIL_FILL_PIECES,
    Batch,
    BatchKind,
    all_missing,
    kept_from_peers,
    planned_batch,
    tail_from_s3,
)
from swarm.messages import OriginPlan
from swarm.policy import Mode
from swarm.sources.peers import TorrentSession
from swarm.sources.s3 import S3Source, S3SourceConfig
from swarm.sources.s3width import GetWidth
from swarm.sources.torrentstate import CHECKING, TorrentState

log = logging.getLogger(__name__)

ORIGIN_GRACE = 1.0
"""Seconds a new fetch waits for peers before it reads the origin: long enough for the
first announce and handshakes on a LAN, short enough not to matter when there are none."""

ORIGIN_BATCH_BYTES = 32 << 20
"""Bytes read from S3 per local decision; the choice is made again after each batch."""

STRIPE_RANGE = 4 << 20
"""Range size of stripe, WIDE and ALL reads (rounded to whole pieces): a stripe is read
as several GETs in flight. Each is a TCP flow, and a node's downlink is shared per flow
with its peer connections (one 16 MiB GET got an eighth of the link against 7 peers).
Under ALL, the whole-file SHA-256 follows the file's prefix: eight 16 MiB GETs side by
side completed it only at the end, and the hash of all of it (0.1 s for 128 MiB) came
after the last byte. Not smaller: every GET costs a first-byte latency on S3 (tens of ms;
AWS advises 8-16 MiB)."""

DIRECT_BATCH_SECONDS = 4.0
"""A batch's direct share (held from peers as a whole) is at most this many seconds of
S3 at the plan's rate. Read 32 pieces at a time, it held them from peers for as long
as S3 took: after an origin fell to an eighth of its rate (the mixed fleet at a quarter,
the plans' S3 rate then 0.17-0.58 MB/s a reader), batches of 13-19 pieces, 30-100 s
each."""

PEERS_FINISH_SECONDS = 2.0
"""When the plan goes ALL, the pieces peers had partly sent are left to libtorrent to
complete for this long (:meth:`PiecePriorities.upload_only`'s ``finishing``); S3 reads
everything else first, and whatever of them is still missing after it, or once it has
nothing else to read. Not in the fetch's tail (:func:`swarm.batch.tail_from_s3`)."""

LANDING_SECONDS = 0.5
"""When the plan goes ALL, the blocks peers had already sent of the pieces libtorrent had
asked them for land after its cancels (libtorrent keeps them): the S3 reader leaves
those pieces alone for this long, then leaves the ones that got blocks to peers too, as
the pieces partly sent at the switch (:data:`PEERS_FINISH_SECONDS`). Read from S3 they
were whole pieces written past libtorrent, and the blocks peers had sent went for
nothing: 1.3-3.4 MB a node in s3-fast at a quarter of its rates."""

PLAN_TTL = 3.0
"""A coordinator plan older than this (three missed reports) is stale: the node decides
alone, on its own samples, with the same policy (:mod:`swarm.policy`)."""


def _either(first: Callable[[], bool] | None, second: Callable[[], bool]) -> Callable[[], bool]:
    """A batch's ``stop``: ``first`` (if any) or ``second`` says so."""
    return second if first is None else lambda: first() or second()


def writing_directly(artifact: Artifact, state: TorrentState) -> DirectSink | None:
    """The sink through which the reader writes the file itself from now on
    (:mod:`.direct`); None while libtorrent is still looking at the file (its check
    would race the writes)."""
    if artifact.direct is None:
        status = state.status
        if status is None or status.state in CHECKING:
            # Asked now rather than waiting for the alert loop's statuses: the first one
            # after the torrent was added often left it out, and the next came
            # STATUS_INTERVAL later (s3-fast: a lone node in three waited 0.5 s here).
            status = state.handle.status()
        if status.state in CHECKING:
            return None
        artifact.direct = DirectSink(artifact.sink, artifact.data_path)
    return artifact.direct


def read_origin(
    session: TorrentSession,
    artifact: Artifact,
    node_id: str,
    has_coordinator: bool,
    wake_reporter: Callable[[], object],
    on_retry: Callable[[str | None], None] | None = None,
    expect_peers: bool = True,
) -> None:
    """Read from S3 what the plan says: the coordinator's stripe, everything missing when
    the swarm is too slow (WIDE) or S3 is the only source, or, without a fresh plan, the
    node's own choice. Returns when the artifact is complete."""
    manifest, sink = artifact.manifest, artifact.sink
    state = session.torrents[manifest.info_hash]
    client = artifact.client

    shapes = {  # (most GETs in flight, range size) per kind of batch: see ``widths``
        BatchKind.ALL: (8, STRIPE_RANGE),
        BatchKind.STRIPE: (8, STRIPE_RANGE),
        BatchKind.WIDE: (8, STRIPE_RANGE),
        # a fill is one piece, or in the fetch's tail every missing one, a GET each at once
        # (swarm.batch.TAIL_FILL_PIECES): not measured, the tail lasts a fraction of a
        # width's measure
        BatchKind.FILL: (TAIL_FILL_PIECES, manifest.piece_size),
    }

    def received() -> int:
        """Pieces the node holds, from any source (what more GETs must raise)."""
        return len(artifact.direct.held() if artifact.direct is not None else state.held)

    # A width per kind of batch, kept across the fetch's batches: under a stripe or WIDE
    # peers share the node's link, under ALL they do not, so a width that paid under one
    # says nothing of the other.
    widths: dict[BatchKind, GetWidth | None] = {
        kind: GetWidth(received, concurrency) if kind is not BatchKind.FILL else None
        for kind, (concurrency, _) in shapes.items()
    }

    upload_only = False
    peers_finish_until = 0.0  # see PEERS_FINISH_SECONDS
    landing: set[int] = set()  # see LANDING_SECONDS
    landing_until = 0.0
    s3_behind = threading.Event()  # S3 fell behind a plan's rate (swarm.agent.holdwatch)

    far_said = False  # what s3_is_far last said (it logs each change)

    def s3_is_far() -> bool:
        """S3 is in another region (its round trip: :meth:`Artifact.s3_round_trip`, which
        may yet find a far figure taken through a full queue near after all)."""
        nonlocal far_said
        rtt = artifact.s3_round_trip()
        if rtt is None:
            return False  # nothing answered: not known to be far
        far = s3_far(rtt)
        if far and not far_said:
            log.info("S3 is %.0f ms away: ALL plans are for nodes near it (own policy "
                     "here), and its reads hold nothing back from peers", rtt * 1e3)  # fmt: skip
        elif far_said and not far:
            log.info("S3 is near after all (%.2f ms, the least round trip on this node's "
                     "connections to it): the coordinator's plans are taken",
                     rtt * 1e3)  # fmt: skip
        far_said = far
        return far

    def retrying(reason: str | None) -> None:
        nonlocal upload_only
        if reason is not None and upload_only:
            # S3 falters under ALL: peers may fill the file meanwhile (a passing outage
            # must not idle the node until the reader gives up, ~25 s of backoff)
            with contextlib.suppress(KeyError, RuntimeError):
                session.upload_only(manifest.info_hash, False)
            upload_only = False
        if on_retry is not None:
            on_retry(reason)

    def leave_all() -> None:
        """ALL is over here: peers feed this node again and get what it read under ALL
        (libtorrent, which knew none of it, does not fetch it again). Done only with a
        batch to read, it never was after a stripe that gave S3 nothing (all missing
        pieces held by nodes upload-only): the fleet waited on itself."""
        nonlocal upload_only
        was_upload_only, upload_only = upload_only, False
        if was_upload_only:
            session.upload_only(manifest.info_hash, False)
        shared = artifact.direct.share() if artifact.direct is not None else 0
        if was_upload_only or shared:
            log.info("ALL is over here: peers feed this node again; %d pieces read from "
                     "S3 handed to libtorrent", shared)  # fmt: skip

    def fresh_plan() -> OriginPlan | None:
        fresh = time.monotonic() - artifact.plan_at < artifact.plan_ttl
        return artifact.plan if fresh else None

    def all_taken_back() -> bool:
        """A fresh plan is no longer ALL (the coordinator saw S3 slow down under it)."""
        plan = fresh_plan()
        return plan is not None and plan.mode != Mode.ALL

    def all_given() -> bool:
        """A fresh plan says ALL (S3 feeds every node at link speed)."""
        plan = fresh_plan()
        return plan is not None and plan.mode == Mode.ALL

    def wide_done() -> bool:
        """A fresh plan says ALL, or no longer WIDE once S3 fell behind a plan (see read)."""
        plan = fresh_plan()
        if plan is None:
            return False
        return plan.mode == Mode.ALL or (s3_behind.is_set() and plan.mode != Mode.WIDE)

    def read(batch: Batch, planned: bool, yield_to_udp: bool = True) -> None:
        # Once the reader writes into the file itself, it goes on doing so (libtorrent
        # learns of those pieces when the verified file is handed to it), except for a
        # plan's batch other than ALL: that one is for sharing, and goes through
        # libtorrent, which has been handed the pieces written before (DirectSink.share).
        sharing = planned and batch.kind is not BatchKind.ALL
        direct = artifact.direct
        target: TorrentSink | DirectSink = direct if direct is not None and not sharing else sink
        config = S3SourceConfig(*shapes[batch.kind])
        # An ALL batch is everything missing: read to its end, it kept the node on a
        # slowed S3, upload-only, whatever the coordinator said meanwhile. It stops at its
        # next piece once the plan is no longer ALL. A WIDE or stripe batch stops once
        # the plan is ALL: read to its end (32 pieces), a WIDE one kept s3-fast's nodes up
        # to two seconds longer on libtorrent's path and their peers after the
        # coordinator said ALL; a stripe (2 s of the node's S3 rate as it read alone,
        # read at a third of it beside peers) up to four at a quarter of its rates. A
        # WIDE one also stops once the plan narrows after S3 fell behind a plan
        # (swarm.agent.holdwatch): its pieces are mostly ones peers hold, and read to its
        # end on the s3-slows bench's origin (an eighth of its rate 10 s in) a WIDE batch
        # begun 3 s in ran 44 s, taking the slowed origin from the pieces nobody held.
        # Not on any narrowing: in the mixed fleet at a quarter the narrowed nodes then
        # finished last (39.82, 39.73 s against 38.08, 35.31; two pairs).
        wide = planned and batch.kind is BatchKind.WIDE
        stop = None
        if planned and batch.kind is BatchKind.ALL:
            stop = all_taken_back
        elif wide:
            stop = wide_done
        elif planned and batch.kind is BatchKind.STRIPE:
            stop = all_given
        if yield_to_udp:  # and any batch stops once UDP carries the WAN (see below)
            stop = _either(stop, artifact.udp_carries_wan)
        # A planned batch's pieces are kept from peers while S3 brings them
        # (swarm.batch.kept_from_peers says which), except where S3 is far: across 100 ms
        # and 0.5% loss, held-back pieces of a direct share kept far-region's nodes
        # waiting 9-17 s on S3 while peers and UDP held them.
        # Nor once S3 has fallen behind a plan in this fetch (swarm.agent.holdwatch): the
        # plans' S3 estimate decays over tens of seconds, and each batch held on it again
        # would keep its pieces from peers until the watch gave them back.
        room = kept_from_peers(batch, planned) and not s3_is_far() and not s3_behind.is_set()
        held_back = [i for i in batch.pieces if not sink.have(i)] if room and target is sink else []
        # Pieces not held back for the batch are for each GET: from its start to its end,
        # peers may not bring them (their blocks already asked for still come). Not past
        # libtorrent (nothing of it comes from peers), nor for a far S3 (as above; asked
        # at the first GET: far-region's readers start none), nor for the coordinator's
        # WIDE: it reads the pieces peers hold first (swarm.agent.hybrid.wide_pieces), so
        # its GETs' pieces (eight GETs of four) are pieces peers could send, kept from
        # them for as long as a shared origin takes to bring them. In the mixed fleet at
        # a quarter of its rates the nodes that read WIDE batches 4-10 s in had 4-6 MB
        # from peers by 10 s against 16-31 for the others (one run traced, `--keep`);
        # the fleet's last node finished 2-7 s after its median in such runs. Six
        # alternating pairs there (``bench/fleet.py --systems swarm --scenario mixed
        # --rate-scale 0.25``): 34.46-36.58 s (mean 35.31) against 34.71-38.01 (36.41);
        # slow uploads at a quarter 36.81, 37.08 against 40.50, 38.33; swarm-bound at a
        # quarter, where these holds began (a node counted 9.6 MB of peers' blocks of
        # pieces S3 brought first), 24.51-26.02 (mean 25.44) against 24.28-28.20
        # (25.63); mixed at full rates unchanged. A peer that brings a piece first cuts
        # the GET short.
        per_get = not room and target is sink and not wide
        plan = fresh_plan()
        watched = bool(held_back) or wide
        expected = (plan.s3_estimate or 0.0) if watched and plan is not None else 0.0

        def hold(pieces: list[int], on: bool) -> None:
            with contextlib.suppress(KeyError, RuntimeError):  # the torrent went meanwhile
                session.hold_back(manifest.info_hash, pieces, on)

        def reading(pieces: list[int], on: bool) -> None:
            if (per_get or (s3_behind.is_set() and not wide)) and not s3_is_far():
                hold(pieces, on)

        def fell_behind() -> None:
            # from here on each GET keeps only its own pieces from peers, and WIDE batches
            # stop once the plan narrows
            s3_behind.set()
            hold([i for i in held_back if not sink.have(i)], False)
            then = (
                "WIDE reads stop once the plan narrows"
                if wide
                else f"{len(held_back)} pieces held for it given back to peers"
            )
            log.info("S3 gives less than %.0f%% of the plan's %.0f kB/s: %s",
                     BEHIND_SHARE * 100, expected / 1e3, then)  # fmt: skip

        artifact.s3_busy.start()
        try:
            session.hold_back(manifest.info_hash, held_back, True)
            with BehindWatch(lambda: artifact.s3_streamed.total, expected, fell_behind):
                reader = S3Source(
                    client,
                    manifest,
                    target,
                    artifact.cancel,
                    config,
                    on_retry=retrying,
                    width=widths[batch.kind],
                    streamed=artifact.s3_streamed.add,
                    overtaken=artifact.s3_overtaken.add,
                    reading=reading if per_get or held_back else None,
                )
                # pieces peers have partly sent: their blocks kept, the rest from S3
                with TopUps(client, manifest, artifact.data_path, target, batch.pieces,
                            in_flight.finished(), artifact.s3_streamed.add,
                            artifact.cancel) as top_ups:  # fmt: skip
                    reader.fetch(top_ups.whole, stop)
                reader.fetch(top_ups.failed, stop)
        finally:
            artifact.s3_busy.stop()
            hold(held_back, False)

    batch_pieces = max(1, ORIGIN_BATCH_BYTES // manifest.piece_size)
    local = LocalOriginPolicy(stripe_offset(node_id, manifest.layout.count))
    s3_only = "peers" not in artifact.sources
    if not s3_only and has_coordinator:
        wake_reporter()
    s3_is_far()  # measured before the first GET fills the downlink's queue
    if not s3_only and has_coordinator:
        # The coordinator's first plan; reading alone meanwhile would duplicate stripes.
        artifact.plan_updated.wait(PLAN_TTL)
    elif not s3_only and expect_peers and state.finished.wait(ORIGIN_GRACE):
        return
    handle = state.handle
    in_flight = InFlight(handle)
    last_kind: tuple[BatchKind, bool] | None = None  # logged when it changes
    try:
        while not artifact.complete_on_disk() and not artifact.cancel.is_set():
            coming = artifact.coming()  # read by swarm fetch, on their way in
            missing = [i for i in artifact.missing() if i not in coming]
            if not missing:
                # all held (libtorrent is flushing), or the rest on their way in
                state.finished.wait(0.05 if coming else 0.25)
                continue
            repair = artifact.take_repair()
            if repair:  # pieces libtorrent will never keep (swarm.agent.stuck): written here
                direct = writing_directly(artifact, state)
                if direct is None:
                    artifact.ask_repair(repair)  # once libtorrent has looked at the file
                    state.finished.wait(0.05)
                    continue
                held = direct.held()
                read(Batch(BatchKind.FILL, [i for i in repair if i not in held]), False, False)
                continue
            if artifact.udp_carries_wan():
                # S3 is far and UDP brings the region its bytes from the holders, dealt
                # among the region's nodes; S3's reads across the WAN are not dealt, take
                # the downlink the region's exchange needs, and come slowly over a lossy
                # path (see swarm.agent.udpauto.FIND_HOLDER_SECONDS)
                if upload_only:
                    leave_all()
                state.finished.wait(0.1)
                continue
            now = time.monotonic()
            plan = fresh_plan()
            if plan is not None and plan.mode == Mode.ALL and s3_is_far():
                # ALL says S3 fills its readers' links: as nodes near it measured. Taken
                # here it would have this node read everything across a WAN, upload-only,
                # so never connected to the holders UDP and peers pull from (far-region:
                # the far nodes then reported S3's rate as their links' and kept ALL for
                # 71 s against 10). Its own policy decides, as without a plan.
                plan = None
            batch: Batch
            planned = False  # the batch is the coordinator's plan (not the node's choice)
            status = state.status
            alone = not has_coordinator and (status is None or not status.num_peers)
            if s3_only or alone:
                # Nobody to share with (no coordinator to stripe, no peer connected): read all
                # of it at full width, like s5cmd. With a coordinator, its plan decides (and
                # the local policy when the plan is stale: the fleet may still be striping).
                batch = all_missing(missing)
            elif plan is not None:
                planned = True
                held = artifact.direct.held() if artifact.direct is not None else state.held
                held = held | coming if coming else held
                budget = math.ceil(plan.direct * manifest.layout.count) - artifact.direct_pieces
                if plan.s3_estimate:
                    # A direct share is kept from peers as a whole while S3 reads it: no
                    # more of it per batch than S3 brings in DIRECT_BATCH_SECONDS at the
                    # plan's rate (swarm.agent.holdwatch tells why)
                    most = int(plan.s3_estimate * DIRECT_BATCH_SECONDS) // manifest.piece_size
                    budget = min(budget, max(1, most))
                # Pieces read for this node alone (a direct share, WIDE) are chosen among
                # those peers hold and the node has not asked them for: asked of
                # libtorrent now, not a second ago. A node asks its peers for ~25 pieces
                # a second at 200 Mbit, and S3 bringing one of them first makes the
                # peers' blocks already sent redundant: in the swarm-bound fleet
                # libtorrent counted 5.5-23.7 MB a node of blocks it no longer wanted
                # (its ``waste_piece_unknown``), 104 MB of redundant bytes in all; 70 MB
                # with this (one run each). Three alternating pairs there: 7.58-7.70 s
                # against 7.60-8.15.
                fresh = plan.mode == Mode.WIDE or budget > 0
                batch = planned_batch(
                    plan,
                    missing,
                    held,
                    handle.piece_availability(),
                    in_flight(0.0 if fresh else IN_FLIGHT_TTL),
                    local.offset,
                    direct_budget=budget,
                    wide_limit=batch_pieces,
                    leave_in_flight=plan.link_bound,
                )
            else:
                pieces = local.choose(
                    missing,
                    handle.piece_availability(),
                    in_flight(),
                    batch_pieces,
                    piece_size=manifest.piece_size,
                    peers_rate=float(status.download_payload_rate) if status is not None else 0.0,
                    s3_bytes=sink.bytes_by_source.get("s3", 0),
                    now=now,
                )
                kind = BatchKind.WIDE if local.state.mode == "wide" else BatchKind.STRIPE
                batch = Batch(kind, pieces)
            artifact.plan_updated.clear()
            all_from_s3 = plan is not None and not s3_only and batch.kind is BatchKind.ALL
            # whether or not S3 has a batch for this node now (see leave_all); a planned
            # batch also once S3 faltered under ALL (``retrying`` ended upload-only alone)
            if not all_from_s3 and (upload_only or (planned and artifact.direct is not None)):
                leave_all()
            if not batch.pieces:
                artifact.plan_updated.wait(0.25)
                continue
            if all_from_s3:
                # the coordinator's ALL: S3 feeds this node at link speed; peers only take
                # from it (they get what libtorrent holds), and nothing comes twice. Set
                # before waiting on libtorrent's check below, which can take a while.
                if not upload_only:
                    assert plan is not None  # (all_from_s3)
                    s3_rate = plan.s3_estimate or 0.0
                    peers_rate = float(status.download_payload_rate) if status else 0.0
                    tail = tail_from_s3(len(missing) * manifest.piece_size, s3_rate,
                                        peers_rate, LANDING_SECONDS)  # fmt: skip
                    queue = [] if tail else handle.get_download_queue()  # tail: none left
                    finishing = partly_received(queue)
                    landing = queued(queue) - finishing
                    landing_until = now + LANDING_SECONDS
                    peers_finish_until = now + PEERS_FINISH_SECONDS
                    session.upload_only(manifest.info_hash, True, finishing)
                    upload_only = True
                    if finishing:
                        log.info("plan is ALL: %d pieces peers partly sent left to them for "
                                 "%.0f s", len(finishing), PEERS_FINISH_SECONDS)  # fmt: skip
                if all_from_s3 and landing and now >= landing_until:
                    landed = partly_received(handle.get_download_queue()) & landing
                    landing = set()
                    if landed:
                        session.finish_from_peers(manifest.info_hash, landed)
                        peers_finish_until = now + PEERS_FINISH_SECONDS
                        log.info("plan is ALL: %d pieces whose blocks landed after the cancel "
                                 "left to peers", len(landed))  # fmt: skip
                # None once upload-only ended (retrying)
                left_to_peers = state.priorities.peers_finish
                if all_from_s3 and landing:
                    # a batch that ends soon after they land, so that this comes back to them
                    rest = [i for i in batch.pieces if i not in landing][:batch_pieces]
                    if not rest:
                        state.finished.wait(max(0.0, landing_until - now))
                        continue
                    batch = Batch(BatchKind.ALL, rest)
                if all_from_s3 and left_to_peers and now < peers_finish_until:
                    rest = [i for i in batch.pieces if i not in left_to_peers]
                    if rest:
                        batch = Batch(BatchKind.ALL, rest)
                    else:
                        # S3 has nothing else to read: it reads them now rather than idle
                        # while peers finish them (slow uploads' last node waited 2 s on
                        # seven pieces from peers sending 0.6 MB/s each, the origin idle)
                        peers_finish_until = now
            is_all = batch.kind is BatchKind.ALL and not manifest.is_tree
            if is_all and writing_directly(artifact, state) is None:
                state.finished.wait(0.05)  # libtorrent is still looking at the file
                continue
            if (batch.kind, planned) != last_kind:
                log.info("S3 reads: %s batches (%s), first of %d pieces with %d missing",
                         batch.kind.value, "plan" if planned else "own choice",
                         len(batch.pieces), len(missing))  # fmt: skip
                last_kind = (batch.kind, planned)
            read(batch, planned)
            artifact.direct_pieces += batch.direct
            if plan is not None and batch.kind is not BatchKind.FILL:
                wake_reporter()  # report the finished stripe, for the next
                artifact.plan_updated.wait(0.5)
    finally:
        if upload_only:  # peers may help again (a later request, a restart of this reader)
            with contextlib.suppress(KeyError, RuntimeError):
                session.upload_only(manifest.info_hash, False)
