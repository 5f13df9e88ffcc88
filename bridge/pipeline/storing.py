"""Appending to an outbox when it or the disk may refuse: every producer's policy, in one place.

An append can be refused for reasons that are not the record's fault: the outbox holds its limit
for the slowest sink (:class:`~bridge.pipeline.outbox.OutboxFull`), or the disk is full, over quota
or failing (``OSError``, :class:`~bridge.pipeline.outbox.OutboxWriteError`). What a producer then
does depends on what the record is:

=============  ===========================================  ================================================
policy         producers                                    when the append is refused
=============  ===========================================  ================================================
keep pending   the agent's poller (a document change)       nothing is stored; the change stays pending and
                                                            the next poll that can write publishes the net
                                                            change since the last stored record
wait           the approver's audit records, the agent's    retried with backoff (:func:`until_stored`)
               own records (preparations, coordination)     until stored; given up only when the service
                                                            stops (the decision is then not committed and is
                                                            read again after the restart)
best effort    the agent's heartbeats, the relay's own      skipped, with a log line: a heartbeat carries no
               audit record of a request it answered        change, and the approver audits every decision
=============  ===========================================  ================================================
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from bridge.pipeline.entry import RecordMeta
from bridge.pipeline.outbox import Outbox, OutboxFull
from bridge.support.retry import Backoff

T = TypeVar("T")

#: What an append raises when the outbox or the disk refuses it (not the record's fault).
REFUSED = (OutboxFull, OSError)


def until_stored(
    store: Callable[[], T],
    stop: threading.Event,
    on_refused: Callable[[BaseException], None],
    backoff: Backoff | None = None,
) -> T | None:
    """Run ``store`` until the outbox and the disk take it and return what it returned; ``on_refused``
    hears each refusal. None when ``stop`` is set first (so ``store`` must not return None itself)."""
    backoff = backoff or Backoff(base=1.0, cap=30.0)
    while not stop.is_set():
        try:
            return store()
        except REFUSED as exc:
            on_refused(exc)
        stop.wait(backoff.next_delay())
    return None


def append_all(
    outbox: Outbox,
    entries: Sequence[tuple[RecordMeta, bytes]],
    stop: threading.Event,
    on_refused: Callable[[BaseException], None],
) -> bool:
    """Append a batch (one fsync, at its last entry), waiting refusals out as :func:`until_stored`;
    False when ``stop`` is set first. A retry goes on from the entry the outbox refused: a full
    outbox refuses in the middle of a batch and the entries before it are whole (starting over
    appended them twice: a 40 000-delivery backlog published 8 000 records twice). A disk that
    failed may have lost what was appended without an fsync: then the whole batch again, durably."""
    stored = 0  # entries[:stored] are in the outbox

    def append() -> bool:
        nonlocal stored
        try:
            for index in range(stored, len(entries)):
                outbox.append(*entries[index], sync=index == len(entries) - 1)
                stored = index + 1
        except OutboxFull:
            raise
        except OSError:
            stored = 0
            raise
        return True

    return not entries or until_stored(append, stop, on_refused) is not None
