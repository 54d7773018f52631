"""A new node's share of the pieces only seeders hold (swarm.agent.seedershare)."""

from __future__ import annotations

from swarm.agent.seedershare import (
    Share,
    first_pull,
    new_nodes_among,
    own_order,
    seeders_held,
    split,
)

PIECES = 12
NONE = [False] * PIECES


def held(*pieces: int) -> list[bool]:
    return [i in pieces for i in range(PIECES)]


def test_each_piece_only_seeders_hold_is_one_new_node_s() -> None:
    nodes = ["10.0.0.2", "10.0.0.3", "10.0.0.4"]
    taken: list[set[int]] = []
    for own in nodes:
        others = {a: NONE for a in nodes if a != own}
        taken.append(set(range(PIECES)) - split(range(PIECES), others, own).left)
    assert [len(t) for t in taken] == [4, 4, 4]
    assert set().union(*taken) == set(range(PIECES))


def test_a_piece_a_new_node_holds_is_anyone_s() -> None:
    left = split(range(PIECES), {"10.0.0.3": held(1, 4)}, "10.0.0.2").left
    # rank 0 of two: the odd pieces are the other's, except 1 (it holds it)
    assert left == {3, 5, 7, 9, 11}


def test_a_node_whose_share_is_in_takes_the_rest_once_no_new_node_has_more() -> None:
    # Its own share (even pieces) all in; 1 and 3 at seeders only, 5 at the other node:
    # 5 comes from that node, and the seeders' pieces wait for their owner meanwhile.
    assert split([1, 3, 5], {"10.0.0.3": held(5)}, "10.0.0.2").left == {1, 3}
    # Nothing it lacks is at a new node: it takes its owner's pieces too (the owner may
    # be one it does not see, or gone).
    assert split([1, 3], {"10.0.0.3": held(5)}, "10.0.0.2").left == set()


def test_alone_or_behind_one_address_nothing_is_left() -> None:
    assert split(range(PIECES), {}, "10.0.0.2").left == set()
    # loopback fleets: every node is 127.0.0.1
    assert split(range(PIECES), {"127.0.0.1": NONE}, "127.0.0.1").left == set()


def test_a_peer_without_a_bitfield_yet_holds_nothing() -> None:
    assert split(range(4), {"10.0.0.3": []}, "10.0.0.2").left == {1, 3}


def test_a_peer_holding_every_piece_is_a_seeder_though_no_plan_named_it() -> None:
    seeders = {"10.0.0.9"}  # the first plan named one seeder of two
    peers = [
        ("10.0.0.9", True, [True] * PIECES),
        ("10.0.0.8", True, [True] * PIECES),  # the other seeder
        ("10.0.0.3", False, held(1)),
        ("10.0.0.2", False, NONE),  # this node
    ]
    new_nodes = new_nodes_among(peers, seeders, "10.0.0.2")
    assert new_nodes == {"10.0.0.3": held(1)}
    assert seeders == {"10.0.0.9", "10.0.0.8"}
    # So the pieces no new node holds are dealt (had 10.0.0.8 counted as a new node
    # holding every piece, none would be at the seeders only, and nothing was left).
    assert split(range(PIECES), new_nodes, "10.0.0.2").left == {3, 5, 7, 9, 11}


def test_a_node_s_own_share_is_what_it_pulls_from_the_seeders() -> None:
    share = split(range(PIECES), {"10.0.0.3": held(1, 4), "10.0.0.4": NONE}, "10.0.0.2")
    # rank 0 of three: pieces 0, 3, 6, 9 are its own; 1 and 4 are at a new node
    assert share.own == {0, 3, 6, 9}
    assert share.left == {2, 5, 7, 8, 10, 11}
    # its own share in, nothing it lacks at a new node: nothing is dealt any more
    assert split([1, 5], {"10.0.0.3": NONE}, "10.0.0.2") == split([], {}, "10.0.0.2")


def test_the_seeders_are_held_off_while_its_own_share_comes_and_not_again() -> None:
    first = split(range(PIECES), {"10.0.0.3": NONE}, "10.0.0.2")
    assert first.own and seeders_held(first, released=False)
    # Its own share in; 1 and 3 are the other's, still at the seeders only, 7 at the
    # other node: libtorrent may take 7 (or anything a new node holds) from the seeders
    # too, while 1 and 3 stay left to their owner.
    done = split([1, 3, 7], {"10.0.0.3": held(7)}, "10.0.0.2")
    assert done == Share(left={1, 3}, own=set())
    assert not seeders_held(done, released=False)
    # A piece dealt to it later (who is connected changed) is pulled, but the seeders
    # are not held off again: a hold closes libtorrent's connections to them.
    assert not seeders_held(Share(left={1}, own={3}), released=True)


def test_before_any_view_each_node_pulls_one_piece_of_its_own_from_one_seeder() -> None:
    nodes = [f"10.77.0.{i}" for i in range(4, 12)]
    seeders = ["10.77.0.2", "10.77.0.3"]
    firsts = [first_pull(range(128), seeders, own, 128) for own in nodes]
    assert all(first is not None for first in firsts)
    pieces = [first[1] for first in firsts if first]
    assert len(set(pieces)) == len(nodes)  # eight nodes starting together: distinct pieces
    by_seeder = [sum(1 for first in firsts if first and first[0] == s) for s in seeders]
    assert min(by_seeder) >= 2  # the first GETs spread over the seeders
    assert first_pull([5, 9], seeders, nodes[0], 128) in [(s, p) for s in seeders for p in (5, 9)]
    assert first_pull([], seeders, nodes[0], 128) is None
    assert first_pull(range(128), [], nodes[0], 128) is None


def test_nodes_with_neighbouring_addresses_order_pieces_unlike_each_other() -> None:
    # CRC-32 of "address piece" is linear in the address's bits: 10.77.0.4 and .5 got
    # nearly the same order; a node's own order must not follow its neighbour's.
    nodes = [f"10.77.0.{i}" for i in range(4, 12)]
    firsts = [own_order(range(128), own, 128)[:8] for own in nodes]
    shared = [len(set(a) & set(b)) for i, a in enumerate(firsts) for b in firsts[i + 1 :]]
    assert max(shared) <= 2  # independent orders: 0.5 pieces of 8 shared on average
