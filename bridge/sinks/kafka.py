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
* **Secrets stay out.** The SASL password is never in the spec (``sasl_password_env`` /
  ``sasl_password_file``, read when a producer is built); librdkafka's own log lines, which it would
  otherwise print raw on stderr, go through the agent's JSON logger (and :func:`redact`) at debug
  level; errors reach the operator through the worker's once-per-streak log.
* **Azure Event Hubs.** ``<ns>.servicebus.windows.net:9093`` gets SASL_SSL with either the
  ``$ConnectionString`` user and the connection string as password, or OAUTHBEARER with an Entra ID
  token from azure-identity (managed identity or the default chain, imported only when asked for),
  plus the settings Microsoft recommends for its Kafka endpoint (idle connections closed by Azure
  after 240 s, 1 MB requests). See ``docs/sink-kafka.md``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from confluent_kafka import KafkaError, KafkaException, Producer

from bridge.observability import redact
from bridge.pipeline import CONTENT_TYPE, Entry, Outcome, Sink, SinkError
from bridge.sinks.base import config_error, numeric_option

log = logging.getLogger("bridge.sinks.kafka")
_rdkafka_log = logging.getLogger("bridge.sinks.kafka.librdkafka")

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")
AZURE_IDENTITIES = ("managed", "default")
DEFAULT_PORT = 9092
#: How long ``open()`` waits for the topic's metadata before calling the broker unreachable.
OPEN_TIMEOUT = 10.0
#: ... but a refused connection is called unreachable after this long (authentication errors, which
#: must stop the start, arrive within milliseconds of a connection).
OPEN_REFUSED_AFTER = 2.0
EVENT_HUBS_SUFFIXES = (
    ".servicebus.windows.net",
    ".servicebus.chinacloudapi.cn",
    ".servicebus.usgovcloudapi.net",
)
EVENT_HUBS_USERNAME = "$ConnectionString"

#: Every query option, with what it does (the error for an unknown option lists them).
OPTIONS: dict[str, str] = {
    "client_id": "client.id shown in broker logs and quotas (default se-bridge)",
    "security_protocol": "PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL",
    "sasl_mechanism": "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER (with a SASL_* protocol)",
    "sasl_username": "SASL user (PLAIN/SCRAM); $ConnectionString for Event Hubs",
    "sasl_password_env": "name of the environment variable holding the SASL password",
    "sasl_password_file": "absolute path of a file holding the SASL password",
    "ssl_ca_location": "CA bundle (PEM file) to verify the brokers with (SSL/SASL_SSL)",
    "message_timeout_ms": "oldest unconfirmed record age before the producer is rebuilt (default 30000)",
    "linger_ms": "how long the producer waits to batch records (default 5)",
    "compression": "none (default), gzip, snappy, lz4 or zstd",
    "idempotence": "true (default) or false for a broker without idempotent producers",
    "azure_identity": "managed or default: OAUTHBEARER token from azure-identity (Event Hubs)",
    "azure_client_id": "client id (UUID) of a user-assigned managed identity",
}

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(?::(\d{1,5}))?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


# --------------------------------------------------------------------------------------------------
# The spec
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KafkaOptions:
    """What a ``kafka://`` spec says, validated. Holds no secret: only where to read it from."""

    bootstrap: tuple[str, ...]
    topic: str
    client_id: str = "se-bridge"
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password_env: str | None = None
    sasl_password_file: str | None = None
    ssl_ca_location: str | None = None
    message_timeout_ms: int = 30_000
    linger_ms: int = 5
    compression: str = "none"
    idempotence: bool = True
    azure_identity: str | None = None
    azure_client_id: str | None = None

    @property
    def first_host(self) -> str:
        host = self.bootstrap[0].rsplit(":", 1)[0]
        return host.strip("[]")

    @property
    def event_hubs(self) -> bool:
        """The Kafka endpoint of an Event Hubs namespace (public or sovereign cloud)."""
        return self.first_host.lower().endswith(EVENT_HUBS_SUFFIXES)

    @property
    def token_scope(self) -> str:
        """The Entra ID scope of an Event Hubs namespace: ``https://<ns>.servicebus.windows.net/.default``."""
        return f"https://{self.first_host}/.default"


def _bootstrap(netloc: str) -> tuple[str, ...]:
    servers = []
    for part in netloc.split(","):
        m = _HOST.match(part.strip())
        if not m:
            raise config_error(f"kafka sink: {part!r} is not a host:port")
        host, port = m.group(1), int(m.group(2) or DEFAULT_PORT)
        if not 0 < port < 65536:
            raise config_error(f"kafka sink: port {port} of {host} is out of range")
        servers.append(f"{host}:{port}")
    return tuple(servers)


def parse_kafka_spec(spec: str) -> KafkaOptions:
    """Validate a ``kafka://`` spec. Every mistake is a permanent :class:`SinkError` naming the option
    (never echoing a value that could be a secret), so a wrong spec stops the agent at start."""
    parts = urlsplit(spec.strip())
    if parts.scheme.lower() != "kafka" or not parts.netloc:
        raise config_error(f"kafka sink needs kafka://host:port[,host:port]/topic[?options], got {spec!r}")
    if "@" in parts.netloc:
        raise config_error(
            "kafka sink: no credentials in the address; use sasl_username and sasl_password_env"
        )
    bootstrap = _bootstrap(parts.netloc)
    topic = unquote(parts.path.lstrip("/"))
    if not _TOPIC.match(topic):
        raise config_error(
            f"kafka sink: the path must be one topic name (letters, digits, '.', '_', '-'), got {topic!r}"
        )
    values: dict[str, str] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        name = key.strip().lower()
        if name in ("password", "sasl_password", "sasl.password", "secret", "connection_string"):
            raise config_error(
                f"kafka sink: {key} is refused: never put a secret in the sink spec; use "
                "sasl_password_env=VARIABLE or sasl_password_file=/path"
            )
        if name not in OPTIONS:
            known = ", ".join(OPTIONS)
            raise config_error(f"kafka sink: unknown option {key!r} (known: {known})")
        if name in values:
            raise config_error(f"kafka sink: option {name} given twice")
        values[name] = value.strip()

    protocol = values.get("security_protocol", "PLAINTEXT").upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise config_error(f"kafka sink: security_protocol must be one of {', '.join(SECURITY_PROTOCOLS)}")
    mechanism = values["sasl_mechanism"].upper() if "sasl_mechanism" in values else None
    sasl = protocol.startswith("SASL_")
    if mechanism is not None and mechanism not in SASL_MECHANISMS:
        raise config_error(f"kafka sink: sasl_mechanism must be one of {', '.join(SASL_MECHANISMS)}")
    if sasl and mechanism is None:
        raise config_error(f"kafka sink: security_protocol={protocol} needs sasl_mechanism")
    if not sasl and mechanism is not None:
        raise config_error("kafka sink: sasl_mechanism needs security_protocol=SASL_SSL or SASL_PLAINTEXT")

    username = values.get("sasl_username") or None
    password_env = values.get("sasl_password_env") or None
    password_file = values.get("sasl_password_file") or None
    azure_identity = values.get("azure_identity", "").lower() or None
    azure_client_id = values.get("azure_client_id") or None
    if mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        if not username:
            raise config_error(f"kafka sink: sasl_mechanism={mechanism} needs sasl_username")
        if (password_env is None) == (password_file is None):
            raise config_error(
                f"kafka sink: sasl_mechanism={mechanism} needs exactly one of sasl_password_env, "
                "sasl_password_file"
            )
    elif username or password_env or password_file:
        raise config_error(
            "kafka sink: sasl_username / sasl_password_* go with sasl_mechanism=PLAIN or SCRAM-SHA-*"
        )
    if password_env is not None and not _ENV_NAME.match(password_env):
        raise config_error("kafka sink: sasl_password_env must be an environment variable name")
    if password_file is not None and not Path(password_file).is_absolute():
        raise config_error("kafka sink: sasl_password_file must be an absolute path")
    if mechanism == "OAUTHBEARER":
        if azure_identity not in AZURE_IDENTITIES:
            raise config_error(
                "kafka sink: sasl_mechanism=OAUTHBEARER needs azure_identity=managed or "
                "azure_identity=default"
            )
    elif azure_identity or azure_client_id:
        raise config_error("kafka sink: azure_identity / azure_client_id go with sasl_mechanism=OAUTHBEARER")
    if azure_client_id is not None:
        try:
            uuid.UUID(azure_client_id)
        except ValueError:
            raise config_error(
                "kafka sink: azure_client_id must be a UUID (the identity's client id)"
            ) from None

    ssl_ca = values.get("ssl_ca_location") or None
    if ssl_ca is not None and protocol not in ("SSL", "SASL_SSL"):
        raise config_error("kafka sink: ssl_ca_location goes with security_protocol=SSL or SASL_SSL")
    if ssl_ca is not None and ssl_ca != "probe" and not Path(ssl_ca).exists():
        raise config_error(f"kafka sink: ssl_ca_location {ssl_ca} does not exist")

    timeout = numeric_option(
        "kafka sink", "message_timeout_ms", values.get("message_timeout_ms", "30000"), 1000, 86_400_000, int
    )
    linger = numeric_option("kafka sink", "linger_ms", values.get("linger_ms", "5"), 0, 900_000, int)
    if linger >= timeout:
        raise config_error("kafka sink: linger_ms must be smaller than message_timeout_ms")
    compression = values.get("compression", "none").lower()
    if compression not in COMPRESSIONS:
        raise config_error(f"kafka sink: compression must be one of {', '.join(COMPRESSIONS)}")
    idempotence_text = values.get("idempotence", "true").lower()
    if idempotence_text not in _TRUE + _FALSE:
        raise config_error("kafka sink: idempotence must be true or false")
    client_id = values.get("client_id") or "se-bridge"
    if len(client_id) > 255 or not client_id.isprintable():
        raise config_error("kafka sink: client_id must be printable and at most 255 characters")

    options = KafkaOptions(
        bootstrap=bootstrap,
        topic=topic,
        client_id=client_id,
        security_protocol=protocol,
        sasl_mechanism=mechanism,
        sasl_username=username,
        sasl_password_env=password_env,
        sasl_password_file=password_file,
        ssl_ca_location=ssl_ca,
        message_timeout_ms=timeout,
        linger_ms=linger,
        compression=compression,
        idempotence=idempotence_text in _TRUE,
        azure_identity=azure_identity,
        azure_client_id=azure_client_id,
    )
    if options.event_hubs and protocol != "SASL_SSL":
        raise config_error(
            "kafka sink: the Event Hubs Kafka endpoint needs security_protocol=SASL_SSL (port 9093) with "
            "sasl_mechanism=PLAIN (connection string) or OAUTHBEARER (azure_identity)"
        )
    return options


def make_azure_credential(options: KafkaOptions) -> Any:
    """The azure-identity credential an ``azure_identity=`` spec asks for (imported only here: an agent
    that does not use Entra ID never loads it). Constructing one contacts nothing."""
    try:
        from azure.identity import DefaultAzureCredential, ManagedIdentityCredential
    except ImportError as exc:
        raise config_error(
            f"kafka sink: azure_identity needs azure-identity ({exc}); "
            "pip install 'scheduled-events-bridge[eventhubs]'"
        ) from None
    if options.azure_identity == "managed":
        if options.azure_client_id:
            return ManagedIdentityCredential(client_id=options.azure_client_id)
        return ManagedIdentityCredential()
    if options.azure_client_id:
        return DefaultAzureCredential(managed_identity_client_id=options.azure_client_id)
    return DefaultAzureCredential()


# --------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------

_PERMANENT_CODES = {
    KafkaError.MSG_SIZE_TOO_LARGE: "too_large",
    KafkaError.RECORD_LIST_TOO_LARGE: "too_large",
    KafkaError.INVALID_RECORD: "invalid",
}
_KIND_BY_CODE = {
    KafkaError._AUTHENTICATION: "auth",
    KafkaError.SASL_AUTHENTICATION_FAILED: "auth",
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "auth",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "auth",
    KafkaError.UNSUPPORTED_SASL_MECHANISM: "auth",
    KafkaError.ILLEGAL_SASL_STATE: "auth",
    KafkaError._SSL: "tls",
    KafkaError.UNKNOWN_TOPIC_OR_PART: "topic",
    KafkaError._UNKNOWN_TOPIC: "topic",
    KafkaError._UNKNOWN_PARTITION: "topic",
    KafkaError._MSG_TIMED_OUT: "timeout",
    KafkaError._TIMED_OUT: "timeout",
    KafkaError.REQUEST_TIMED_OUT: "timeout",
    KafkaError._TRANSPORT: "unreachable",
    KafkaError._ALL_BROKERS_DOWN: "unreachable",
    KafkaError._RESOLVE: "unreachable",
    KafkaError._QUEUE_FULL: "queue_full",
}


def classify(err: KafkaError) -> SinkError:
    """Map a librdkafka error to a :class:`SinkError`: permanent only for what no retry of *this
    record* can fix; everything else (transport, timeouts, authentication, a missing topic, fatal
    idempotence errors) is transient and makes the worker resend in order."""
    code = err.code()
    text = f"{err.name()}: {err.str()}"
    if code in _PERMANENT_CODES:
        return SinkError(text, kind=_PERMANENT_CODES[code], retryable=False)
    if err.fatal():
        return SinkError(text, kind="fatal")
    return SinkError(text, kind=_KIND_BY_CODE.get(code, "kafka"))


class _TokenUnavailable(Exception):
    """Raised from the OAUTHBEARER callback when no Entra ID token can be had; confluent-kafka re-raises
    it from ``poll()``/``Producer()``, where the sink turns it into a transient ``token`` failure."""


class _LibrdkafkaLog:
    """librdkafka's log lines (``logger`` config): at debug level through the agent's JSON logger and
    its redaction, never raw on stderr. Failures reach the operator through delivery outcomes and the
    worker's once-per-streak log; librdkafka would log every reconnect attempt."""

    def log(self, level: int, fmt: str, *args: Any) -> None:
        if _rdkafka_log.isEnabledFor(logging.DEBUG):
            _rdkafka_log.debug(fmt, *args, extra={"librdkafkaLevel": logging.getLevelName(level)})


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
        self._credential: Any = None
        self._token: Any = None  # last AccessToken, reused while a refresh fails
        if self.options.security_protocol == "SASL_PLAINTEXT" and self.options.sasl_mechanism == "PLAIN":
            log.warning(
                "SASL PLAIN without TLS: the password and the records cross the network in clear",
                extra={"sink": self.name},
            )

    # -- configuration ----------------------------------------------------------------------------

    def connection_config(self) -> dict[str, Any]:
        """Where and how to connect (brokers, TLS, SASL, Entra ID tokens), shared by the producer and
        the approver's consumer (:mod:`bridge.approver.kafka_source`). Holds the password: never log it."""
        o = self.options
        conf: dict[str, Any] = {
            "bootstrap.servers": ",".join(o.bootstrap),
            "client.id": o.client_id,
            "security.protocol": o.security_protocol,
            "socket.keepalive.enable": True,
            "error_cb": self._on_error,
            "logger": _LibrdkafkaLog(),
        }
        if o.sasl_mechanism is not None:
            conf["sasl.mechanism"] = o.sasl_mechanism
        if o.sasl_mechanism == "OAUTHBEARER":
            conf["oauth_cb"] = self._oauth_token
        elif o.sasl_mechanism is not None:
            conf["sasl.username"] = o.sasl_username
            conf["sasl.password"] = self._password()
        if o.ssl_ca_location is not None:
            conf["ssl.ca.location"] = o.ssl_ca_location
        if o.event_hubs:
            # Microsoft's recommendations for its Kafka endpoint: Azure closes connections idle for
            # 240 s (a send on such a connection shows up as a timeout), and requests over 1 MB.
            conf["metadata.max.age.ms"] = 180_000
            conf["connections.max.idle.ms"] = 180_000
        return conf

    def producer_config(self) -> dict[str, Any]:
        """The librdkafka configuration (with the password, read now: never log this dict)."""
        o = self.options
        conf: dict[str, Any] = {
            **self.connection_config(),
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

    def _password(self) -> str:
        o = self.options
        if o.sasl_password_env is not None:
            value = os.environ.get(o.sasl_password_env, "")
            if not value:
                raise config_error(
                    f"kafka sink: environment variable {o.sasl_password_env} (sasl_password_env) is not set"
                )
        else:
            assert o.sasl_password_file is not None
            try:
                value = Path(o.sasl_password_file).read_text(encoding="utf-8").rstrip("\r\n")
            except (OSError, UnicodeDecodeError) as err:
                reason = getattr(err, "strerror", None) or type(err).__name__
                raise config_error(f"kafka sink: cannot read sasl_password_file: {reason}") from None
            if not value:
                raise config_error("kafka sink: sasl_password_file is empty")
        if o.sasl_username == EVENT_HUBS_USERNAME:
            self._check_connection_string(value)
        return value

    def _check_connection_string(self, value: str) -> None:
        """Catch the classic Event Hubs mistakes without ever showing the value."""
        source = self.options.sasl_password_env or "sasl_password_file"
        fields = dict(
            item.split("=", 1) for item in value.strip().strip(";").split(";") if "=" in item.strip()
        )
        fields = {k.strip().lower(): v.strip() for k, v in fields.items()}
        if not fields.get("endpoint", "").startswith("sb://"):
            raise config_error(
                f"kafka sink: with sasl_username=$ConnectionString the password ({source}) must be an Event "
                "Hubs connection string (Endpoint=sb://...;SharedAccessKeyName=...;SharedAccessKey=...)"
            )
        entity = fields.get("entitypath")
        if entity and entity != self.topic:
            raise config_error(
                f"kafka sink: the connection string in {source} is for event hub {entity!r}, "
                f"not {self.topic!r}"
            )

    # -- Entra ID (OAUTHBEARER) -------------------------------------------------------------------

    def _get_credential(self) -> Any:
        if self._credential is None:
            self._credential = make_azure_credential(self.options)
        return self._credential

    def _oauth_token(self, _oauthbearer_config: str | None = None) -> tuple[str, float]:
        """confluent-kafka's ``oauth_cb``: ``(token, expiry in epoch seconds)`` for the namespace scope.
        librdkafka calls it when the producer is built and again at 80 % of the token's lifetime."""
        scope = self.options.token_scope
        try:
            token = self._get_credential().get_token(scope)
        except SinkError:
            raise
        except Exception as exc:
            text = redact(f"cannot get an Entra ID token for {scope}: {type(exc).__name__}: {exc}")
            self._problem = ("token", text)
            cached = self._token
            if cached is not None and cached.expires_on - time.time() > 60:
                return cached.token, float(cached.expires_on)  # still valid: librdkafka retries later
            raise _TokenUnavailable(text) from None
        self._token = token
        return token.token, float(token.expires_on)

    # -- producer lifecycle -----------------------------------------------------------------------

    def _ensure_producer(self) -> Producer:
        if self._producer is not None:
            return self._producer
        if self.options.sasl_mechanism == "OAUTHBEARER":
            try:  # fetch the first token here: a failure is then a clear transient error, at once
                self._oauth_token()
            except _TokenUnavailable as exc:
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
        except (KafkaException, _TokenUnavailable, RuntimeError):
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
        except _TokenUnavailable:
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
        except SinkError as err:
            # Never dead-letter a record because the producer cannot be built: the record is fine.
            self._outcomes.append(Outcome(entry.seq, SinkError(str(err), kind=err.kind)))
            self._failed = True
            return
        meta = entry.meta
        headers = [(name, value.encode()) for name, value in meta.headers().items() if name != "contentType"]
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
            with contextlib.suppress(KafkaException, _TokenUnavailable, RuntimeError):
                producer.flush(timeout)
        self._drop_producer("closing")
