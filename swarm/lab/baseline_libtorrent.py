"""Baseline for bench/fleet.py: a plain libtorrent 2.1 client, stock settings.

    python -m swarm.lab.baseline_libtorrent TORRENT SAVE_DIR --listen IP --tracker URL
        [--sha256 HEX] [--seed] [--timeout SECONDS]

It adds TORRENT (its ``url-list`` web seed included) with ``--tracker`` as an extra
tracker, downloads into SAVE_DIR, checks the whole file's SHA-256 and prints one JSON line
``{"event": "done", "seconds": ..., "sha256": ..., "bytes_by_source": ...}``. Then it exits,
or with ``--seed`` keeps seeding until SIGTERM/SIGINT (or ``--timeout``), as a deployed node
that stays in the swarm would. If SAVE_DIR already holds the complete file, libtorrent's
check finds it and the client seeds it (a pre-existing instance).

Settings are libtorrent's defaults except: the listen interface bound to ``--listen``,
DHT, LSD, UPnP and NAT-PMP off (a private fleet; the torrent is private anyway), and
alerts for status only. No tuning: this is what "just use libtorrent" gives.

Exit codes: 0 done (and, with --seed, stopped by a signal); 1 error or timeout;
5 SHA-256 mismatch.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

import libtorrent as lt

from swarm.pieces import file_sha256

ALERT_WAIT_MS = 200


def emit(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("torrent", type=Path)
    parser.add_argument("save_dir", type=Path)
    parser.add_argument("--listen", required=True, help="IP to bind (the node's address)")
    parser.add_argument("--port", type=int, default=6881)
    parser.add_argument("--tracker", action="append", default=[], help="extra tracker URL")
    parser.add_argument("--sha256", help="expected SHA-256 of the file (checked when done)")
    parser.add_argument("--seed", action="store_true", help="keep seeding until a signal")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    settings = {
        "listen_interfaces": f"{args.listen}:{args.port}",
        "enable_dht": False,
        "enable_lsd": False,
        "enable_upnp": False,
        "enable_natpmp": False,
        "alert_mask": lt.alert.category_t.status_notification
        | lt.alert.category_t.error_notification
        | lt.alert.category_t.storage_notification,
    }
    session = lt.session(settings)  # type: ignore[call-overload]  # a dict is a settings_pack
    params = lt.add_torrent_params()
    params.ti = lt.torrent_info(str(args.torrent))
    params.save_path = str(args.save_dir)
    params.trackers = list(args.tracker)
    args.save_dir.mkdir(parents=True, exist_ok=True)
    handle = session.add_torrent(params)
    started = time.monotonic()
    deadline = started + args.timeout
    done_at: float | None = None
    flushed = False
    reported = False
    while not stop.is_set():
        if time.monotonic() > deadline:
            emit("error", message=f"timed out after {args.timeout:g}s")
            return 1
        session.wait_for_alert(ALERT_WAIT_MS)
        for alert in session.pop_alerts():
            if isinstance(alert, lt.torrent_error_alert | lt.file_error_alert):
                emit("error", message=alert.message())
                return 1
            if isinstance(alert, lt.torrent_finished_alert) and done_at is None:
                done_at = time.monotonic()
                # Finished means every piece passed its hash, not that every block is in
                # the file: libtorrent 2's disk I/O may still hold some in its store
                # buffer. Hashing the file at once read a few blocks as zeros under load
                # (2 runs of 7 in one bench session). A cache flush is the fence.
                handle.flush_cache()
            if isinstance(alert, lt.cache_flushed_alert):
                flushed = True
        if done_at is not None and flushed and not reported:
            status = handle.status()
            path = args.save_dir / params.ti.name()
            digest = file_sha256(path) if args.sha256 else None
            if args.sha256 and digest != args.sha256:
                emit("error", message=f"SHA-256 mismatch: {digest} != {args.sha256}")
                return 5
            emit(
                "done",
                seconds=round(done_at - started, 3),
                sha256=digest,
                bytes_by_source={
                    # payload from peers vs the web seed is not split by libtorrent's
                    # counters; total_payload_download covers both.
                    "total_payload": status.total_payload_download,
                },
                upload_bytes=status.total_payload_upload,
            )
            if not args.seed:
                return 0
            reported = True  # keep seeding until a signal
    return 0


if __name__ == "__main__":
    sys.exit(main())
