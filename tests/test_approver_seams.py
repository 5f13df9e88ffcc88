"""The approver's durability seams, in-process (issue 24): what happens between "the audit records
are appended" and "the source position is committed" when the disk fails while the approver stops.

These seams sit behind the run loop and no process-level test reaches them: the stand-ins below are
only what the two methods touch (the outbox, the stop event, the error streak), the methods are the
real ones.
"""

from __future__ import annotations

import functools
import logging
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from bridge.approver.dispatch import Slot
from bridge.approver.service import Approver
from bridge.approver.sources.base import Message
from bridge.observability import ErrorStreak
from bridge.pipeline.outbox import OutboxWriteError


class FailingOutbox:
    """``sync`` fails (a writeback error); ``append`` then fails too (the disk is gone)."""

    def __init__(self) -> None:
        self.appended = 0

    def sync(self) -> None:
        raise OutboxWriteError("fsync: EIO")

    def append(self, meta: Any, payload: bytes) -> int:
        self.appended += 1
        raise OSError(5, "Input/output error")


def approver_stand_in(stopping: bool) -> Any:
    me = SimpleNamespace(
        outbox=FailingOutbox(),
        stop_event=threading.Event(),
        _outbox_streak=ErrorStreak(logging.getLogger("test"), "storing decisions and audit records"),
    )
    if stopping:
        me.stop_event.set()
    me._until_stored = functools.partial(Approver._until_stored, me)
    return me


def audit(n: int) -> dict[str, Any]:
    return {"recordType": "approval", "recordId": f"r{n}", "decisionId": f"d{n}", "outcome": "approved",
            "eventIds": [], "vm": {"name": "vm"}}  # fmt: skip


def test_a_failed_audit_sync_while_stopping_commits_nothing() -> None:
    """The bug issue 24 found: ``_until_stored`` ended with ``return False`` where its callers test
    ``is None``, so a failed sync during shutdown reported the audit records durable and the chunk's
    positions were committed without them."""
    me = approver_stand_in(stopping=True)
    done = [(Slot(Message(b"{}", f"decisions/0@{n}")), audit(n)) for n in range(3)]
    assert Approver._audits_synced(me, done) is False


def test_until_stored_says_none_when_the_approver_stops_first() -> None:
    me = approver_stand_in(stopping=True)
    assert Approver._until_stored(me, lambda: 1, Message(b"{}", "decisions/0@1")) is None


def test_until_stored_returns_what_the_store_returned_once_the_disk_takes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import bridge.approver.service as service

    monkeypatch.setattr(service, "Backoff", lambda **_: SimpleNamespace(next_delay=lambda: 0.01))
    me = approver_stand_in(stopping=False)
    attempts: list[Any] = [OSError(28, "No space left on device"), 7]

    def store() -> int:
        step = attempts.pop(0)
        if isinstance(step, Exception):
            raise step
        return int(step)

    assert Approver._until_stored(me, store, Message(b"{}", "decisions/0@1")) == 7
    assert attempts == []
