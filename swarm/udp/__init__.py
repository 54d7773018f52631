"""Tsunami-style UDP transfer between nodes: TCP control, rate-paced UDP data.

- the sans-IO machines, one module per seam (all re-exported by :mod:`swarm.udp.protocol`):
  :mod:`~swarm.udp.wire` (format, block plan), :mod:`~swarm.udp.crypto` (HKDF keys,
  AES-GCM), :mod:`~swarm.udp.rate` (rate rule, pacer), :mod:`~swarm.udp.request` (REQUEST
  and ACCEPT rules), :mod:`~swarm.udp.handshake` (both halves, and the PROBE check),
  :mod:`~swarm.udp.sender` (with :mod:`~swarm.udp.blast`, :mod:`~swarm.udp.schedule` and
  :mod:`~swarm.udp.batch`) and :mod:`~swarm.udp.receiver` (with :mod:`~swarm.udp.intake`,
  :mod:`~swarm.udp.assembly` and :mod:`~swarm.udp.loss`);
- :mod:`swarm.udp.datapath`: UDP sockets with GSO sends, GRO receives, no IP fragments;
- :class:`UdpServer`: what every daemon runs to serve the pieces it holds, looked up in a
  :class:`PieceProvider` (:mod:`swarm.udp.pieces`);
- :func:`fetch_pieces` / :func:`fetch_pieces_sync`: what the agent's UDP source calls.

Off without a fleet secret: :func:`secret_from_env` returns None when ``SWARM_SECRET`` is
unset or empty, and the daemon then starts no server and no UDP source.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from swarm.udp.api import (
    DEFAULT_RATE_BPS,
    DEFAULT_RATE_CAP_BPS,
    FetchStats,
    UdpAuthError,
    UdpError,
)
from swarm.udp.wire import DEFAULT_BLOCK_SIZE, DEFAULT_PORT, MIN_SECRET_LEN

if TYPE_CHECKING:
    from swarm.udp.client import fetch_pieces, fetch_pieces_sync
    from swarm.udp.pieces import ArtifactPieces, FilePieces, PieceProvider, StaticProvider
    from swarm.udp.server import UdpServer

_LAZY = {
    "fetch_pieces": "swarm.udp.client",
    "fetch_pieces_sync": "swarm.udp.client",
    "ArtifactPieces": "swarm.udp.pieces",
    "FilePieces": "swarm.udp.pieces",
    "PieceProvider": "swarm.udp.pieces",
    "StaticProvider": "swarm.udp.pieces",
    "UdpServer": "swarm.udp.server",
}
"""Names whose modules load on first use (PEP 562): the client and the server are most
of the package's import time, and a daemon needs neither to start (:mod:`swarm.udp.api`)."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def secret_from_env(environ: Mapping[str, str] = os.environ) -> bytes | None:
    """The fleet secret from ``SWARM_SECRET``, or None (UDP off). Never a default.

    Raises:
        ValueError: the secret is set but shorter than :data:`MIN_SECRET_LEN` bytes.
    """
    value = environ.get("SWARM_SECRET", "")
    if not value:
        return None
    secret = value.encode()
    if len(secret) < MIN_SECRET_LEN:
        raise ValueError(
            f"SWARM_SECRET is {len(secret)} bytes; use at least {MIN_SECRET_LEN} "
            "(e.g. `openssl rand -hex 32`), the same on every node"
        )
    return secret


__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_PORT",
    "DEFAULT_RATE_BPS",
    "DEFAULT_RATE_CAP_BPS",
    "ArtifactPieces",
    "FetchStats",
    "FilePieces",
    "PieceProvider",
    "StaticProvider",
    "UdpAuthError",
    "UdpError",
    "UdpServer",
    "fetch_pieces",
    "fetch_pieces_sync",
    "secret_from_env",
]
