"""The coordinator: the swarm's BitTorrent tracker and its view of the fleet.

Rooms: ``tracker`` (the announce codec, sans-IO), ``fleet`` (soft state: peers, node
reports, expiry, ranking), ``history`` (SQLite record of completed fetches) and ``app``
(the aiohttp edge that wires them to HTTP). This package ``__init__`` imports nothing, so
that a node can use the pure codec without pulling in aiohttp or sqlite3.
"""
