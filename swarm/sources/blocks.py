"""The states of a block in libtorrent's download queue (``get_download_queue``'s
``block_info.state``: 0 none, 1 requested, 2 writing, 3 finished; the binding has no
names for them).

A module of their own, apart from :mod:`swarm.sources.torrentstate`, because it must not
import libtorrent: ``swarm fetch`` loads the agent's modules that read these states
(:mod:`swarm.agent.stuck`) before it forks its daemon, and libtorrent there would be
loaded in the CLI (``test_swarm_fetch_runs_no_native_threads_before_it_forks_the_daemon``).
"""

from __future__ import annotations

from typing import Final

BLOCK_WRITING: Final = 2
"""From this state on a block has come in from its peer (being written, or written)."""

BLOCK_FINISHED: Final = 3
"""The block is written to the data file."""
