"""One delivery worker per sink: moves that sink's cursor through the outbox.

Each sink progresses on its own, so a sink that is down never blocks another (until the outbox
limit, which is shared: see :mod:`bridge.pipeline.outbox`). Within a sink, records are submitted in
outbox order and the cursor only moves over a contiguous run of confirmed records, so per-VM order
is kept and nothing is skipped. After a transient failure the worker backs off (full jitter) and
re-submits from the first unconfirmed record: at-least-once, with the record's deterministic id
for consumers that deduplicate. A permanent failure moves the record to
``<state-dir>/dead-letter/<sink-id>.jsonl`` with the reason, instead of blocking the queue forever.

No silent death: an internal error (the outbox cannot be read, the dead-letter file cannot be
written, a sink raised) is counted, logged once per streak and retried with backoff; the worker
reports to :class:`~bridge.pipeline.health.Health`, which ends the service (so it is restarted) if
the worker itself dies or its internal errors last for minutes.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from bridge.pipeline.entry import Entry
from bridge.pipeline.health import Health
from bridge.pipeline.metrics import PipelineMetrics
from bridge.pipeline.outbox import Outbox
from bridge.pipeline.sink import Outcome, Sink, SinkError
from bridge.support.fsutil import append_durably, ensure_private_dir
from bridge.support.observability import ErrorStreak
from bridge.support.retry import Backoff

log = logging.getLogger(__name__)

DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
#: A sink's ``Retry-After`` is honoured up to this many seconds (a webhook's 429 may ask for minutes).
MAX_SINK_RETRY_AFTER = 300.0


@dataclass
class _Window:
    """What the worker has handed to the transport and not yet seen confirmed."""

    cursor: int  # last seq confirmed (contiguously) by the sink
    submitted: int  # highest seq handed to the transport
    in_flight: deque[Entry] = field(default_factory=deque)
    confirmed: set[int] = field(default_factory=set)

    def rewind(self) -> None:
        """Forget what is in flight: it is submitted again from the first unconfirmed record."""
        self.in_flight.clear()
        self.confirmed.clear()
        self.submitted = self.cursor


class DeliveryWorker(threading.Thread):
    """Drives one :class:`~bridge.pipeline.sink.Sink` from its outbox cursor."""

    def __init__(
        self,
        sink: Sink,
        outbox: Outbox,
        metrics: PipelineMetrics,
        dead_letter_dir: Path,
        *,
        health: Health | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        super().__init__(name=f"deliver-{sink.id}", daemon=True)
        self.sink = sink
        self.outbox = outbox
        self.metrics = metrics
        self.dead_letter_path = dead_letter_dir / f"{sink.id}.jsonl"
        self.backoff = backoff or Backoff(base=0.5, cap=30.0, max_retry_after=MAX_SINK_RETRY_AFTER)
        self.health = health or Health(metrics)
        self.component = f"delivery/{sink.id}"
        self.health.register(self.component)
        self._stopping = threading.Event()
        self._drain_deadline: float | None = None
        self._streak = ErrorStreak(log, f"delivery to {sink.name}")
        self._internal = ErrorStreak(log, f"delivery worker of {sink.name}", level=logging.ERROR)
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

    def _done(self) -> bool:
        return self._stopping.is_set() and (self.caught_up or time.monotonic() >= (self._drain_deadline or 0))

    # -- loop -------------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # the loop itself broke: end the service, so it is restarted
            log.exception("delivery worker ended unexpectedly", extra={"sink": self.sink.name})
            self.health.failed(self.component, f"{type(exc).__name__}: {exc}")
        finally:
            try:
                self.sink.close(timeout=2.0)
            except Exception as exc:  # a failing close must not hide the shutdown
                log.warning("sink close failed", extra={"sink": self.sink.name, "error": str(exc)})

    def _loop(self) -> None:
        cursor = self.outbox.cursor(self.sink.id)
        window = _Window(cursor=cursor, submitted=cursor)
        while not self._done():
            try:
                self._step(window)
            except Exception as exc:  # outbox I/O (EMFILE, EIO), a dead letter that cannot be written
                self._internal_error(exc)
                window.rewind()

    def _step(self, window: _Window) -> None:
        if not self._opened and not self._open():
            return
        self._fill(window)
        if not window.in_flight:
            if self.sink_failed is not None:
                failed, self.sink_failed = self.sink_failed, None
                self._retry_later(failed)
                window.rewind()
            else:
                # Idle: sleep until a record is appended or stop() wakes us; no periodic wake-up.
                self.outbox.wait(window.submitted, None if not self._stopping.is_set() else 0.05)
            return
        failure, self.sink_failed = self.sink_failed, None
        try:
            outcomes = self.sink.poll(0.2)
        except Exception as exc:
            log.exception("sink raised unexpectedly", extra={"sink": self.sink.name})
            self.health.error(self.component, "sink_raised")
            outcomes, failure = [], SinkError(f"{type(exc).__name__}: {exc}", kind="internal")
        failure = self._settle(window, outcomes) or failure
        self._advance(window)
        if failure is not None:
            self._retry_later(failure)
            window.rewind()

    def _fill(self, window: _Window) -> None:
        """Hand the transport what fits in its window, in outbox order."""
        room = self.sink.max_in_flight - len(window.in_flight)
        if room <= 0:
            return
        for entry in self.outbox.read(window.submitted, room):
            try:
                self.sink.submit(entry)
            except Exception as exc:  # a sink bug must not kill delivery: retry like a failure
                log.exception("sink raised unexpectedly", extra={"sink": self.sink.name})
                self.health.error(self.component, "sink_raised")
                self.sink_failed = SinkError(f"{type(exc).__name__}: {exc}", kind="internal")
                break
            window.in_flight.append(entry)
            window.submitted = entry.seq

    def _settle(self, window: _Window, outcomes: list[Outcome]) -> SinkError | None:
        """Record confirmations; dead-letter permanent refusals. Returns the first transient failure."""
        failure: SinkError | None = None
        for outcome in outcomes:
            if outcome.ok:
                window.confirmed.add(outcome.seq)
            elif outcome.error is not None and not outcome.error.retryable:
                entry = next((e for e in window.in_flight if e.seq == outcome.seq), None)
                if entry is not None:
                    self._dead_letter(entry, outcome.error)  # raises if it cannot be kept
                window.confirmed.add(outcome.seq)
            elif failure is None:
                failure = outcome.error
        return failure

    def _advance(self, window: _Window) -> None:
        """Move the cursor over the contiguous confirmed prefix only: order is kept, nothing skipped."""
        advanced = False
        while window.in_flight and window.in_flight[0].seq in window.confirmed:
            window.confirmed.discard(window.in_flight[0].seq)
            window.cursor = window.in_flight.popleft().seq
            self.metrics.sink_sent.labels(self.sink.id).inc()
            advanced = True
        if advanced:
            self.outbox.ack(self.sink.id, window.cursor)
            self.last_success = time.time()
            self.metrics.sink_last_success.labels(self.sink.id).set(self.last_success)
            self.backoff.reset()
            self._streak.success()
            self._internal.success()
            self.health.ok(self.component)

    def open_at_start(self) -> None:
        """Open the sink before the service starts working, so a configuration that can never work (a
        wrong hub, a refused credential) stops the start with a clear message. A transient failure
        (the namespace is unreachable) is only logged: the worker keeps retrying, the queue intact."""
        try:
            self.sink.open()
        except SinkError as err:
            if not err.retryable:
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
        self._sleep(delay)

    def _internal_error(self, exc: Exception) -> None:
        kind = "io" if isinstance(exc, OSError) else "internal"
        # A full disk is not cured by a restart (and a restart loop would stop polling too): it is
        # counted and retried, but never makes the service give up.
        disk_full = isinstance(exc, OSError) and exc.errno in DISK_FULL
        self.health.error(self.component, "disk_full" if disk_full else kind, restart_helps=not disk_full)
        delay = self.backoff.next_delay()
        detail = f"{type(exc).__name__}: {exc}"
        self._internal.failure(kind, detail, sink=self.sink.name, retryInSeconds=round(delay, 2))
        if kind == "internal":
            log.debug("internal error", exc_info=exc)
        self._sleep(delay)

    def _sleep(self, delay: float) -> None:
        if self._stopping.is_set():  # draining: never sleep past the drain deadline
            time.sleep(min(delay, max(0.0, (self._drain_deadline or 0) - time.monotonic())))
        else:
            self._stopping.wait(delay)

    def _dead_letter(self, entry: Entry, err: SinkError) -> None:
        """Keep a refused record with its reason. Raises OSError if the file cannot take it: the
        record then stays unconfirmed and is retried, never dropped."""
        label = self.sink.id
        letter: dict[str, object] = {
            "deadLetteredAt": time.time(),
            "sink": self.sink.name,
            "reason": str(err),
            "kind": err.kind,
            "recordId": entry.record_id,
        }
        try:  # the record verbatim; bytes that are no JSON as text, or the line itself would not be
            orjson.loads(entry.payload)
            letter["record"] = orjson.Fragment(entry.payload)
        except orjson.JSONDecodeError:
            letter["recordText"] = entry.payload.decode("utf-8", "replace")
        line = orjson.dumps(letter)
        ensure_private_dir(self.dead_letter_path.parent)
        append_durably(self.dead_letter_path, line + b"\n")
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

    def lag(self) -> tuple[str, int, float]:
        """(sink id, records not confirmed, seconds since the oldest of them became durable)."""
        label = self.sink.id
        oldest = self.outbox.oldest_unconfirmed(label)
        return label, self.outbox.depth(label), 0.0 if oldest is None else max(0.0, time.time() - oldest)
