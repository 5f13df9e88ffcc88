"""``eventhubs://<namespace>.servicebus.windows.net/<hub>[?options]``: Azure Event Hubs over AMQP 1.0
with the official ``azure-eventhub`` SDK, records confirmed only when the service accepted their batch.

Why it is built this way:

* **Batches, in order, one partition per VM.** What :meth:`EventHubsSink.submit` hands over is
  collected and sent in ``EventDataBatch``es as large as the hub allows, built with
  ``create_batch(partition_key=<vmId>)`` so a VM's records land on one partition in outbox order
  (one agent only ever has one VM's records; the key is still kept per batch, a batch never mixes
  keys). A batch's records are confirmed together when ``send_batch`` returns. Each event carries
  the application properties ``recordType``, ``schemaVersion`` (an AMQP int), ``vmId``, ``recordId``,
  the content type ``application/json`` and ``message-id`` = ``recordId``. A record too large for an
  empty batch can never be sent: it is a permanent error (dead-letter), nothing else is.
* **The SDK blocks, the worker must not.** ``send_batch`` is synchronous, so sending happens in this
  sink's own background thread; ``submit`` queues and ``poll`` collects outcomes, both return at once
  (``max_in_flight`` records, 500 by default, may be waiting for confirmation).
* **A watchdog, because the SDK can hang for ever.** azure-eventhub 5.15.1 (pyamqp) reads the SASL
  handshake with a socket in blocking mode without timeout (``Transport.block()``), and wraps TLS the
  same way: a port that accepts TCP but never answers (a black-holed network path, a stuck proxy)
  hangs ``create_batch``/``send_batch`` for ever, even with ``send_batch(timeout=...)``. So a batch
  that has not finished within ``send_timeout`` (30 s) is abandoned: its records come back as
  transient failures, the client is dropped and a new one is built for the resend. The abandoned
  thread is blocked in a ``recv`` that nothing else would ever end (it holds the transport's lock, so
  not even ``client.close()`` gets through): the watchdog finds the sockets in that thread's stack
  frames and shuts them down, again until the thread exits (the SDK's own retry reconnects and hangs
  anew), so a long outage does not pile up threads and sockets. ``open()`` is guarded the same way.
* **Nothing reordered after a failure.** After a failure the sink drops everything still queued and
  ignores further submissions until the worker starts resending from the first failed record, so a
  later record never overtakes the resend. A send the watchdog abandoned may still have reached the
  hub: consumers may see a duplicate (same ``recordId``), never a gap or a reordering.
* **Fail fast at start, retry later.** ``open()`` reads the hub's properties (a ``$management`` READ):
  a 404 ("hub not found") or a refused credential (401 on the ``$cbs`` put-token, or an identity that
  Entra ID refuses) stops the agent with a clear message (exit 2); an unreachable namespace is
  transient (the agent starts, keeps the queue and retries). Once running, the same errors are
  retried (kinds ``auth``, ``not_found``), never dead-lettered: they are not about one record.
* **Short SDK retries.** ``retry_total`` defaults to 1 (backoff 0.5 x 2^n s, at most 4 s; the SDK's
  default is 3 retries at 0.8 x 2^n s): the delivery worker already backs off with full jitter, and
  long SDK retries would only add opaque delays on top.
* **One spec syntax with the approver's Event Hubs source.** The spec's options, the connection
  string or Entra ID credential, building SDK clients, abandoning a hung call and classifying SDK
  failures are :mod:`bridge.transports.eventhubs`'s, shared with
  :mod:`bridge.streams.eventhubs`; this module adds the producer, its batches and its
  watchdog. The connection string is never in the spec (``connection_string_env`` /
  ``connection_string_file``, read each time a client is built); Entra ID needs no secret at all and
  is the default. A connection string with ``UseDevelopmentEmulator=true`` (local emulators and test
  peers) makes its ``Endpoint`` win over the spec's host, which the sink says once.

See ``docs/sink-eventhubs.md``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

from bridge.pipeline import CONTENT_TYPE, Entry, Outcome, Sink, SinkError
from bridge.sinks.base import owner
from bridge.transports import eventhubs
from bridge.transports.eventhubs import (
    Abandoned,
    EventHubsOptions,
    HubConnection,
    abandon,
    call_with_deadline,
)

log = logging.getLogger(__name__)

#: Who speaks in this sink's refusals ("eventhubs sink: ...").
OWNER = owner("eventhubs sink")
BATCH_PARTITION_KEY_MAX = 128  # Event Hubs refuses longer partition keys


def parse_eventhubs_spec(spec: str) -> EventHubsOptions:
    """Validate an ``eventhubs://`` sink spec (:func:`bridge.transports.eventhubs.parse_spec`): every
    mistake is a permanent :class:`SinkError` naming the option, so a wrong spec stops the agent."""
    return eventhubs.parse_spec(spec, OWNER)[0]


# --------------------------------------------------------------------------------------------------
# The sink
# --------------------------------------------------------------------------------------------------


class EventHubsSink(Sink):
    """Azure Event Hubs through ``EventHubProducerClient``, driven from a background thread."""

    scheme = "eventhubs"

    def __init__(self, spec: str) -> None:
        super().__init__(spec)
        self.options = parse_eventhubs_spec(spec)
        self.max_in_flight = self.options.max_in_flight
        self._cond = threading.Condition()
        self._pending: deque[Entry] = deque()  # submitted, not yet taken by the sender thread
        self._unconfirmed: list[int] = []  # taken by the sender thread, outcome not yet reported
        self._outcomes: list[Outcome] = []
        self._generation = 0  # bumped when a sender thread and its client are abandoned
        self._sender: threading.Thread | None = None
        self._client: Any = None  # the current generation's EventHubProducerClient
        self._busy_since: float | None = None  # monotonic start of the batch being sent
        self._resync_after: int | None = None  # after a failure: drop submissions above this seq
        self._closing = False
        #: The credential or connection string, and the hub's name and endpoint once it is read.
        self.connection = HubConnection(self.options, OWNER, log, {"sink": self.name})
        #: Sender threads the watchdog gave up on (tests check that they exit once unblocked).
        self.abandoned: list[threading.Thread] = []
        #: How many times the watchdog abandoned a send and dropped the client.
        self.watchdog_fired = 0
        self.partition_ids: list[str] = []

    # -- clients ----------------------------------------------------------------------------------

    def _build_client(self) -> Any:
        """A new producer client (connects lazily: building it contacts nothing)."""
        return self.connection.build("EventHubProducerClient")

    # -- errors -----------------------------------------------------------------------------------

    def _error(self, exc: BaseException, *, opening: bool) -> SinkError:
        """Classify an SDK failure: at start a refused credential or a missing hub is permanent."""
        return self.connection.classify(exc, SinkError, opening=opening)

    # -- start-up ---------------------------------------------------------------------------------

    def open(self) -> None:
        """Read the hub's properties: proves the namespace answers, the credential is accepted and the
        hub exists, before the agent starts polling."""
        with self._cond:
            self._closing = False
        client = self._build_client()
        try:
            props = call_with_deadline(
                client.get_eventhub_properties, self.options.open_timeout, "eventhubs-open"
            )
        except Abandoned as stuck:
            abandon(stuck.thread, client)
            raise SinkError(
                f"the Event Hubs namespace did not answer within {self.options.open_timeout:g} s "
                f"({self.connection.where}); will retry",
                kind="timeout",
            ) from None
        except Exception as exc:
            abandon(None, client)
            raise self._error(exc, opening=True) from None
        self.partition_ids = list((props or {}).get("partition_ids") or [])
        log.info(
            "event hub reachable",
            extra={"sink": self.name, "hub": self.connection.hub, "partitions": len(self.partition_ids)},
        )
        with self._cond:
            old, self._client = self._client, client
        if old is not None and old is not client:
            abandon(None, old)

    # -- submit / poll ----------------------------------------------------------------------------

    def submit(self, entry: Entry) -> None:
        with self._cond:
            if self._resync_after is not None:
                if entry.seq > self._resync_after:
                    # A failure was reported for an earlier record: the worker will resend from there.
                    # Sending this one now would put it ahead of the resend.
                    return
                self._resync_after = None
            self._pending.append(entry)
            if self._sender is None or not self._sender.is_alive():
                self._sender = threading.Thread(
                    target=self._sender_loop,
                    args=(self._generation,),
                    name=f"eventhubs-send-{self.id}",
                    daemon=True,
                )
                self._sender.start()
            self._cond.notify_all()

    def poll(self, timeout: float) -> list[Outcome]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                self._watchdog_locked()
                remaining = deadline - time.monotonic()
                if self._outcomes or remaining <= 0:
                    break
                self._cond.wait(min(remaining, 0.1))
            out, self._outcomes = self._outcomes, []
        return out

    # -- the sender thread ------------------------------------------------------------------------

    def _sender_loop(self, generation: int) -> None:
        while True:
            with self._cond:
                while generation == self._generation and not self._pending and not self._closing:
                    self._cond.wait(1.0)
                if generation != self._generation or not self._pending:
                    return
                entries = list(self._pending)
                self._pending.clear()
                self._unconfirmed = [e.seq for e in entries]
            try:
                self._send(generation, entries)
            except Exception as exc:
                self._failed(generation, self._error(exc, opening=False))

    def _current_client(self, generation: int) -> Any:
        with self._cond:
            if generation != self._generation:
                raise Abandoned("generation")
            client = self._client
        if client is not None:
            return client
        client = self._build_client()
        with self._cond:
            if generation == self._generation and self._client is None:
                self._client = client
                return client
        abandon(None, client)
        raise Abandoned("generation")

    def _send(self, generation: int, entries: list[Entry]) -> None:
        from azure.eventhub import EventData

        metas = [e.meta for e in entries]
        index = 0
        while index < len(entries):
            key = metas[index].key[:BATCH_PARTITION_KEY_MAX]
            self._set_busy(generation, time.monotonic())
            client = self._current_client(generation)
            batch = client.create_batch(partition_key=key)
            seqs: list[int] = []
            while index < len(entries):
                entry, meta = entries[index], metas[index]
                if meta.key[:BATCH_PARTITION_KEY_MAX] != key:
                    break
                event = EventData(entry.payload)
                event.content_type = CONTENT_TYPE
                event.message_id = entry.record_id
                event.properties = {
                    "recordType": meta.record_type,
                    "schemaVersion": meta.schema_version,
                    "vmId": meta.vm_id or "",
                    "recordId": meta.record_id,
                }
                try:
                    batch.add(event)
                except ValueError:
                    if seqs:
                        break  # the batch is full: send it, this record starts the next one
                    limit = getattr(batch, "max_size_in_bytes", None)
                    self._report(
                        generation,
                        [entry.seq],
                        SinkError(
                            f"record {entry.record_id} ({len(entry.payload)} bytes) is larger than the "
                            f"hub accepts in one event ({limit} bytes per batch)",
                            kind="too_large",
                            retryable=False,
                        ),
                    )
                    index += 1
                    continue
                seqs.append(entry.seq)
                index += 1
            if not seqs:
                self._set_busy(generation, None)
                continue
            client.send_batch(batch, timeout=self.options.send_timeout)
            if not self._report(generation, seqs, None):
                return
        self._set_busy(generation, None)

    def _set_busy(self, generation: int, since: float | None) -> None:
        with self._cond:
            if generation == self._generation:
                self._busy_since = since

    def _report(self, generation: int, seqs: list[int], error: SinkError | None) -> bool:
        """Outcomes for ``seqs`` (confirmed, or a permanent error); False if this thread was abandoned."""
        with self._cond:
            if generation != self._generation:
                return False
            done = set(seqs)
            self._unconfirmed = [s for s in self._unconfirmed if s not in done]
            if not self._unconfirmed:
                self._busy_since = None  # nothing of this take left to send: nothing to watch
            self._outcomes.extend(Outcome(seq, error) for seq in seqs)
            self._cond.notify_all()
            return True

    def _failed(self, generation: int, error: SinkError) -> None:
        with self._cond:
            if generation != self._generation:
                return
            client, self._client = self._client, None  # a failed client is rebuilt for the resend
            self._fail_locked(error)
        abandon(None, client)

    def _fail_locked(self, error: SinkError) -> None:
        """Report every record not yet confirmed as failed and wait for the worker's resend."""
        failed = [*self._unconfirmed, *(e.seq for e in self._pending)]
        self._unconfirmed = []
        self._pending.clear()
        self._busy_since = None
        if failed:
            self._outcomes.extend(Outcome(seq, error) for seq in failed)
            self._resync_after = min(failed)
        self._cond.notify_all()

    def _watchdog_locked(self) -> None:
        since = self._busy_since
        if since is None or time.monotonic() - since < self.options.send_timeout:
            return
        self.watchdog_fired += 1
        self._generation += 1
        thread, self._sender = self._sender, None
        client, self._client = self._client, None
        self._fail_locked(
            SinkError(
                f"an Event Hubs send did not finish within {self.options.send_timeout:g} s: "
                "abandoned, the client is rebuilt",
                kind="timeout",
            )
        )
        log.warning(
            "event hubs send abandoned by the watchdog",
            extra={"sink": self.name, "sendTimeout": self.options.send_timeout},
        )
        if thread is not None:  # keep the ones still blocked, and the newest
            self.abandoned = [t for t in self.abandoned if t.is_alive()] + [thread]
        abandon(thread, client)

    # -- shutdown ---------------------------------------------------------------------------------

    def close(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            sender = self._sender
        if sender is not None:
            sender.join(timeout)
        with self._cond:
            self._generation += 1
            self._sender = None
            client, self._client = self._client, None
            self._pending.clear()
            self._unconfirmed = []
            self._busy_since = None
        abandon(sender if sender is not None and sender.is_alive() else None, client)
