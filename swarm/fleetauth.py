"""The fleet's credentials: a token derived from the fleet secret, and log redaction.

The secret (``SWARM_SECRET``) never leaves a node: what travels is the *fleet token*,
``HMAC-SHA256(secret, "swarm fleet token v1")``, in the tracker URL's query and in an
``Authorization: Bearer`` header. Neither the secret nor the token is ever put on a
command line (``ps``), and :class:`Redactor` masks both in every log record, including
libtorrent's alert messages that quote the tracker URL.
"""

from __future__ import annotations

import hashlib
import hmac
import logging

TOKEN_LABEL = b"swarm fleet token v1"
MASK = "***"


def fleet_token(secret: str) -> str:
    return hmac.new(secret.encode(), TOKEN_LABEL, hashlib.sha256).hexdigest()


def token_matches(presented: str | None, expected: str) -> bool:
    """Constant-time comparison; a missing token never matches."""
    return presented is not None and hmac.compare_digest(presented.encode(), expected.encode())


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header, or None."""
    if header and header.startswith("Bearer "):
        return header[len("Bearer ") :].strip()
    return None


class Redactor(logging.Filter):
    """Masks the fleet secret and token in every record that passes a handler."""

    def __init__(self, *secrets: str) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(s in message for s in self.secrets):
            for secret in self.secrets:
                message = message.replace(secret, MASK)
            record.msg, record.args = message, None
        return True


def install_redactor(secret: str | None) -> None:
    """Attach a :class:`Redactor` for ``secret`` (and its token) to every root handler."""
    if not secret:
        return
    redactor = Redactor(secret, fleet_token(secret))
    for handler in logging.getLogger().handlers:
        handler.addFilter(redactor)
