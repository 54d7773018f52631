"""An artifact's last steps in the daemon: hash it while it downloads, verify the whole
file, put it at DEST and seed it; repair what libtorrent loses on the way; after a
restart, seed what was verified once libtorrent has checked it again.

The whole-file hash and the move to DEST are :mod:`.finisher`'s (:mod:`.treefs`'s for a
directory); this module runs them for the daemon (:class:`Completion`), a thread per
artifact.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from swarm.agent import finisher, registry, treefs
from swarm.agent.hybrid import TorrentSink
from swarm.agent.registry import Artifact
from swarm.errors import IntegrityError, SwarmError
from swarm.sources.peers import TorrentSession
from swarm.sources.torrentstate import CHECKING

log = logging.getLogger(__name__)

REPAIR_ROUNDS = 3
"""Whole-file checks of a fetch whose own S3 writes failed it (each round reads the
pieces that fail their SHA-1 again)."""

CANCEL_POLL = 0.25
"""Seconds between looks at the cancel flag while a fetch waits for its last pieces (an
arriving piece wakes it at once)."""


class Completion:
    """The daemon's finishing of its artifacts. ``extra_peers``: the peers to connect a
    re-added torrent to (the daemon's list of the moment); ``start_source``: (re)start
    one of an artifact's sources (the S3 reader, to repair pieces); ``verified``: told
    when an artifact is verified (the daemon reports at once: until its next report the
    coordinator counts it as fetching, and a node that starts meanwhile was planned as
    part of the finished cohort, WIDE beside seeders it did not know of)."""

    def __init__(
        self,
        session: TorrentSession,
        home: Path,
        trackers: list[str],
        extra_peers: Callable[[], list[tuple[str, int]]],
        start_source: Callable[[Artifact, str], None],
        verified: Callable[[], object] = lambda: None,
    ) -> None:
        self.session = session
        self.home = home
        self.trackers = trackers
        self.extra_peers = extra_peers
        self.start_source = start_source
        self.verified = verified

    def start(self, artifact: Artifact) -> None:
        """Once per artifact: hash while it downloads, then verify and place it."""
        if artifact.finisher is not None or artifact.verified.is_set():
            return
        if artifact.restored and artifact.was_verified:
            # Verified before the restart: seed once libtorrent has checked it again.
            threading.Thread(
                target=self._seed_restored, args=(artifact,), daemon=True, name="restored"
            ).start()
            return
        artifact.finisher = self._new_finisher(artifact)
        artifact.finisher.start()
        name = f"finish-{artifact.manifest.name}"
        threading.Thread(target=self._finish, args=(artifact,), daemon=True, name=name).start()

    def _new_finisher(self, artifact: Artifact) -> finisher.Finisher:
        state = self.session.torrents[artifact.info_hash]

        def held() -> set[int]:
            return artifact.direct.held() if artifact.direct is not None else state.held

        def hashed() -> None:
            if artifact.direct is not None:  # the S3 reader writes the file: make it durable
                artifact.direct.write_back()

        kind = treefs.TreeFinisher if artifact.manifest.is_tree else finisher.Finisher
        return kind(
            self.session,
            artifact.manifest,
            artifact.data_path,
            artifact.cancel,
            held,
            on_stuck=functools.partial(self._repair, artifact),
            on_hashed=hashed,
        )

    def _repair(self, artifact: Artifact, pieces: list[int]) -> None:
        """libtorrent counts every block of ``pieces`` as written but never keeps them
        (:mod:`.stuck`): the S3 reader writes them into the file itself, outside
        libtorrent; without S3 (or for a tree, which the reader never writes itself),
        libtorrent checks the file again and fetches what it then finds missing."""
        from_s3 = "s3" in artifact.sources and not artifact.manifest.is_tree
        log.warning(
            "%s: libtorrent counts pieces %s as written but does not hold them: %s",
            artifact.manifest.name, pieces,
            "reading them from S3 into the file" if from_s3 else "checking the file again",
        )  # fmt: skip
        if from_s3:
            artifact.ask_repair(pieces)
            self.start_source(artifact, "s3")
            return
        with contextlib.suppress(KeyError, RuntimeError):  # removed meanwhile
            self.session.torrents[artifact.info_hash].handle.force_recheck()

    def _seed_restored(self, artifact: Artifact) -> None:
        """A restored artifact that was verified: seeding once libtorrent has checked it.
        If the check finds pieces missing (an unclean stop lost writes), the file is no
        longer what was verified: it is repaired in place and hashed whole again."""
        state = self.session.torrents[artifact.info_hash]
        while not state.finished.wait(0.25):
            if artifact.cancel.is_set():
                return
            status = state.status
            if status is not None and status.state not in CHECKING and not status.is_seeding:
                log.warning(
                    "%s lost pieces: repairing it, then hashing it again", artifact.manifest.name
                )
                artifact.was_verified = False
                artifact.finisher = self._new_finisher(artifact)
                artifact.finisher.start()
                self._finish(artifact)
                return
        # artifact.identity stands as the restore recorded it: DEST is not locked during
        # the check, and a file put there meanwhile is not the one verified
        artifact.verified.set()

    def _finish(self, artifact: Artifact) -> None:
        """Wait for every piece, check the whole file, put it at DEST, seed it."""
        state = self.session.torrents[artifact.info_hash]
        try:
            for _ in range(REPAIR_ROUNDS):
                while True:
                    seen = state.arrivals
                    if state.finished.is_set() or artifact.complete_on_disk():
                        break
                    if artifact.cancel.is_set():
                        return
                    state.wait_arrival(seen, CANCEL_POLL)
                fin = artifact.finisher
                assert fin is not None
                try:
                    fin.wait()
                    break
                except IntegrityError:
                    direct = artifact.direct
                    if direct is None or not direct.drop_bad():
                        raise
                    # Bytes from S3 went bad on the way: read those pieces again.
                    log.warning(
                        "%s: pieces failed their SHA-1: reading them again", artifact.manifest.name
                    )
                    artifact.finisher = self._new_finisher(artifact)
                    artifact.finisher.start()
                    self.start_source(artifact, "s3")
            if artifact.direct is not None:
                self._adopt(artifact)
            elif artifact.manifest.is_tree:
                if artifact.dest is not None and artifact.data_path != artifact.dest:
                    treefs.place_tree(self.session, artifact, self.trackers, self.extra_peers())
            elif artifact.dest is not None and artifact.data_path != artifact.dest:
                finisher.place(self.session, artifact.info_hash, artifact.data_path, artifact.dest)
                artifact.data_path = artifact.dest
            # placed: the data path is DEST (or the home's file when there is none)
            identity = registry.save_record(
                self.home, artifact.manifest, artifact.data_path, artifact.dest, verified=True
            )
        except IntegrityError as error:
            artifact.failure = (str(error), error.exit_code)
            log.error("%s", error)
        except (SwarmError, OSError, RuntimeError) as error:
            artifact.failure = (f"swarm: cannot place {artifact.manifest.name}: {error}", 1)
            log.error("%s", artifact.failure[0])
        else:
            artifact.identity = identity
            artifact.verified.set()
            self.verified()
            self.session.save_resume(artifact.info_hash)
            log.info("%s verified at %s%s", artifact.manifest.name, artifact.final_path,
                     _received(self.session, artifact))  # fmt: skip
        finally:
            artifact.end_tunings()
            if artifact.lock is not None:
                artifact.lock.release()
                artifact.lock = None

    def _adopt(self, artifact: Artifact) -> None:
        """The S3 reader wrote (some of) the verified file itself: hand the whole file to
        libtorrent, at its final path, in seed mode (see :mod:`.direct`)."""
        direct = artifact.direct
        assert direct is not None
        old = artifact.sink
        # libtorrent's own counters now, not the last status update (up to 0.5 s old): the
        # end of a fetch no longer waits for a poll, and peers' last bytes went uncounted
        before = self.session.torrents[artifact.info_hash].handle.status()
        self.session.remove(artifact.info_hash)
        direct.close()
        final = artifact.final_path
        if final != artifact.data_path:
            os.chmod(artifact.data_path, finisher.DEST_MODE)
            os.replace(artifact.data_path, final)
            finisher.fsync_dir(final.parent)
        state = self.session.add(artifact.manifest, final, self.trackers, seed_mode=True)
        for address in self.extra_peers():
            state.handle.connect_peer(address)
        sink = TorrentSink(self.session, artifact.manifest)
        sink.bytes_by_source, sink.hash_failures = old.bytes_by_source, old.hash_failures
        # what peers gave lives in the old handle's counters: carried (see status.describe)
        sink.bytes_by_source["peers"] = (
            old.bytes_by_source.get("peers", 0) + before.total_payload_download
        )
        artifact.peers_redundant_before += before.total_redundant_bytes
        artifact.sink, artifact.data_path, artifact.direct = sink, final, None


def peers_for_nothing(size: int, peers: int, s3_kept: int, udp_kept: int) -> int:
    """Of ``peers`` bytes received from peers, those outside the pieces they completed
    (every piece S3 and UDP did not bring, ``size`` less what those two kept): blocks
    libtorrent got twice or no longer wanted, and blocks of pieces another source wrote
    whole. Never below 0 (pieces held before the fetch began count as peers')."""
    return max(0, peers - (size - s3_kept - udp_kept))


def _received(session: TorrentSession, artifact: Artifact) -> str:
    """What the fetch received against the artifact's size, for the completion's log line:
    S3's bytes as they streamed in (with those ``swarm fetch`` read while the daemon
    started: ``FetchRequest.s3_read``), peers' payload (with what an earlier handle counted,
    as the status shows it: the verified file is handed to a new one in seed mode). The
    excess over the size came twice or in vain, and is told by source:

    - peers' bytes for nothing: what peers sent beyond the pieces S3 and UDP did not
      bring (the pieces peers completed). libtorrent's redundant count, shown inside it,
      sees only blocks it got twice or no longer wanted; the rest are blocks of pieces
      S3 then wrote whole, peers' blocks already on their way when S3 took the piece (a
      hold, an ALL plan's cancel): s3-fast at a quarter of its rates, 2-4 MB a node of
      134, libtorrent's count 0-2. Pieces held before the fetch began (a resumed one)
      count as peers', so the figure is then a floor;
    - S3's read for pieces another source brought while S3 did (the S3 reader's count).
    """
    state = session.torrents.get(artifact.info_hash)
    try:
        status = state.handle.status() if state is not None else None
    except RuntimeError:
        status = None
    by_source = artifact.sink.bytes_by_source
    peers = by_source.get("peers", 0) + (status.total_payload_download if status is not None else 0)
    s3, udp = artifact.s3_streamed.total, by_source.get("udp", 0)
    redundant = artifact.peers_redundant_before + (
        status.total_redundant_bytes if status is not None else 0
    )
    for_nothing = peers_for_nothing(artifact.manifest.size, peers, by_source.get("s3", 0), udp)
    return (
        f" (received {(s3 + peers + udp) / 1e6:.1f} MB for {artifact.manifest.size / 1e6:.1f}:"
        f" S3 {s3 / 1e6:.1f}, peers {peers / 1e6:.1f}, UDP {udp / 1e6:.1f};"
        f" {for_nothing / 1e6:.1f} of peers' for nothing ({redundant / 1e6:.1f} redundant as"
        " libtorrent counts them, the rest in pieces another source wrote),"
        f" {artifact.s3_overtaken.total / 1e6:.1f} of S3's read for pieces another source brought"
        " meanwhile)"
    )
