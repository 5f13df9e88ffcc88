"""The poll loop: IMDS document -> change detection -> record -> outbox.

This is the hot path of the whole product (once a second on every VM of a fleet), so an unchanged
answer costs one kept-alive HTTP exchange and one bytes comparison: no JSON parsing, no allocation
beyond the response, no disk I/O. Only an answer whose bytes differ is parsed, diffed against the
baseline and, if it is a change (another incarnation *or* other content), turned into a record.

Errors never end the loop. A failing poll is counted by kind and logged once per streak; the next
attempt is scheduled by the kind of failure:

* ``410 Gone``: IMDS's "retry after some time for a max of 70 seconds": retried at the poll interval
  for 70 s, then with backoff like any other failure (and logged at error level);
* ``429``, 5xx, timeouts, refused connections: full-jitter backoff from the poll interval up to 10 s
  (short enough not to sleep through a Spot VM's 30 s notice), honouring ``Retry-After``;
* an answer that is not a Scheduled Events document: counted by reason, the previous state is kept,
  polling goes on at the normal interval.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from bridge.agent.diff import Change, diff, is_change
from bridge.agent.identity import IdentityResolver
from bridge.agent.metrics import AgentMetrics
from bridge.agent.state import BaselineStore
from bridge.imds.client import IMDS_MAX_RETRY_AFTER, ImdsClient, ImdsError, ImdsResponse
from bridge.imds.document import (
    KNOWN_EVENT_STATUSES,
    KNOWN_EVENT_TYPES,
    DocumentError,
    EventsDocument,
    parse_document,
)
from bridge.pipeline import Health, Outbox, OutboxFull, OutboxWriteError, RecordMeta
from bridge.records import encode, scheduled_events_record
from bridge.support.observability import ErrorStreak
from bridge.support.retry import Backoff

log = logging.getLogger(__name__)

GONE_RETRY_WINDOW = 70.0  # seconds, from the IMDS documentation of 410
COMPONENT = "poller"
#: What one poll did (the poll loop's next step depends on it).
PollOutcome = Literal["unchanged", "changed", "error", "invalid", "full"]


@dataclass(frozen=True, slots=True)
class Observation:
    """The current document as last seen, for the HTTP API and the relay."""

    document: EventsDocument
    observed_at: float


class Poller:
    def __init__(
        self,
        client: ImdsClient,
        outbox: Outbox,
        baseline: BaselineStore,
        identity: IdentityResolver,
        metrics: AgentMetrics,
        *,
        interval: float = 1.0,
        api_version: str,
        health: Health | None = None,
        approved: Callable[[str], bool] | None = None,
        first_document: Callable[[EventsDocument], None] | None = None,
    ) -> None:
        self.client = client
        self.outbox = outbox
        self.baseline_store = baseline
        self.identity = identity
        self.metrics = metrics
        self.interval = interval
        self.api_version = api_version
        self.health = health or Health(metrics)
        self.health.register(COMPONENT)
        self.baseline: EventsDocument | None = baseline.load(outbox)
        self.current: Observation | None = None
        #: Called with (previous, current, changes) after each change is durable (local policies).
        self.listeners: list[Callable[[EventsDocument | None, EventsDocument, list[Change]], None]] = []
        #: Called once with the first document this run parsed (the relay resolves a POST a previous
        #: run left unanswered: bridge.agent.ledger).
        self.first_document = first_document
        #: Called after every poll, whatever it returned (the impact meter: bridge.agent.impact).
        self.after_poll: list[Callable[[], None]] = []
        #: Whether this VM approved an event (the relay's ledger): a Scheduled event gone after it is
        #: ``completed`` (bridge.agent.diff).
        self.approved = approved
        self.first_success: float | None = None
        self._last_body: bytes | None = None  # body of the last answer fully processed
        self._last_error = ImdsError("none", "no error yet")
        self._baseline_from_disk = self.baseline is not None
        self._last_seen_at: float | None = None  # when IMDS last answered
        self._gap_seconds = max(30.0, 5 * interval)
        self._imds_streak = ErrorStreak(log, "polling IMDS scheduled events")
        self._doc_streak = ErrorStreak(log, "reading the scheduled events document")
        self._full_streak = ErrorStreak(
            log, "admitting a record into the outbox", remind_every=60.0, level=logging.ERROR
        )
        # Never longer than 10 s between attempts, whatever a Retry-After says: a Spot VM gets 30 s.
        cap = max(IMDS_MAX_RETRY_AFTER, interval)
        self._backoff = Backoff(base=interval, cap=cap, floor=interval, max_retry_after=cap)
        if self.baseline is not None:
            self.metrics.document_incarnation.set(self.baseline.incarnation)
        # A refresh (the relay) or a stop cuts the wait between polls short; the counters let a
        # refresh wait for a poll that *started* after it asked.
        self._wake = threading.Event()
        self._cycle = threading.Condition()
        self._polls_started = 0
        self._polls_done = 0
        self._thread: threading.Thread | None = None  # the poll loop's, once it runs

    # -- state for readiness ------------------------------------------------------------------------

    @property
    def polled(self) -> bool:
        """True once a poll has finished (answered or failed)."""
        return self._polls_done > 0

    def failing_for(self) -> float:
        """Seconds IMDS has been failing without a break (0 when the last poll succeeded)."""
        return self._imds_streak.duration()

    def wake(self) -> None:
        """End the current wait between polls (the loop checks its stop event, then polls)."""
        self._wake.set()

    def document(self) -> EventsDocument | None:
        """The current document (None before the first poll answered): the relay's view."""
        current = self.current
        return current.document if current is not None else None

    def refresh(self, timeout: float) -> bool:
        """Poll now, on the poller's thread, and wait until that poll is processed.

        Why: IMDS serves each VM its own document, and the agents of one availability set poll at
        different moments. A fleet approver acts on the first VM's record of an event; the target
        VM's agent may not have polled since the event appeared. Its relay asks for a fresh
        document instead of answering ``notFound`` for an event IMDS already shows. The poll goes
        through the normal path (change record first, then the relay acts on it) and the same
        IMDS budget. True when the poll finished within ``timeout`` seconds; False at once while IMDS
        is failing (an authenticated caller must not turn the loop's backoff into a poll per request).
        """
        if threading.current_thread() is self._thread:
            return False  # asked from a change listener on the poll loop: it cannot wait for itself
        if self.failing_for() > 0:
            return False  # IMDS is failing: the poll loop's backoff stands, relay requests cannot cut it
        with self._cycle:
            wanted = self._polls_started + 1
        self._wake.set()
        with self._cycle:
            return self._cycle.wait_for(lambda: self._polls_done >= wanted, timeout)

    # -- one poll -----------------------------------------------------------------------------------

    def poll_once(self) -> PollOutcome:
        """Poll once. Returns ``unchanged``, ``changed``, ``error``, ``invalid`` or ``full``."""
        try:
            resp = self.client.get_scheduled_events()
        except ImdsError as err:
            self.metrics.poll_errors.labels(err.kind).inc()
            self._imds_streak.failure(err.kind, str(err), status=err.status)
            self._last_error = err
            return "error"
        self._imds_streak.success()
        self.metrics.polls.inc()
        previous_seen, self._last_seen_at = self._last_seen_at, resp.received_at
        if self.first_success is None:
            self.first_success = resp.received_at
        if resp.body == self._last_body:
            return "unchanged"
        try:
            doc = parse_document(resp.body, self.api_version)
        except DocumentError as err:
            self.metrics.document_errors.labels(err.reason).inc()
            self._doc_streak.failure(err.reason, str(err), incarnationKept=self._kept_incarnation())
            return "invalid"
        if doc.rejected:
            self.metrics.document_errors.labels("bad_event").inc(len(doc.rejected))
            doc = doc.keeping(self.baseline)
        self._observed(doc, resp.received_at)
        if not is_change(self.baseline, doc):
            self._last_body = resp.body
            return "unchanged"
        return self._record(doc, resp, previous_seen)

    def _observed(self, doc: EventsDocument, received_at: float) -> None:
        """A document parsed: it is the current one (the first of this run is announced)."""
        self._doc_streak.success()
        for warning in doc.warnings:
            log.warning("document field not understood", extra={"detail": warning})
        first, self.current = self.current is None, Observation(doc, received_at)
        if first and self.first_document is not None:
            try:
                self.first_document(doc)
            except Exception:
                log.exception("first-document listener failed")

    def _record(self, doc: EventsDocument, resp: ImdsResponse, previous_seen: float | None) -> PollOutcome:
        """A changed document: its record into the outbox, then the baseline and the listeners."""
        # Watching without a break since the baseline was seen? Not after a restart (the baseline came
        # from disk) nor after a long IMDS outage: then a vanished Scheduled event may have started.
        gap = self._baseline_from_disk or (
            previous_seen is not None and resp.received_at - previous_seen > self._gap_seconds
        )
        changes = diff(self.baseline, doc, resp.received_at, continuous=not gap, approved=self.approved)
        identity = self.identity.current
        record = scheduled_events_record(identity, self.baseline, doc, changes, resp.received_at)
        try:
            entry = self.outbox.append(RecordMeta.of(record), encode(record))
        except OutboxFull as err:
            # Keep the baseline and the last body: the next poll retries, and once there is room the
            # record carries the net change since the last admitted one. Loud, counted, documented.
            self.metrics.outbox_full.inc()
            self._full_streak.failure(
                "outbox_full", f"{err}; change held back, newest state kept", incarnation=doc.incarnation
            )
            return "full"
        except OutboxWriteError as err:
            # Disk full or failing: nothing of the record was kept. Same rule as a full outbox: the
            # change stays pending and the next poll that can write records the net change.
            self.metrics.outbox_full.inc()
            self._full_streak.failure(
                "outbox_io", f"{err}; change held back, newest state kept", incarnation=doc.incarnation
            )
            return "full"
        self._full_streak.success()
        self.metrics.record_latency.observe(time.monotonic() - resp.received_mono)
        try:
            self.baseline_store.save(doc, entry.seq)
        except OSError as err:  # the outbox has the record; recovery rebuilds the baseline from it
            log.error("cannot save baseline.json", extra={"error": str(err)})
        previous, self.baseline, self._last_body = self.baseline, doc, resp.body
        self._baseline_from_disk = False
        self._count(previous, doc, changes, str(record["recordId"]))
        for listener in self.listeners:  # after the record is durable: notify before acting
            try:
                listener(previous, doc, changes)
            except Exception:
                log.exception("change listener failed")
        return "changed"

    def _count(
        self, previous: EventsDocument | None, doc: EventsDocument, changes: list[Change], record_id: str
    ) -> None:
        m = self.metrics
        m.records.inc()
        m.document_incarnation.set(doc.incarnation)
        m.events_current.clear()
        for e in doc.events:
            # Event types and statuses are IMDS enums; an unknown value is kept in the record but
            # folded into "other" here so a label can never grow without bound.
            m.events_current.labels(_bounded_type(e.event_type), _bounded_status(e.event_status)).inc()
        for c in changes:
            m.changes.labels(c.change, _bounded_type(c.event_type)).inc()
        log.info(
            "document change recorded",
            extra={
                "recordId": record_id,
                "incarnation": doc.incarnation,
                "previousIncarnation": None if previous is None else previous.incarnation,
                "changes": [f"{c.event_id}:{c.change}" for c in changes],
            },
        )

    def _kept_incarnation(self) -> int | None:
        return None if self.baseline is None else self.baseline.incarnation

    # -- the loop -----------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set. Scheduling is drift-free and never busy-waits."""
        self._thread = threading.current_thread()
        gone_since: float | None = None
        next_due = time.monotonic()
        while not stop.is_set():
            with self._cycle:
                self._polls_started += 1
            try:
                outcome = self._poll_counted()
                self.health.ok(COMPONENT)
            except Exception as exc:  # a bug must not end the agent: keep the state, count, go on
                log.exception("internal error while polling; state kept, polling goes on")
                self.metrics.internal_errors.inc()
                self.health.error(COMPONENT, "internal")
                self._last_error = ImdsError("internal", f"{type(exc).__name__}: {exc}")
                outcome = "error"
            for hook in self.after_poll:
                try:
                    hook()
                except Exception:
                    log.exception("after-poll hook failed")
            now = time.monotonic()
            if outcome == "error":
                err = self._last_error
                if err.kind == "http_410":
                    gone_since = gone_since or now
                    if now - gone_since < GONE_RETRY_WINDOW:
                        delay = self.interval
                    else:
                        if now - gone_since - GONE_RETRY_WINDOW < self.interval * 1.5:
                            log.error("IMDS kept answering 410 beyond the documented 70 s; backing off")
                        delay = self._backoff.next_delay(err.retry_after)
                else:
                    delay = self._backoff.next_delay(err.retry_after)
                next_due = now + delay
            else:
                gone_since = None
                self._backoff.reset()
                next_due = max(now, next_due + self.interval)
            if self._wake.wait(max(0.0, next_due - time.monotonic())):
                self._wake.clear()  # a refresh (or a stop): poll now, and the schedule restarts here
                next_due = time.monotonic()

    def _poll_counted(self) -> PollOutcome:
        """:meth:`poll_once`, then wake the refreshes that waited for it (whatever it returned)."""
        try:
            return self.poll_once()
        finally:
            with self._cycle:
                self._polls_done += 1
                self._cycle.notify_all()


def _bounded_type(value: str) -> str:
    return value if value in KNOWN_EVENT_TYPES else "other"


def _bounded_status(value: str) -> str:
    return value if value in KNOWN_EVENT_STATUSES else "other"
