"""The interface counter a node reports as its uplink measure (swarm.agent.linkcount):
none where the node's address is a loopback's or no interface's (the namespaced case is
in tests/fleet/test_linkcount.py)."""

from __future__ import annotations

from swarm.agent.linkcount import link_interface, sent_bytes


def test_no_counter_for_loopback_unheld_or_unspecified_addresses() -> None:
    assert link_interface("127.0.0.1") is None  # nodes on one machine share it
    assert link_interface("0.0.0.0") is None
    assert link_interface("198.51.100.254") is None  # TEST-NET-2: held by no interface
    assert link_interface("not an address") is None
    assert sent_bytes("no-such-interface0") is None
