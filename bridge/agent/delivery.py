"""One delivery worker per sink: moves that sink's cursor through the outbox.

Each sink progresses on its own, so a sink that is down never blocks another (until the outbox
limit, which is shared: see :mod:`bridge.agent.outbox`). Within a sink, records are submitted in
outbox order and the cursor only moves over a contiguous run of confirmed records, so per-VM order
is kept and nothing is skipped. After a transient failure the worker backs off (full jitter) and
re-submits from the first unconfirmed record: at-least-once, with the record's deterministic id
for consumers that deduplicate. A permanent failure moves the record to
``<state-dir>/dead-letter/<sink-id>.jsonl`` with the reason, instead of blocking the queue forever.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from pathlib import Path

import orjson

from bridge.agent.outbox import Entry, Outbox
from bridge.fsutil import datasync
from bridge.observability import AgentMetrics, ErrorStreak
from bridge.retry import Backoff
from bridge.sinks.base import Sink, SinkError

log = logging.getLogger("bridge.delivery")


class DeliveryWorker(threading.Thread):
    """Drives one :class:`~bridge.sinks.base.Sink` from its outbox cursor."""

    def __init__(
        self,
        sink: Sink,
        outbox: Outbox,
        metrics: AgentMetrics,
        dead_letter_dir: Path,
        *,
        backoff: Backoff | None = None,
    ) -> None:
        super().__init__(name=f"deliver-{sink.id}", daemon=True)
        self.sink = sink
        self.outbox = outbox
        self.metrics = metrics
        self.dead_letter_path = dead_letter_dir / f"{sink.id}.jsonl"
        self.backoff = backoff or Backoff(base=0.5, cap=30.0)
        self._stopping = threading.Event()
        self._drain_deadline: float | None = None
        self._streak = ErrorStreak(log, f"delivery to {sink.name}")
        self._opened = False
        self.last_success: float | None = None
        metrics.sink_lag.add(self.lag)
        self.sink_failed: SinkError | None = None  # set when submit() raised instead of reporting

    # -- control ----------------------------------------------------------------------------------

    def stop(self, drain_seconds: float) -> None:
        """Stop after delivering what is queued, or after ``drain_seconds``, whichever comes first."""
        self._drain_deadline = time.monotonic() + drain_seconds
        self._stopping.set()
        self.outbox.wake()

    @property
    def caught_up(self) -> bool:
        return self.outbox.depth(self.sink.id) == 0

    # -- loop -------------------------------------------------------------------------------------

    def run(self) -> None:
        label = self.sink.id
        in_flight: deque[Entry] = deque()
        confirmed: set[int] = set()
        cursor = self.outbox.cursor(label)
        submitted = cursor  # highest seq handed to the transport
        while True:
            if self._stopping.is_set() and (
                self.caught_up or time.monotonic() >= (self._drain_deadline or 0)
            ):
                break
            if not self._opened and not self._open():
                continue
            # Fill the transport's window.
            room = self.sink.max_in_flight - len(in_flight)
            if room > 0:
                batch = self.outbox.read(submitted, room)
                for entry in batch:
                    try:
                        self.sink.submit(entry)
                    except Exception as exc:  # a sink bug must not kill delivery: retry like a failure
                        log.exception("sink raised unexpectedly", extra={"sink": self.sink.name})
                        self.sink_failed = SinkError(f"{type(exc).__name__}: {exc}", kind="internal")
                        break
                    in_flight.append(entry)
                    submitted = entry.seq
            if not in_flight and self.sink_failed is not None:
                self._retry_later(self.sink_failed)
                self.sink_failed = None
                continue
            if not in_flight:
                # Idle: sleep until a record is appended or stop() wakes us; no periodic wake-up.
                self.outbox.wait(submitted, None if not self._stopping.is_set() else 0.05)
                continue
            failure, self.sink_failed = self.sink_failed, None
            try:
                outcomes = self.sink.poll(0.2)
            except Exception as exc:
                log.exception("sink raised unexpectedly", extra={"sink": self.sink.name})
                outcomes, failure = [], SinkError(f"{type(exc).__name__}: {exc}", kind="internal")
            for outcome in outcomes:
                if outcome.ok:
                    confirmed.add(outcome.seq)
                elif outcome.error is not None and outcome.error.permanent:
                    entry = next((e for e in in_flight if e.seq == outcome.seq), None)
                    if entry is not None:
                        self._dead_letter(entry, outcome.error)
                    confirmed.add(outcome.seq)
                elif failure is None:
                    failure = outcome.error
            # Move the cursor over the contiguous confirmed prefix only: order is kept.
            advanced = False
            while in_flight and in_flight[0].seq in confirmed:
                confirmed.discard(in_flight[0].seq)
                cursor = in_flight.popleft().seq
                self.metrics.sink_sent.labels(label).inc()
                advanced = True
            if advanced:
                self.outbox.ack(label, cursor)
                self.last_success = time.time()
                self.metrics.sink_last_success.labels(label).set(self.last_success)
                self.backoff.reset()
                self._streak.success()
            if failure is not None:
                self._retry_later(failure)
                in_flight.clear()
                confirmed.clear()
                submitted = cursor
        try:
            self.sink.close(timeout=2.0)
        except Exception as exc:  # a failing close must not hide the shutdown
            log.warning("sink close failed", extra={"sink": self.sink.name, "error": str(exc)})

    def open_at_start(self) -> None:
        """Open the sink before the agent starts polling, so a configuration that can never work (a
        wrong hub, a refused credential) stops the start with a clear message. A transient failure
        (the namespace is unreachable) is only logged: the worker keeps retrying, the queue intact."""
        try:
            self.sink.open()
        except SinkError as err:
            if err.permanent:
                raise
            log.warning(
                "sink not reachable at start, will retry", extra={"sink": self.sink.name, "error": str(err)}
            )
            return
        self._opened = True

    def _open(self) -> bool:
        try:
            self.sink.open()
        except SinkError as err:
            self._retry_later(err)
            return False
        self._opened = True
        return True

    def _retry_later(self, err: SinkError) -> None:
        label = self.sink.id
        self.metrics.sink_failures.labels(label, err.kind).inc()
        self.metrics.sink_retries.labels(label).inc()
        delay = self.backoff.next_delay(err.retry_after)
        self._streak.failure(err.kind, str(err), sink=self.sink.name, retryInSeconds=round(delay, 2))
        if self._stopping.is_set():  # draining: never sleep past the drain deadline
            time.sleep(min(delay, max(0.0, (self._drain_deadline or 0) - time.monotonic())))
        else:
            self._stopping.wait(delay)

    def _dead_letter(self, entry: Entry, err: SinkError) -> None:
        label = self.sink.id
        self.metrics.sink_failures.labels(label, err.kind).inc()
        self.metrics.sink_dead_letters.labels(label).inc()
        log.error(
            "record refused permanently, moved to dead-letter file",
            extra={
                "sink": self.sink.name,
                "recordId": entry.record_id,
                "reason": str(err),
                "file": str(self.dead_letter_path),
            },
        )
        line = orjson.dumps(
            {
                "deadLetteredAt": time.time(),
                "sink": self.sink.name,
                "reason": str(err),
                "kind": err.kind,
                "record": orjson.Fragment(entry.payload),
            }
        )
        self.dead_letter_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dead_letter_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line + b"\n")
            datasync(fd)
        finally:
            os.close(fd)

    def lag(self) -> tuple[str, int, float]:
        """(sink id, records not confirmed, seconds since the oldest of them became durable)."""
        label = self.sink.id
        oldest = self.outbox.oldest_unconfirmed(label)
        return label, self.outbox.depth(label), 0.0 if oldest is None else max(0.0, time.time() - oldest)
