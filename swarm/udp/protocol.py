"""Tsunami-style transfer, sans-IO: a TCP control channel and rate-paced UDP data.

Tsunami UDP (Meier, Indiana University, 2002) showed that a sender pacing large UDP blocks
at a target rate, with retransmit requests over a TCP control channel, fills a long fat
link that one TCP flow cannot. It also showed what to avoid: a default shared secret,
plaintext data, a client that names any path and any rate. Here the secret has no default,
every byte after the handshake is sealed with AES-256-GCM under per-session keys, a request
names an info-hash, and the server's cap bounds the rate.

The machines live in one module per seam; this module gathers their names (one import for
the edges, the tests and the fuzzers):

- :mod:`swarm.udp.wire`: constants, errors, frames, datagram header, the block plan;
- :mod:`swarm.udp.crypto`: HKDF keys, handshake proofs, AES-GCM sealing;
- :mod:`swarm.udp.rate`: the rate rule, its feedback loop and the pacer;
- :mod:`swarm.udp.events`: what the machines tell their edges;
- :mod:`swarm.udp.request`: the REQUEST and ACCEPT rules both sides check;
- :mod:`swarm.udp.handshake`: both halves of the handshake, and the PROBE check;
- :mod:`swarm.udp.sender` / :mod:`swarm.udp.receiver`: the server's and client's machines,
  with their data paths and bookkeeping: :mod:`swarm.udp.blast` (blocks sealed at the
  paced rate), :mod:`swarm.udp.schedule` (what is left to send) and :mod:`swarm.udp.batch`
  (GSO batches); :mod:`swarm.udp.intake` (blocks into piece buffers),
  :mod:`swarm.udp.assembly` (pieces being received) and :mod:`swarm.udp.loss` (NAKs and
  REPORTs).

Nothing in them touches a socket, a clock or an RNG: nonces and times are passed in, bytes
go in and out, and the asyncio edges (``server.py``, ``client.py``, with the socket work in
``datapath.py``) do the I/O. Bad input from the peer on the *control* channel raises
:class:`RemoteProtocolError` (the edge sends ``ERROR`` and closes). A bad *datagram* never
raises (it is dropped and counted), except an authentic block that does not fit the plan.
"""

from __future__ import annotations

from swarm.udp.assembly import MAX_PIECE_ATTEMPTS
from swarm.udp.batch import Batch
from swarm.udp.control import ControlChannel
from swarm.udp.crypto import FleetKey, Sealer, SessionKeys, hkdf, nonce
from swarm.udp.events import (
    Accepted,
    Authenticated,
    Event,
    NeedPieces,
    PathValidated,
    PeerError,
    PieceReceived,
    Progress,
    Refused,
    RequestReceived,
    TransferDone,
)
from swarm.udp.loss import END_GRACE, RENAK_TIMEOUT, REORDER_SLACK
from swarm.udp.rate import (
    BURST_SECONDS,
    LOSS_HIGH,
    LOSS_LOW,
    MAX_DECREASE,
    MIN_LOSS_SAMPLE,
    MIN_RATE_BPS,
    RATE_INCREASE,
    START_FRACTION,
    Pacer,
    adapt_rate,
)
from swarm.udp.receiver import (
    PROBE_INTERVAL,
    REPORT_INTERVAL,
    ClientSession,
    ClientState,
    ReceiverStats,
)
from swarm.udp.sender import SenderStats, ServerSession, ServerState
from swarm.udp.wire import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_PORT,
    DGRAM_DATA,
    DGRAM_HEADER_LEN,
    DGRAM_OVERHEAD,
    DGRAM_PROBE,
    FLAG_RETRANSMIT,
    HASH_LEN,
    MAX_BLOCK_SIZE,
    MAX_CONTROL_FRAME,
    MAX_NAKS_PER_REPORT,
    MAX_PIECE_SIZE,
    MAX_PIECES_PER_REQUEST,
    MAX_PREAUTH_FRAME,
    MIN_BLOCK_SIZE,
    MIN_SECRET_LEN,
    NONCE_LEN,
    TAG_LEN,
    VERSION_MAGIC,
    AuthenticationError,
    BlockPlan,
    FrameBuffer,
    LocalProtocolError,
    Msg,
    ProtocolError,
    RefuseCode,
    RemoteProtocolError,
    block_size_for_mtu,
    frame,
    peek_session_id,
    piece_count_for,
    split_datagrams,
    validate_block_size,
)

__all__ = [
    "BURST_SECONDS",
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_PORT",
    "DGRAM_DATA",
    "DGRAM_HEADER_LEN",
    "DGRAM_OVERHEAD",
    "DGRAM_PROBE",
    "END_GRACE",
    "FLAG_RETRANSMIT",
    "HASH_LEN",
    "LOSS_HIGH",
    "LOSS_LOW",
    "MAX_BLOCK_SIZE",
    "MAX_CONTROL_FRAME",
    "MAX_DECREASE",
    "MAX_NAKS_PER_REPORT",
    "MAX_PIECES_PER_REQUEST",
    "MAX_PIECE_ATTEMPTS",
    "MAX_PIECE_SIZE",
    "MAX_PREAUTH_FRAME",
    "MIN_BLOCK_SIZE",
    "MIN_LOSS_SAMPLE",
    "MIN_RATE_BPS",
    "MIN_SECRET_LEN",
    "NONCE_LEN",
    "PROBE_INTERVAL",
    "RATE_INCREASE",
    "RENAK_TIMEOUT",
    "REORDER_SLACK",
    "REPORT_INTERVAL",
    "START_FRACTION",
    "TAG_LEN",
    "VERSION_MAGIC",
    "Accepted",
    "Authenticated",
    "AuthenticationError",
    "Batch",
    "BlockPlan",
    "ClientSession",
    "ClientState",
    "ControlChannel",
    "Event",
    "FleetKey",
    "FrameBuffer",
    "LocalProtocolError",
    "Msg",
    "NeedPieces",
    "Pacer",
    "PathValidated",
    "PeerError",
    "PieceReceived",
    "Progress",
    "ProtocolError",
    "ReceiverStats",
    "RefuseCode",
    "Refused",
    "RemoteProtocolError",
    "RequestReceived",
    "Sealer",
    "SenderStats",
    "ServerSession",
    "ServerState",
    "SessionKeys",
    "TransferDone",
    "adapt_rate",
    "block_size_for_mtu",
    "frame",
    "hkdf",
    "nonce",
    "peek_session_id",
    "piece_count_for",
    "split_datagrams",
    "validate_block_size",
]
