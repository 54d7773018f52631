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
