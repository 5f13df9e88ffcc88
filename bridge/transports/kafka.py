"""``kafka://host:port[,host:port]/topic[?options]``: what the Kafka sink and the Kafka decision source
share (Apache Kafka, any Kafka-protocol broker, and the Kafka endpoint of Azure Event Hubs).

Why one module for both directions: ``se-bridge decide --sink X`` writes decisions where
``se-bridge approver --source X`` reads them, so ``X`` must mean the same thing to both. The spec's
options and their validation (:func:`parse_spec`), the secrets and tokens a connection needs and the
librdkafka settings built from them (:class:`KafkaConnection`), and what a librdkafka error means
(:func:`classify`) therefore live here, once. The sink (:mod:`bridge.sinks.kafka`) adds its producer
settings, the source (:mod:`bridge.streams.kafka`) its consumer-group settings; each passes
its :class:`~bridge.transports.base.Owner`, so a refusal reads "kafka sink: ..." or "kafka source:
...". The producer options (``message_timeout_ms``, ``linger_ms``, ``compression``, ``idempotence``)
are part of the one spec syntax: a source checks and ignores them, so one spec serves both.

* **Secrets stay out of the spec.** The SASL password is named (``sasl_password_env`` /
  ``sasl_password_file``, a :class:`~bridge.transports.secrets.SecretRef`) and read each time a client
  is built; a value in the spec is refused without being shown.
* **Azure Event Hubs.** ``<ns>.servicebus.windows.net:9093`` needs SASL_SSL with either the
  ``$ConnectionString`` user and the connection string as password (checked for the classic mistakes
  without echoing it), or OAUTHBEARER with an Entra ID token from azure-identity (managed identity or
  the default chain, imported only then), plus Microsoft's settings for its Kafka endpoint
  ("Recommended configurations for Apache Kafka clients", learn.microsoft.com/azure/event-hubs/
  apache-kafka-configurations): metadata and idle connections below Azure's 240 s idle cut,
  ``request.timeout.ms`` 60000, requests below 1,046,528 bytes, consumer sessions of 30 s, and
  ``gzip`` as the only compression (another one is refused at start: Event Hubs would not store it).
* **librdkafka's own log lines** go through the caller's logger (and :func:`redact`) at debug level,
  never raw on stderr.

This module imports confluent-kafka, so it is itself imported only when a ``kafka://`` spec is used.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import SplitResult, unquote, urlsplit

from confluent_kafka import KafkaError

from bridge.errors import BridgeError
from bridge.support.redaction import redact
from bridge.transports.azure import IDENTITIES, check_client_id, make_credential
from bridge.transports.base import Owner, numeric_option, query_options
from bridge.transports.secrets import SecretRef

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
PASSWORD_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")
EVENT_HUBS_COMPRESSIONS = ("none", "gzip")
#: Microsoft's request timeout for Event Hubs' Kafka endpoint (at least 60000 ms; the service's own
#: minimum is 20000, and a shorter one makes idempotent producers fail requests the service still runs).
EVENT_HUBS_REQUEST_TIMEOUT_MS = 60_000
#: Microsoft's consumer session timeout for Event Hubs (30000, within 6000..300000).
EVENT_HUBS_SESSION_TIMEOUT_MS = 30_000
AZURE_IDENTITIES = IDENTITIES
DEFAULT_PORT = 9092
EVENT_HUBS_SUFFIXES = (
    ".servicebus.windows.net",
    ".servicebus.chinacloudapi.cn",
    ".servicebus.usgovcloudapi.net",
)
EVENT_HUBS_USERNAME = "$ConnectionString"

#: Where and how to connect: what every client of the spec uses.
CONNECTION_OPTIONS: dict[str, str] = {
    "client_id": "client.id shown in broker logs and quotas (default se-bridge)",
    "security_protocol": "PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL",
    "sasl_mechanism": "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER (with a SASL_* protocol)",
    "sasl_username": "SASL user (PLAIN/SCRAM); $ConnectionString for Event Hubs",
    "sasl_password_env": "name of the environment variable holding the SASL password",
    "sasl_password_file": "absolute path of a file holding the SASL password",
    "ssl_ca_location": "CA bundle (PEM file) to verify the brokers with (SSL/SASL_SSL)",
    "azure_identity": "managed or default: OAUTHBEARER token from azure-identity (Event Hubs)",
    "azure_client_id": "client id (UUID) of a user-assigned managed identity",
}
#: How the sink produces (a source checks them and ignores them: one spec serves both directions).
PRODUCER_OPTIONS: dict[str, str] = {
    "message_timeout_ms": "oldest unconfirmed record age before the producer is rebuilt (default 30000)",
    "linger_ms": "how long the producer waits to batch records (default 5)",
    "compression": "none (default), gzip, snappy, lz4 or zstd (Event Hubs: none or gzip)",
    "idempotence": "true (default) or false for a broker without idempotent producers",
}
#: Every query option, with what it does (the refusal of an unknown option lists them).
OPTIONS: dict[str, str] = {**CONNECTION_OPTIONS, **PRODUCER_OPTIONS}
_SECRET_NAMES = ("password", "sasl_password", "sasl.password", "secret", "connection_string")
_SECRET_HINT = "sasl_password_env=VARIABLE or sasl_password_file=/path"

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(?::(\d{1,5}))?$")
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")

E = TypeVar("E", bound=BridgeError)


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
    password: SecretRef | None = None  # sasl_password_env / sasl_password_file
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


def parse_spec(spec: str, owner: Owner) -> KafkaOptions:
    """Validate a ``kafka://`` spec. Every mistake is a permanent error of ``owner`` naming the option
    (never echoing a value that could be a secret), so a wrong spec stops the process at start."""
    parts = _address(spec, owner)
    bootstrap = _bootstrap(parts.netloc, owner)
    topic = _topic(parts.path, owner)
    values = query_options(parts.query, owner, OPTIONS, _secret_hint)
    protocol, mechanism = _security(values, owner)
    username, password = _sasl_login(values, mechanism, owner)
    azure_identity, azure_client_id = _azure_identity(values, mechanism, owner)
    message_timeout_ms, linger_ms = _timing(values, owner)
    options = KafkaOptions(
        bootstrap=bootstrap,
        topic=topic,
        client_id=_client_id(values, owner),
        security_protocol=protocol,
        sasl_mechanism=mechanism,
        sasl_username=username,
        password=password,
        ssl_ca_location=_ssl_ca(values, protocol, owner),
        message_timeout_ms=message_timeout_ms,
        linger_ms=linger_ms,
        compression=_compression(values, owner),
        idempotence=_idempotence(values, owner),
        azure_identity=azure_identity,
        azure_client_id=azure_client_id,
    )
    _check_event_hubs(options, owner)
    return options


def _secret_hint(name: str) -> str | None:
    return _SECRET_HINT if name in _SECRET_NAMES else None


def _address(spec: str, owner: Owner) -> SplitResult:
    parts = urlsplit(spec.strip())
    if parts.scheme.lower() != "kafka" or not parts.netloc:
        raise owner.error(f"{owner.label} needs kafka://host:port[,host:port]/topic[?options], got {spec!r}")
    if "@" in parts.netloc:
        raise owner.refuse("no credentials in the address; use sasl_username and sasl_password_env")
    return parts


def _bootstrap(netloc: str, owner: Owner) -> tuple[str, ...]:
    servers = []
    for part in netloc.split(","):
        m = _HOST.match(part.strip())
        if not m:
            raise owner.refuse(f"{part!r} is not a host:port")
        host, port = m.group(1), int(m.group(2) or DEFAULT_PORT)
        if not 0 < port < 65536:
            raise owner.refuse(f"port {port} of {host} is out of range")
        servers.append(f"{host}:{port}")
    return tuple(servers)


def _topic(path: str, owner: Owner) -> str:
    topic = unquote(path.lstrip("/"))
    if not _TOPIC.match(topic):
        raise owner.refuse(f"the path must be one topic name (letters, digits, '.', '_', '-'), got {topic!r}")
    return topic


def _security(values: dict[str, str], owner: Owner) -> tuple[str, str | None]:
    """``security_protocol`` and ``sasl_mechanism``: a SASL protocol needs a mechanism and vice versa."""
    protocol = values.get("security_protocol", "PLAINTEXT").upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise owner.refuse(f"security_protocol must be one of {', '.join(SECURITY_PROTOCOLS)}")
    mechanism = values["sasl_mechanism"].upper() if "sasl_mechanism" in values else None
    sasl = protocol.startswith("SASL_")
    if mechanism is not None and mechanism not in SASL_MECHANISMS:
        raise owner.refuse(f"sasl_mechanism must be one of {', '.join(SASL_MECHANISMS)}")
    if sasl and mechanism is None:
        raise owner.refuse(f"security_protocol={protocol} needs sasl_mechanism")
    if not sasl and mechanism is not None:
        raise owner.refuse("sasl_mechanism needs security_protocol=SASL_SSL or SASL_PLAINTEXT")
    return protocol, mechanism


def _sasl_login(
    values: dict[str, str], mechanism: str | None, owner: Owner
) -> tuple[str | None, SecretRef | None]:
    """The user and the password's :class:`SecretRef`: both for PLAIN/SCRAM, neither otherwise."""
    username = values.get("sasl_username") or None
    env = values.get("sasl_password_env") or None
    path = values.get("sasl_password_file") or None
    if mechanism in PASSWORD_MECHANISMS:
        if not username:
            raise owner.refuse(f"sasl_mechanism={mechanism} needs sasl_username")
        if (env is None) == (path is None):
            raise owner.refuse(
                f"sasl_mechanism={mechanism} needs exactly one of sasl_password_env, sasl_password_file"
            )
    elif username or env or path:
        raise owner.refuse("sasl_username / sasl_password_* go with sasl_mechanism=PLAIN or SCRAM-SHA-*")
    return username, SecretRef.from_options(owner, "sasl_password", env, path)


def _azure_identity(
    values: dict[str, str], mechanism: str | None, owner: Owner
) -> tuple[str | None, str | None]:
    """``azure_identity`` and ``azure_client_id``: required with OAUTHBEARER, refused without it."""
    identity = values.get("azure_identity", "").lower() or None
    client_id = values.get("azure_client_id") or None
    if mechanism == "OAUTHBEARER":
        if identity not in AZURE_IDENTITIES:
            raise owner.refuse(
                "sasl_mechanism=OAUTHBEARER needs azure_identity=managed or azure_identity=default"
            )
    elif identity or client_id:
        raise owner.refuse("azure_identity / azure_client_id go with sasl_mechanism=OAUTHBEARER")
    return identity, check_client_id(owner, "azure_client_id", client_id)


def _ssl_ca(values: dict[str, str], protocol: str, owner: Owner) -> str | None:
    ssl_ca = values.get("ssl_ca_location") or None
    if ssl_ca is not None and protocol not in ("SSL", "SASL_SSL"):
        raise owner.refuse("ssl_ca_location goes with security_protocol=SSL or SASL_SSL")
    if ssl_ca is not None and ssl_ca != "probe" and not Path(ssl_ca).exists():
        raise owner.refuse(f"ssl_ca_location {ssl_ca} does not exist")
    return ssl_ca


def _timing(values: dict[str, str], owner: Owner) -> tuple[int, int]:
    """``message_timeout_ms`` and ``linger_ms`` (a record must be able to wait less than it may age)."""
    timeout = numeric_option(
        owner, "message_timeout_ms", values.get("message_timeout_ms", "30000"), 1000, 86_400_000, int
    )
    linger = numeric_option(owner, "linger_ms", values.get("linger_ms", "5"), 0, 900_000, int)
    if linger >= timeout:
        raise owner.refuse("linger_ms must be smaller than message_timeout_ms")
    return timeout, linger


def _compression(values: dict[str, str], owner: Owner) -> str:
    compression = values.get("compression", "none").lower()
    if compression not in COMPRESSIONS:
        raise owner.refuse(f"compression must be one of {', '.join(COMPRESSIONS)}")
    return compression


def _idempotence(values: dict[str, str], owner: Owner) -> bool:
    text = values.get("idempotence", "true").lower()
    if text not in _TRUE + _FALSE:
        raise owner.refuse("idempotence must be true or false")
    return text in _TRUE


def _client_id(values: dict[str, str], owner: Owner) -> str:
    client_id = values.get("client_id") or "se-bridge"
    if len(client_id) > 255 or not client_id.isprintable():
        raise owner.refuse("client_id must be printable and at most 255 characters")
    return client_id


def _check_event_hubs(options: KafkaOptions, owner: Owner) -> None:
    if not options.event_hubs:
        return
    if options.security_protocol != "SASL_SSL":
        raise owner.refuse(
            "the Event Hubs Kafka endpoint needs security_protocol=SASL_SSL (port 9093) with "
            "sasl_mechanism=PLAIN (connection string) or OAUTHBEARER (azure_identity)"
        )
    if options.compression not in EVENT_HUBS_COMPRESSIONS:
        raise owner.refuse(
            f"compression={options.compression}: the Event Hubs Kafka endpoint supports only "
            f"{' or '.join(EVENT_HUBS_COMPRESSIONS)}"
        )


def make_azure_credential(options: KafkaOptions, owner: Owner) -> Any:
    """The azure-identity credential an ``azure_identity=`` spec asks for (constructing it contacts
    nothing; azure-identity is imported only now)."""
    assert options.azure_identity is not None
    return make_credential(owner, "azure_identity", options.azure_identity, options.azure_client_id)


# --------------------------------------------------------------------------------------------------
# The connection: secrets, tokens and the librdkafka settings every client of the spec uses
# --------------------------------------------------------------------------------------------------


class TokenUnavailable(Exception):
    """Raised from the OAUTHBEARER callback when no Entra ID token can be had; confluent-kafka re-raises
    it from ``poll()`` and the client constructors, where the caller turns it into a transient failure."""


class LibrdkafkaLog:
    """librdkafka's log lines (``logger`` config): at debug level through the caller's logger (the
    JSON formatter and its redaction), never raw on stderr. Failures reach the operator through the
    caller's own errors; librdkafka would log every reconnect attempt."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def log(self, level: int, fmt: str, *args: Any) -> None:
        if self.logger.isEnabledFor(logging.DEBUG):
            self.logger.debug(fmt, *args, extra={"librdkafkaLevel": logging.getLevelName(level)})


class KafkaConnection:
    """Where and how the clients of one ``kafka://`` spec connect (brokers, TLS, SASL, Entra ID).

    Secrets are read when :meth:`config` is called, i.e. when a client is built, so a rotated password
    is picked up by the next producer or consumer. ``on_problem(kind, text)`` hears of a token that
    could not be had (the sink reports it if records stall).
    """

    def __init__(
        self,
        options: KafkaOptions,
        owner: Owner,
        on_problem: Callable[[str, str], None] | None = None,
    ) -> None:
        self.options = options
        self.owner = owner
        self.credential: Any = None  # the azure-identity credential, built on the first token request
        self._token: Any = None  # the last AccessToken, reused while a refresh fails
        self._on_problem = on_problem

    def config(self, *, error_cb: Callable[[KafkaError], None], logger: logging.Logger) -> dict[str, Any]:
        """The librdkafka settings every client of this spec gets (with the password, read now: never
        log this dict). The caller adds its producer or consumer settings."""
        o = self.options
        conf: dict[str, Any] = {
            "bootstrap.servers": ",".join(o.bootstrap),
            "client.id": o.client_id,
            "security.protocol": o.security_protocol,
            "socket.keepalive.enable": True,
            "error_cb": error_cb,
            "logger": LibrdkafkaLog(logger),
        }
        if o.sasl_mechanism is not None:
            conf["sasl.mechanism"] = o.sasl_mechanism
        if o.sasl_mechanism == "OAUTHBEARER":
            conf["oauth_cb"] = self.oauth_token
        elif o.sasl_mechanism is not None:
            conf["sasl.username"] = o.sasl_username
            conf["sasl.password"] = self.password()
        if o.ssl_ca_location is not None:
            conf["ssl.ca.location"] = o.ssl_ca_location
        if o.event_hubs:
            # Microsoft's recommendations for its Kafka endpoint: Azure closes connections idle for
            # 240 s (a send on such a connection shows up as a timeout).
            conf["metadata.max.age.ms"] = 180_000
            conf["connections.max.idle.ms"] = 180_000
            conf["request.timeout.ms"] = EVENT_HUBS_REQUEST_TIMEOUT_MS
        return conf

    def password(self) -> str:
        """The SASL password, read now; with ``$ConnectionString`` it must be an Event Hubs connection
        string (checked without ever showing it)."""
        ref = self.options.password
        assert ref is not None
        value = ref.resolve(self.owner)
        if self.options.sasl_username == EVENT_HUBS_USERNAME:
            self._check_connection_string(value, ref)
        return value

    def _check_connection_string(self, value: str, ref: SecretRef) -> None:
        """Catch the classic Event Hubs mistakes without ever showing the value."""
        fields = dict(
            item.split("=", 1) for item in value.strip().strip(";").split(";") if "=" in item.strip()
        )
        fields = {k.strip().lower(): v.strip() for k, v in fields.items()}
        if not fields.get("endpoint", "").startswith("sb://"):
            raise self.owner.refuse(
                f"with sasl_username=$ConnectionString the password ({ref.source}) must be an Event "
                "Hubs connection string (Endpoint=sb://...;SharedAccessKeyName=...;SharedAccessKey=...)"
            )
        entity = fields.get("entitypath")
        if entity and entity != self.options.topic:
            raise self.owner.refuse(
                f"the connection string in {ref.source} is for event hub {entity!r}, "
                f"not {self.options.topic!r}"
            )

    def oauth_token(self, _oauthbearer_config: str | None = None) -> tuple[str, float]:
        """confluent-kafka's ``oauth_cb``: ``(token, expiry in epoch seconds)`` for the namespace scope.
        librdkafka calls it when a client is built and again at 80 % of the token's lifetime."""
        scope = self.options.token_scope
        try:
            if self.credential is None:
                self.credential = make_azure_credential(self.options, self.owner)
            token = self.credential.get_token(scope)
        except BridgeError:
            raise  # azure-identity missing: a configuration error of the owner's
        except Exception as exc:
            text = redact(f"cannot get an Entra ID token for {scope}: {type(exc).__name__}: {exc}")
            if self._on_problem is not None:
                self._on_problem("token", text)
            cached = self._token
            if cached is not None and cached.expires_on - time.time() > 60:
                return cached.token, float(cached.expires_on)  # still valid: librdkafka retries later
            raise TokenUnavailable(text) from None
        self._token = token
        return token.token, float(token.expires_on)


# --------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------

_TLS_FAILURE = re.compile(r"certificate verify failed|SSL routines|SSL handshake failed", re.IGNORECASE)
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


def classify(err: KafkaError, error: Callable[..., E], context: str | None = None) -> E:
    """Map a librdkafka error to the caller's error type (``error(text, kind=..., retryable=...)``):
    permanent only for what no retry of *this record* can fix (too large, invalid); everything else
    (transport, timeouts, authentication, a missing topic, fatal idempotence errors) is transient:
    it is not about one record, and waiting lets an operator fix a credential without losing any.
    ``context`` prefixes the text (``"kafka source <name>"``)."""
    code = err.code()
    text = f"{err.name()}: {err.str()}"
    if context:
        text = f"{context}: {text}"
    if code in _PERMANENT_CODES:
        return error(text, kind=_PERMANENT_CODES[code], retryable=False)
    if err.fatal():
        return error(text, kind="fatal", retryable=True)
    kind = _KIND_BY_CODE.get(code, "kafka")
    if code == KafkaError._TRANSPORT and _TLS_FAILURE.search(err.str() or ""):
        # librdkafka reports a failed handshake as _SSL or, depending on when the socket closed, as
        # _TRANSPORT with the OpenSSL reason: both are the broker's certificate, not the network.
        kind = "tls"
    return error(text, kind=kind, retryable=True)
