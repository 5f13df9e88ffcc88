"""``kafka://host:port/topic?...``: decisions from a Kafka topic, through a consumer group.

The spec takes exactly the options of the Kafka sink (TLS, SASL, the Event Hubs Kafka endpoint with a
connection string or an Entra ID token), so one spec syntax serves both directions; the connection
settings are built by :class:`bridge.sinks.kafka.KafkaSink` itself. Offsets are committed one by one,
synchronously, only after a decision's outcome is final (auto-commit is off): a crash re-reads the
decision, and the approver's store makes the re-read harmless.

Group settings: ``roundrobin`` assignment (works everywhere, and some Kafka-protocol brokers hang a
``range,roundrobin`` join) and a 10 s session timeout (a dead approver's partitions move on quickly).
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from bridge.approver.sources import DecisionSource, Message, SourceError
from bridge.pipeline import SinkError
from bridge.sinks.kafka import KafkaSink


class KafkaSource(DecisionSource):
    def __init__(self, spec: str, group: str) -> None:
        super().__init__(spec)
        try:
            self._connection = KafkaSink(spec)  # parses and validates the spec; builds no producer
        except SinkError as exc:
            raise SourceError(str(exc).replace("kafka sink", "kafka source")) from None
        self.topic = self._connection.topic
        self.group = group
        self._consumer: Any = None

    def open(self) -> None:
        try:
            config = self._connection.connection_config()
        except SinkError as exc:
            raise SourceError(str(exc).replace("kafka sink", "kafka source")) from None
        self._consumer = Consumer(
            {
                **config,
                "group.id": self.group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "partition.assignment.strategy": "roundrobin",
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 2_000,
                # Notice a topic created after the approver started within 30 s, not librdkafka's 5 min.
                "topic.metadata.refresh.interval.ms": 30_000,
            }
        )
        self._consumer.subscribe([self.topic])

    def poll(self, timeout: float) -> list[Message]:
        if self._consumer is None:
            self.open()
        msg = self._consumer.poll(timeout)
        if msg is None:
            return []
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                return []
            raise SourceError(f"kafka source {self.name}: {err.str()}", retryable=err.retriable())
        return [Message(msg.value() or b"", f"{msg.topic()}/{msg.partition()}@{msg.offset()}")]

    def commit(self, message: Message) -> None:
        topic_partition, _, offset = message.position.rpartition("@")
        topic, _, partition = topic_partition.rpartition("/")
        try:
            self._consumer.commit(
                offsets=[TopicPartition(topic, int(partition), int(offset) + 1)], asynchronous=False
            )
        except KafkaException as exc:
            # A lost commit (rebalance, broker away) means a re-read later, which the store absorbs.
            raise SourceError(f"kafka source {self.name}: commit failed: {exc}", retryable=True) from None

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
