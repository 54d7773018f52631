"""Which network interface carries this node's traffic: its byte counters
(``/sys/class/net/IF/statistics``) measure the link itself, where libtorrent counts an
upload as its socket takes the bytes (a slow uplink's socket buffers and queue take a
burst at once: the slow-uploads fleet at a quarter of its rates showed 0.97-1.31 MB/s
of upload per node by libtorrent's counter where its tbf passes 0.625; 0.64 by the
interface's). A loopback interface (nodes on one machine share it) or an address no
interface holds has none.
"""

from __future__ import annotations

import fcntl
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Final

SYS_NET: Final = Path("/sys/class/net")
PROC_ROUTE: Final = Path("/proc/net/route")
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


def route_interface(table: Path = PROC_ROUTE) -> str | None:
    """The interface of the IPv4 default route (the least metric of them), or None."""
    try:
        lines = table.read_text().splitlines()[1:]
    except OSError:
        return None
    best: tuple[int, str] | None = None
    for line in lines:
        # Iface Destination Gateway Flags RefCnt Use Metric Mask ...
        fields = line.split()
        if len(fields) < 8 or fields[1] != "00000000" or fields[7] != "00000000":
            continue
        try:
            metric = int(fields[6])
        except ValueError:
            continue
        if best is None or metric < best[0]:
            best = (metric, fields[0])
    return best[1] if best else None


def interface_for(listen_ip: str) -> str | None:
    """The interface whose counters measure a daemon listening on ``listen_ip`` (for
    0.0.0.0, the default route's); None where there is none (loopback, no ``/sys``)."""
    interface = link_interface(listen_ip)
    if interface is None and listen_ip in ("0.0.0.0", ""):
        interface = route_interface()  # every address: the default route's link
    if interface is None or not (SYS_NET / interface / "statistics").is_dir():
        return None
    return interface


def interface_counter(interface: str, name: str) -> int | None:
    """One of the interface's byte counters (``tx_bytes``, ``rx_bytes``: running
    totals), None if it cannot be read."""
    try:
        return int((SYS_NET / interface / "statistics" / name).read_text())
    except (OSError, ValueError):
        return None


class SentUploads:
    """Upload totals as the link carried them: libtorrent's counters held back to what
    the interface has sent since.

    libtorrent counts an upload when its socket takes the bytes, and a socket takes a
    burst at once (buffers, the uplink's queue): over the one-second intervals the
    coordinator takes a node's upload peak from, a 62.5 Mbit (7.8 MB/s) uplink in the
    s3-fast fleet at a quarter of its rates read 15.7 MB/s. That peak is the fleet's
    link to the allocator, which then judged that S3 no longer filled the links and took
    ALL back, 2 s into it. Bytes the link has not sent yet are owed, not lost: they count
    once the interface's counter has moved by as much."""

    def __init__(self, read_sent: Callable[[], int | None]) -> None:
        self._read_sent = read_sent
        self._last_sent: int | None = None
        self._counted: dict[str, tuple[int, int, int]] = {}
        """Per artifact: libtorrent's total when last seen, the total reported, and the
        bytes libtorrent counted that the link has not carried yet. (Not derived from
        the first two: a handle replaced by the seed-mode hand-over starts its total at
        zero, and the reported total goes on from where it was.)"""

    def totals(self, uploaded: dict[str, int]) -> dict[str, int]:
        """Each artifact's upload total as the link has carried it (``uploaded``:
        libtorrent's totals by info-hash); libtorrent's own where the interface cannot
        be read."""
        sent = self._read_sent()
        if sent is None:
            return dict(uploaded)
        budget = max(0, sent - self._last_sent) if self._last_sent is not None else 0
        self._last_sent = sent
        result = {}
        for key, total in uploaded.items():
            seen, reported, owed = self._counted.get(key, (total, total, 0))
            owed += max(0, total - seen)
            paid = min(owed, budget)
            budget -= paid
            self._counted[key] = (total, reported + paid, owed - paid)
            result[key] = reported + paid
        for key in set(self._counted) - set(uploaded):  # artifacts gone
            del self._counted[key]
        return result
