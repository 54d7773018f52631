"""The control channel both machines share: frames in, events out, sealed once keyed."""

from __future__ import annotations

from swarm.udp.crypto import Sealer
from swarm.udp.events import Event
from swarm.udp.wire import (
    MAX_CONTROL_FRAME,
    FrameBuffer,
    LocalProtocolError,
    Msg,
    RemoteProtocolError,
    frame,
)


class ControlChannel:
    """Frames read (:attr:`frames`), bytes to write, events, and the two sealers (set by the
    handshake: :attr:`send_ctl` for our frames, :attr:`recv_ctl` for the peer's)."""

    def __init__(self) -> None:
        self.frames = FrameBuffer()
        self._out = bytearray()
        self.pending: list[Event] = []
        self.send_ctl: Sealer | None = None
        self.recv_ctl: Sealer | None = None
        self.closed = False

    def events(self) -> list[Event]:
        """Events since the last call, oldest first."""
        events, self.pending = self.pending, []
        return events

    def data_to_send(self) -> bytes:
        """Control-channel bytes to write, since the last call."""
        out = bytes(self._out)
        self._out.clear()
        return out

    def use_keys(self, send_key: bytes, recv_key: bytes) -> None:
        """The handshake is done: our frames are sealed with ``send_key``, the peer's opened
        with ``recv_key``, and frames may be as large as :data:`MAX_CONTROL_FRAME`."""
        self.send_ctl = Sealer(send_key)
        self.recv_ctl = Sealer(recv_key)
        self.frames.limit = MAX_CONTROL_FRAME

    def send_plain(self, msg: Msg, body: bytes) -> None:
        self._out += frame(msg, body)

    def send_sealed(self, msg: Msg, body: bytes) -> None:
        if self.send_ctl is None:
            raise LocalProtocolError(f"cannot send {msg.name} before authentication")
        self._out += frame(msg, self.send_ctl.seal(body, bytes([msg])))

    def open(self, kind: int, body: bytes) -> bytes:
        if self.recv_ctl is None:
            raise RemoteProtocolError(f"message type {kind} before authentication")
        return self.recv_ctl.open(body, bytes([kind]))

    def send_error(self, reason: str) -> None:
        """Tell the peer why we are closing (sealed once authenticated)."""
        body = reason.encode()[:100]
        if self.send_ctl is None:
            self.send_plain(Msg.ERROR, body)
        else:
            self.send_sealed(Msg.ERROR, body)
        self.closed = True

    def error_frame(self, body: bytes) -> str:
        if self.recv_ctl is not None:
            body = self.open(Msg.ERROR, body)
        return body.decode("utf-8", "replace")
