"""A node's upload totals as its link carried them (swarm.agent.linkcount.SentUploads):
libtorrent counts what its sockets took, the coordinator's upload peaks want what the
link sent."""

from __future__ import annotations

from swarm.agent.linkcount import SentUploads, interface_counter, interface_for


class Interface:
    """A ``tx_bytes`` the test moves by hand (None: unreadable)."""

    def __init__(self) -> None:
        self.sent: int | None = 0

    def __call__(self) -> int | None:
        return self.sent


def test_a_burst_the_link_has_not_sent_counts_as_it_goes_out() -> None:
    link = Interface()
    uploads = SentUploads(link)
    assert uploads.totals({"a": 0}) == {"a": 0}
    # libtorrent's sockets took 2 MB, the link sent 1 MB of it: 1 MB counts now...
    link.sent = 1_000_000
    assert uploads.totals({"a": 2_000_000}) == {"a": 1_000_000}
    # ...and the rest once the link has sent it, though libtorrent took nothing more
    link.sent = 2_500_000
    assert uploads.totals({"a": 2_000_000}) == {"a": 2_000_000}
    # the link's other bytes (ACKs, S3 requests) never count as uploads
    link.sent = 3_000_000
    assert uploads.totals({"a": 2_000_000}) == {"a": 2_000_000}


def test_artifacts_share_what_the_link_sent_and_a_gone_one_is_forgotten() -> None:
    link = Interface()
    uploads = SentUploads(link)
    uploads.totals({"a": 0, "b": 0})
    link.sent = 1_000
    assert uploads.totals({"a": 800, "b": 800}) == {"a": 800, "b": 200}
    link.sent = 2_000
    assert uploads.totals({"b": 800}) == {"b": 800}
    # "a" comes back later: counted afresh from its total then
    assert uploads.totals({"a": 5_000, "b": 800}) == {"a": 5_000, "b": 800}


def test_without_a_readable_interface_libtorrents_totals_stand() -> None:
    link = Interface()
    link.sent = None
    uploads = SentUploads(link)
    assert uploads.totals({"a": 7}) == {"a": 7}
    assert uploads.totals({"a": 9_000}) == {"a": 9_000}


def test_loopback_has_no_interface_to_count() -> None:
    assert interface_for("127.0.0.1") is None
    assert interface_counter("no-such-interface-0", "tx_bytes") is None


def test_a_total_that_starts_again_from_zero_goes_on_from_where_it_was() -> None:
    """The seed-mode hand-over replaces the torrent's handle, whose upload total starts
    at zero: the reported total must not fall back with it."""
    link = Interface()
    uploads = SentUploads(link)
    uploads.totals({"a": 0})
    link.sent = 5_000
    assert uploads.totals({"a": 4_000}) == {"a": 4_000}
    link.sent = 6_000
    assert uploads.totals({"a": 0}) == {"a": 4_000}
    link.sent = 9_000
    assert uploads.totals({"a": 2_000}) == {"a": 6_000}
