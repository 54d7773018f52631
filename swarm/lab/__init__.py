"""The lab: one way to start "S3 server + coordinator + nodes" for ``swarm demo``, the
tests and ``bench/fleet.py``.

Hosts are either network namespaces with tbf-shaped links (:mod:`.netlab`; root) or
loopback addresses (:mod:`.hosts`); the servers start on either:

- :mod:`.s3`: an S3 server (MinIO, moto, or the demo's paced moto), a bucket, ``publish``
- :mod:`.coordinator`: ``swarm coordinator`` (start, stop, kill, restart)
- :mod:`.procs`: stopping processes and node daemons (by pid file), their CPU seconds
- :mod:`.tcpmeasure`: one TCP flow across a lab, measured; the lab's tbf self-check
- :mod:`.fleet`: a fleet in namespaces, one system at a time, measured (the bench's core)
- :mod:`.fleetdata`: a fleet's config (with the P2P bound) and its results, as dataclasses
- :mod:`.systems`: the compared systems, one class each (swarm, libtorrent, aria2c, s5cmd)
- :mod:`.scenarios`: the bench's fleet shapes, as data
- :mod:`.wan`: a WAN emulator between two regions of a lab (delay, loss, rate)

It ships in the wheel (``swarm demo`` needs it; it is standard library plus boto3) but
nothing a node runs imports it. Nothing here is imported by ``import swarm.lab``.
"""
