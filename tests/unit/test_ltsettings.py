"""The libtorrent session's settings, as a real session takes them."""

from __future__ import annotations

from pathlib import Path

import libtorrent as lt

from swarm.sources.ltsettings import (
    AMONG_SEEDERS_SETTINGS,
    FAR_FETCH_SETTINGS,
    FAR_REQUEST_QUEUE_SECONDS,
    SEND_BUFFERS,
    session_settings,
)
from swarm.sources.peers import TorrentSession


def test_a_session_keeps_shallow_send_buffers_not_the_seed_presets():
    """A node downloads while it uploads: its requests must not queue behind seconds of
    upload data (see SEND_BUFFERS), so the seed preset's deep send buffers are undone,
    and libtorrent's own half second of a peer's rate is cut to a tenth."""
    preset = lt.high_performance_seed()
    defaults = lt.default_settings()
    assert any(preset[key] != defaults[key] for key in SEND_BUFFERS)  # what is undone
    session = lt.session(session_settings("127.0.0.1", 0))
    try:
        applied = session.get_settings()
        assert {key: applied[key] for key in SEND_BUFFERS} == SEND_BUFFERS
        assert applied["send_buffer_watermark_factor"] < defaults["send_buffer_watermark_factor"]
        assert applied["max_out_request_queue"] == preset["max_out_request_queue"]
    finally:
        session.pause()


def test_request_queues_are_shallow_while_a_far_fetch_holds_them(tmp_path: Path) -> None:
    """What a UDP session brings while libtorrent has it requested from a near peer comes
    twice: queues hold FAR_REQUEST_QUEUE_SECONDS of a peer's rate (and end game takes busy
    blocks at once) while any far fetch runs, and libtorrent's own settings again once the
    last one is done."""
    session = TorrentSession("127.0.0.1", 0, tmp_path / "resume")
    try:
        settings = session.session.get_settings
        assert settings()["request_queue_time"] == lt.default_settings()["request_queue_time"] == 3
        assert settings()["strict_end_game_mode"] is True
        with session.tuned(FAR_FETCH_SETTINGS):
            with session.tuned(FAR_FETCH_SETTINGS):  # a second far fetch at once
                assert settings()["request_queue_time"] == FAR_REQUEST_QUEUE_SECONDS
            assert settings()["request_queue_time"] == FAR_REQUEST_QUEUE_SECONDS
            assert settings()["strict_end_game_mode"] is False
        assert settings()["request_queue_time"] == 3
        assert settings()["strict_end_game_mode"] is True
    finally:
        session.close()


def test_tunings_held_at_once_combine_and_each_key_comes_back_when_its_last_holder_goes(
    tmp_path: Path,
) -> None:
    """A fetch beside seeders and a far fetch in one daemon: the session's settings are
    shared, so each key holds while any tuning sets it, and is libtorrent's own again
    only when none does, in whatever order they end."""
    session = TorrentSession("127.0.0.1", 0, tmp_path / "resume")
    try:
        settings = session.session.get_settings
        own = settings()["request_queue_time"]
        beside_seeders = session.tuned(AMONG_SEEDERS_SETTINGS)
        far = session.tuned(FAR_FETCH_SETTINGS)
        beside_seeders.__enter__()
        assert settings()["request_queue_time"] == AMONG_SEEDERS_SETTINGS["request_queue_time"]
        assert settings()["strict_end_game_mode"] is True  # not among its settings
        far.__enter__()
        assert settings()["strict_end_game_mode"] is False
        beside_seeders.__exit__(None, None, None)  # the first one ends first
        assert settings()["request_queue_time"] == FAR_REQUEST_QUEUE_SECONDS
        assert settings()["strict_end_game_mode"] is False
        far.__exit__(None, None, None)
        assert settings()["request_queue_time"] == own
        assert settings()["strict_end_game_mode"] is True
    finally:
        session.close()
