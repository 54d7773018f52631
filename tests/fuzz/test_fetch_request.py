"""The daemon's fetch request and the coordinator's plan, as the daemon parses them: any
JSON gives a valid message or a usage error (never another exception, never a message
that breaks the daemon later)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from swarm.errors import UsageError
from swarm.messages import SOURCES, FetchRequest, OriginPlan, parse_udp_source
from tests.fuzz import FUZZ

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=20,
)

request_like = st.fixed_dictionaries(
    {},
    optional={
        "source": st.one_of(st.text(max_size=30), json_values),
        "dest": st.one_of(st.text(max_size=30), st.just("/var/lib/app/x"), json_values),
        "copy": json_values,
        "catalog": json_values,
        "endpoint_url": json_values,
        "sources": st.one_of(
            st.lists(st.sampled_from([*SOURCES, "udp://h:1", "udp://h", "x"]), max_size=4),
            json_values,
        ),
        "listen": json_values,
        "coordinator": json_values,
        "peers_from_asg": json_values,
    },
)


@FUZZ
@given(st.one_of(request_like, json_values))
def test_fetch_request_is_valid_or_a_usage_error(body: Any) -> None:
    try:
        request = FetchRequest.from_json(body)
    except UsageError:
        return
    assert isinstance(request.source, str) and request.source
    assert request.dest is None or request.dest.startswith("/")
    assert request.sources
    for source in request.sources:
        assert source in SOURCES or parse_udp_source(source)
    assert FetchRequest.from_json(request.to_json()) == request  # round trip


@FUZZ
@given(json_values)
def test_origin_plan_is_a_plan_or_none(body: Any) -> None:
    plan = OriginPlan.from_json(body)
    if plan is not None:
        assert all(isinstance(p, int) for p in plan.stripe)
        assert isinstance(plan.mode, str) and isinstance(plan.fill, bool)
