"""``kafka://host:port[,host:port]/topic[?options]``: an idempotent Kafka producer whose delivery
reports are the outbox acknowledgement (Apache Kafka, any Kafka-protocol broker, and the Kafka
endpoint of Azure Event Hubs).

Why it is built this way:

* **Confirmed means written.** ``acks=all`` and ``enable.idempotence=true``: a record counts as
  delivered only when librdkafka's delivery report says the in-sync replicas have it. ``submit`` is
  ``produce(..., on_delivery=...)``; ``poll`` serves the reports and returns them in order.
* **One VM, one partition, in order.** The message key is the VM id, so all of a VM's records land on
  one partition; the idempotent producer keeps their order with up to 5 requests in flight per
  connection, so a backlog of 1000 records drains in a few round trips instead of 1000.
* **No gaps, so a resend never reorders.** librdkafka's own message timeout can leave gaps: records
  2 and 3 time out in the queue, 4 and 5 are written afterwards (librdkafka's INTRODUCTION.md,
  "message timeout considerations"); the worker's resend from 2 would then put 2 after 4 on the
  topic. So librdkafka never times a record out here (``message.timeout.ms=0``, it retries for ever)
  and the sink watches the age of the oldest unconfirmed record itself. Past ``message_timeout_ms``
  it purges and drops the producer (what the broker did write is a prefix: it enforces the producer's
  sequence numbers) and reports a transient failure; the worker resends from the first unconfirmed
  record to a fresh producer. Consumers may see duplicates (same ``recordId``), never a reordering.
* **A fresh producer unsticks a lost producer id.** A broker that lost the producer's state (a
  Kafka-protocol broker restarted without persistence; Event Hubs after a service-side timeout, see
  Azure/azure-event-hubs-for-kafka#261) answers UNKNOWN_PRODUCER_ID / InvalidPidMapping to the old
  producer id for ever. Any transient failure and any fatal (idempotence) error therefore drops the
  producer; the next record builds a new one, which gets a new producer id.
* **Fail fast at start, retry later.** ``open()`` asks the broker for the topic's metadata: refused
  authentication, an unusable TLS setup and a missing topic (auto-creation off) stop the agent with a
  clear message (exit 2); an unreachable broker is only transient (the agent starts and retries). Once
  running, the same errors are retried (kinds ``auth``, ``tls``, ``topic``), not dead-lettered: they
  are not about one record, and dead-lettering would empty the whole queue into the dead-letter file
  while a credential is being fixed. Only what the broker will never take for *this record* (too
  large, invalid) is permanent.
* **One spec syntax with the approver's Kafka source.** The spec's options, the SASL password and
  Entra ID tokens, the connection settings (Event Hubs' Kafka endpoint included) and the meaning of a
  librdkafka error are :mod:`bridge.transports.kafka`'s, shared with
  :mod:`bridge.streams.kafka`; this module adds the producer. The SASL password is never in
  the spec (``sasl_password_env`` / ``sasl_password_file``, read when a producer is built);
  librdkafka's own log lines go through the ``bridge.sinks.kafka.librdkafka`` logger at debug level;
  errors reach the operator through the worker's once-per-streak log.
* **Azure Event Hubs** refuses requests over 1 MB: ``message.max.bytes`` is capped there. See
  ``docs/sink-kafka.md``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from bridge.pipeline import CONTENT_TYPE, Entry, Outcome, Sink, SinkError
from bridge.sinks.base import config_error, owner
from bridge.transports import kafka
from bridge.transports.kafka import KafkaConnection, KafkaOptions, TokenUnavailable

log = logging.getLogger(__name__)
_rdkafka_log = logging.getLogger(f"{__name__}.librdkafka")

#: Who speaks in this sink's refusals ("kafka sink: ...").
OWNER = owner("kafka sink")
#: How long ``open()`` waits for the topic's metadata before calling the broker unreachable.
OPEN_TIMEOUT = 10.0
#: ... but a refused connection is called unreachable after this long (authentication errors, which
#: must stop the start, arrive within milliseconds of a connection).
OPEN_REFUSED_AFTER = 2.0


def parse_kafka_spec(spec: str) -> KafkaOptions:
    """Validate a ``kafka://`` sink spec (:func:`bridge.transports.kafka.parse_spec`): every mistake is
    a permanent :class:`SinkError` naming the option, so a wrong spec stops the agent at start."""
    return kafka.parse_spec(spec, OWNER)


def classify(err: KafkaError) -> SinkError:
    """A librdkafka error as a :class:`SinkError` (see :func:`bridge.transports.kafka.classify`)."""
    return kafka.classify(err, SinkError)


# --------------------------------------------------------------------------------------------------
# The sink
# --------------------------------------------------------------------------------------------------


class KafkaSink(Sink):
    """See the module docstring. Driven by one delivery worker thread (``open`` runs before it)."""

    scheme = "kafka"
    #: Enough to drain a backlog in few round trips; order is kept by the idempotent producer.
    max_in_flight = 1000

    def __init__(self, spec: str) -> None:
        super().__init__(spec)
        self.options = parse_kafka_spec(spec)
        self.topic = self.options.topic
        self._producer: Producer | None = None
        self._generation = 0  # reports of a dropped producer carry an older one and are ignored
        self._outcomes: list[Outcome] = []
        self._pending: OrderedDict[int, float] = OrderedDict()  # seq -> monotonic submit time
        self._failed = False  # a transient failure is waiting to be returned: submit nothing more
        self._fatal: KafkaError | None = None
        self._problem: tuple[str, str] | None = None  # (kind, text) of the last client-level error
        #: Brokers, TLS, the SASL password or Entra ID tokens (shared with the Kafka source).
        self.connection = KafkaConnection(self.options, OWNER, on_problem=self._note_problem)
        if self.options.security_protocol == "SASL_PLAINTEXT" and self.options.sasl_mechanism == "PLAIN":
            log.warning(
                "SASL PLAIN without TLS: the password and the records cross the network in clear",
                extra={"sink": self.name},
            )

    # -- configuration ----------------------------------------------------------------------------

    def _note_problem(self, kind: str, text: str) -> None:
        self._problem = (kind, text)

    def producer_config(self) -> dict[str, Any]:
        """The librdkafka configuration (with the password, read now: never log this dict)."""
        o = self.options
        conf: dict[str, Any] = {
            **self.connection.config(error_cb=self._on_error, logger=_rdkafka_log),
            "enable.idempotence": o.idempotence,
            "acks": "all",
            "max.in.flight.requests.per.connection": 5 if o.idempotence else 1,
            # librdkafka never times a record out (it would leave gaps): the sink does, see poll().
            "message.timeout.ms": 0,
            "linger.ms": o.linger_ms,
            "compression.type": o.compression,
        }
        if not o.idempotence:
            conf["retries"] = 2_147_483_647
        if o.event_hubs:
            conf["message.max.bytes"] = 1_000_000
        return conf

    # -- producer lifecycle -----------------------------------------------------------------------

    def _ensure_producer(self) -> Producer:
        if self._producer is not None:
            return self._producer
        if self.options.sasl_mechanism == "OAUTHBEARER":
            try:  # fetch the first token here: a failure is then a clear transient error, at once
                self.connection.oauth_token()
            except TokenUnavailable as exc:
                raise SinkError(str(exc), kind="token") from None
        conf = self.producer_config()
        try:
            producer = Producer(conf)
        except KafkaException as exc:
            err = exc.args[0]
            if isinstance(err, KafkaError) and err.code() == KafkaError.SASL_AUTHENTICATION_FAILED:
                raise SinkError(f"no OAUTHBEARER token: {err.str()}", kind="token") from None
            text = err.str() if isinstance(err, KafkaError) else str(exc)
            raise config_error(f"kafka sink: invalid producer configuration: {text}") from None
        except (TypeError, ValueError) as exc:
            raise config_error(f"kafka sink: invalid producer configuration: {exc}") from None
        self._producer = producer
        self._failed = False
        self._fatal = None
        return producer

    def _drop_producer(self, why: str) -> None:
        """Abandon the current producer: purge what it holds (nothing it still has can be written after
        records sent by its successor) and ignore its late reports."""
        producer, self._producer = self._producer, None
        self._generation += 1
        self._pending.clear()
        self._failed = False
        self._fatal = None
        if producer is None:
            return
        log.debug("dropping the Kafka producer", extra={"sink": self.name, "reason": why})
        try:
            producer.purge(in_queue=True, in_flight=True)
            producer.poll(0)
        except (KafkaException, TokenUnavailable, RuntimeError):
            pass
        close = getattr(producer, "close", None)
        if close is not None:
            with contextlib.suppress(KafkaException, RuntimeError):
                close()

    def _serve(self, producer: Producer, timeout: float) -> None:
        """Serve delivery reports and client errors: wait up to ``timeout`` for the first, then take
        whatever else is ready without waiting (a backlog's reports arrive by the hundred)."""
        try:
            served = producer.poll(timeout)
            for _ in range(8):
                if not served:
                    break
                served = producer.poll(0)
        except TokenUnavailable:
            pass  # recorded in self._problem; the stall watch reports it if it lasts

    # -- callbacks (run inside producer.poll, on the worker thread) -------------------------------

    def _on_error(self, err: KafkaError) -> None:
        sink_error = classify(err)
        self._problem = (sink_error.kind, str(sink_error))
        if err.fatal():
            self._fatal = err

    def _on_delivery(self, generation: int, seq: int, err: KafkaError | None, _msg: Any) -> None:
        if generation != self._generation:
            return  # a report of a producer dropped since: its records are being resent
        self._pending.pop(seq, None)
        if err is None:
            self._problem = None
            self._outcomes.append(Outcome(seq))
            return
        error = classify(err)
        if error.retryable:
            self._failed = True
        self._outcomes.append(Outcome(seq, error))

    # -- the Sink interface -----------------------------------------------------------------------

    def open(self) -> None:
        """Build the producer and ask for the topic's metadata: refused authentication, a TLS failure
        or a missing topic raise a permanent error (the agent does not start); an unreachable broker a
        transient one (the agent starts, the worker retries)."""
        producer = self._ensure_producer()
        started = time.monotonic()
        self._problem = None
        metadata = None
        failure = ""
        while metadata is None:
            try:
                metadata = producer.list_topics(self.topic, timeout=1.0)
            except KafkaException as exc:
                err = exc.args[0]
                failure = err.str() if isinstance(err, KafkaError) else str(exc)
            self._serve(producer, 0)
            problem = self._problem
            if problem is not None and problem[0] in ("auth", "tls"):
                self._drop_producer("refused at start")
                what = "refused by the broker" if problem[0] == "auth" else "TLS with the broker failed"
                raise SinkError(f"{what}: {problem[1]}", kind=problem[0], retryable=False)
            if metadata is not None:
                break
            elapsed = time.monotonic() - started
            refused = problem is not None and problem[0] == "unreachable"
            if elapsed >= OPEN_TIMEOUT or (refused and elapsed >= OPEN_REFUSED_AFTER):
                detail = problem[1] if problem is not None else failure
                raise SinkError(
                    f"cannot reach the Kafka brokers {','.join(self.options.bootstrap)}: {detail}",
                    kind="unreachable",
                )
        topic = metadata.topics.get(self.topic)
        err = topic.error if topic is not None else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
        if err is None or err.code() == KafkaError.LEADER_NOT_AVAILABLE:  # fine, or being created
            return
        if err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
            raise SinkError(
                f"topic {self.topic!r} does not exist and the broker does not create topics on first "
                "use: create it (on Event Hubs: an event hub of that name)",
                kind="topic",
                retryable=False,
            )
        if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            raise SinkError(f"not authorized to use topic {self.topic!r}", kind="auth", retryable=False)
        raise SinkError(f"topic {self.topic!r}: {err.name()}: {err.str()}", kind="topic")

    def submit(self, entry: Entry) -> None:
        if self._failed or self._fatal is not None:
            # An earlier record failed: sending this one now could put it before that one's resend.
            self._outcomes.append(
                Outcome(entry.seq, SinkError("not sent: an earlier record failed", kind="ordering"))
            )
            self._failed = True
            return
        try:
            producer = self._ensure_producer()
        except SinkError as unbuilt:
            # Never dead-letter a record because the producer cannot be built: the record is fine.
            self._outcomes.append(Outcome(entry.seq, SinkError(str(unbuilt), kind=unbuilt.kind)))
            self._failed = True
            return
        meta = entry.meta
        headers: list[tuple[str, str | bytes | None]] = [
            (name, value.encode()) for name, value in meta.headers().items() if name != "contentType"
        ]
        headers.append(("content-type", CONTENT_TYPE.encode()))
        try:
            producer.produce(
                self.topic,
                value=entry.payload,
                key=meta.key.encode(),
                headers=headers,
                on_delivery=partial(self._on_delivery, self._generation, entry.seq),
            )
        except BufferError as exc:
            self._outcomes.append(
                Outcome(entry.seq, SinkError(f"producer queue full: {exc}", kind="queue_full"))
            )
            self._failed = True
        except KafkaException as exc:
            err = exc.args[0]
            error = classify(err) if isinstance(err, KafkaError) else SinkError(str(exc), kind="kafka")
            if error.retryable:
                self._failed = True
            self._outcomes.append(Outcome(entry.seq, error))
        else:
            self._pending[entry.seq] = time.monotonic()

    def poll(self, timeout: float) -> list[Outcome]:
        producer = self._producer
        if producer is not None:
            self._serve(producer, 0 if self._outcomes else timeout)
        elif not self._outcomes:
            time.sleep(timeout)
        self._watch_stall()
        if self._failed or self._fatal is not None:
            why = f"fatal error {self._fatal.name()}" if self._fatal is not None else "a record failed"
            if self._fatal is not None and not self._failed:
                # librdkafka raised a fatal error without failing a record yet: fail the oldest.
                seq = next(iter(self._pending), None)
                if seq is not None:
                    self._outcomes.append(Outcome(seq, classify(self._fatal)))
            self._drop_producer(why)
        out, self._outcomes = self._outcomes, []
        # Reports come per partition, a refusal at produce() at once: hand them over in record order.
        out.sort(key=lambda outcome: outcome.seq)
        return out

    def _watch_stall(self) -> None:
        """Fail the oldest unconfirmed record once it is older than ``message_timeout_ms``."""
        if self._failed or not self._pending:
            return
        seq, since = next(iter(self._pending.items()))
        waited_ms = (time.monotonic() - since) * 1000
        if waited_ms < self.options.message_timeout_ms:
            return
        kind, why = self._problem or ("timeout", "no acknowledgement from the broker")
        self._outcomes.append(
            Outcome(
                seq,
                SinkError(
                    f"not acknowledged within {self.options.message_timeout_ms} ms (last error: {why})",
                    kind=kind,
                ),
            )
        )
        self._failed = True

    def close(self, timeout: float = 5.0) -> None:
        producer = self._producer
        if producer is not None:
            with contextlib.suppress(KafkaException, TokenUnavailable, RuntimeError):
                producer.flush(timeout)
        self._drop_producer("closing")
