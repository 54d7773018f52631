"""One error tree for the whole project.

The CLI catches only :class:`SwarmError` and exits with its ``exit_code``; user-data
scripts branch on those codes, so they are part of the contract (README, "Exit codes").
Every message says what went wrong *and* what to do next.
"""

from __future__ import annotations


class SwarmError(Exception):
    """Base of every error swarm reports to a user. Exit code 1."""

    exit_code = 1


class UsageError(SwarmError):
    """Bad flags, arguments or configuration values. Exit code 2."""

    exit_code = 2


class NotFoundError(SwarmError):
    """The artifact, its manifest or its catalog entry does not exist. Exit code 3."""

    exit_code = 3


class AccessDeniedError(SwarmError):
    """Credentials are missing or lack a permission. Exit code 4."""

    exit_code = 4


class IntegrityError(SwarmError):
    """Data or a manifest failed verification even after retries. Exit code 5."""

    exit_code = 5


class ManifestError(IntegrityError):
    """The manifest cannot be parsed, is inconsistent, or its signature does not match."""


class NoSpaceError(SwarmError):
    """The destination file system has too little free space. Exit code 6."""

    exit_code = 6


class DeadlineError(SwarmError):
    """``--deadline`` passed before the artifact was complete. Exit code 7."""

    exit_code = 7


class DestBusyError(SwarmError):
    """Another fetch owns DEST (a different artifact, or the same one for too long).
    Exit code 8."""

    exit_code = 8


EXIT_CODES: dict[int, str] = {
    0: "done: DEST is complete and verified",
    1: "other failure (the message says which)",
    2: "usage: bad flag, argument or configuration value",
    3: "artifact, manifest or catalog entry not found",
    4: "access denied (credentials or S3 permissions)",
    5: "integrity failure after retries (bad piece, bad manifest)",
    6: "no space left for DEST",
    7: "deadline passed",
    8: "DEST is being fetched by another swarm fetch",
}
