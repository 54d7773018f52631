"""Keys and sealing: the fleet secret, per-session keys, AES-256-GCM on frames and datagrams.

Keys come from HKDF-SHA256 (RFC 5869, ``cryptography``'s implementation) over the fleet
secret: once per process a fleet key and an authentication key, then per session four
directional keys and a session id, salted with both handshake nonces, so every session has
fresh keys and a fresh id even if one side's nonce repeats. The handshake proofs are
HMAC-SHA256 under the authentication key with distinct labels (``"server"``, ``"client"``)
so a proof of one side cannot be reflected as the other's.

Sealed control frames use a per-direction key and an implicit frame counter as nonce (TCP is
ordered), so a reordered, replayed or injected frame fails its tag. A datagram's nonce is its
``seq``, carried in its authenticated header (:mod:`swarm.udp.wire`). Each datagram is sealed
on its own, so any datagram can be lost, duplicated or reordered and every one that arrives
is authenticated before a byte of it is used.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from swarm.udp.wire import (
    DGRAM,
    DGRAM_HEADER_LEN,
    MIN_SECRET_LEN,
    TAG_LEN,
    LocalProtocolError,
    RemoteProtocolError,
)

FLEET_SALT = b"swarm-udp/1 fleet"
KEY_LEN = 32


def hkdf(ikm: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    """HKDF-SHA256 (RFC 5869): extract with ``salt``, expand to ``length`` bytes."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(ikm)


def nonce(counter: int) -> bytes:
    """The 96-bit GCM nonce of message ``counter``: 4 zero bytes and the 64-bit counter."""
    return counter.to_bytes(12, "big")


@dataclass(frozen=True, slots=True)
class SessionKeys:
    control_c2s: bytes
    control_s2c: bytes
    data_s2c: bytes
    data_c2s: bytes
    session_id: bytes


class FleetKey:
    """The fleet secret, reduced once to a fleet key and an authentication key."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < MIN_SECRET_LEN:
            raise LocalProtocolError(
                f"fleet secret must be at least {MIN_SECRET_LEN} bytes, got {len(secret)}: "
                "set SWARM_SECRET to a random value (e.g. `openssl rand -hex 32`) on every node"
            )
        self._fleet = hkdf(secret, FLEET_SALT, b"fleet key", KEY_LEN)
        self._auth = hkdf(secret, FLEET_SALT, b"auth", KEY_LEN)

    def proof(self, label: bytes, transcript: bytes) -> bytes:
        return hmac.digest(self._auth, label + transcript, "sha256")

    def session_keys(self, client_nonce: bytes, server_nonce: bytes) -> SessionKeys:
        material = hkdf(self._fleet, client_nonce + server_nonce, b"session keys", 4 * 32 + 8)
        return SessionKeys(
            control_c2s=material[0:32],
            control_s2c=material[32:64],
            data_s2c=material[64:96],
            data_c2s=material[96:128],
            session_id=material[128:136],
        )


class Sealer:
    """AES-256-GCM with a 64-bit counter nonce: one instance per key and direction, so a
    nonce is never reused (GCM's one hard rule, SP 800-38D section 8). Control frames use
    :meth:`seal`/:meth:`open` (the counter is implicit); datagrams :meth:`seal_datagram`
    (the counter is the datagram's ``seq``)."""

    __slots__ = ("aead", "counter")

    def __init__(self, key: bytes) -> None:
        self.aead = AESGCM(key)
        self.counter = 0

    def seal(self, plaintext: bytes, aad: bytes) -> bytes:
        sealed = self.aead.encrypt(nonce(self.counter), plaintext, aad)
        self.counter += 1
        return sealed

    def open(self, ciphertext: bytes, aad: bytes) -> bytes:
        try:
            plaintext = self.aead.decrypt(nonce(self.counter), ciphertext, aad)
        except InvalidTag:
            raise RemoteProtocolError("control frame failed authentication") from None
        self.counter += 1
        return plaintext

    def seal_datagram_into(
        self,
        out: memoryview,
        kind: int,
        flags: int,
        session_id: bytes,
        ordinal: int,
        payload: memoryview | bytes,
    ) -> int:
        """Write one sealed datagram (header, ciphertext, tag) at the start of ``out``;
        returns its length. ``out`` must hold ``DGRAM_OVERHEAD + len(payload)`` bytes."""
        seq = self.counter
        self.counter = seq + 1
        DGRAM.pack_into(out, 0, kind, flags, session_id, seq, ordinal)
        end = DGRAM_HEADER_LEN + len(payload) + TAG_LEN
        self.aead.encrypt_into(
            nonce(seq), payload, out[:DGRAM_HEADER_LEN], out[DGRAM_HEADER_LEN:end]
        )
        return end

    def seal_datagram(
        self, kind: int, flags: int, session_id: bytes, ordinal: int, payload: bytes
    ) -> bytearray:
        out = bytearray(DGRAM_HEADER_LEN + len(payload) + TAG_LEN)
        self.seal_datagram_into(memoryview(out), kind, flags, session_id, ordinal, payload)
        return out


def open_datagram(aead: AESGCM, datagram: memoryview | bytes) -> bytes | None:
    """The payload of an authentic datagram, or None (a bad tag). The caller has checked
    the length; the nonce is the header's ``seq``."""
    try:
        return aead.decrypt(
            bytes(datagram[10:18]).rjust(12, b"\0"),
            datagram[DGRAM_HEADER_LEN:],
            datagram[:DGRAM_HEADER_LEN],
        )
    except InvalidTag:
        return None


__all__ = [
    "AESGCM",
    "FleetKey",
    "InvalidTag",
    "Sealer",
    "SessionKeys",
    "hkdf",
    "nonce",
    "open_datagram",
]
