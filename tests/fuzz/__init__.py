"""Fuzz tests: every parser of untrusted input raises only its declared error type.

Two hypothesis profiles, chosen by ``SWARM_FUZZ``:

- ``short`` (default, part of ``make test``): ~200 examples per target, derandomized,
  so every CI run tries the same inputs and a failure reproduces by re-running.
- ``long`` (``SWARM_FUZZ=long``, what ``make fuzz`` runs): 20 000 examples per target,
  random, no deadline; a failure prints a ``@reproduce_failure`` blob to paste into the
  test.

Neither profile keeps an example database (``database=None``): a run depends only on
the code and the profile, never on what an earlier run happened to find. A failure found
by a long run belongs in the test as an ``@example`` so the short profile keeps it.

Tests apply the profile with ``@FUZZ`` instead of ``settings.load_profile`` so that
hypothesis tests elsewhere in the suite keep their own settings.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

SHORT_EXAMPLES = 200
"""Examples per target in the default run: all targets together stay well under 20 s."""

LONG_EXAMPLES = 20_000
"""Examples per target with ``SWARM_FUZZ=long``."""

settings.register_profile(
    "swarm-fuzz-short",
    max_examples=SHORT_EXAMPLES,
    derandomize=True,
    database=None,
    # Benchmarks share this 2-core machine: a wall-clock deadline would flake, and the
    # targets are bounded by their inputs' size caps anyway.
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "swarm-fuzz-long",
    max_examples=LONG_EXAMPLES,
    derandomize=False,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)

PROFILE = os.environ.get("SWARM_FUZZ", "short").strip().lower() or "short"
if PROFILE not in {"short", "long"}:
    raise ValueError(f"SWARM_FUZZ must be 'short' or 'long', got {PROFILE!r}")

FUZZ = settings.get_profile(f"swarm-fuzz-{PROFILE}")
"""Decorator applying the selected profile to one ``@given`` test."""
