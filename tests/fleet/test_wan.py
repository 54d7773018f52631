"""The WAN emulator (tools/wanem, swarm/lab/wan.py) does what it is set to: delay, loss, rate,
and one TCP flow through it behaves as TCP theory says it should (Mathis et al. 1997)."""

from __future__ import annotations

import statistics
from collections.abc import Iterator

import pytest

from swarm.lab import wan, wanprobe
from swarm.lab.netlab import Host, Lab, lab_unavailable

pytestmark = pytest.mark.fleet


@pytest.fixture
def pair() -> Iterator[tuple[Lab, Host, Host, wan.Wan]]:
    """Hosts ``a`` (near) and ``b`` (far) with 10 Gbit tbf links, the WAN between them."""
    reason = lab_unavailable() or wan.wanem_unavailable()
    if reason:
        pytest.skip(reason)
    with Lab("wt") as lab:
        a = lab.host("a", 10_000, 10_000)
        b = lab.host("b", 10_000, 10_000)
        link = wan.split_regions(lab, [b], wan.Shape())
        yield lab, a, b, link


def test_ping_rtt_and_jitter(pair: tuple[Lab, Host, Host, wan.Wan]) -> None:
    """100 ms RTT: every echo within 5% (the emulator adds at most 2 x 0.2 ms of
    coalescing); with +-5 ms jitter each way the mean stays within 5% and the spread shows."""
    _, a, b, link = pair
    link.set(wan.Shape.path(rtt_ms=100))
    rtts = wanprobe.ping(a, b.ip, count=40, interval=0.02)["rtts_ms"]
    assert len(rtts) == 40
    assert statistics.median(rtts) == pytest.approx(100, rel=0.05), rtts
    assert min(rtts) >= 100 and statistics.mean(rtts) == pytest.approx(100, rel=0.05)
    link.set(wan.Shape.path(rtt_ms=100, jitter_ms=5))
    rtts = wanprobe.ping(a, b.ip, count=40, interval=0.02)["rtts_ms"]
    assert statistics.mean(rtts) == pytest.approx(100, rel=0.05), rtts
    assert max(rtts) - min(rtts) > 4, rtts  # two uniform +-5 ms samples per echo


def test_random_loss_matches_the_setting(pair: tuple[Lab, Host, Host, wan.Wan]) -> None:
    """0.5% loss: 100,000 datagrams lose 500 +- 22 (1 sigma); within 20% is 4.5 sigma."""
    _, a, b, link = pair
    link.set(wan.Shape(loss=0.005))
    result = wanprobe.udp_loss(a, b, count=100_000, pps=40_000, size=100)
    assert result["loss"] == pytest.approx(0.005, rel=0.2), result
    stats = link.stats()["ab"]
    assert stats["overflow"] == 0 and stats["dropped"] == 0


def test_rate_and_queue(pair: tuple[Lab, Host, Host, wan.Wan]) -> None:
    """A 100 Mbit link carries one TCP flow at its rate (less TCP/IP/Ethernet headers:
    1448 of 1514 bytes a frame), and no faster."""
    _, a, b, link = pair
    link.set(wan.Shape(rate_mbit=100))
    flow = wanprobe.tcp_flow(a, b, seconds=3, warmup=0.5)
    assert 0.9 * 100 * 1448 / 1514 <= flow["mbit"] <= 100 * 1448 / 1514 * 1.02, flow


def test_one_tcp_flow_is_near_the_mathis_estimate(pair: tuple[Lab, Host, Host, wan.Wan]) -> None:
    """100 ms RTT, 0.5% loss each way: one CUBIC flow gets about MSS/RTT * 1.22/sqrt(p)
    (2.0 Mbit/s). Four flows at once are four samples of a single flow (the link has no
    rate limit: they do not compete); each is measured for 20 s after a 3 s warm-up (slow
    start overshoots the steady window). Measured 0.89-1.15x over 40 s windows."""
    _, a, b, link = pair
    link.set(wan.Shape.path(rtt_ms=100, loss=0.005))
    flows = wanprobe.tcp_flows(a, b, count=4, seconds=20, warmup=3)
    estimate = wanprobe.mathis_mbit(flows[0]["mss"], 100, 0.005)
    ratios = [flow["mbit"] / estimate for flow in flows]
    assert all(flow["algorithm"] == "cubic" for flow in flows)
    assert all(0.5 <= r <= 2.0 for r in ratios), ratios
    assert 0.7 <= statistics.mean(ratios) <= 1.4, ratios
