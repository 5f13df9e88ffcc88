"""``eventhubs://<namespace>.servicebus.windows.net/<hub>?...``: decisions (or, in fleet mode, event
records) from Azure Event Hubs, with ``EventHubConsumerClient`` and checkpoints in Azure Blob Storage
(``azure-eventhub-checkpointstoreblob``).

Why it is built this way:

* **One spec syntax for both directions.** The hub part of the spec (namespace, hub, ``credential``,
  ``client_id``, ``connection_string_env|file``, ``open_timeout``, ``retry_total``, ``transport``) is
  parsed, read and classified by :mod:`bridge.transports.eventhubs`, which the Event Hubs sink uses
  too, so ``se-bridge decide --sink X`` and ``se-bridge approver --source X`` accept the same ``X``;
  the sink's delivery options (``send_timeout``, ``max_in_flight``) are checked and ignored. The
  source adds ``consumer_group`` and the checkpoint store.
* **Checkpoint only when final.** The SDK's ``receive`` runs in a background thread and hands events
  to :meth:`EventHubsSource.poll` through a bounded queue, each partition in order. Nothing is
  checkpointed by the SDK: :meth:`EventHubsSource.commit` writes the partition's checkpoint (offset
  and sequence number, the dict ``BlobCheckpointStore.update_checkpoint`` expects, under the same
  namespace/hub/consumer group names the SDK reads them back with) only once the approver says the
  decision's outcome is final. An approver killed before that re-reads the decision after the
  restart, and its decision store recognises it (same position ``<partition>@<sequence number>``).
* **Load balancing is the SDK's.** With a checkpoint store, approvers sharing a consumer group split
  the partitions (ownership blobs next to the checkpoints; each partition has one epoch reader). The
  SDK gives every processor a random owner id, so an approver killed with SIGKILL would leave
  ownerships that a restarted one must wait out (``ownership_expiration``, 3 minutes by default) or
  steal one partition per round. The store handed to the SDK therefore writes a *stable* owner id
  kept in the state directory (locked by one process at a time): a restarted approver recognises its
  previous incarnation's ownerships as released and claims them at once.
* **No store, no sharing.** Without a checkpoint store every partition is read by this instance (no
  load balancing, non-epoch readers: at most 5 per partition and consumer group, an Event Hubs limit)
  and positions are kept in the state directory: what a per-VM approver, or a fleet approver learning
  the events stream (it never commits and must see every partition), needs.
* **Fail fast at start, retry later.** The hub is checked like the sink does (a ``$management`` READ)
  and the checkpoint container too (one listing of its checkpoints): a refused credential, a missing
  hub or a missing container can never work, so they stop the approver when the source is built
  ("configuration refused", exit 2: the check runs in the constructor because that is where the
  approver turns a :class:`SourceError` into a configuration error). An unreachable namespace or
  storage account is only logged: the SDK keeps trying (ownership rounds every
  ``load_balancing_interval``), :meth:`poll` reports the failure to the approver's error streak while
  nothing arrives, and decisions flow as soon as both answer.
* **Secrets stay out.** Connection strings come from environment variables or files named in the
  spec; ``checkpoint_url`` refuses a SAS query; every message goes through :func:`redact`.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson

from bridge.streams.base import DecisionSource, Message, Position, SourceError
from bridge.streams.eventhubs_options import (
    OWNER,
    parse_source_spec,
)
from bridge.streams.eventhubs_store import Checkpoints
from bridge.support.fsutil import ensure_private_dir, write_atomic
from bridge.support.redaction import redact
from bridge.transports.eventhubs import (
    Abandoned,
    HubConnection,
    abandon,
    call_with_deadline,
    one_line,
)

log = logging.getLogger(__name__)

MAX_QUEUED = 200  # events received and not yet handed out: the SDK's receive thread waits beyond
MAX_BATCH = 100  # messages handed out by one poll


def _payload(event: Any) -> bytes:
    """The event's body as bytes (a data body may come as one bytes object or as several)."""
    body = event.body
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    if isinstance(body, str):
        return body.encode()
    try:
        return b"".join(bytes(part) for part in body)
    except TypeError:
        return str(event.body_as_str()).encode()


class EventHubsSource(DecisionSource):
    """Event Hubs through ``EventHubConsumerClient.receive`` in a background thread (see the module)."""

    partitioned = True

    def __init__(self, spec: str, state_dir: Path, group: str | None = None) -> None:
        super().__init__(spec)
        self.options, self.source_options = parse_source_spec(spec, group)
        opts = self.options
        self.consumer_group = self.source_options.consumer_group
        #: The credential or connection string, and the hub's name and endpoint once it is read.
        self.connection = HubConnection(opts, OWNER, log, {"source": self.name})
        if opts.uses_connection_string:
            self.connection.connection_string()  # the hub and endpoint it names (and a check, now)
        self.hub = self.connection.hub
        self._where = self.connection.where
        digest = hashlib.sha256(f"{self._where}/{self.consumer_group}".lower().encode()).hexdigest()[:12]
        ensure_private_dir(state_dir)
        owner_path = state_dir / f"source-eventhubs-{digest}.owner"
        self._positions_path = state_dir / f"source-eventhubs-{digest}.positions"
        self._cond = threading.Condition()
        self._queue: deque[tuple[str, int, str, bytes]] = deque()  # partition, sequence, offset, body
        self._seen: dict[str, int] = {}  # partition -> highest sequence number queued or handed out
        self._handed: dict[str, int] = {}  # partition -> highest sequence number handed out
        self._pending: dict[Position, str] = {}  # handed out, not committed: position -> offset
        self._committed: dict[str, int] = {}  # partition -> sequence number of the last checkpoint
        self._contexts: dict[str, tuple[str, str, str]] = {}  # partition -> namespace, hub, group (SDK's)
        self._errors: deque[str] = deque(maxlen=20)  # one-shot receive errors, reported by poll
        # Partitions claimed (ownership, /metrics): replaced under the lock, never mutated, so the HTTP
        # thread reads a consistent set without taking the lock.
        self._owned: frozenset[str] = frozenset()
        self._closing = False
        self._client: Any = None
        self._thread: threading.Thread | None = None
        #: The checkpoint store (bridge.streams.eventhubs_store); None: positions in the state directory.
        self._checkpoints = (
            Checkpoints(
                self.source_options,
                self.connection,
                owner_path,
                self.hub,
                self.name,
                self.options.open_timeout,
            )
            if self.source_options.has_store
            else None
        )
        # The SDK's store (stable owner id) and the source's own client for update_checkpoint.
        self._store = self._checkpoints.store if self._checkpoints is not None else None
        self._committer = self._checkpoints.committer if self._checkpoints is not None else None
        self._store_where = self._checkpoints.where if self._checkpoints is not None else ""
        self._positions = _read_positions(self._positions_path) if self._checkpoints is None else {}
        self._opened_at: float | None = None
        if self._checkpoints is not None:
            self._checkpoints.check(self.consumer_group)
        self._client = _reachable_client(self)

    @classmethod
    def create(cls, spec: str, state_dir: Path, group: str) -> EventHubsSource:
        return cls(spec, state_dir, group=group)

    # -- building ---------------------------------------------------------------------------------

    def _build_client(self) -> Any:
        """A new consumer client (connects lazily: building it contacts nothing)."""
        so = self.source_options
        return self.connection.build(
            "EventHubConsumerClient",
            consumer_group=self.consumer_group,
            checkpoint_store=self._store,
            load_balancing_interval=so.load_balancing_interval,
            partition_ownership_expiration_interval=so.ownership_expiration,
        )

    # -- start-up checks --------------------------------------------------------------------------

    # -- receiving --------------------------------------------------------------------------------

    def open(self) -> None:
        with self._cond:
            if self._thread is not None and self._thread.is_alive():
                return
            self._closing = False
        client, self._client = self._client, None
        if client is None:
            client = self._build_client()
        starting = self._starting()
        self._opened_at = time.monotonic()
        thread = threading.Thread(
            target=self._receive, args=(client, starting), name="eventhubs-source", daemon=True
        )
        with self._cond:
            self._client = client
            self._thread = thread
        thread.start()

    def _starting(self) -> Any:
        """Where reading starts: this instance's own positions (no checkpoint store), else the SDK's
        checkpoints, and where none exists the start of the partition's retention ("-1")."""
        if self._store is None and self._positions:
            self._committed = {p: int(v.get("sequenceNumber", -1)) for p, v in self._positions.items()}
            return {p: str(v["offset"]) for p, v in self._positions.items()}
        return "-1"

    def _receive(self, client: Any, starting: Any) -> None:
        try:
            client.receive(
                on_event=self._on_event,
                on_error=self._on_error,
                on_partition_initialize=self._on_partition_initialize,
                on_partition_close=self._on_partition_close,
                starting_position=starting,
            )
        except Exception as exc:  # receive() only returns on close(); anything else is reported
            with self._cond:
                if not self._closing:
                    self._errors.append(f"receiving stopped: {one_line(exc)}")
                    self._cond.notify_all()

    def _on_event(self, context: Any, event: Any) -> None:
        if event is None:
            return
        partition = str(context.partition_id)
        sequence = int(event.sequence_number)
        payload = _payload(event)
        with self._cond:
            self._contexts[partition] = (
                context.fully_qualified_namespace,
                context.eventhub_name,
                context.consumer_group,
            )
            if sequence <= self._seen.get(partition, -1):
                return  # read again after the partition was re-opened: already queued or handed out
            while len(self._queue) >= MAX_QUEUED and not self._closing:
                self._cond.wait(0.5)
            if self._closing:
                return
            self._seen[partition] = sequence
            self._queue.append((partition, sequence, str(event.offset), payload))
            self._cond.notify_all()

    def _on_error(self, context: Any, error: Exception) -> None:
        where = f"partition {context.partition_id}" if context is not None else "load balancing"
        detail = f"{where}: {one_line(error)}"
        log.debug("event hubs receive error", extra={"source": self.name, "error": detail})
        with self._cond:
            self._errors.append(detail)
            self._cond.notify_all()

    def ownership(self) -> dict[str, int | None]:
        """The partitions this instance reads (lag is not tracked on Event Hubs: None)."""
        return dict.fromkeys(sorted(self._owned))

    def assigned(self) -> bool:
        """A partition claimed (a reader without a store claims all once it reached the namespace:
        until then it read nothing, yet it said caught up); or, for an instance the balance leaves
        none, two balancing rounds gone by since it opened (the SDK reports no empty round)."""
        if self._owned or self._store is None:
            return bool(self._owned)
        rounds = 2 * self.source_options.load_balancing_interval
        return self._opened_at is not None and time.monotonic() - self._opened_at >= rounds

    def _on_partition_initialize(self, context: Any) -> None:
        with self._cond:
            self._owned = self._owned | {str(context.partition_id)}
        extra = {"source": self.name, "partition": context.partition_id, "consumerGroup": self.consumer_group}
        log.info("partition claimed", extra=extra)

    def _on_partition_close(self, context: Any, reason: Any) -> None:
        partition = str(context.partition_id)
        with self._cond:
            self._owned = self._owned - {partition}
            # What was queued and not handed out is left to whoever reads the partition next (from
            # the checkpoint); what was handed out is still finished and committed here.
            self._queue = deque(item for item in self._queue if item[0] != partition)
            self._seen[partition] = self._handed.get(partition, -1)
            self._cond.notify_all()
        why = getattr(reason, "name", str(reason))
        log.info("partition released", extra={"source": self.name, "partition": partition, "reason": why})

    # -- the standby (bridge.approver.standby) ----------------------------------------------------

    def standby(self, instance: str, state_dir: Path) -> EventHubsStandbyReader | None:
        """Reads every partition in the consumer group ``<group>-standby`` (an epoch reader of the
        group itself would disconnect the owners' readers: Event Hubs allows one per partition)."""
        if self._committer is None:
            return None  # no checkpoint store: a single reader per group, nothing to stand by for
        return EventHubsStandbyReader(self.spec, state_dir, self.consumer_group, start=self.group_progress)

    def group_progress(self) -> dict[str, int]:
        """The group's checkpoints (the sequence number of each partition's last finished event)."""
        if self._checkpoints is None:
            return {}
        address = getattr(self._client, "_address", None)
        return self._checkpoints.progress(
            getattr(address, "hostname", None) or self.options.namespace, self.consumer_group
        )

    def _take_error_locked(self) -> str | None:
        if self._errors:
            return self._errors.popleft()
        if self._checkpoints is not None and self._checkpoints.health.failure is not None:
            return f"checkpoint store {self._store_where}: {self._checkpoints.health.failure}"
        return None

    def poll(self, timeout: float) -> list[Message]:
        with self._cond:
            thread = self._thread
        if thread is None or not thread.is_alive():
            if thread is not None and self._client is not None:  # receive() gave up: start again
                abandon(None, self._client)
                self._client = None
            self.open()
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._queue:
                if self._closing:
                    return []
                error = self._take_error_locked()
                if error is not None:
                    raise _receive_error(self.name, error)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                self._cond.wait(min(remaining, 0.25))
            out: list[Message] = []
            while self._queue and len(out) < MAX_BATCH:
                partition, sequence, offset, payload = self._queue.popleft()
                position = Position(partition, sequence)
                self._handed[partition] = max(sequence, self._handed.get(partition, -1))
                self._pending[position] = offset
                out.append(Message(payload, position))
            self._cond.notify_all()  # room again for the receive thread
        return out

    # -- committing -------------------------------------------------------------------------------

    def commit(self, message: Message) -> None:
        with self._cond:
            offset = self._pending.pop(message.position, None)
            if offset is None:
                raise SourceError(
                    f"eventhubs source {self.name}: nothing to commit at {message.position}", retryable=True
                )
            partition, sequence = message.position.stream, message.position.number
            if sequence <= self._committed.get(partition, -1):
                return  # never move a checkpoint back (a message handed out twice)
            context = self._contexts.get(partition)
        if self._committer is None:
            self._commit_locally(partition, sequence, offset)
            return
        assert context is not None
        namespace, hub, group = context
        checkpoint = {
            "fully_qualified_namespace": namespace,
            "eventhub_name": hub,
            "consumer_group": group,
            "partition_id": partition,
            "offset": offset,
            "sequence_number": sequence,
        }
        try:
            self._committer.update_checkpoint(checkpoint)
        except Exception as exc:
            raise SourceError(
                f"eventhubs source {self.name}: checkpoint of partition {partition} not written to "
                f"{self._store_where}: {one_line(exc)}",
                retryable=True,
            ) from None
        with self._cond:
            self._committed[partition] = max(sequence, self._committed.get(partition, -1))

    def _commit_locally(self, partition: str, sequence: int, offset: str) -> None:
        with self._cond:
            self._committed[partition] = sequence
            self._positions[partition] = {"offset": offset, "sequenceNumber": sequence}
            data = orjson.dumps(self._positions, option=orjson.OPT_SORT_KEYS)
        write_atomic(self._positions_path, data + b"\n")

    # -- shutdown ---------------------------------------------------------------------------------

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            client, self._client = self._client, None
            thread, self._thread = self._thread, None
        if client is not None:
            # close() stops the processor, which releases its partitions (another approver takes them
            # over at once); a client stuck in the SDK is left to the reaper instead of blocking exit.
            try:
                call_with_deadline(client.close, 10.0, "eventhubs-source-close")
            except Abandoned as stuck:
                abandon(stuck.thread, None)
            except Exception as exc:
                log.debug("closing the consumer failed", extra={"error": one_line(exc)})
        if thread is not None:
            thread.join(10.0)
        if self._checkpoints is not None:
            self._checkpoints.close()


def _reachable_client(source: EventHubsSource) -> Any:
    """A consumer client once the hub's properties answered, classified like the sink does at
    start: a permanent refusal stops the start (exit 2); anything else is logged and retried (None)."""
    client = source._build_client()
    timeout = source.options.open_timeout
    try:
        props = call_with_deadline(client.get_eventhub_properties, timeout, "eventhubs-source-check")
    except Exception as exc:
        if isinstance(exc, Abandoned):
            abandon(exc.thread, client)
            detail = f"no answer within {timeout:g} s"
        else:
            abandon(None, client)
            error = source.connection.classify(exc, SourceError, opening=True)
            if not error.retryable:
                raise OWNER.refuse(str(error)) from None
            detail = str(error)
        log.warning(
            "event hubs namespace unreachable at start; the source retries",
            extra={"source": source.name, "error": redact(detail)},
        )
        return None
    log.info(
        "event hub reachable",
        extra={
            "source": source.name,
            "hub": source.hub,
            "consumerGroup": source.consumer_group,
            "partitions": len((props or {}).get("partition_ids") or []),
            "checkpoints": source._store_where or "state directory",
        },
    )
    return client


def _read_positions(path: Path) -> dict[str, dict[str, Any]]:
    """This instance's own positions (no checkpoint store): the state directory's file."""
    try:
        data = orjson.loads(path.read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, dict) and "offset" in v}


def standby_group(group: str) -> str:
    """The consumer group of the standby readers of ``group`` (created next to it: infra/)."""
    return f"{group.lstrip('$')}-standby"[:50]


class EventHubsStandbyReader(EventHubsSource):
    """Every partition of the hub in consumer group ``<group>-standby``, without a checkpoint store
    or ownership, starting after the owners' checkpoints; never commits (bridge.approver.standby)."""

    def __init__(self, spec: str, state_dir: Path, group: str, start: Any) -> None:
        parts = urlsplit(spec)
        values = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
                  if not k.startswith("checkpoint_") and k != "consumer_group"]  # fmt: skip
        values.append(("consumer_group", standby_group(group)))
        super().__init__(urlunsplit(parts._replace(query=urlencode(values))), state_dir)
        self._start = start  # -> the owners' group progress, {partition: last finished sequence}

    def _starting(self) -> Any:
        return dict(self._start())  # sequence numbers, exclusive; partitions without one: "-1"

    def commit(self, message: Message) -> None:
        with self._cond:
            self._pending.pop(message.position, None)  # the standby owns no position

    def ownership(self) -> dict[str, int | None]:
        return {}


def _receive_error(name: str, error: str) -> SourceError:
    """A receive error for :meth:`EventHubsSource.poll`. Event Hubs admits 5 readers per partition and
    consumer group: the 6th local approver of a scale set is refused with ``QuotaExceeded``, which is
    reported with what to do about it (bridge.streams.topology)."""
    if "quotaexceeded" in error.lower() or "maximum number of allowed receivers" in error.lower():
        return SourceError(
            f"eventhubs source {name}: {error}: more than 5 readers of this consumer group; local mode "
            'on Event Hubs is for at most 5 VMs, use a fleet approver (mode = "fleet", with a '
            "checkpoint store) or a Kafka decisions topic",
            retryable=True,
            kind="quota",
        )
    return SourceError(f"eventhubs source {name}: {error}", retryable=True)
