"""``se-bridge azure-channel``: Azure's own Scheduled Events channel, published and reconciled.

Wiring (the same parts as the approver's: a source, an outbox, delivery workers):

    Event Grid -> Event Hub --(source, committed after the records are durable)--> parse
    (bridge.azure.events) -> news? (bridge.azure.tracker) -> azureScheduledEvent record + settled
    findings (bridge.azure.reconcile) -> outbox -> sinks

    agents' events stream --(read, never committed: every instance reads all)--> reconciler
    every second: findings whose grace ended -> outbox -> sinks

A delivery that is not a usable event (not JSON, another resource type, malformed) is counted by
reason, logged (rate-limited) and written to ``<state_dir>/dead-letter/azure-refused.jsonl`` with
its reason; it never stops reading. ``/healthz``, ``/readyz`` (sources open, the agents' stream read
to its end once), ``/metrics`` and ``GET /v1/unwatched`` (the open unwatched VMs, JSON) like every
service; SIGTERM stops reading, commits what is durable and drains the sinks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from bridge import __version__
from bridge.azure.config import AzureChannelConfig
from bridge.azure.events import AzureEvent, AzureEventRefused, deliveries, from_event_grid, from_graph_row
from bridge.azure.graph import ResourceGraphReader
from bridge.azure.metrics import AzureChannelMetrics
from bridge.azure.reconcile import Reconciler
from bridge.azure.records import azure_event_record
from bridge.azure.tracker import EventTracker
from bridge.errors import BridgeError
from bridge.http.apiguard import guarded_listener
from bridge.http.listener import Listener, Request, Response, json_response, probe_routes
from bridge.pipeline import RecordMeta
from bridge.pipeline.storing import append_all
from bridge.records import encode
from bridge.records.ids import HEARTBEAT, SCHEDULED_EVENTS
from bridge.records.reader import Reader
from bridge.schemas import JsonObject
from bridge.shell.service import Shell
from bridge.signing import load_key_from, sign_record
from bridge.sinks import Sink, create_sink
from bridge.streams import DecisionSource, Message, create_source, topology
from bridge.streams.follow import follow
from bridge.support.fsutil import datasync, ensure_private_dir
from bridge.support.observability import ErrorStreak, RateLimitedLog
from bridge.support.retry import Backoff

log = logging.getLogger(__name__)

READ_PATHS = frozenset({"/metrics", "/v1/unwatched"})
#: A refused delivery's payload kept in the dead letter, at most (an Event Grid event is <= 1 MB).
DEAD_LETTER_BYTES = 64 * 1024
#: How long a poll's first messages wait for more, and the most stored together (see ``_linger``).
LINGER = 0.05
MAX_BATCH = 500
#: Messages whose records are built and stored together (one outbox fsync and one tracker commit);
#: the source's position is still committed once per poll.
STORE_BATCH = 200
#: Events in their grace at most before the Azure sources wait (issue 33: "bounded whatever the
#: backlog"). A backlog is read faster than the grace (120 s) settles its events, and each is held
#: until then: 120 000 waiting deliveries took the service to 84 MB. Past this many, the Azure
#: readers pause until the oldest settle (at most a grace: shorter than a Kafka consumer's
#: max.poll.interval); the agents' stream is never paused, or its records would come too late and
#: make VMs look unwatched. The price is latency: each pause lasts up to a grace. 12 000 events (and
#: a poll, read before the check): a 40 000-delivery backlog (11 000 events) is read without a pause
#: (8 000 made it 131 s instead of 24); 120 000 deliveries peak at 53 MB (docs/performance.md).
MAX_IN_GRACE = 12_000


class AzureChannel:
    def __init__(
        self,
        sources: list[DecisionSource],
        sinks: list[Sink],
        state_dir: Path,
        *,
        events_sources: list[DecisionSource] = (),  # type: ignore[assignment]
        grace: float = 120.0,
        graph: ResourceGraphReader | None = None,
        graph_interval: float = 60.0,
        signer: tuple[str, bytes] | None = None,
        max_in_grace: int = MAX_IN_GRACE,
    ) -> None:
        self.signer = signer  # (key id, key): records a fleet approver may act on (bridge.signing)
        self.max_in_grace = max_in_grace
        self.graph = graph
        self.graph_interval = graph_interval
        self._graph_polled = graph is None  # readiness: one poll done (or no Resource Graph)
        self.sources = sources
        self.events_sources = list(events_sources)
        self.state_dir = state_dir
        self.metrics = AzureChannelMetrics()
        # State directory (locked, watched), outbox, delivery, health, stop: the services' one shell.
        self.shell = Shell("azure channel", state_dir, sinks, self.metrics)
        self.stop_event, self.health = self.shell.stop_event, self.shell.health
        self.outbox, self.workers = self.shell.outbox, self.shell.workers
        # What decides news survives restarts, on disk (a month of events is not held in memory).
        self.tracker = EventTracker(
            state_path=state_dir / "azure-events.sqlite", legacy_path=state_dir / "azure-states.jsonl"
        )
        # Pins survive restarts; so does what ended (the tracker's states): a late word about a settled
        # event starts nothing, before or after a restart.
        self.reconciler = Reconciler(
            grace, ended=self.tracker.ended, pins_path=state_dir / "agent-pins.jsonl"
        )
        self.metrics.reconciler_counts(self.reconciler.counts, lambda: dict(self.reconciler.refused))
        self.metrics.state_errors(lambda: dict(self.tracker.errors))
        #: The agents' records, schema-checked where they come off the stream (the reconciler reads
        #: their scheduledEvents and heartbeats only).
        self.reader = Reader(types=(SCHEDULED_EVENTS, HEARTBEAT))
        self.metrics.registry.register(self.reader)
        self.api: Listener | None = None
        self._open: set[int] = set()
        self._caught_up: set[int] = set()
        self._refused_log = RateLimitedLog(log, every=60.0, level=logging.WARNING)
        self._settling = RateLimitedLog(log, every=60.0, level=logging.INFO)
        self._dead_letter = state_dir / "dead-letter" / "azure-refused.jsonl"
        self._storing = ErrorStreak(log, "storing Azure channel records")

    # -- serving ----------------------------------------------------------------------------------------

    def serve(self, listen: str, *, read_token_file: str | None = None) -> None:
        refused = self.metrics.http_refused
        routes = probe_routes(self.health.report, self.ready, self.metrics.registry)
        routes[("GET", "/v1/unwatched")] = self._unwatched
        self.api = guarded_listener(
            listen, routes, READ_PATHS, read_token_file=read_token_file,
            on_refused=lambda reason: refused.labels(reason).inc(),
        )  # fmt: skip

    def _unwatched(self, _: Request) -> Response:
        return json_response(200, {"unwatched": self.reconciler.unwatched()})

    def ready(self) -> tuple[bool, str]:
        if self.health.fatal is not None:
            return False, f"component failed: {self.health.fatal}"
        if len(self._open) < len(self.sources):
            return False, "Azure channel source not open yet"
        if len(self._caught_up) < len(self.events_sources):
            return False, "reading the agents' events stream"
        if not self._graph_polled:
            return False, "first Resource Graph poll not done yet"
        return True, "ok"

    # -- running ------------------------------------------------------------------------------------------

    def run(self, install_signals: bool = True) -> int:
        if install_signals:
            self.shell.install_signals()
        self.shell.start()  # delivery, and the state directory watched (deleted: exit 70)
        threads = [
            threading.Thread(target=self._read, args=(i, s), name=f"azure-{i}", daemon=True)
            for i, s in enumerate(self.sources)
        ]
        threads += [
            threading.Thread(target=self._follow, args=(i, s), name=f"agents-{i}", daemon=True)
            for i, s in enumerate(self.events_sources)
        ]
        threads.append(threading.Thread(target=self._tick, name="reconcile", daemon=True))
        if self.graph is not None:
            threads.append(
                threading.Thread(target=self._poll_graph, args=(self.graph,), name="graph", daemon=True)
            )
        for thread in threads:
            thread.start()
        if self.api is not None:
            self.api.start()
        log.info(
            "azure channel started",
            extra={"version": __version__, "sources": [s.name for s in self.sources],
                   "eventsSources": [s.name for s in self.events_sources]},
        )  # fmt: skip
        self.stop_event.wait()
        for thread in threads:
            thread.join(10.0)
        self.shutdown()
        return self.shell.exit_code()

    def _read(self, index: int, source: DecisionSource) -> None:
        """Read one Azure channel source; commit a poll's messages once their records are durable."""
        streak = ErrorStreak(log, f"reading Azure's channel from {source.name}")
        backoff = Backoff(base=1.0, cap=30.0)
        while not self.stop_event.is_set():
            try:
                source.open()
                self._open.add(index)
                while not self.stop_event.is_set():
                    if self.reconciler.in_grace() >= self.max_in_grace:  # a backlog: see MAX_IN_GRACE
                        self._settling.log("waiting for Azure's events to settle", limit=self.max_in_grace)
                        self.stop_event.wait(0.5)
                        continue
                    messages = source.poll(0.5)
                    if messages:
                        messages += linger(source, len(messages), self.stop_event)
                    streak.success()
                    backoff.reset()
                    if messages and self._publish(messages):
                        source.commit_many(messages)
            except Exception as exc:  # a failing source is opened again: a reader never dies
                self._open.discard(index)
                kind = exc.kind if isinstance(exc, BridgeError) else "other"
                self.metrics.source_errors.labels(kind).inc()
                streak.failure(kind, str(exc))
                self.stop_event.wait(backoff.next_delay())
        source.close()

    def _publish(self, messages: list[Message]) -> bool:
        """The records of a poll's messages, durable; False when stopping first (not committed).
        Stored :data:`STORE_BATCH` messages at a time: a backlog's poll is a whole read (about 850
        deliveries from a file), and its records, built all at once, were a few MB of objects
        interleaved with the events held in their grace (issue 33: memory whatever the backlog)."""
        for first in range(0, len(messages), STORE_BATCH):
            now = time.time()
            out: list[JsonObject] = []
            seen: list[AzureEvent] = []
            for message in messages[first : first + STORE_BATCH]:
                for item in deliveries(message.payload):
                    event = self._parsed(item, message)
                    if event is not None:
                        seen.append(event)
                        out += self._observed(event, now)
            if not self._store(out, seen):
                return False
        return True

    def _unexpected(self, exc: Exception) -> AzureEventRefused:
        """An item the parser raised on by mistake: refused on its own (dead letter, metric), never
        the batch it came with, never the reader (issue 31: a poison delivery wedged the source)."""
        log.exception("an Azure channel item could not be read; refused on its own")
        return AzureEventRefused("malformed", f"unreadable: {type(exc).__name__}")

    def _observed(self, event: AzureEvent, now: float) -> list[JsonObject]:
        """The records an observation makes: none for a duplicate; its record and the findings it
        settles otherwise."""
        news = self.tracker.observe(event)
        if news is None:
            self.metrics.events.labels(event.channel, "duplicate").inc()
            return []
        self.metrics.events.labels(event.channel, "late" if news.late else "news").inc()
        return [azure_event_record(event, news, now), *self.reconciler.azure(event, news, now)]

    def _parsed(
        self,
        item: JsonObject | AzureEventRefused,
        message: Message | None,
        parse: Callable[[JsonObject], AzureEvent] = from_event_grid,
    ) -> AzureEvent | None:
        """The event of a delivery (or a Resource Graph row: ``message`` None); a refusal is dead-
        lettered and counted, never raised."""
        try:
            if isinstance(item, AzureEventRefused):
                raise item
            return parse(item)
        except AzureEventRefused as refusal:
            self._refused(refusal, message, item)
        except Exception as exc:
            self._refused(self._unexpected(exc), message, item)
        return None

    def _refused(self, refusal: AzureEventRefused, message: Message | None, item: Any) -> None:
        self.metrics.refused.labels(refusal.reason).inc()
        self._refused_log.log(
            "Azure channel event refused (dead-lettered)", reason=refusal.reason, detail=refusal.detail
        )
        payload = (
            message.payload
            if message is not None and isinstance(item, AzureEventRefused)
            else orjson.dumps(item)
        )
        position = str(message.position) if message is not None else "resourceGraph"
        dead_letter(self._dead_letter, refusal, position, payload)

    def _store(self, records: list[JsonObject], observed: Sequence[AzureEvent] = ()) -> bool:
        """``records`` durable in the outbox (waiting out a full or failing disk); False when stopping
        first. Whatever prevents it, the observations behind them are forgotten by the tracker, so
        the same deliveries (not committed) or rows (polled again) are news again."""
        try:
            stored = self._append_all(records)
        except BaseException:
            for event in observed:
                self.tracker.forget(event)
            raise
        if not stored:
            for event in observed:
                self.tracker.forget(event)
        else:
            try:
                self.tracker.persist(observed)
            except OSError as exc:  # the records are out; only a restart's late flag may be wrong
                log.error("cannot keep the events' states", extra={"error": str(exc)})
        return stored

    def _append_all(self, records: list[JsonObject]) -> bool:
        if not records:
            return True
        if self.signer is not None:
            records = [sign_record(*self.signer, record) for record in records]
        entries = [(RecordMeta.of(record), encode(record)) for record in records]
        if not append_all(
            self.outbox, entries, self.stop_event, lambda e: self._storing.failure("outbox", str(e))
        ):
            return False
        self._storing.success()
        for record in records:
            if record["recordType"] == "reconciliation":
                self.metrics.findings.labels(record["finding"]).inc()
        return True

    def _poll_graph(self, graph: ResourceGraphReader) -> None:
        """Ask Resource Graph every ``graph_interval`` seconds; only changed rows become records."""
        streak = ErrorStreak(log, "polling Resource Graph")
        while not self.stop_event.is_set():
            try:
                rows = graph.rows()
            except Exception as exc:  # the next poll starts over: rows are state, nothing is lost
                kind = exc.kind if isinstance(exc, BridgeError) else "other"
                self.metrics.source_errors.labels(kind).inc()
                streak.failure(kind, str(exc))
            else:
                streak.success()
                now, out, seen = time.time(), [], []
                for row in rows:
                    event = self._parsed(row, None, from_graph_row)
                    if event is not None:
                        seen.append(event)
                        out += self._observed(event, now)
                try:
                    if self._store(out, seen):
                        self._graph_polled = True
                except Exception as exc:  # the thread outlives any poll; the next one starts over
                    self.metrics.source_errors.labels("other").inc()
                    streak.failure("other", f"storing the poll's records failed: {type(exc).__name__}")
            self.stop_event.wait(self.graph_interval)

    def _follow(self, index: int, source: DecisionSource) -> None:
        follow(
            source,
            lambda record: self.reconciler.agent(record, time.time()),
            self.stop_event,
            self.reader,
            caught_up=lambda: self._caught_up.add(index),
        )

    def _tick(self) -> None:
        while not self.stop_event.wait(1.0):
            while True:  # the findings due, STORE_BATCH at a time (a backlog settles thousands at once)
                findings = self.reconciler.due(time.time(), limit=STORE_BATCH)
                if not self._store(findings) or len(findings) < STORE_BATCH:
                    break
            try:
                self.reconciler.save_pins()
            except OSError as exc:  # kept in memory, written at the next tick
                self._storing.failure("pins", str(exc))

    def shutdown(self) -> None:
        self.stop_event.set()
        with contextlib.suppress(OSError):
            self.reconciler.save_pins()
        if self.api is not None:
            self.api.stop()
        left = self.shell.drain(10.0)
        self.shell.close()
        log.info("azure channel stopped", extra={"undelivered": left})


def linger(source: DecisionSource, have: int, stop: threading.Event) -> list[Message]:
    """What else arrives within :data:`LINGER` seconds of a poll's first messages (at most
    :data:`MAX_BATCH` in all), so they are stored, journalled and committed together.

    Why: a source that wakes on every write (the file source's inotify, an Event Hub under a
    trickle) handed over one delivery at a time, and each paid its own outbox fsync, journal fsync
    and position commit: at 10 000 deliveries a minute that was most of the service's CPU
    (bench/azure_bench.py). Azure announces maintenance minutes to days ahead; 50 ms is nothing to
    the person waiting, and a wave's burst is where the batches grow."""
    out: list[Message] = []
    deadline = time.monotonic() + LINGER
    while have + len(out) < MAX_BATCH and not stop.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        more = source.poll(remaining)
        if not more:
            break
        out += more
    return out


def dead_letter(path: Path, refusal: AzureEventRefused, position: str, payload: bytes) -> None:
    """One refused delivery, with its reason, appended (fsynced) to ``path``; its payload cut to
    DEAD_LETTER_BYTES. A disk that refuses costs the dead letter only (logged), never the reader."""
    entry = {
        "at": time.time(),
        "reason": refusal.reason,
        "detail": refusal.detail,
        "position": position,
        "payload": payload[:DEAD_LETTER_BYTES].decode("utf-8", "replace"),
        "truncated": len(payload) > DEAD_LETTER_BYTES,
    }
    try:
        ensure_private_dir(path.parent)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, orjson.dumps(entry) + b"\n")
            datasync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        log.error("cannot write the dead letter", extra={"error": str(exc)})


def build(config: AzureChannelConfig) -> AzureChannel:
    """The service from its configuration (:class:`bridge.azure.config.AzureChannelConfig`)."""
    from bridge.settings import ConfigError
    from bridge.sinks import SinkError

    state_dir = Path(config.state_dir)
    try:
        ensure_private_dir(state_dir)
        sources = [create_source(spec, state_dir, group=config.group) for spec in config.source]
        events = []
        for spec in config.events_source:
            topology.check_events_reader(spec)
            group = topology.events_group(spec, config.group, state_dir)
            events.append(create_source(spec, state_dir, group=group))
        sinks = [create_sink(spec) for spec in config.sink]
        signer = None
        if config.sign_key:
            key_id, _, where = config.sign_key.partition("=")
            signer = (key_id, load_key_from(where))
    except (ValueError, SinkError, BridgeError, OSError) as exc:
        raise ConfigError(str(exc)) from None
    service = AzureChannel(
        sources, sinks, state_dir, events_sources=events, grace=config.grace,
        graph=_graph_reader(config), graph_interval=config.graph_interval, signer=signer,
    )  # fmt: skip
    if config.listen:
        service.serve(config.listen, read_token_file=config.read_token_file)
    return service


def _graph_reader(config: AzureChannelConfig) -> ResourceGraphReader | None:
    """Resource Graph when ``--graph-subscription`` names subscriptions (its credential is built,
    nothing is contacted yet)."""
    if not config.graph_subscription:
        return None
    from bridge.settings import ConfigError
    from bridge.transports.azure import check_client_id, make_credential
    from bridge.transports.base import Owner

    owner = Owner("resource graph", lambda message: ConfigError(message))
    client_id = check_client_id(owner, "arm_client_id", config.arm_client_id)
    credential = make_credential(owner, "arm_credential", config.arm_credential, client_id)
    return ResourceGraphReader(
        credential, tuple(config.graph_subscription), config.arm_endpoint,
        audience=config.arm_audience, ca_file=config.arm_ca_file,
    )  # fmt: skip
