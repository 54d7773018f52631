"""The receiver's loss bookkeeping: which blocks are missing, when to NAK them (again), and
the REPORT that tells the sender what was lost and what arrived. Pure: times are passed in.

Loss detection: first-pass blocks arrive in ordinal order, so a missing ordinal well below
the highest first-pass one seen was lost (Tsunami's retransmit requests); it is NAKed in the
next REPORT, and NAKed again if its retransmission is lost too.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from swarm.udp.wire import FLAG_RETRANSMIT, MAX_NAKS_PER_REPORT, REPORT, pack_u32s

REORDER_SLACK = 16
"""First-pass ordinals a block may arrive late by before it is NAKed: reordering is rare on
one path, and a spurious NAK costs one duplicate block."""
END_GRACE = 0.02
"""After the sender's first pass ends, seconds before NAKing the tail (datagrams sent just
before PASS_DONE may still be in flight)."""
RENAK_TIMEOUT = 1.0
"""Seconds after which a NAKed block that did not arrive is NAKed again regardless. Lost
retransmissions are found sooner and without a timer: the sender serves NAKs in order, so
a retransmission arriving for a later NAK reveals the loss of an earlier one, and the
sender's PROGRESS says when every NAK it was sent has been served. This timeout is only a
backstop: a timer tight enough to matter would fire while a retransmission waits in a
bottleneck's queue and send every such block twice."""


class LossTracker:
    """Missing blocks, the NAKs sent for them, and the datagrams counted since the last
    REPORT (``seq_high`` and ``received_interval``: the rate rule's sample)."""

    def __init__(self) -> None:
        self.scan = 0
        """Ordinals below this were looked at by the gap detection."""
        self.first_high = -1
        self.outstanding: dict[int, float] = {}
        """Missing ordinals to NAK -> when (0.0: at the next report)."""
        self.nak_order: deque[tuple[int, int]] = deque()
        self.nak_id: dict[int, int] = {}
        """Outstanding ordinal -> the id of its latest NAK."""
        self.nak_first: dict[int, int] = {}
        """Outstanding ordinal -> the id of its first NAK: a retransmission that arrives
        answers that one at least (if the ordinal was NAKed again, maybe not the latest)."""
        self.nak_at: dict[int, int] = {}
        """Outstanding ordinal -> the stamp (``echo``) of the report that last NAKed it."""
        self.next_nak_id = 0
        self.pass_done = False
        self.pass_done_at: float | None = None
        self.seq_high = -1
        self.seq_high_reported = -1
        self.received_interval = 0

    def counted(self, seq: int) -> None:
        """An authentic datagram ``seq`` arrived (for the next REPORT's sample)."""
        self.received_interval += 1
        if seq > self.seq_high:
            self.seq_high = seq

    def arrived(self, ordinal: int, flags: int) -> None:
        """Block ``ordinal`` arrived (sent with ``flags``)."""
        if self.outstanding.pop(ordinal, None) is not None:
            self.answered(ordinal, flags)
        if not flags & FLAG_RETRANSMIT and ordinal > self.first_high:
            self.first_high = ordinal

    def answered(self, ordinal: int, flags: int) -> None:
        """Outstanding ``ordinal`` arrived (and is no longer in :attr:`outstanding`)."""
        self.nak_at.pop(ordinal, None)
        self.nak_id.pop(ordinal, None)
        nak_id = self.nak_first.pop(ordinal, None)
        if nak_id is not None and flags & FLAG_RETRANSMIT:
            self.lost_before(nak_id - REORDER_SLACK)

    def lost_before(self, nak_id: int) -> None:
        """NAKs are served in order: those before ``nak_id`` still missing were lost again
        (unless NAKed again since: the later NAK's retransmission may still come)."""
        order = self.nak_order
        while order and order[0][0] < nak_id:
            old_id, ordinal = order.popleft()
            if self.nak_id.get(ordinal) == old_id:
                self.outstanding[ordinal] = 0.0

    def missing_again(self, ordinals: Iterable[int]) -> None:
        """``ordinals`` (a piece whose hash failed) are missing again: those the gap
        detection passed are NAKed at the next report, it finds the others."""
        for ordinal in ordinals:
            if ordinal < self.scan:
                self.outstanding[ordinal] = 0.0

    def skipped(self, ordinals: Iterable[int]) -> None:
        """``ordinals`` (a skipped piece's) are NAKed no more."""
        for ordinal in ordinals:
            if self.outstanding.pop(ordinal, None) is not None:
                self.nak_at.pop(ordinal, None)
                self.nak_id.pop(ordinal, None)
                self.nak_first.pop(ordinal, None)

    def sender_pass_done(self, now: float, served: int) -> None:
        """The sender's PROGRESS says its first pass is over, and every NAK up to the
        report stamped ``served`` was served."""
        if not self.pass_done:
            self.pass_done = True
            self.pass_done_at = now + END_GRACE
        # NAKs up to report `served` were all sent: what is still missing of them
        # was lost again (after a grace for datagrams in flight).
        due = now + END_GRACE
        for ordinal, at in self.nak_at.items():
            if at <= served and self.outstanding.get(ordinal, 0.0) > due:
                self.outstanding[ordinal] = due

    def report(self, have: bytearray, now: float, caught_up: bool = True) -> tuple[bytes, int]:
        """The body of a REPORT at ``now`` (blocks present in ``have``), and how many
        NAKs it holds. See :meth:`~swarm.udp.receiver.ClientSession.handle_timer` for
        ``caught_up``."""
        total = len(have)
        # Gap detection: first-pass blocks arrive in ordinal order, so a missing ordinal well
        # below the highest first-pass one seen was lost (Tsunami's retransmit requests).
        horizon = self.first_high - REORDER_SLACK
        pass_over = self.pass_done_at is not None and now >= self.pass_done_at
        if self.pass_done and pass_over and caught_up:
            horizon = total
        if horizon > self.scan:
            for ordinal in range(self.scan, min(horizon, total)):
                if not have[ordinal]:
                    self.outstanding[ordinal] = 0.0
            self.scan = min(horizon, total)
        echo = max(1, int(now * 1e6))
        naks: list[int] = []
        for ordinal, due in self.outstanding.items():
            # due 0.0: known lost; later: NAKed before and not seen since (maybe late)
            if due <= now and (caught_up or due == 0.0):
                naks.append(ordinal)
                if len(naks) >= MAX_NAKS_PER_REPORT:
                    break
        for ordinal in naks:
            self.outstanding[ordinal] = now + RENAK_TIMEOUT
            self.nak_id[ordinal] = self.next_nak_id
            self.nak_first.setdefault(ordinal, self.next_nak_id)
            self.nak_order.append((self.next_nak_id, ordinal))
            self.nak_at[ordinal] = echo
            self.next_nak_id += 1
        # u32 on the wire: only a server sealing absurd seqs (a compromised member) gets
        # near it, and it then reads ~100% loss and slows down.
        expected = min(0xFFFFFFFF, max(0, self.seq_high - self.seq_high_reported))
        received = min(self.received_interval, expected)
        self.seq_high_reported = self.seq_high
        self.received_interval = 0
        body = REPORT.pack(echo, max(0, self.seq_high), expected, received, len(naks))
        return body + pack_u32s(naks), len(naks)
