"""How the daemon's libtorrent session is configured: its settings pack (listen and
outgoing interfaces, peer discovery off, unchoke everyone, TCP only, rate limits) and its
disk back end (:data:`DISK_IO`), chosen for a private fleet on a fast LAN/VPC.
:class:`swarm.sources.peers.TorrentSession` builds its one session from these.
"""

from __future__ import annotations

from typing import Any, Final, cast

import libtorrent as lt

DEFAULT_PORT = 6881

SEND_BUFFERS: dict[str, int] = {
    "send_buffer_watermark": 512_000,
    "send_buffer_low_watermark": 10_240,
    "send_buffer_watermark_factor": 10,
    "send_not_sent_low_watermark": 16_384,
}
"""A peer connection's send buffers: a tenth of a second of the connection's upload rate
in libtorrent (at most 500 KB), 16 KiB unsent in the kernel (``TCP_NOTSENT_LOWAT``),
where ``high_performance_seed`` keeps 1-3 MiB and 512 KiB for a pure seed and
libtorrent's default half a second. A node downloads while it uploads, and each request
it sends a peer waits behind the piece data queued to that peer on the same connection.
In the mixed fleet at a quarter of the rates (25 Mbit uplinks shared by seven peers),
with the preset's buffers ``ss`` showed 0.5-1.1 MB unsent per connection and the peers'
logs request queues of 4-8 blocks from the nodes whose uplinks were fullest: their
requests waited seconds, and they got 40-60 KB/s from each peer while the others got
300-900. With libtorrent's half second the last node of a run still got 20-130 KB/s
from most peers at request round trips of 110-600 ms (``get_peer_info``), and a
node's request queue is ``request_queue_time`` of what the peer gives it, so the
starvation fed itself. A tenth, alternating pairs against the half second
(``bench/fleet.py --systems swarm``, at a quarter of the rates unless said): mixed 36.51 s
mean against 37.86 (six pairs, faster in four), slow uploads 38.14 against 39.22 (four,
three), existing seeders 28.50 against 28.90 (four), origin-bound 48.58 against 48.83
(three), swarm-bound at full rates 8.13 against 8.40 and mixed 9.81 against 10.05 (two
each). The kernel's in-flight data (the congestion window) is not limited by these,
only what waits to be sent."""


FAR_REQUEST_QUEUE_SECONDS: Final = 1
"""libtorrent's ``request_queue_time`` while a fetch's S3 is far and its UDP source runs
(:data:`FAR_FETCH_SETTINGS`), against libtorrent's 3: each peer connection keeps this many
seconds of its rate in block requests, and every piece a UDP session brings while
libtorrent has it requested from a near peer arrives twice, as much of it as the queue
holds. far-region's nodes counted 3-20 MB of libtorrent's redundant bytes each with 3 s,
2-6 MB with 1 s, and the fleet took 9.0-9.6 s against 9.5-10.9 (six alternating pairs).
Not for every fetch: in origin-bound and mixed (LAN peers, S3 near) one second cost
0.3-0.4 s a run (five pairs each)."""

FAR_FETCH_SETTINGS: Final[dict[str, int | bool]] = {
    "request_queue_time": FAR_REQUEST_QUEUE_SECONDS,
    # A peer with nothing else to request may ask for blocks already requested from
    # another (libtorrent's default waits until every piece is requested): a far node's
    # last blocks, requested from a far holder over lossy TCP (a few Mbit/s), then come
    # from its region's peers. far-region, ten alternating pairs: 8.12 s mean (7.67-8.75)
    # against 8.48 (7.96-9.76; two runs over 9.3 s).
    "strict_end_game_mode": False,
}
"""libtorrent's settings while any fetch whose S3 is far runs its UDP source
(:meth:`swarm.sources.peers.TorrentSession.tuned`, :func:`swarm.agent.udpauto.auto_udp`)."""

AMONG_SEEDERS_SETTINGS: Final[dict[str, int | bool]] = {
    "request_queue_time": FAR_REQUEST_QUEUE_SECONDS,
}
"""libtorrent's settings while a fetch started beside nodes that hold the whole artifact
(the coordinator named them in its first plans: ``OriginPlan.holders``). Every new node
asks the seeders for seconds of their rate at once, and at first every piece is equally
rare: with libtorrent's 3 s the requests in flight covered much of the artifact, several
nodes took the same pieces from the seeders, and the nodes' own uplinks idled for lack of
anything the others lacked (existing seeders at a quarter of the rates: at 12 s, 57 pieces
held by the seeders only, 28 by every node). One second of a peer's rate asks for a third
of that. Existing seeders at full rates, three alternating pairs: 8.71-8.99 s against
8.87-10.19, peers' bytes 101% of what each node lacked against 104-105%; at a quarter,
six pairs, 31.71 s mean (28.40-36.03) against 31.86 (30.07-33.89): no change. Not for
every fetch: see :data:`FAR_REQUEST_QUEUE_SECONDS`."""


def session_settings(
    listen_ip: str, port: int, upload_limit: int = 0, peer_id_prefix: str = "-SW0100-"
) -> Any:
    """The session's settings, chosen for a private fleet on a fast LAN/VPC.

    Starts from libtorrent's ``high_performance_seed`` preset (big request queues, many
    connections), then:

    - send buffers shallower than libtorrent's defaults (:data:`SEND_BUFFERS`): the
      preset's deep ones delay a downloading node's requests behind its uploads;

    - bind listen *and* outgoing sockets to ``listen_ip`` so several nodes can share a
      host (one loopback address each) and the tracker sees the node's own address;
    - DHT, LSD, UPnP and NAT-PMP off: peers come only from the fleet's coordinator (the
      torrents are private, BEP 27), and nothing probes the VPC or the router;
    - ``ssrf_mitigation`` stays on (libtorrent's default): a tracker on a loopback or
      private address must use the ``/announce`` path, which ours does, and web seeds
      may not point at local services with a query string;
    - every fleet member is trusted, so no tit-for-tat: unchoke everyone (-1 slots) so
      a seeder's upload is never idle while someone still needs data;
    - no queueing of our torrents (active limits unlimited): a node seeds all it holds;
    - connections stay when one end has all it wants (``close_redundant_connections``
      off): libtorrent counts a torrent finished once every piece it lacks is at
      priority 0, which ours are for a while (held for S3, left to their owners beside
      seeders, upload mode under an ALL plan); at finishing it closed every seed's
      connection and told peers it was upload-only, so seeders closed theirs, and when
      the pieces came back it had to connect again. Existing seeders at a quarter of the
      rates: each new node finished so 1-5 times a run and dropped 2-14 connections.
      Alternating runs with and without: existing seeders at a quarter 27.83-29.97 s
      against 27.66-33.13 (three pairs), mixed at a quarter 34.41-38.20 against
      35.19-41.31 (three): within the noise, kept for the reconnects it saves;
    - ``upload_limit`` (bytes/s, 0 = none) caps uploads to *every* peer: libtorrent
      exempts LAN peers from rate limits by default (``ignore_limits_on_local_network``),
      and in a VPC every peer is a LAN peer, so that exemption is turned off;
    - the disk back end is :data:`DISK_IO` (a session parameter, not a setting).
    """
    settings = lt.high_performance_seed()
    settings.update(
        {
            "listen_interfaces": f"{listen_ip}:{port}",
            "outgoing_interfaces": listen_ip,
            "enable_dht": False,
            "enable_lsd": False,
            "enable_upnp": False,
            "enable_natpmp": False,
            "ssrf_mitigation": True,
            "allow_multiple_connections_per_ip": True,
            # TCP only: uTP's LEDBAT congestion control yields to any queueing delay, which
            # on a LAN/VPC means a few MB/s where TCP fills the link (measured here: 8 MB/s
            # with uTP vs well over 100 MB/s with TCP between two daemons on loopback).
            "enable_outgoing_utp": False,
            "enable_incoming_utp": False,
            "choking_algorithm": 0,  # fixed_slots
            "unchoke_slots_limit": -1,
            "active_downloads": -1,
            "active_seeds": -1,
            "active_limit": -1,
            "close_redundant_connections": False,
            "peer_fingerprint": peer_id_prefix,
            "user_agent": "swarm/0.1 libtorrent/" + lt.__version__,
            "min_reconnect_time": 1,
            "peer_connect_timeout": 3,
            "tracker_completion_timeout": 10,
            "tracker_receive_timeout": 5,
            "stop_tracker_timeout": 1,
            "min_announce_interval": 5,
            "alert_mask": (
                lt.alert.category_t.error_notification
                | lt.alert.category_t.status_notification
                | lt.alert.category_t.storage_notification
                | lt.alert.category_t.piece_progress_notification
                | lt.alert.category_t.tracker_notification
                | lt.alert.category_t.peer_notification
                | lt.alert.category_t.ip_block_notification  # see TorrentSession.on_blocked
            ),
            "alert_queue_size": 10000,
            "upload_rate_limit": upload_limit,
            "ignore_limits_on_local_network": False,
            "apply_ip_filter_to_trackers": False,
            # A busy port is an error the operator sees, not a silent move to 6882 (or to
            # a random port) that peers and firewalls do not expect.
            "max_retry_port_bind": 0,
            "listen_system_port_fallback": False,
        }
    )
    # the preset's send buffers undone (see SEND_BUFFERS); cast: the stubs' settings pack
    # takes literal keys only
    settings.update(cast(Any, SEND_BUFFERS))
    return settings


DISK_IO = "posix_disk_io_constructor"
"""libtorrent's disk back end (the binding takes its name): plain pread/pwrite, no cache
of its own (the page cache is the cache). Not 2.1's default, ``pread_disk_io``: its
write cache parks writes until some other job wakes a thread to flush them (a review on
arvidn/libtorrent#7013 describes it, and a race that can lose a write made during a
flush). In fleet runs it left every block of some pieces "writing" for good (the stuck
pieces of :mod:`swarm.agent.stuck`), a node's flushes went unanswered for minutes, and
stock libtorrent (bench baseline) ended with files whose SHA-256 was wrong. Not
``mmap_disk_io`` either: the pages it maps to read and hash count in the daemon's RSS
(296 MiB for a 2 GiB fetch with ``disk_write_mode`` at ``always_pwrite``, against the
250 MiB bound of ``test_resources``)."""
