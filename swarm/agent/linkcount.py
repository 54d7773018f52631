"""What left this node: its network interface's byte counter, for the coordinator's
measure of the node's uplink.

libtorrent counts an upload as its socket takes the bytes, and a slow uplink's socket
buffers and queue take a burst at once: the slow-uploads fleet at a quarter of its rates
was planned on 0.97-1.31 MB/s of upload per node where its tbf passes 0.625, and the
allocation leaned on peers that could not give it. libtorrent's own rate is a 5-second
average, right in the end but slow to rise (a third of a link after two seconds: capped
by it, swarm-bound and mixed ran slower). The interface counts what it sent, as fast as
it goes (0.64 MB/s there).

The counter is the interface's, not the daemon's: everything the node sends (its S3
requests, its downloads' ACKs, another program's traffic) counts, so it measures the
link, not swarm's share of it; that is what the allocation plans on. A loopback
interface (nodes on one machine share it) or an address no interface holds has none:
libtorrent's counter stands in.
"""

from __future__ import annotations

import fcntl
import socket
import struct
from pathlib import Path
from typing import Final

SYS_NET: Final = Path("/sys/class/net")
SIOCGIFADDR: Final = 0x8915
SIOCGIFFLAGS: Final = 0x8913
IFF_LOOPBACK: Final = 0x8


def link_interface(ip: str) -> str | None:
    """The interface whose address is ``ip`` (IPv4), if it is not a loopback; None
    otherwise (also for 0.0.0.0, an alias address, or a system without ``/sys``)."""
    try:
        packed = socket.inet_aton(ip)
    except OSError:
        return None
    if packed == bytes(4):
        return None
    try:
        names = sorted(p.name for p in SYS_NET.iterdir())
    except OSError:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for name in names:
            request = struct.pack("256s", name.encode()[:15])
            try:
                address = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)[20:24]
                flags = struct.unpack_from(
                    "H", fcntl.ioctl(probe.fileno(), SIOCGIFFLAGS, request), 16
                )[0]
            except OSError:  # no IPv4 address, or gone meanwhile
                continue
            if address == packed:
                return None if flags & IFF_LOOPBACK else name
    return None


def sent_bytes(interface: str) -> int | None:
    """Bytes ``interface`` has sent since it came up (None: unreadable)."""
    try:
        return int((SYS_NET / interface / "statistics" / "tx_bytes").read_text())
    except (OSError, ValueError):
        return None
