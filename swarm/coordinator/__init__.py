"""The coordinator: the swarm's BitTorrent tracker and its view of the fleet.

Rooms: ``tracker`` (the announce codec, sans-IO), ``fleet`` (soft state: peers, node
reports, expiry; the store interface), ``reports`` (node report types and parsing),
``ranking`` (peer ranking), ``memorystore`` / ``redisstore`` (the stores; Redis' scripts
in ``redisscripts``, its plan state in ``redisplan``), ``history`` (SQLite record of
completed fetches), ``handlers`` (the HTTP handlers and the background sweep) and
``app`` (the aiohttp application that wires them to HTTP). This package
``__init__`` imports nothing, so that a node can use the pure codec without pulling in
aiohttp or sqlite3.
"""
