"""The libtorrent session's settings, as a real session takes them."""

from __future__ import annotations

import libtorrent as lt

from swarm.sources.ltsettings import SEND_BUFFERS, session_settings


def test_a_session_keeps_libtorrent_default_send_buffers_not_the_seed_presets():
    """A node downloads while it uploads: its requests must not queue behind seconds of
    upload data (see SEND_BUFFERS), so the seed preset's deep send buffers are undone."""
    preset = lt.high_performance_seed()
    defaults = lt.default_settings()
    assert any(preset[key] != defaults[key] for key in SEND_BUFFERS)  # what is undone
    session = lt.session(session_settings("127.0.0.1", 0))
    try:
        applied = session.get_settings()
        assert {key: applied[key] for key in SEND_BUFFERS} == SEND_BUFFERS
        assert {key: defaults[key] for key in SEND_BUFFERS} == SEND_BUFFERS
        assert applied["max_out_request_queue"] == preset["max_out_request_queue"]
    finally:
        session.pause()
