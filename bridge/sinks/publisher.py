"""Publishing one message at a time, synchronously, until its transport confirms it: decisions, from
``se-bridge decide`` and from the ops console (a person waits for the answer; there is no outbox to
keep it across a crash, so the caller must know whether it landed). It reuses the sink
implementations, so a decision can go to every transport the agent publishes to."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping

import orjson

from bridge.pipeline import Entry, RecordMeta
from bridge.sinks import SinkError, create_sink


class DecisionPublisher:
    """One decisions topic, opened once, a decision at a time until its transport confirms it: what
    ``se-bridge decide`` does once and the ops console for every approval."""

    def __init__(self, spec: str) -> None:
        self.sink = create_sink(spec)
        self._lock = threading.Lock()
        self._opened = False
        self._seq = 0

    @property
    def name(self) -> str:
        return self.sink.name

    def publish(self, decision: Mapping[str, object], timeout: float = 30.0) -> None:
        """Return once the transport confirmed ``decision``; :class:`SinkError` otherwise."""
        with self._lock:
            if not self._opened:
                self.sink.open()
                self._opened = True
            self._seq += 1
            # A decision is keyed by its target VM, so one VM's decisions stay in order on one partition.
            key = str(decision.get("target") or decision.get("eventId"))
            meta = RecordMeta(str(decision["decisionId"]), "decision", key)
            self.sink.submit(Entry(self._seq, meta, time.time(), orjson.dumps(decision)))
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                for outcome in self.sink.poll(0.2):
                    if outcome.error is not None:
                        raise SinkError(f"publishing to {self.sink.name} failed: {outcome.error}")
                    return
            raise SinkError(f"{self.sink.name} did not confirm the decision within {timeout:g} s")

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing must not hide the outcome already known
            self.sink.close(timeout=5.0)
