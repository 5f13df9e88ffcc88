"""The approver's durability seams, in-process (issue 24): what happens between "the audit records
are appended" and "the source position is committed" when the disk fails while the approver stops.

These seams sit behind the run loop and no process-level test reaches them. The audit writer is
the real one (bridge.approver.auditing); its outbox is a stand-in whose sync and append fail the way
a dying disk makes them fail (that failure cannot be produced on demand in-process).
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from bridge.approver import auditing
from bridge.approver.auditing import AuditWriter
from bridge.approver.dispatch import Slot
from bridge.approver.metrics import ApproverMetrics
from bridge.pipeline.outbox import OutboxWriteError
from bridge.streams.base import Message, Position


class FailingOutbox:
    """``sync`` fails (a writeback error); ``append`` then fails too (the disk is gone)."""

    def __init__(self) -> None:
        self.appended = 0

    def sync(self) -> None:
        raise OutboxWriteError("fsync: EIO")

    def append(self, meta: Any, payload: bytes) -> int:
        self.appended += 1
        raise OSError(5, "Input/output error")


def writer(stopping: bool) -> AuditWriter:
    stop = threading.Event()
    if stopping:
        stop.set()
    return AuditWriter(FailingOutbox(), None, ApproverMetrics(), stop)  # type: ignore[arg-type]


def audit(n: int) -> dict[str, Any]:
    return {"recordType": "approval", "recordId": f"r{n}", "decisionId": f"d{n}", "outcome": "approved",
            "eventIds": [], "vm": {"name": "vm"}}  # fmt: skip


def test_a_failed_audit_sync_while_stopping_commits_nothing() -> None:
    """The bug issue 24 found: ``_until_stored`` ended with ``return False`` where its callers test
    ``is None``, so a failed sync during shutdown reported the audit records durable and the chunk's
    positions were committed without them."""
    done = [(Slot(Message(b"{}", Position("decisions/0", n))), audit(n)) for n in range(3)]
    assert writer(stopping=True).synced(done) is False


def test_until_stored_says_none_when_the_approver_stops_first() -> None:
    assert writer(stopping=True).until_stored(lambda: 1, Message(b"{}", Position("decisions/0", 1))) is None


def test_until_stored_returns_what_the_store_returned_once_the_disk_takes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(auditing, "Backoff", lambda **_: SimpleNamespace(next_delay=lambda: 0.01))
    attempts: list[Any] = [OSError(28, "No space left on device"), 7]

    def store() -> int:
        step = attempts.pop(0)
        if isinstance(step, Exception):
            raise step
        return int(step)

    assert writer(stopping=False).until_stored(store, Message(b"{}", Position("decisions/0", 1))) == 7
    assert attempts == []
