"""swarm: peer-to-peer distribution of large artifacts to autoscaled cloud nodes."""

__version__ = "0.1.0"
