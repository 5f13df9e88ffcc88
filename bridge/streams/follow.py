"""Reading a records stream (the events topic) to its end and on, never committing: what the fleet
approver learns the fleet from and what the ops console shows. Records are written only on changes
(and heartbeats), so a reader that restarts learns everything again from what the stream retains."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import orjson

from bridge.streams.base import DecisionSource

log = logging.getLogger(__name__)


def follow(
    source: DecisionSource,
    on_record: Callable[[dict[str, Any]], None],
    stop: threading.Event,
    caught_up: Callable[[], None] = lambda: None,
) -> None:
    """Hand every JSON object of ``source`` to ``on_record`` until ``stop``; ``caught_up()`` whenever
    a poll finds nothing more once the source has its share (the stream was read to its end). A
    failing source is opened again after 2 s, whatever it raised: a reader must never die."""
    while not stop.is_set():
        try:
            source.open()
            while not stop.is_set():
                messages = source.poll(0.5)
                if not messages and source.assigned():
                    caught_up()
                for message in messages:
                    try:
                        record = orjson.loads(message.payload)
                    except orjson.JSONDecodeError:
                        continue
                    if isinstance(record, dict):
                        on_record(record)
        except Exception as exc:
            log.error("events stream failed; retrying", extra={"source": source.name, "error": str(exc)})
            stop.wait(2.0)
    source.close()
