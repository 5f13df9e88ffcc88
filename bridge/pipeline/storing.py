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
from collections.abc import Callable
from typing import TypeVar

from bridge.pipeline.outbox import OutboxFull
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
