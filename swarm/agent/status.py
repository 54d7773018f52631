"""An artifact's status as its daemon reports it: progress, per-source waits, failure.

A fetch never hangs silently: ``waiting`` says per source what it waits on (shown on the
progress line), and when no source can make progress (every S3/UDP source failed for
good and no connected peer has held a missing piece for :data:`STALL_SECONDS`), the
status carries ``failed`` with the failed source's exit code, which ends the CLI's wait.
"""

from __future__ import annotations

import errno
import time
from typing import Any

from swarm.agent.hybrid import bitfield
from swarm.agent.registry import Artifact
from swarm.agent.supervisor import TaskState
from swarm.messages import ArtifactStatus

STALL_SECONDS = 60.0
"""How long a fetch whose own sources failed for good waits for a peer to hold a missing
piece before it fails with their exit code."""


def peers_can_help(artifact: Artifact, status: Any) -> bool:
    """True if a connected peer holds a piece this artifact misses."""
    if status is None or not status.num_peers:
        return False
    availability = artifact.sink.handle.piece_availability()
    return any(availability[i] > 0 for i in artifact.missing() if i < len(availability))


def update_failure(artifact: Artifact, status: Any, now: float) -> dict[str, str]:
    """Per-source waits; sets ``artifact.failure`` once no source can make progress."""
    waiting: dict[str, str] = {}
    for name, task in artifact.tasks.items():
        if task.detail:  # a retry's reason, a backoff, or a final failure
            waiting[name] = task.detail
    if artifact.verified.is_set() or artifact.complete_on_disk():
        return waiting
    if any(task.alive for task in artifact.tasks.values()):
        if "peers" in artifact.sources and status is not None and not status.num_peers:
            waiting["peers"] = "no peer connected yet"
        return waiting
    helped = "peers" in artifact.sources and peers_can_help(artifact, status)
    if helped:
        artifact.peers_idle_since = None
        return waiting
    if artifact.peers_idle_since is None:
        artifact.peers_idle_since = now
    if "peers" in artifact.sources:
        waiting["peers"] = (
            "no peer connected"
            if status is None or not status.num_peers
            else f"no connected peer holds any of the {len(artifact.sink.missing())} missing pieces"
        )
    failed = [t for t in artifact.tasks.values() if t.state == TaskState.FAILED and t.failure]
    idle_for = now - artifact.peers_idle_since
    if (
        failed
        and artifact.failure is None
        and ("peers" not in artifact.sources or idle_for >= STALL_SECONDS)
    ):
        first = failed[0].failure
        assert first is not None
        reasons = "; ".join(f"{name}: {why}" for name, why in waiting.items())
        artifact.failure = (
            f"swarm: no source can complete {artifact.manifest.name} ({reasons}); fix the "
            "cause and fetch again: the daemon keeps what it has",
            first.exit_code,
        )
    return waiting


def describe(artifact: Artifact) -> ArtifactStatus:
    manifest, sink = artifact.manifest, artifact.sink
    state = sink.state
    # A fresh status per API call (a request, not a polling loop): counters are exact
    # when someone asks, instead of up to STATUS_INTERVAL old.
    try:
        status = state.handle.status()
    except RuntimeError:  # removed a moment ago (the seed-mode adoption swaps the torrent)
        status = None
    complete = artifact.verified.is_set()
    now = time.monotonic()
    if complete and artifact.seconds is None:
        artifact.seconds = round(now - artifact.started, 3)
    waiting = update_failure(artifact, status, now)
    # every piece held, wanted or not (those the S3 reader holds back from peers are not)
    have = status.total_done if status is not None else 0
    if artifact.direct is not None:
        have = max(have, artifact.direct.bytes_done)
    s3_task = artifact.tasks.get("s3")
    # S3's counters once anything read it: the S3 reader, or ``swarm fetch`` while this
    # daemon started (in the first report, before the reader's task exists: see
    # swarm.agent.earlyread.take_read_ahead)
    s3_counted = s3_task is not None or artifact.s3_streamed.total > 0
    udp_errors = [t.detail for n, t in artifact.tasks.items() if n.startswith("udp") and t.detail]
    failure = artifact.failure or (
        (str(artifact.finisher.error), artifact.finisher.error.exit_code)
        if artifact.finisher is not None and artifact.finisher.error is not None
        else None
    )
    return ArtifactStatus(
        info_hash=manifest.info_hash,
        name=manifest.name,
        size=manifest.size,
        sha256=manifest.sha256,
        path=str(artifact.final_path if complete else artifact.data_path),
        state=(
            "seeding"
            if complete
            else "failed"
            if failure
            else (
                "error"
                if state.error
                else "verifying"
                if artifact.complete_on_disk()
                else "fetching"
            )
        ),
        complete=complete,
        have_bytes=manifest.size if complete else have,
        bytes_by_source={
            # plus what peers gave before a directory was swapped in (a new handle)
            "peers": (status.total_payload_download if status is not None else 0)
            + sink.bytes_by_source.get("peers", 0),
            "s3": sink.bytes_by_source.get("s3", 0),
            "udp": sink.bytes_by_source.get("udp", 0),
        },
        down_rate=status.download_payload_rate if status is not None else 0,
        up_rate=status.upload_payload_rate if status is not None else 0,
        uploaded=status.total_payload_upload if status is not None else 0,
        peers=status.num_peers if status is not None else 0,
        seconds=artifact.seconds,
        # the fetch's duration (history); unknown for what a restart restored
        elapsed=None
        if artifact.restored
        else (artifact.seconds if complete else round(now - artifact.started, 3)),
        error=state.error,
        error_no_space=state.error_errno == errno.ENOSPC,
        s3_error=s3_task.detail if s3_task is not None else None,
        udp_error=udp_errors[0] if udp_errors else None,
        waiting=waiting,
        failed=failure[0] if failure else None,
        exit_code=failure[1] if failure else None,
        hash_failures=sink.hash_failures,
        peer_hash_failures=state.peer_hash_failures,
        peers_banned=state.peers_banned,
        piece_size=manifest.piece_size,
        piece_count=manifest.layout.count,
        pieces=bitfield(status.pieces) if status is not None else None,
        mode=artifact.plan.mode if artifact.plan is not None else None,
        s3_busy=round(artifact.s3_busy.seconds(), 3) if s3_counted else None,
        s3_streamed=artifact.s3_streamed.total if s3_counted else None,
        s3_early=artifact.early_streamed.total or None,
    )
