"""The UDP transfer machines, driven through a simulated link (no sockets, no clock).

:class:`Sim` is a discrete-event simulation: a reliable control channel with a fixed delay,
and a datagram path with seeded loss, duplication, reordering (random extra delay) and,
optionally, a drop-tail bottleneck of a given rate, like a tbf qdisc.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.udp import protocol as p
from swarm.udp import wire
from swarm.udp.rate import start_rate

SECRET = b"fleet-secret-for-tests-0123456789"
HASH_HEX = "ab" * 20
CLIENT_IP = ("10.0.0.2", 40000)


def artifact(size: int, piece_size: int, seed: int = 1) -> tuple[bytes, list[bytes]]:
    data = random.Random(seed).randbytes(size)
    return data, [data[i : i + piece_size] for i in range(0, size, piece_size)]


@dataclass
class Link:
    loss: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    delay: float = 0.005
    rate_bps: float | None = None
    """Bottleneck rate; None for an unlimited link."""
    queue_bytes: int = 256 * 1024
    busy_until: float = 0.0
    queued: list[tuple[float, int]] = field(default_factory=list)
    drops: int = 0
    delivered_bytes: int = 0


class Sim:
    """One server session and one client session joined by a :class:`Link`."""

    def __init__(
        self,
        link: Link,
        seed: int = 7,
        size: int = 3 * 65536 + 1000,
        piece_size: int = 65536,
        block_size: int = 4096,
        pieces: list[int] | None = None,
        rate_bps: int = 200_000_000,
        rate_cap_bps: int = 1_000_000_000,
        server_has: Callable[[int], bool] = lambda i: True,
        sink_ok: Callable[[int, bytes, int], bool] | None = None,
        client_secret: bytes = SECRET,
        batched: bool = False,
        arrived_elsewhere: Callable[[Sim], list[int]] | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        self.link = link
        self.arrived_elsewhere = arrived_elsewhere
        """Pieces another source brought by now (the client skips them)."""
        self.sent_ordinals: list[int] = []
        self.data, self.pieces = artifact(size, piece_size)
        self.hashes = [hashlib.sha1(x).digest() for x in self.pieces]
        self.piece_size, self.size = piece_size, size
        self.server_has = server_has
        self.sink_ok = sink_ok
        self.now = 0.0
        self.queue: list[tuple[float, int, str, object]] = []
        self.seq = itertools.count()
        self.batched = batched
        """GSO/GRO: the server seals batches of up to 8 datagrams; datagrams that arrive
        at the same instant with one size are handed to the client as one receive."""
        self.server = p.ServerSession(
            p.FleetKey(SECRET),
            bytes(range(32)),
            CLIENT_IP[0],
            rate_cap_bps,
            max_batch_segments=8 if batched else 1,
            wake_bytes=8 * (block_size + p.DGRAM_OVERHEAD) if batched else 0,
        )
        self.receives = 0
        wanted = pieces if pieces is not None else list(range(len(self.pieces)))
        self.client = p.ClientSession(
            p.FleetKey(client_secret),
            bytes(range(32, 64)),
            HASH_HEX,
            wanted,
            rate_bps,
            block_size,
            piece_size,
            len(self.pieces),
        )
        self.kept: dict[int, bytes] = {}
        self.offers: dict[int, int] = {}
        self.server_events: list[p.Event] = []
        self.client_events: list[p.Event] = []
        self.sent_wire_bytes = 0
        self.server_timer: float | None = None
        self.client_timer: float | None = None

    def at(self, when: float, kind: str, payload: object = None) -> None:
        heapq.heappush(self.queue, (when, next(self.seq), kind, payload))

    def datagram(self, data: bytes) -> None:
        link, rng = self.link, self.rng
        self.sent_wire_bytes += len(data)
        self.sent_ordinals.append(wire.DGRAM.unpack_from(data)[4])
        if rng.random() < link.loss:
            return
        copies = 2 if rng.random() < link.dup else 1
        for _ in range(copies):
            when = self.now + link.delay
            if link.rate_bps is not None:
                # Drop-tail queue in front of a link of rate_bps (a tbf without its burst).
                link.queued = [(t, n) for t, n in link.queued if t > self.now]
                if sum(n for _, n in link.queued) + len(data) > link.queue_bytes:
                    link.drops += 1
                    continue
                start = max(self.now, link.busy_until)
                link.busy_until = start + len(data) * 8 / link.rate_bps
                link.queued.append((link.busy_until, len(data)))
                when = link.busy_until + link.delay
            if rng.random() < link.reorder:
                when += rng.uniform(0, 3 * link.delay)
            link.delivered_bytes += len(data)
            self.at(when, "to_client", bytes(data))

    def pump(self) -> None:
        """Move control bytes and handle events until both machines are quiet."""
        for _ in range(100):
            busy = False
            out = self.server.data_to_send()
            if out:
                self.at(self.now + self.link.delay, "ctl_to_client", out)
            out = self.client.data_to_send()
            if out:
                self.at(self.now + self.link.delay, "ctl_to_server", out)
            for event in self.server.events():
                busy = True
                self.server_events.append(event)
                if isinstance(event, p.RequestReceived):
                    assert event.info_hash_hex == HASH_HEX
                    have = [i for i in event.pieces if self.server_has(i)]
                    gone = [i for i in event.pieces if not self.server_has(i)]
                    self.server.accept(
                        self.piece_size, self.size, have, gone, event.rate_bps, event.block_size
                    )
                elif isinstance(event, p.NeedPieces):
                    for index in event.pieces:
                        self.server.piece_loaded(index, self.pieces[index])
            for event in self.client.events():
                busy = True
                self.client_events.append(event)
                if isinstance(event, p.PieceReceived):
                    n = self.offers[event.index] = self.offers.get(event.index, 0) + 1
                    ok = hashlib.sha1(event.data).digest() == self.hashes[event.index]
                    if self.sink_ok is not None:
                        ok = ok and self.sink_ok(event.index, event.data, n)
                    if ok:
                        self.kept[event.index] = bytes(event.data)
                    self.client.piece_checked(event.index, ok)
                    self.client.recycle(event.data)
            if not busy:
                break
        self.server_timer = self.server.next_timer(self.now)
        self.client_timer = self.client.next_timer()

    def run(self, until: float = 30.0) -> None:
        self.pump()
        while not self.client.done and self.now < until:
            candidates = [t for t in (self.server_timer, self.client_timer) if t is not None]
            if self.queue:
                candidates.append(self.queue[0][0])
            if not candidates:
                break
            self.now = max(self.now, min(candidates))
            while self.queue and self.queue[0][0] <= self.now:
                when, _, kind, payload = heapq.heappop(self.queue)
                assert isinstance(payload, bytes)
                if kind == "to_client" and self.batched:
                    # GRO: what arrives together in one size (the last may be shorter).
                    batch = [payload]
                    while (
                        self.queue
                        and self.queue[0][0] == when
                        and self.queue[0][2] == "to_client"
                        and len(batch[-1]) == len(payload)
                        and len(self.queue[0][3]) <= len(payload)  # type: ignore[arg-type]
                    ):
                        batch.append(heapq.heappop(self.queue)[3])  # type: ignore[arg-type]
                    data = b"".join(batch)
                    self.client.receive_batch(memoryview(data), len(data), len(payload))
                    self.receives += 1
                elif kind == "to_client":
                    self.receives += 1
                    self.client.receive_datagram(payload)
                elif kind == "to_server":
                    self.server.receive_datagram(payload, CLIENT_IP)
                elif kind == "ctl_to_client":
                    self.client.receive_control(payload, self.now)
                elif kind == "ctl_to_server":
                    self.server.receive_control(payload, self.now)
                self.pump()
            if self.server_timer is not None and self.server_timer <= self.now:
                if self.batched:
                    for batch in self.server.handle_timer_batches(self.now):
                        assert batch.count <= 8
                        sizes = [len(d) for d in batch.datagrams()]
                        assert len(sizes) == batch.count and set(sizes[:-1]) <= {batch.segment}
                        assert sizes[-1] <= batch.segment
                        for dgram in batch.datagrams():
                            self.datagram(bytes(dgram))
                        self.server.recycle(batch)
                else:
                    for dgram in self.server.handle_timer(self.now):
                        self.datagram(bytes(dgram))
            if self.client_timer is not None and self.client_timer <= self.now:
                if self.arrived_elsewhere is not None:
                    self.client.skip(self.arrived_elsewhere(self))
                for dgram in self.client.handle_timer(self.now):
                    self.at(self.now + self.link.delay, "to_server", dgram)
            self.pump()
        # Deliver the last control bytes (DONE -> BYE).
        end = self.now + 1.0
        while self.queue and self.queue[0][0] <= end:
            self.now, _, kind, payload = heapq.heappop(self.queue)
            assert isinstance(payload, bytes)
            if kind == "ctl_to_server":
                self.server.receive_control(payload, self.now)
            elif kind == "ctl_to_client":
                self.client.receive_control(payload, self.now)
            self.pump()

    def assert_complete(self) -> None:
        assert self.client.done
        assert sorted(self.kept) == sorted(self.client.kept)
        for index, data in self.kept.items():
            assert data == self.pieces[index]


# -- transfers ---------------------------------------------------------------------------------


def test_clean_link_transfers_every_piece_once() -> None:
    sim = Sim(Link())
    sim.run()
    sim.assert_complete()
    assert sorted(sim.kept) == list(range(len(sim.pieces)))
    assert sim.client.stats.duplicates == 0
    assert sim.server.stats.retransmits == 0
    assert sim.client.stats.forged == 0
    assert any(isinstance(e, p.TransferDone) for e in sim.server_events)
    assert sim.server.state is p.ServerState.DONE


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_loss_duplication_and_reordering_still_deliver_exact_bytes(seed: int) -> None:
    sim = Sim(Link(loss=0.08, dup=0.05, reorder=0.1), seed=seed, block_size=2048)
    sim.run()
    sim.assert_complete()
    assert sorted(sim.kept) == list(range(len(sim.pieces)))
    assert sim.server.stats.retransmits > 0
    assert sim.client.stats.naks > 0
    assert sim.client.stats.duplicates > 0
    assert sim.client.stats.forged == 0


@pytest.mark.parametrize("seed", [1, 2])
def test_batches_gso_and_gro_deliver_the_same_bytes(seed: int) -> None:
    """Batched sends and receives (GSO/GRO) through the same lossy, duplicating,
    reordering link: exact bytes, and receives carry several datagrams each."""
    sim = Sim(Link(loss=0.05, dup=0.03, reorder=0.05), seed=seed, block_size=2048, batched=True)
    sim.run()
    sim.assert_complete()
    assert sorted(sim.kept) == list(range(len(sim.pieces)))
    assert sim.server.stats.retransmits > 0 and sim.client.stats.duplicates > 0
    assert sim.server.stats.batches * 3 < sim.server.stats.datagrams
    assert sim.receives * 2 < sim.client.stats.datagrams
    assert sim.client.stats.forged == 0


def test_heavy_loss_completes() -> None:
    sim = Sim(Link(loss=0.3), seed=5, block_size=2048)
    sim.run(until=60)
    sim.assert_complete()
    assert len(sim.kept) == len(sim.pieces)


@pytest.mark.parametrize(
    ("ask", "min_goodput", "max_wire"), [(100e6, 0.85, 1.3), (400e6, 0.85, 1.6)]
)
def test_rate_adapts_to_a_bottleneck_and_keeps_it_full(
    ask: float, min_goodput: float, max_wire: float
) -> None:
    """Asked for 2x (8x) a 50 Mbit bottleneck with a 20 ms RTT: the sender finds about
    the link rate; goodput, handshake, slow start and tail included (3 s in all), stays
    near the link rate and the bytes sent (lost ones included) stay bounded."""
    link = Link(rate_bps=50e6, queue_bytes=128 * 1024, delay=0.01)
    size = 16 << 20
    sim = Sim(link, size=size, piece_size=1 << 20, block_size=16384, rate_bps=int(ask))
    sim.run(until=60)
    sim.assert_complete()
    goodput = size * 8 / sim.now
    assert goodput >= min_goodput * 50e6, goodput
    assert 35e6 <= sim.server.rate <= 80e6
    assert sim.sent_wire_bytes < max_wire * size, sim.sent_wire_bytes / size
    assert sim.client.stats.duplicates < 0.01 * sim.client.stats.datagrams


def test_server_cap_holds_whatever_the_client_asks() -> None:
    cap = 20_000_000
    sim = Sim(Link(), size=2 << 20, piece_size=1 << 18, rate_bps=10_000_000_000, rate_cap_bps=cap)
    sim.run(until=60)
    sim.assert_complete()
    accepted = next(e for e in sim.client_events if isinstance(e, p.Accepted))
    assert accepted.rate_bps == cap
    # Paced: the wire bytes never exceed cap * time + one burst.
    assert sim.sent_wire_bytes * 8 <= cap * sim.now + 8 * 65536
    assert sim.now >= (2 << 20) * 8 / cap * 0.95


def test_cap_lowered_mid_transfer_applies() -> None:
    sim = Sim(Link(), size=1 << 20, piece_size=1 << 18, rate_bps=100_000_000)
    sim.pump()
    sim.server.set_rate_cap(5_000_000)
    sim.run(until=60)
    sim.assert_complete()
    assert sim.server.rate <= 5_000_000


def test_unavailable_pieces_are_reported_not_sent() -> None:
    sim = Sim(Link(), server_has=lambda i: i != 1)
    sim.run()
    sim.assert_complete()
    assert sim.client.unavailable == (1,)
    assert sorted(sim.kept) == [0, 2, 3]


def test_subset_request_in_any_order() -> None:
    sim = Sim(Link(loss=0.05), pieces=[3, 0])
    sim.run()
    sim.assert_complete()
    assert sorted(sim.kept) == [0, 3]


def test_hash_failure_rerequests_then_gives_up() -> None:
    # Piece 0 fails once then passes; piece 2 fails every time.
    def sink_ok(index: int, data: bytes, attempt: int) -> bool:
        return not (index == 0 and attempt == 1) and index != 2

    sim = Sim(Link(), sink_ok=sink_ok)
    sim.run()
    sim.assert_complete()
    assert sim.offers[0] == 2
    assert sim.offers[2] == p.MAX_PIECE_ATTEMPTS
    assert sim.client.failed == [2]
    assert 0 in sim.kept and 2 not in sim.kept
    assert sim.client.stats.hash_failures == p.MAX_PIECE_ATTEMPTS + 1


def test_refused_request() -> None:
    server, client = handshake()
    server.receive_control(client.data_to_send(), 0.0)  # AUTH + REQUEST
    request = [e for e in server.events() if isinstance(e, p.RequestReceived)]
    assert request == [p.RequestReceived(HASH_HEX, (0, 1), 10**8, 1024)]
    server.refuse(p.RefuseCode.UNKNOWN_ARTIFACT, "no such artifact")
    client.receive_control(server.data_to_send(), 0.0)
    refused = [e for e in client.events() if isinstance(e, p.Refused)]
    assert refused == [p.Refused(p.RefuseCode.UNKNOWN_ARTIFACT, "no such artifact")]
    assert client.done and client.unavailable == (0, 1)


# -- security ----------------------------------------------------------------------------------


def handshake(
    client_secret: bytes = SECRET, server_secret: bytes = SECRET
) -> tuple[p.ServerSession, p.ClientSession]:
    server = p.ServerSession(p.FleetKey(server_secret), b"s" * 32, CLIENT_IP[0], 10**9)
    client = p.ClientSession(
        p.FleetKey(client_secret), b"c" * 32, HASH_HEX, [0, 1], 10**8, 1024, 4096, 2
    )
    server.receive_control(client.data_to_send(), 0.0)
    client.receive_control(server.data_to_send(), 0.0)
    return server, client


def accepted_pair() -> tuple[p.ServerSession, p.ClientSession]:
    server, client = handshake()
    server.receive_control(client.data_to_send(), 0.0)
    server.events()
    server.accept(4096, 8000, [0, 1], [], 10**8, 1024)
    client.receive_control(server.data_to_send(), 0.0)
    return server, client


def test_client_refuses_a_server_with_another_secret() -> None:
    with pytest.raises(p.AuthenticationError, match="server failed to prove"):
        handshake(server_secret=b"another-fleet-secret-0123456789")


def test_server_refuses_a_wrong_proof_and_the_client_learns_why() -> None:
    server = p.ServerSession(p.FleetKey(SECRET), b"s" * 32, CLIENT_IP[0], 10**9)
    hello = p.frame(p.Msg.HELLO, p.VERSION_MAGIC + b"c" * 32)
    server.receive_control(hello, 0.0)
    server.data_to_send()
    with pytest.raises(p.AuthenticationError, match="wrong fleet secret"):
        server.receive_control(p.frame(p.Msg.AUTH, b"x" * 32), 0.0)
    assert server.session_id == b""
    assert server.handle_timer(1.0) == []

    # The real client, against a server that rejects it, raises an authentication error.
    server, client = handshake()
    server.receive_control(client.data_to_send(), 0.0)
    client2 = p.ClientSession(p.FleetKey(SECRET), b"d" * 32, HASH_HEX, [0], 10**8, 1024, 4096, 2)
    client2.data_to_send()
    client2.state = p.ClientState.AWAIT_ACCEPT
    client2._side.recv_ctl = p.Sealer(b"k" * 32)
    with pytest.raises(p.AuthenticationError, match="refused our fleet secret"):
        client2.receive_control(p.frame(p.Msg.ERROR, b"authentication failed"), 0.0)


def test_proofs_are_not_reflectable() -> None:
    key = p.FleetKey(SECRET)
    assert key.proof(b"server", b"t") != key.proof(b"client", b"t")


def test_secret_is_required_and_long_enough() -> None:
    for bad in (b"", b"short"):
        with pytest.raises(p.LocalProtocolError, match="SWARM_SECRET"):
            p.FleetKey(bad)


def test_sessions_get_distinct_keys() -> None:
    key = p.FleetKey(SECRET)
    a = key.session_keys(b"c" * 32, b"s" * 32)
    b = key.session_keys(b"c" * 32, b"t" * 32)
    assert a.data_s2c != b.data_s2c and a.session_id != b.session_id
    assert len({a.control_c2s, a.control_s2c, a.data_s2c, a.data_c2s}) == 4


def test_hkdf_matches_rfc5869_case_1() -> None:
    """Our call of ``cryptography``'s HKDF puts salt, info and key where RFC 5869 does."""
    ikm = bytes.fromhex("0b" * 22)
    salt = bytes.fromhex("000102030405060708090a0b0c")
    info = bytes.fromhex("f0f1f2f3f4f5f6f7f8f9")
    okm = p.hkdf(ikm, salt, info, 42)
    assert okm.hex() == (
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
    )


def test_preauth_frames_are_small() -> None:
    server = p.ServerSession(p.FleetKey(SECRET), b"s" * 32, CLIENT_IP[0], 10**9)
    with pytest.raises(p.RemoteProtocolError, match="limit"):
        server.receive_control(struct.pack("!IB", 10_000, p.Msg.HELLO), 0.0)


def test_tampered_control_frame_is_rejected() -> None:
    server, client = handshake()
    out = bytearray(client.data_to_send())
    out[-1] ^= 1  # last byte of REQUEST's tag
    with pytest.raises(p.RemoteProtocolError, match="failed authentication"):
        server.receive_control(bytes(out), 0.0)


def test_replayed_control_frame_is_rejected() -> None:
    server, client = accepted_pair()
    client.state = p.ClientState.RECEIVING
    client._report(1.0)
    report = client.data_to_send()
    server.receive_control(report, 1.0)
    with pytest.raises(p.RemoteProtocolError):
        server.receive_control(report, 1.1)


def test_no_datagram_before_the_path_is_validated() -> None:
    server, _ = accepted_pair()
    for event in server.events():
        if isinstance(event, p.NeedPieces):
            for index in event.pieces:
                server.piece_loaded(index, bytes(4096 if index == 0 else 8000 - 4096))
    assert server.state is p.ServerState.AWAIT_PATH
    assert server.handle_timer(10.0) == [] and server.data_addr is None


def test_forged_probes_are_dropped_and_counted() -> None:
    server, client = accepted_pair()
    probe = client.handle_timer(0.0)[0]
    forged = bytearray(probe)
    forged[-1] ^= 1
    assert not server.receive_datagram(bytes(forged), CLIENT_IP)
    assert not server.receive_datagram(b"\x50" * 5, CLIENT_IP)
    # A genuine probe replayed from another IP: authentic, but never a data address.
    assert not server.receive_datagram(probe, ("10.9.9.9", 1234))
    assert server.stats.forged == 3
    assert server.data_addr is None and server.state is p.ServerState.AWAIT_PATH
    # The genuine probe from the control connection's IP validates the path.
    probe2 = client.handle_timer(1.0)[0]
    assert server.receive_datagram(probe2, CLIENT_IP)
    assert server.data_addr == CLIENT_IP
    assert any(isinstance(e, p.PathValidated) for e in server.events())


def test_a_probe_sent_with_auth_validates_the_path_on_accept() -> None:
    """The client probes from its keys on, before ACCEPT: the server takes the path on
    accept() and sends PATH_OK after ACCEPT, a round trip sooner; data that reaches the
    client before it has read ACCEPT is kept and taken once it has."""
    server, client = handshake()
    assert client.state is p.ClientState.AWAIT_ACCEPT
    assert client.next_timer() == pytest.approx(0.005)
    (probe,) = client.handle_timer(0.01)
    server.receive_control(client.data_to_send(), 0.01)  # AUTH and REQUEST
    assert server.receive_datagram(probe, CLIENT_IP)
    assert server.data_addr is None and server.state is p.ServerState.DECIDING
    server.events()
    server.accept(4096, 8000, [0, 1], [], 10**8, 1024)
    assert server.data_addr == CLIENT_IP and server.state is p.ServerState.SENDING
    pieces = random.Random(5).randbytes(8000)
    for event in server.events():
        if isinstance(event, p.NeedPieces):
            for index in event.pieces:
                server.piece_loaded(index, pieces[index * 4096 : (index + 1) * 4096])
    data: list[bytearray] = []
    for step in range(100):
        data += server.handle_timer(step * 0.01)
    assert len(data) == 8
    for datagram in data:  # before the client has read ACCEPT
        client.receive_batch(memoryview(datagram), len(datagram), len(datagram))
    assert client.stats.datagrams == 0
    client.receive_control(server.data_to_send(), 1.0)  # ACCEPT, PATH_OK
    assert client.stats.datagrams == len(data)
    assert client.state is p.ClientState.RECEIVING


def test_a_session_asked_its_pieces_after_the_handshake_gets_data_a_round_trip_later() -> None:
    """Made without pieces, the client authenticates and probes its UDP path, then waits;
    the request it sends when told its pieces is accepted on a path already proven."""
    server = p.ServerSession(p.FleetKey(SECRET), b"s" * 32, CLIENT_IP[0], 10**9)
    client = p.ClientSession(p.FleetKey(SECRET), b"c" * 32, HASH_HEX, None, 10**8, 1024, 4096, 2)
    server.receive_control(client.data_to_send(), 0.0)  # HELLO
    client.receive_control(server.data_to_send(), 0.0)  # CHALLENGE
    assert client.state is p.ClientState.AWAIT_PIECES
    (probe,) = client.handle_timer(0.01)
    server.receive_control(client.data_to_send(), 0.01)  # AUTH alone
    assert server.state is p.ServerState.AWAIT_REQUEST
    assert server.receive_datagram(probe, CLIENT_IP)
    with pytest.raises(p.LocalProtocolError):
        client.request([])
    client.request([1, 0])
    server.receive_control(client.data_to_send(), 0.2)  # REQUEST
    server.events()
    server.accept(4096, 8000, [1, 0], [], 10**8, 1024)
    assert server.data_addr == CLIENT_IP and server.state is p.ServerState.SENDING
    client.receive_control(server.data_to_send(), 0.3)  # ACCEPT, PATH_OK
    assert client.state is p.ClientState.RECEIVING and client.plan is not None
    assert client.plan.pieces == [1, 0]
    with pytest.raises(p.LocalProtocolError):
        client.request([1])  # once only


def test_a_session_never_asked_its_pieces_ends_quietly() -> None:
    client = p.ClientSession(p.FleetKey(SECRET), b"c" * 32, HASH_HEX, None, 10**8, 1024, 4096, 2)
    client.data_to_send()
    client.cancel()
    assert client.done and client.data_to_send() == b""
    assert any(isinstance(event, p.TransferDone) for event in client.events())


def test_forged_data_datagrams_are_dropped_and_counted() -> None:
    server, client = accepted_pair()
    piece0 = random.Random(3).randbytes(4096)
    for event in server.events():
        if isinstance(event, p.NeedPieces):
            for index in event.pieces:
                server.piece_loaded(index, piece0 if index == 0 else bytes(8000 - 4096))
    server.receive_datagram(client.handle_timer(0.0)[0], CLIENT_IP)
    client.receive_control(server.data_to_send(), 0.0)  # PATH_OK
    assert client.state is p.ClientState.RECEIVING
    dgrams: list[bytearray] = []
    for step in range(100):
        dgrams += server.handle_timer(step * 0.01)
    assert len(dgrams) == 8
    good = bytes(dgrams[0])
    for forged in (
        good[:-1] + bytes([good[-1] ^ 1]),  # tag
        good[:30] + bytes([good[30] ^ 1]) + good[31:],  # payload
        good[:20] + b"\x05" + good[21:],  # ordinal (authenticated header)
        b"\x44" * 100,  # garbage
        good[:2] + b"x" * 8 + good[10:],  # another session
    ):
        client.receive_datagram(forged)
    assert client.stats.forged == 5
    assert client.stats.datagrams == 0
    client.receive_datagram(good)
    client.receive_datagram(good)
    assert client.stats.datagrams == 2 and client.stats.duplicates == 1
    for dgram in dgrams[1:4]:
        client.receive_datagram(bytes(dgram))
    received = [e for e in client.events() if isinstance(e, p.PieceReceived)]
    assert received == [p.PieceReceived(0, piece0)]


def test_nak_out_of_range_is_a_remote_error() -> None:
    server, client = accepted_pair()
    client.state = p.ClientState.RECEIVING
    client._loss.outstanding[999] = 0.0
    client._report(1.0)
    with pytest.raises(p.RemoteProtocolError, match="NAK for block 999"):
        server.receive_control(client.data_to_send(), 1.0)


def test_request_validation_is_local() -> None:
    key = p.FleetKey(SECRET)
    with pytest.raises(p.LocalProtocolError, match="info_hash"):
        p.ClientSession(key, b"c" * 32, "nothex", [0], 10**8)
    with pytest.raises(p.LocalProtocolError, match="block_size"):
        p.ClientSession(key, b"c" * 32, HASH_HEX, [0], 10**8, block_size=100)
    with pytest.raises(p.LocalProtocolError, match="distinct"):
        p.ClientSession(key, b"c" * 32, HASH_HEX, [0, 0], 10**8)
    server, _ = handshake()
    with pytest.raises(p.LocalProtocolError, match="accept"):
        server.accept(4096, 8000, [0], [], 10**8, 1024)


# -- the rate rule -----------------------------------------------------------------------------


def test_adapt_rate_rule() -> None:
    target = 500e6
    # Too few datagrams: no change (but never above target).
    assert p.adapt_rate(100e6, target, 3, 0) == (100e6, False)
    assert p.adapt_rate(600e6, target, 3, 0) == (target, False)
    # Clean: multiplicative increase, capped at the target.
    assert p.adapt_rate(100e6, target, 100, 100) == (pytest.approx(104e6), False)
    assert p.adapt_rate(490e6, target, 100, 100) == (target, False)
    # High loss: cut to the delivered rate, never below a quarter.
    assert p.adapt_rate(100e6, target, 100, 80) == (pytest.approx(80e6), True)
    assert p.adapt_rate(100e6, target, 100, 10) == (pytest.approx(25e6), True)
    # A pooled sample spanning 3 intervals increases by 4% per interval.
    assert p.adapt_rate(100e6, target, 9, 9, 3) == (pytest.approx(100e6 * 1.04**3), False)
    # In between: hold.
    assert p.adapt_rate(100e6, target, 1000, 990) == (100e6, False)
    # Floor.
    assert p.adapt_rate(1.2e6, target, 100, 0) == (p.MIN_RATE_BPS, True)
    # More received than expected (duplicates, reordering): treated as no loss.
    assert p.adapt_rate(100e6, target, 10, 12)[1] is False
    # A datagram or two lost at random is no loss, however few the datagrams (at 8 Mbit/s
    # a report holds ~35): the rate grows (in slow start, doubles); three lost is a cut.
    assert p.adapt_rate(8e6, target, 35, 34) == (pytest.approx(8e6 * 1.04), False)
    assert p.adapt_rate(8e6, target, 35, 33, slow_start=True) == (pytest.approx(16e6), False)
    assert p.adapt_rate(8e6, target, 35, 32) == (pytest.approx(8e6 * (1 - 3 / 35)), True)


def test_a_session_starts_at_an_eighth_of_its_target_and_a_window_per_round_trip() -> None:
    assert start_rate(80e6, 0.1) == pytest.approx(10e6)  # a measured path's ask: an eighth
    assert start_rate(1e9, 0.1) == pytest.approx(32e6)  # a NIC's worth 100 ms away
    assert start_rate(1e9, 0.0005) == pytest.approx(125e6)  # on a LAN the eighth
    assert start_rate(1e9) == pytest.approx(125e6)  # round trip unknown
    assert start_rate(2e6, 0.1) == p.MIN_RATE_BPS


def test_a_session_the_servers_budget_caps_starts_at_half_of_its_share() -> None:
    assert start_rate(46e6, 0.1, capped=True) == pytest.approx(23e6)
    assert start_rate(184e6, 0.1, capped=True) == pytest.approx(32e6)  # the window holds
    for cap, first in ((10**9, 10**8 / 8), (40e6, 20e6)):  # the ask (100 Mbit/s), a share
        server, client = handshake()
        server.set_rate_cap(cap)
        server.receive_control(client.data_to_send(), 0.0)
        server.events()
        server.accept(4096, 8000, [0, 1], [], 10**8, 1024)
        assert server.rate == pytest.approx(first)


def test_block_plan_numbers_blocks_in_request_order() -> None:
    plan = p.BlockPlan([2, 0], piece_size=10, total_size=25, block_size=4)
    # Piece 2 is the 5-byte tail: 2 blocks; piece 0 has 3.
    assert plan.total == 5
    assert [plan.locate(o) for o in range(5)] == [
        (0, 0, 4),
        (0, 4, 1),
        (1, 0, 4),
        (1, 4, 4),
        (1, 8, 2),
    ]
    assert plan.ordinals(1) == range(2, 5)


# -- the datapath's sans-IO side: batches, receiver lag, retransmission inference ------------


def test_a_batch_holds_one_piece_run_and_ends_with_a_short_block() -> None:
    server, client = accepted_pair()
    server.max_batch_segments = 3
    for event in server.events():
        if isinstance(event, p.NeedPieces):
            for index in event.pieces:
                server.piece_loaded(index, bytes(4096 if index == 0 else 8000 - 4096))
    server.receive_datagram(client.handle_timer(0.0)[0], CLIENT_IP)
    server.rate = 1e9
    assert server.handle_timer_batches(0.5) == []  # the pacer's first tick: no tokens yet
    batches = server.handle_timer_batches(1.0)
    # piece 0: 4 blocks of 1024; piece 1: 3 of 1024 and one of 832 (8000 - 4096 - 3072)
    assert [(b.count, b.segment) for b in batches] == [(3, 1062), (3, 1062), (2, 1062)]
    assert [len(d) for d in batches[-1].datagrams()] == [1062, 870]
    assert server.stats.batches == 3 and server.stats.datagrams == 8
    buffers = [b.buffer for b in batches]
    for batch in batches:
        server.recycle(batch)
    assert server._pool.free == buffers  # reused, not reallocated, by the next batches


def test_a_lagging_receiver_does_not_nak_the_tail() -> None:
    """After the sender's first pass, a receiver that has not fed every datagram from its
    socket (caught_up=False) NAKs no block merely late; once caught up it NAKs the rest."""
    server, client = accepted_pair()
    for event in server.events():
        if isinstance(event, p.NeedPieces):
            for index in event.pieces:
                server.piece_loaded(index, bytes(4096 if index == 0 else 8000 - 4096))
    server.receive_datagram(client.handle_timer(0.0)[0], CLIENT_IP)
    client.receive_control(server.data_to_send(), 0.0)  # PATH_OK
    server.rate = 1e9
    server.handle_timer(0.4)  # the pacer's first tick
    dgrams = server.handle_timer(0.5)
    assert len(dgrams) == 8
    for dgram in dgrams[:5]:  # the last 3 are still in the socket buffer
        client.receive_datagram(dgram)
    server.receive_control(client.data_to_send(), 0.5)
    client._report(0.5)
    server.receive_control(client.data_to_send(), 0.6)  # -> PROGRESS pass_done
    client.receive_control(server.data_to_send(), 0.6)
    client.handle_timer(1.0, caught_up=False)
    server.receive_control(client.data_to_send(), 1.0)
    assert server.stats.naks == 0
    client.handle_timer(2.0, caught_up=True)
    server.receive_control(client.data_to_send(), 2.0)
    assert server.stats.naks == 3


def test_a_retransmission_proves_losses_only_before_its_first_nak() -> None:
    """Block A NAKed (id 0), B and C NAKed later; A NAKed again. A's first retransmission
    arriving now answers NAK 0, not A's latest: B and C are not presumed lost again."""
    _, client = accepted_pair()
    client.state = p.ClientState.RECEIVING
    a, b, c = 0, 1, 2
    loss = client._loss
    for ordinal in (a, b, c):
        loss.outstanding[ordinal] = 0.0
    client._report(1.0)  # ids 0, 1, 2
    loss.outstanding[a] = 0.0
    client._report(3.0)  # A again: id 3
    assert loss.nak_first[a] == 0 and loss.nak_id[a] == 3
    client._assembly.have[a] = 0
    loss.lost_before(loss.nak_first.pop(a) - p.REORDER_SLACK)
    assert loss.outstanding[b] > 3.0 and loss.outstanding[c] > 3.0


def test_a_retransmission_waiting_for_its_piece_does_not_stall_the_first_pass() -> None:
    server, client = accepted_pair()
    for event in server.events():
        if isinstance(event, p.NeedPieces):
            for index in event.pieces:
                server.piece_loaded(index, bytes(4096 if index == 0 else 8000 - 4096))
    server.receive_datagram(client.handle_timer(0.0)[0], CLIENT_IP)
    server._schedule.next_ordinal = 4  # piece 0 was sent, and left the cache...
    del server._schedule.loaded[0]
    server.handle_timer(0.5)  # the pacer's first tick
    server._on_report(wire.REPORT.pack(1, 3, 4, 3, 1) + struct.pack("!I", 2), 0.1)  # ...one lost
    server.rate = 1e9
    sent = server.handle_timer(1.0)
    assert len(sent) == 4 and server.stats.retransmits == 0  # piece 1 went meanwhile
    assert any(isinstance(e, p.NeedPieces) and 0 in e.pieces for e in server.events())
    server.piece_loaded(0, bytes(4096))
    assert len(server.handle_timer(2.0)) == 1 and server.stats.retransmits == 1


def test_another_protocol_version_is_named() -> None:
    server = p.ServerSession(p.FleetKey(SECRET), b"s" * 32, CLIENT_IP[0], 10**9)
    with pytest.raises(p.RemoteProtocolError, match="want SWUDP3"):
        server.receive_control(p.frame(p.Msg.HELLO, b"SWUDP2" + b"c" * 32), 0.0)


def test_an_absurd_seq_from_the_server_does_not_break_the_report() -> None:
    """Found by the fuzzer: an authentic block with seq near 2**64 made the next REPORT's
    u32 'expected' overflow (struct.error, not a protocol error)."""
    server, client = accepted_pair()
    for event in server.events():
        if isinstance(event, p.NeedPieces):
            for index in event.pieces:
                server.piece_loaded(index, bytes(4096 if index == 0 else 8000 - 4096))
    server.receive_datagram(client.handle_timer(0.0)[0], CLIENT_IP)
    client.receive_control(server.data_to_send(), 0.0)  # PATH_OK
    server._data.counter = 2**64 - 9  # what a misbehaving sender's seq could be
    server.rate = 1e9
    server.handle_timer(0.4)
    for dgram in server.handle_timer(0.5):
        client.receive_datagram(dgram)
    client._report(1.0)
    server.receive_control(client.data_to_send(), 1.0)
    assert server.stats.reports == 1


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["good", "dup", "forged", "short", "garbage"]),
            st.integers(0, 7),
        ),
        max_size=12,
    ),
    st.integers(1, 4),
)
def test_a_gro_batch_is_taken_as_its_datagrams_one_by_one(
    plan: list[tuple[str, int]], per_receive: int
) -> None:
    """receive_batch (the fast path) and receive_datagram (the careful one) agree on any
    mix of authentic, duplicate, forged and truncated datagrams, and raise nothing."""
    keys = p.FleetKey(SECRET).session_keys(b"c" * 32, b"s" * 32)
    sealer = p.Sealer(keys.data_s2c)
    datagrams: list[bytes] = []
    for kind, ordinal in plan:
        payload = bytes([0 if ordinal < 4 else 1]) * (1024 if ordinal != 7 else 832)
        good = bytes(sealer.seal_datagram(p.DGRAM_DATA, 0, keys.session_id, ordinal, payload))
        if kind == "dup":
            datagrams += [good, good]
        elif kind == "forged":
            datagrams.append(good[:-1] + bytes([good[-1] ^ 1]))
        elif kind == "short":
            datagrams.append(good[:20])
        elif kind == "garbage":
            datagrams.append(bytes(40))
        else:
            datagrams.append(good)
    outcomes = []
    for batched in (False, True):
        _, client = accepted_pair()
        client.state = p.ClientState.RECEIVING
        try:
            if batched:
                for i in range(0, len(datagrams), per_receive):
                    group = datagrams[i : i + per_receive]
                    if len({len(d) for d in group[:-1]}) > 1 or (
                        len(group) > 1 and len(group[-1]) > len(group[0])
                    ):
                        for d in group:  # not one GRO batch: sizes differ
                            client.receive_batch(memoryview(d), len(d), len(d))
                        continue
                    data = b"".join(group)
                    client.receive_batch(memoryview(data), len(data), len(group[0]))
            else:
                for d in datagrams:
                    client.receive_datagram(d)
            error = None
        except p.RemoteProtocolError as exc:
            error = type(exc)
        pieces = [
            (e.index, bytes(e.data)) for e in client.events() if isinstance(e, p.PieceReceived)
        ]
        s = client.stats
        outcomes.append((error, pieces, s.datagrams, s.bytes, s.duplicates, s.forged))
    assert outcomes[0] == outcomes[1]


# -- SKIP: pieces another source brought while the session ran -----------------------------


def pieces_sent(sim: Sim) -> dict[int, int]:
    """Datagrams the server sent per piece index."""
    plan = sim.client.plan
    assert plan is not None
    sent: dict[int, int] = {}
    for ordinal in sim.sent_ordinals:
        piece = plan.pieces[plan.locate(ordinal)[0]]
        sent[piece] = sent.get(piece, 0) + 1
    return sent


def test_skipped_pieces_are_not_sent_and_the_rest_completes() -> None:
    # Eight pieces over a slow link; once the first is kept, pieces 5-7 "arrive over TCP".
    elsewhere = [5, 6, 7]

    def arrived(sim: Sim) -> list[int]:
        return elsewhere if sim.kept else []

    sim = Sim(Link(rate_bps=50_000_000), size=8 * 65536, arrived_elsewhere=arrived)
    sim.run()
    sim.assert_complete()
    assert sorted(sim.kept) == [0, 1, 2, 3, 4]
    assert sim.client.stats.skipped == 3
    assert sim.server.stats.skipped == 3
    sent = pieces_sent(sim)
    assert all(sent.get(i, 0) == 0 for i in elsewhere)  # skipped before the pass got there
    assert any(isinstance(e, p.TransferDone) for e in sim.server_events)


def test_a_piece_skipped_mid_way_gets_no_retransmission() -> None:
    # A lossy link: piece 1 is skipped while its blocks are still coming; nothing of it is
    # NAKed or retransmitted after that, and the rest arrives whole.
    skip_at: list[int] = []

    def arrived(sim: Sim) -> list[int]:
        plan = sim.client.plan
        if plan is None or not sim.sent_ordinals:
            return []
        if max(sim.sent_ordinals) >= plan.first[1] + 2:  # piece 1 begun
            if not skip_at:
                skip_at.append(len(sim.sent_ordinals))
            return [1]
        return []

    sim = Sim(Link(loss=0.05), seed=3, size=4 * 65536, arrived_elsewhere=arrived)
    sim.run()
    sim.assert_complete()
    assert sorted(sim.kept) == [0, 2, 3]
    plan = sim.client.plan
    assert plan is not None and skip_at
    # what the server sent once the SKIP had had a round trip to reach it
    later = sim.sent_ordinals[skip_at[0] + 64 :]
    assert not [o for o in later if plan.first[1] <= o < plan.ends[1]]
    assert sim.client.stats.skipped == 1


def test_skipping_every_piece_left_ends_the_transfer() -> None:
    def arrived(sim: Sim) -> list[int]:
        return [1, 2, 3, 4, 5] if sim.kept else []

    sim = Sim(Link(rate_bps=20_000_000), size=6 * 65536, arrived_elsewhere=arrived)
    sim.run()
    assert sim.client.done
    assert sorted(sim.kept) == [0]
    assert sim.server.state is p.ServerState.DONE
    assert sim.sent_wire_bytes < 3 * 65536  # far less than the six pieces


def test_skip_of_a_piece_not_accepted_is_a_remote_error() -> None:
    server, client = accepted_pair()
    client.data_to_send()
    client._side.send_sealed(p.Msg.SKIP, wire.pack_u32s([1, 999]))
    with pytest.raises(p.RemoteProtocolError, match="SKIP of piece 999"):
        server.receive_control(client.data_to_send(), 1.0)


def test_skip_before_accept_or_of_a_whole_piece_does_nothing() -> None:
    _, client = handshake()
    assert client.skip([0]) == []  # no ACCEPT yet: nothing to skip
    _, client = accepted_pair()
    assert client.outstanding_pieces() == [0, 1]
    assert client.skip([1, 7]) == [1]  # 7 was never asked for
    assert client.outstanding_pieces() == [0]
    assert client.skip([1]) == []  # once only
