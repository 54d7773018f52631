"""How the two machines come to trust each other, sans-IO: the handshake on the control
connection (HELLO, CHALLENGE, AUTH: each side proves the fleet secret over the transcript,
and both derive the session's keys from both nonces), and the PROBE that proves the
client's UDP address before the server sends it a byte.

Both halves are here so the transcript, the proofs and their checks can be read, and
changed, together; the sessions (:mod:`swarm.udp.sender`, :mod:`swarm.udp.receiver`) keep
the states that carry them. The format: :mod:`swarm.udp.wire`; the keys and proofs:
:mod:`swarm.udp.crypto`.
"""

from __future__ import annotations

import enum
import hmac

from swarm.udp.crypto import AESGCM, FleetKey, InvalidTag, Sealer, SessionKeys, nonce
from swarm.udp.wire import (
    DGRAM_HEADER_LEN,
    DGRAM_OVERHEAD,
    DGRAM_PROBE,
    NONCE_LEN,
    VERSION_MAGIC,
    AuthenticationError,
    LocalProtocolError,
    Msg,
    RemoteProtocolError,
)


class ServerHandshake:
    """The server's half: answers HELLO with CHALLENGE, then checks AUTH."""

    def __init__(self, key: FleetKey, server_nonce: bytes) -> None:
        if len(server_nonce) != NONCE_LEN:
            raise LocalProtocolError(f"server nonce must be {NONCE_LEN} bytes")
        self._key = key
        self._nonce = server_nonce
        self._transcript = b""
        self._keys: SessionKeys | None = None

    def challenge(self, kind: int, body: bytes) -> bytes:
        """The CHALLENGE body that answers the client's HELLO (frame ``kind``, ``body``)."""
        if kind != Msg.HELLO or len(body) != len(VERSION_MAGIC) + NONCE_LEN:
            raise RemoteProtocolError("expected HELLO")
        if not body.startswith(VERSION_MAGIC):
            raise RemoteProtocolError(
                f"unsupported protocol version (want {VERSION_MAGIC.decode()})"
            )
        self._transcript = body + self._nonce
        self._keys = self._key.session_keys(body[len(VERSION_MAGIC) :], self._nonce)
        return self._nonce + self._key.proof(b"server", self._transcript)

    def check_auth(self, kind: int, body: bytes) -> SessionKeys:
        """The session's keys, once the client's AUTH proves the fleet secret."""
        if kind != Msg.AUTH or len(body) != 32:
            raise RemoteProtocolError("expected AUTH")
        expected = self._key.proof(b"client", self._transcript)
        if not hmac.compare_digest(body, expected):
            raise AuthenticationError("authentication failed: wrong fleet secret")
        keys = self._keys
        assert keys is not None
        return keys


class ClientHandshake:
    """The client's half: sends :attr:`hello`, checks the server's CHALLENGE, answers AUTH."""

    def __init__(self, key: FleetKey, client_nonce: bytes) -> None:
        if len(client_nonce) != NONCE_LEN:
            raise LocalProtocolError(f"client nonce must be {NONCE_LEN} bytes")
        self._key = key
        self._client_nonce = client_nonce
        self.hello = VERSION_MAGIC + client_nonce
        """The HELLO body."""

    def answer(self, kind: int, body: bytes) -> tuple[SessionKeys, bytes]:
        """The session's keys and the AUTH body, once the server's CHALLENGE (frame
        ``kind``, ``body``) proves the fleet secret."""
        if kind != Msg.CHALLENGE or len(body) != NONCE_LEN + 32:
            raise RemoteProtocolError("expected CHALLENGE")
        server_nonce, proof = body[:NONCE_LEN], body[NONCE_LEN:]
        transcript = self.hello + server_nonce
        if not hmac.compare_digest(proof, self._key.proof(b"server", transcript)):
            raise AuthenticationError("the server failed to prove the fleet secret")
        keys = self._key.session_keys(self._client_nonce, server_nonce)
        return keys, self._key.proof(b"client", transcript)


def seal_probe(sealer: Sealer, session_id: bytes) -> bytes:
    """A PROBE datagram, for the client's data socket to send."""
    return bytes(sealer.seal_datagram(DGRAM_PROBE, 0, session_id, 0, b""))


class Probe(enum.Enum):
    """The server's verdict on a datagram sent to a session (:meth:`ProbeCheck.check`)."""

    FORGED = "forged"
    """Not an authentic PROBE of this session from the peer's IP."""
    STALE = "stale"
    """Authentic, but no newer than one already taken: a duplicate or a replay."""
    FRESH = "fresh"


class ProbeCheck:
    """The server's check of PROBEs: sealed with the session's client-to-server data key,
    newer than the last one taken, and from ``peer_ip``, the IP whose TCP handshake proved
    it can receive there."""

    def __init__(self, aead: AESGCM, session_id: bytes, peer_ip: str) -> None:
        self._aead = aead
        self._session_id = session_id
        self._peer_ip = peer_ip
        self._seq = -1

    def check(self, data: bytes | memoryview, addr: tuple[str, int]) -> Probe:
        if len(data) != DGRAM_OVERHEAD or data[0] != DGRAM_PROBE or data[2:10] != self._session_id:
            return Probe.FORGED
        seq = int.from_bytes(data[10:18], "big")
        try:
            self._aead.decrypt(
                nonce(seq), bytes(data[DGRAM_HEADER_LEN:]), bytes(data[:DGRAM_HEADER_LEN])
            )
        except InvalidTag:
            return Probe.FORGED
        if seq <= self._seq:
            return Probe.STALE  # a duplicate or replayed probe: authentic but stale
        self._seq = seq
        if addr[0] != self._peer_ip:
            # Sealed with our key but from another IP: a replay by someone on the path. Data
            # only ever goes to the IP whose TCP handshake proved it can receive there.
            return Probe.FORGED
        return Probe.FRESH
