"""``kafka://host:port/topic?...``: decisions from a Kafka topic, through a consumer group.

The spec is :mod:`bridge.transports.kafka`'s, the one the Kafka sink takes (TLS, SASL, the Event Hubs
Kafka endpoint with a connection string or an Entra ID token; the producer options are checked and
ignored), so ``se-bridge decide --sink X`` and ``se-bridge approver --source X`` accept the same
``X``. The connection settings come from the same place; this module adds only the consumer.

Offsets are committed synchronously, only after a decision's outcome is final (auto-commit is off;
one commit per poll, each partition's last finished offset): a crash re-reads the decision, and the
approver's store makes the re-read harmless. Group settings: ``roundrobin`` assignment (works
everywhere, and some Kafka-protocol brokers hang a ``range,roundrobin`` join) and a 10 s session
timeout (a dead approver's partitions move on quickly); 30 s on Event Hubs, as Microsoft recommends
for its Kafka endpoint.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from bridge.streams.base import DecisionSource, Message, Position, SourceError, owner
from bridge.transports import kafka
from bridge.transports.kafka import KafkaConnection, TokenUnavailable

#: Messages one poll hands out at most (what the consumer already fetched; the lanes bound the rest).
MAX_BATCH = 100

log = logging.getLogger(__name__)
_rdkafka_log = logging.getLogger(f"{__name__}.librdkafka")

#: Who speaks in this source's refusals ("kafka source: ...").
OWNER = owner("kafka source")
#: Seconds between two lag snapshots (``/metrics``).
LAG_EVERY = 5.0
#: Seconds a topic's partition list is trusted (a partition added later is read within this).
PARTITIONS_EVERY = 30.0


#: A lean reader's fetch limits (every reader but the console's, :attr:`DecisionSource.bulk`).
LEAN_FETCH = {
    # What librdkafka prefetches ahead of the approver: its 64 MiB default became the largest part
    # of a fleet approver's memory while it read a 100 000-VM events stream; 4 MiB keep 8 000
    # decisions or records ahead, more than the lanes can take at once.
    "queued.max.messages.kbytes": 4096,
    # One fetch response is held whole while it is parsed: librdkafka's 50 MiB default let a
    # restarted fleet approver re-reading a 1.1 M-record stream peak 45-55 MB above its steady state
    # (issue 33, bench/fleet_scale_bench.py --restart); 4 MiB is still four times a message's
    # largest size (message.max.bytes) and ~6 000 records a fetch. The price: the backlog is read
    # ~40 % slower, which the console (a person waits on it) does not pay.
    "fetch.max.bytes": 4 * 1024 * 1024,
}

#: A bulk reader's (the console's): four times the lean limits. At 10 000 VMs after 20 waves
#: (bench/console_bench.py, 610 000 records), librdkafka's own defaults (50 MiB a fetch, 64 MiB
#: prefetched) read them in 27 s but peaked at 260 MB (the console's budget: 250); these, in 37 s and
#: 221 MB; the lean limits, at ~5 500 records/s (~110 s).
BULK_FETCH = {"queued.max.messages.kbytes": 16384, "fetch.max.bytes": 16 * 1024 * 1024}


class KafkaSource(DecisionSource):
    partitioned = True

    def __init__(self, spec: str, group: str) -> None:
        super().__init__(spec)
        self.options = kafka.parse_spec(spec, OWNER)
        self.connection = KafkaConnection(self.options, OWNER)
        self.topic = self.options.topic
        self.group = group
        self._consumer: Any = None
        self._owned: dict[str, int | None] = {}  # "topic/partition" -> lag (a snapshot, see ownership)
        self._lag_checked = 0.0
        self._progress_consumer: Any = None  # asks the group's committed offsets (the standby's thread)
        self._assigned = False
        self._partitions: list[int] = []
        self._partitions_at = 0.0
        self._streams: dict[str, tuple[str, int]] = {}  # a position's stream -> (topic, partition)

    @classmethod
    def create(cls, spec: str, state_dir: Path, group: str) -> KafkaSource:
        return cls(spec, group)

    def consumer_config(self) -> dict[str, Any]:
        """The librdkafka configuration (with the password, read now: never log this dict)."""
        conf = {
            **self.connection.config(error_cb=self._on_error, logger=_rdkafka_log),
            "group.id": self.group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "roundrobin",
            "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 2_000,
            # A decision is an approval someone waits for. Some Kafka-protocol brokers (Tansu, the
            # tests' broker) hold a fetch for the whole wait even when data arrives, which made
            # librdkafka's 500 ms default the approver's typical latency (p50 ~200 ms, measured with
            # bench/fleet_bench.py); 100 ms bounds it at <= 10 idle fetches/s per broker connection.
            "fetch.wait.max.ms": 100,
            # Notice a topic created after the approver started within 30 s, not librdkafka's 5 min.
            "topic.metadata.refresh.interval.ms": 30_000,
        }
        conf |= BULK_FETCH if self.bulk else LEAN_FETCH
        if self.options.event_hubs:
            # Microsoft's recommendation for its Kafka endpoint (bridge.transports.kafka): a shorter
            # session makes Event Hubs rebalance on its own latency; a dead approver's partitions move
            # on after 30 s instead of 10.
            conf["session.timeout.ms"] = kafka.EVENT_HUBS_SESSION_TIMEOUT_MS
            conf["heartbeat.interval.ms"] = 3_000
        return conf

    def open(self) -> None:
        config = self.consumer_config()
        try:
            self._consumer = Consumer(config)
        except TokenUnavailable as exc:
            raise SourceError(f"kafka source {self.name}: {exc}", retryable=True, kind="token") from None
        except (KafkaException, TypeError, ValueError) as exc:
            raise OWNER.refuse(f"invalid consumer configuration: {exc}") from None
        self._consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self._assigned = True  # an empty share counts: more instances than partitions
        self._owned = {**self._owned, **{f"{p.topic}/{p.partition}": None for p in partitions}}
        log.info("partitions assigned", extra={"source": self.name, "partitions": sorted(self._owned)})

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        gone = {f"{p.topic}/{p.partition}" for p in partitions}
        self._owned = {k: v for k, v in self._owned.items() if k not in gone}
        log.info("partitions revoked", extra={"source": self.name, "partitions": sorted(gone)})

    def ownership(self) -> dict[str, int | None]:
        return dict(self._owned)

    def assigned(self) -> bool:
        return self._assigned

    def behind(self) -> int | None:
        """The owned partitions' lag summed (called after an empty poll). From librdkafka's cached
        watermarks when it has fetched from a partition; otherwise asked of the broker (a start, when
        an empty poll meant only that nothing was fetched yet), a partition not read from yet
        counting from its low watermark (``auto.offset.reset`` is earliest). None when the broker
        does not answer."""
        if self._consumer is None or not self._owned:
            return 0 if self._assigned else None
        owned = [TopicPartition(k.rpartition("/")[0], int(k.rpartition("/")[2])) for k in self._owned]
        total = 0
        try:
            for tp in self._consumer.position(owned):
                low, high = self._consumer.get_watermark_offsets(tp, cached=True)
                if high < 0:
                    low, high = self._consumer.get_watermark_offsets(tp, timeout=2.0, cached=False)
                if high < 0:
                    return None
                total += max(0, high - (tp.offset if tp.offset >= 0 else max(low, 0)))
        except KafkaException:
            return None
        return total

    def _refresh_lag(self) -> None:
        """Lag of each owned partition (high watermark - position), from librdkafka's cached
        watermarks: no broker round trip, at most every 5 s, on the polling thread."""
        now = time.monotonic()
        if now - self._lag_checked < LAG_EVERY or not self._owned:
            return
        self._lag_checked = now
        owned = [TopicPartition(k.rpartition("/")[0], int(k.rpartition("/")[2])) for k in self._owned]
        lags: dict[str, int | None] = {}
        try:
            for tp in self._consumer.position(owned):
                _low, high = self._consumer.get_watermark_offsets(tp, cached=True)
                key = f"{tp.topic}/{tp.partition}"
                lags[key] = max(0, high - tp.offset) if high >= 0 and tp.offset >= 0 else None
        except KafkaException:
            return
        self._owned = {k: lags.get(k) for k in self._owned}

    def _on_error(self, err: KafkaError) -> None:
        """Client-level errors (a broker away, a refused login) are retried by librdkafka; they reach
        the operator through :meth:`poll` while nothing arrives."""
        log.debug(
            "kafka client error", extra={"source": self.name, "error": str(kafka.classify(err, SourceError))}
        )

    def poll(self, timeout: float) -> list[Message]:
        if self._consumer is None:
            self.open()
        msg = self._consumer.poll(timeout)
        self._refresh_lag()
        if msg is None:
            return []
        # Then what the consumer already fetched, without waiting: a burst reaches the lanes together,
        # so a VM's queued decisions go to its agent in one relay request.
        batch = [msg, *self._consumer.consume(num_messages=MAX_BATCH - 1, timeout=0)]
        out: list[Message] = []
        for msg in batch:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                error = kafka.classify(err, SourceError, context=f"kafka source {self.name}")
                if not out:
                    raise error
                # Messages before it are handed out; a client error reported once is logged (one that
                # persists is reported again, and then raised by a poll it comes first in).
                log.warning("kafka source error after messages", extra={"error": str(error)})
                break
            stream = f"{msg.topic()}/{msg.partition()}"
            self._streams.setdefault(stream, (msg.topic(), msg.partition()))
            out.append(Message(msg.value() or b"", Position(stream, msg.offset())))
        return out

    def commit(self, message: Message) -> None:
        self.commit_many([message])

    def commit_many(self, messages: list[Message]) -> None:
        # Offsets are cumulative: one synchronous request with each partition's last message, not
        # one broker round trip per decision (a burst of 200 spent most of its time committing).
        last: dict[tuple[str, int], int] = {}
        for message in messages:
            key = self._streams[message.position.stream]
            last[key] = max(message.position.number, last.get(key, -1))
        if not last:
            return
        offsets = [
            TopicPartition(topic, partition, offset + 1) for (topic, partition), offset in last.items()
        ]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            # A lost commit (rebalance, broker away) means a re-read later, which the store absorbs.
            raise SourceError(f"kafka source {self.name}: commit failed: {exc}", retryable=True) from None

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._progress_consumer is not None:
            self._progress_consumer.close()
            self._progress_consumer = None

    # -- the standby (bridge.approver.standby) ----------------------------------------------------

    def standby(self, instance: str, state_dir: Path) -> KafkaStandbyReader:
        return KafkaStandbyReader(self.spec, f"{self.group}-standby", start=self.group_progress)

    def partitions(self) -> list[int]:
        """The topic's partitions, from the cluster's metadata (cached for ``PARTITIONS_EVERY``)."""
        now = time.monotonic()
        if self._partitions and now - self._partitions_at < PARTITIONS_EVERY:
            return self._partitions
        consumer = self._progress()
        try:
            topic = consumer.list_topics(self.topic, timeout=5).topics.get(self.topic)
        except KafkaException as exc:
            raise SourceError(f"kafka source {self.name}: no metadata: {exc}", retryable=True) from None
        if topic is None or topic.error is not None or not topic.partitions:
            raise SourceError(f"kafka source {self.name}: topic {self.topic} unknown", retryable=True)
        self._partitions, self._partitions_at = sorted(topic.partitions), now
        return self._partitions

    def group_progress(self) -> dict[str, int]:
        """The group's committed offsets (OffsetFetch for the group, by a consumer that never joins
        it), as the offset of the last finished message per partition."""
        consumer = self._progress()
        wanted = [TopicPartition(self.topic, p) for p in self.partitions()]
        try:
            committed = consumer.committed(wanted, timeout=5)
        except KafkaException as exc:
            raise SourceError(f"kafka source {self.name}: committed offsets: {exc}", retryable=True) from None
        return {f"{tp.topic}/{tp.partition}": tp.offset - 1 for tp in committed if tp.offset >= 0}

    def _progress(self) -> Any:
        """A consumer of this group that only asks (metadata, committed offsets): it never
        subscribes, so it never joins the group or moves a partition. The standby's thread only."""
        if self._progress_consumer is None:
            config = {**self.consumer_config(), "enable.auto.offset.store": False}
            self._progress_consumer = Consumer(config)
        return self._progress_consumer


class KafkaStandbyReader(KafkaSource):
    """Every partition of the topic, assigned by hand (no group membership, no rebalance), starting
    after the group's committed offsets; never commits (bridge.approver.standby)."""

    def __init__(self, spec: str, group: str, start: Any) -> None:
        super().__init__(spec, group)
        self._start = start  # -> the owners' group progress, {"topic/partition": last finished}
        self._partitions_read: set[int] = set()
        self._assigned_at = 0.0

    def open(self) -> None:
        try:
            self._consumer = Consumer(self.consumer_config())
        except (KafkaException, TypeError, ValueError) as exc:
            raise OWNER.refuse(f"invalid consumer configuration: {exc}") from None
        self._partitions_read = set()
        self._assign_new()

    def _assign_new(self) -> None:
        """Assign the partitions not assigned yet, each after the group's last finished message."""
        self._assigned_at = time.monotonic()
        new = [p for p in self.partitions() if p not in self._partitions_read]
        if not new:
            return
        done = self._start()
        keys = {p: f"{self.topic}/{p}" for p in new}
        first = [
            TopicPartition(self.topic, p, done[keys[p]] + 1 if keys[p] in done else OFFSET_BEGINNING)
            for p in new
        ]
        self._consumer.incremental_assign(first)
        self._partitions_read.update(new)
        self._assigned = True
        log.info("standby reads", extra={"source": self.name, "partitions": sorted(self._partitions_read)})

    def poll(self, timeout: float) -> list[Message]:
        if time.monotonic() - self._assigned_at >= PARTITIONS_EVERY:
            self._assign_new()
        return super().poll(timeout)

    def commit_many(self, messages: list[Message]) -> None:
        return None  # the standby owns no position

    def ownership(self) -> dict[str, int | None]:
        return {}
