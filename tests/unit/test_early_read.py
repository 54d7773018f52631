"""Where ``swarm fetch`` reads ahead (:func:`swarm.agent.earlyread.early_start`), and how
the fetch request carries what it read (``early``, ``s3_rtt``)."""

from __future__ import annotations

import pytest

from swarm.agent.earlyread import early_start
from swarm.errors import UsageError
from swarm.messages import FetchRequest, S3Read


@pytest.mark.parametrize(
    ("pieces", "count", "low", "high"),
    [
        (128, 32, 64, 96),  # the upper half, where the coordinator's first stripes are not
        (200, 32, 100, 168),
        (40, 32, 8, 8),  # no room in the upper half: as high as it fits
        (24, 24, 0, 0),  # all of it
        (1, 1, 0, 0),
    ],
)
def test_a_read_begins_at_random_in_the_upper_half(
    pieces: int, count: int, low: int, high: int
) -> None:
    starts = {early_start(pieces, count) for _ in range(3000)}
    assert min(starts) == low and max(starts) == high
    assert all(start + count <= pieces for start in starts)


def test_the_request_carries_the_pieces_and_the_round_trip() -> None:
    sent = FetchRequest(
        source="index.db", early=(3, 4, 5), s3_rtt=0.0012, s3_read=S3Read(6 << 20, 0.41)
    )
    assert FetchRequest.from_json(sent.to_json()) == sent
    assert FetchRequest.from_json({"source": "index.db"}).early == ()  # an older CLI


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("early", [1, -2]),
        ("early", ["1"]),
        ("early", [True]),
        ("early", 3),
        ("s3_rtt", -0.1),
        ("s3_rtt", float("nan")),
        ("s3_rtt", "0.1"),
        ("s3_rtt", True),
    ],
)
def test_bad_values_are_refused(field: str, value: object) -> None:
    with pytest.raises(UsageError, match=f"bad fetch request: {field} must be"):
        FetchRequest.from_json({"source": "index.db", field: value})


@pytest.mark.parametrize(
    "value",
    [[1, 2], {"bytes": -1, "seconds": 0.5}, {"bytes": 1.5, "seconds": 0.5},
     {"bytes": 100, "seconds": -0.5}, {"bytes": 100}, "100 in 0.5"],
)  # fmt: skip
def test_a_bad_s3_read_is_refused(value: object) -> None:
    with pytest.raises(UsageError, match="an S3 read is"):
        FetchRequest.from_json({"source": "index.db", "s3_read": value})
