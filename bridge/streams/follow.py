"""Reading a records stream (the events topic) to its end and on, never committing: what the fleet
approver learns the fleet from and what the ops console shows. Records are written only on changes
(and heartbeats), so a reader that restarts learns everything again from what the stream retains."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from bridge.records.fields import Refused
from bridge.records.reader import Reader, Record
from bridge.streams.base import DecisionSource

log = logging.getLogger(__name__)


def follow(
    source: DecisionSource,
    on_record: Callable[[Record], None],
    stop: threading.Event,
    reader: Reader,
    caught_up: Callable[[], None] = lambda: None,
) -> None:
    """Hand every record of ``source`` that ``reader`` reads (typed: its schema checked, signatures
    verified) to ``on_record`` until ``stop``; refused records are counted by the reader and skipped.
    ``caught_up()`` whenever a poll finds nothing more once the source has its share, and the source
    does not know of anything waiting (:meth:`DecisionSource.behind`): the stream was read to its
    end. A failing source is opened again after 2 s, whatever it raised: a reader must
    never die."""
    while not stop.is_set():
        try:
            source.open()
            while not stop.is_set():
                messages = source.poll(0.5)
                if not messages and source.assigned() and not source.behind():
                    caught_up()
                for message in messages:
                    record = reader.read_bytes(message.payload)
                    if record is not None and not isinstance(record, Refused):
                        on_record(record)
        except Exception as exc:
            log.error("events stream failed; retrying", extra={"source": source.name, "error": str(exc)})
            stop.wait(2.0)
    source.close()
