"""The uplink pacer's rules (swarm.agent.uplink), and its hold on real sockets: it finds
this process's connections by their peers' addresses and paces them through the kernel."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarm.agent.linkcount import link_interface, route_interface
from swarm.agent.uplink import (
    PACE_SHARE,
    PROOF_SECONDS,
    QUEUE_DELAY,
    RATE_WINDOW,
    SO_MAX_PACING_RATE,
    FlowInfo,
    LinkRates,
    Pacing,
    UplinkPacer,
    first_budget,
    flow_info,
    peer_sockets,
    queue_delay,
)


def rates(sent: float, received: float, sent_peak: float | None = None) -> LinkRates:
    """Counters that moved at ``sent`` and ``received`` bytes/s over one window, after
    a window at ``sent_peak`` (if given)."""
    link = LinkRates("eth-test")
    tx = rx = 0
    now = 0.0
    link.add(now, tx, rx)
    if sent_peak is not None:
        now += RATE_WINDOW
        tx, rx = tx + int(sent_peak), rx + int(received)
        link.add(now, tx, rx)
    now += RATE_WINDOW
    link.add(now, tx + int(sent), rx + int(received))
    return link


def test_rates_are_over_a_window_and_peaks_are_kept() -> None:
    link = LinkRates("eth-test")
    link.add(0.0, 0, 0)
    link.add(0.5, 400_000, 100)  # half a window: a shaper's burst, not a rate yet
    assert link.sent == 0.0
    link.add(1.0, 600_000, 10_000_000)
    assert link.sent == pytest.approx(600_000)
    assert link.received == pytest.approx(10_000_000)
    link.add(2.0, 900_000, 12_000_000)  # the window is the last second's
    assert link.sent == pytest.approx(300_000)
    assert link.received == pytest.approx(2_000_000)
    assert link.sent_peak == pytest.approx(600_000)
    assert link.received_peak == pytest.approx(10_000_000)


def test_queue_delay_is_what_every_sending_flow_sees() -> None:
    flows = [FlowInfo(True, 0.30, 0.01), FlowInfo(True, 0.25, 0.01), FlowInfo(False, 2.0, 0.0)]
    assert queue_delay(flows) == pytest.approx(0.24)
    # a receiver's full downlink holds only the flows to it
    assert queue_delay([FlowInfo(True, 0.30, 0.01), FlowInfo(True, 0.011, 0.01)]) < QUEUE_DELAY
    assert queue_delay([FlowInfo(True, 0.30, 0.01)]) == 0.0  # one flow cannot tell
    assert queue_delay([FlowInfo(True, 0.30, 0.0), FlowInfo(True, 0.3, 0.0)]) == 0.0
    # a connection opened into the queue has never seen the link without it
    born_queued = [
        FlowInfo(True, 0.30, 0.01),
        FlowInfo(True, 0.62, 0.62),
        FlowInfo(False, 0, 0.0001),
    ]
    assert queue_delay(born_queued) == pytest.approx(0.2999)


def test_pacing_starts_on_a_narrow_uplink_with_a_standing_queue() -> None:
    slow_uploads = rates(sent=620_000, received=12_000_000)
    assert first_budget(slow_uploads, 0.2) == pytest.approx(PACE_SHARE * 620_000)
    assert first_budget(slow_uploads, QUEUE_DELAY / 2) is None  # no queue: nothing to do
    mixed = rates(sent=3_000_000, received=9_000_000)  # 300 down, 100 up: uploads matter
    assert first_budget(mixed, 0.2) is None
    idle = rates(sent=0, received=12_000_000)
    assert first_budget(idle, 0.2) is None
    # slow uploads' last node: its full uplink held its downloads to 2.7 MB/s at most
    starved = rates(sent=620_000, received=2_680_000)
    assert first_budget(starved, 0.2) == pytest.approx(PACE_SHARE * 620_000)


def test_a_node_held_below_its_link_is_judged_by_what_the_fleet_receives() -> None:
    # slow uploads' last node in another run: 2.3 MB/s at most for 20 s, while the
    # median node's download peak was 7.5-8.7
    held = rates(sent=640_000, received=2_300_000)
    assert first_budget(held, 0.2) is None
    assert first_budget(held, 0.2, fleet_down=7_500_000) == pytest.approx(PACE_SHARE * 640_000)
    # a fleet of links three times as fast down as up (mixed) still leaves uploads whole
    mixed = rates(sent=3_000_000, received=6_000_000)
    assert first_budget(mixed, 0.2, fleet_down=9_000_000) is None


@pytest.fixture
def connection() -> Iterator[tuple[socket.socket, socket.socket]]:
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    server.close()
    try:
        yield client, accepted
    finally:
        client.close()
        accepted.close()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def pacing_rate(sock: socket.socket) -> int:
    raw = sock.getsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, 4)
    return int(struct.unpack("=I", raw)[0])


def test_the_pacer_caps_this_process_connections_to_its_peers(
    connection: tuple[socket.socket, socket.socket],
) -> None:
    client, accepted = connection
    peer = client.getpeername()[:2]
    before = open_fds()
    found = [(fd, s.getsockname()) for fd, s in peer_sockets({peer})]
    assert found == [(client.fileno(), client.getsockname())]  # the other end's peer differs
    assert open_fds() == before  # every duplicate closed
    among = [fd for fd, _ in peer_sockets({peer}, [accepted.fileno(), client.fileno(), 9999])]
    assert among == [client.fileno()]  # only the descriptors asked for, and open ones
    UplinkPacer._cap({peer}, 123_456)
    assert pacing_rate(client) == 123_456
    assert pacing_rate(accepted) != 123_456
    UplinkPacer._cap({peer}, 0xFFFFFFFF)  # unpaced
    assert pacing_rate(client) == 0xFFFFFFFF


def test_flow_info_tells_a_flow_with_bytes_to_send(
    connection: tuple[socket.socket, socket.socket],
) -> None:
    client, accepted = connection
    idle = flow_info(accepted)
    assert idle is not None and not idle.queued
    client.setblocking(False)
    with pytest.raises(BlockingIOError):
        while True:  # fill the receiver's window and the send buffer
            client.send(bytes(1 << 16))
    sending = flow_info(client)
    assert sending is not None and sending.queued
    assert 0 < sending.min_rtt <= sending.rtt < 1.0


def test_no_pacer_without_an_interface_to_measure() -> None:
    assert link_interface("127.0.0.1") is None  # nodes on one machine share it
    assert link_interface("0.0.0.0") is None
    assert link_interface("198.51.100.254") is None  # TEST-NET-2: held by no interface
    assert UplinkPacer.for_address("127.0.0.1", set, lambda: True) is None


def test_the_default_routes_interface_is_the_link_of_every_address(tmp_path: Path) -> None:
    table = tmp_path / "route"
    table.write_text(
        "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n"
        "eth1\t00000000\t010200C0\t0003\t0\t0\t200\t00000000\t0\t0\t0\n"
        "eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
        "eth0\t00000000\t010200C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
    )
    assert route_interface(table) == "eth0"  # the least metric
    table.write_text("Iface\tDestination\n")
    assert route_interface(table) is None
    assert route_interface(tmp_path / "missing") is None


def test_pacing_waits_for_a_queue_that_stands_on_a_flat_uplink() -> None:
    pacing = Pacing()
    ramping = [rates(sent=sent, received=20_000_000) for sent in (1e6, 2e6, 3e6, 4e6, 5e6)]
    for second, link in enumerate(ramping):  # a queue, but the uplink is speeding up
        assert pacing.look(float(second), link, 0.1) is None
    flat = rates(sent=620_000, received=12_000_000)
    pacing = Pacing()
    assert pacing.look(0.0, flat, 0.1) is None
    assert pacing.look(1.0, flat, 0.1) is None
    assert pacing.look(1.0 + PROOF_SECONDS, flat, 0.1) == pytest.approx(PACE_SHARE * 620_000)
    # paced at the proven rate, queue or not, until the fetch is done
    assert pacing.look(3.5, flat, 0.0) == pytest.approx(PACE_SHARE * 620_000)
    pacing.done()
    assert pacing.budget is None
    assert pacing.look(4.0, flat, 0.1) is None  # the next fetch proves anew


def test_a_queue_that_goes_away_restarts_the_proof() -> None:
    flat = rates(sent=620_000, received=12_000_000)
    pacing = Pacing()
    assert pacing.look(0.0, flat, 0.1) is None
    assert pacing.look(1.0, flat, 0.0) is None  # gone
    assert pacing.look(2.0, flat, 0.1) is None
    assert pacing.look(2.0 + PROOF_SECONDS / 2, flat, 0.1) is None
