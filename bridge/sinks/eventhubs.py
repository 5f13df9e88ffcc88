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
* **Secrets stay out.** The connection string is never in the spec (``connection_string_env`` /
  ``connection_string_file``, read each time a client is built so a rotated key is picked up); every
  error text goes through :func:`redact`; Entra ID (managed identity, the default chain) needs no
  secret at all and is the default.
* **Local emulators and test peers.** A connection string with ``UseDevelopmentEmulator=true`` makes
  the SDK use plain AMQP on the endpoint's port (the spec's host and port are then only a label: the
  connection string's ``Endpoint`` wins). The SDK compares the value with ``"true"`` exactly, so
  ``True`` silently means TLS on port 5671: that is refused here with an explanation.

See ``docs/sink-eventhubs.md``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from bridge import __version__
from bridge.observability import redact
from bridge.pipeline import CONTENT_TYPE, Entry, Outcome, Sink, SinkError
from bridge.sinks.base import config_error, numeric_option

log = logging.getLogger("bridge.sinks.eventhubs")

#: Every query option, with what it does (the error for an unknown option lists them).
OPTIONS: dict[str, str] = {
    "credential": "managed (default: ManagedIdentityCredential) or default (DefaultAzureCredential)",
    "client_id": "client id (UUID) of a user-assigned managed identity",
    "connection_string_env": "name of the environment variable holding the connection string",
    "connection_string_file": "absolute path of a file holding the connection string",
    "send_timeout": "seconds one batch may take before it is abandoned and the client rebuilt (default 30)",
    "open_timeout": "seconds the start-up check (hub properties) may take (default 10)",
    "max_in_flight": "records submitted before the first is confirmed (default 500)",
    "retry_total": "the SDK's own retries per operation (default 1: the agent backs off itself)",
    "transport": "amqp (default, TCP 5671) or websockets (AMQP over WebSockets, TCP 443)",
}
CREDENTIALS = ("managed", "default")
TRANSPORTS = ("amqp", "websockets")
BATCH_PARTITION_KEY_MAX = 128  # Event Hubs refuses longer partition keys

_HUB = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,254}[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_OPTIONS = (
    "connection_string",
    "connectionstring",
    "sharedaccesskey",
    "key",
    "sas",
    "password",
    "secret",
)


# --------------------------------------------------------------------------------------------------
# The spec
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventHubsOptions:
    """What an ``eventhubs://`` spec says, validated. Holds no secret: only where to read it from."""

    namespace: str  # host of the spec ("" when only the connection string names it)
    port: int | None
    hub: str  # "" when the connection string's EntityPath names it
    credential: str | None = "managed"
    client_id: str | None = None
    connection_string_env: str | None = None
    connection_string_file: str | None = None
    send_timeout: float = 30.0
    open_timeout: float = 10.0
    max_in_flight: int = 500
    retry_total: int = 1
    transport: str = "amqp"

    @property
    def uses_connection_string(self) -> bool:
        return self.connection_string_env is not None or self.connection_string_file is not None


def parse_eventhubs_spec(spec: str) -> EventHubsOptions:
    """Validate an ``eventhubs://`` spec. Every mistake is a permanent :class:`SinkError` naming the
    option (never echoing a value that could be a secret), so a wrong spec stops the agent at start."""
    usage = "eventhubs://<namespace>.servicebus.windows.net/<hub>[?options]"
    parts = urlsplit(spec.strip())
    if parts.scheme.lower() != "eventhubs":
        raise config_error(f"eventhubs sink needs {usage}")
    if "@" in parts.netloc:
        raise config_error(
            "eventhubs sink: no credentials in the address; use credential=managed, "
            "connection_string_env=NAME or connection_string_file=/path"
        )
    try:
        host, port = parts.hostname or "", parts.port
    except ValueError:
        raise config_error(f"eventhubs sink: the port of {parts.netloc!r} is not a number") from None
    hub = unquote(parts.path.strip("/"))
    if hub and not _HUB.match(hub):
        raise config_error(
            "eventhubs sink: the path must be one event hub name (letters, digits, '.', '_', '-'), "
            f"got {hub!r}"
        )
    values: dict[str, str] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        name = key.strip().lower()
        if name in _SECRET_OPTIONS:
            raise config_error(
                f"eventhubs sink: {key} is refused: never put a secret in the sink spec; use "
                "connection_string_env=VARIABLE, connection_string_file=/path or credential=managed"
            )
        if name not in OPTIONS:
            raise config_error(f"eventhubs sink: unknown option {key!r} (known: {', '.join(OPTIONS)})")
        if name in values:
            raise config_error(f"eventhubs sink: option {name} given twice")
        values[name] = value.strip()

    env = values.get("connection_string_env") or None
    path = values.get("connection_string_file") or None
    credential = values.get("credential", "").lower() or None
    client_id = values.get("client_id") or None
    if env is not None and path is not None:
        raise config_error("eventhubs sink: give connection_string_env or connection_string_file, not both")
    connection_string = env is not None or path is not None
    if connection_string and (credential or client_id):
        raise config_error(
            "eventhubs sink: credential / client_id (Entra ID) and connection_string_* exclude each other"
        )
    if not connection_string:
        credential = credential or "managed"
        if credential not in CREDENTIALS:
            raise config_error(f"eventhubs sink: credential must be one of {', '.join(CREDENTIALS)}")
        if not host:
            raise config_error(f"eventhubs sink: the namespace is missing: {usage}")
        if port is not None:
            raise config_error(
                "eventhubs sink: a port is only meaningful with a local emulator's connection string "
                "(UseDevelopmentEmulator=true); Entra ID always uses the namespace's TLS port"
            )
        if not hub:
            raise config_error(f"eventhubs sink: the event hub name is missing: {usage}")
    if env is not None and not _ENV_NAME.match(env):
        raise config_error("eventhubs sink: connection_string_env must be an environment variable name")
    if path is not None and not Path(path).is_absolute():
        raise config_error("eventhubs sink: connection_string_file must be an absolute path")
    if client_id is not None:
        try:
            uuid.UUID(client_id)
        except ValueError:
            raise config_error(
                "eventhubs sink: client_id must be a UUID (the identity's client id)"
            ) from None
    transport = values.get("transport", "amqp").lower()
    if transport not in TRANSPORTS:
        raise config_error(f"eventhubs sink: transport must be one of {', '.join(TRANSPORTS)}")
    return EventHubsOptions(
        namespace=host,
        port=port,
        hub=hub,
        credential=None if connection_string else credential,
        client_id=client_id,
        connection_string_env=env,
        connection_string_file=path,
        send_timeout=numeric_option(
            "eventhubs sink", "send_timeout", values.get("send_timeout", "30"), 0.1, 3600, float
        ),
        open_timeout=numeric_option(
            "eventhubs sink", "open_timeout", values.get("open_timeout", "10"), 0.1, 3600, float
        ),
        max_in_flight=numeric_option(
            "eventhubs sink", "max_in_flight", values.get("max_in_flight", "500"), 1, 100_000, int
        ),
        retry_total=numeric_option(
            "eventhubs sink", "retry_total", values.get("retry_total", "1"), 0, 10, int
        ),
        transport=transport,
    )


@dataclass(frozen=True, slots=True)
class ConnectionStringInfo:
    """The non-secret parts of a connection string (what may be logged or compared)."""

    host: str  # host[:port] of the Endpoint
    entity_path: str | None
    emulator: bool


def inspect_connection_string(text: str) -> ConnectionStringInfo:
    """Check a connection string without ever echoing it; permanent :class:`SinkError` when unusable."""
    fields: dict[str, str] = {}
    for part in text.strip().split(";"):
        key, sep, value = part.partition("=")
        if sep:
            fields[key.strip().lower()] = value.strip()
    endpoint = fields.get("endpoint", "")
    host = urlsplit(endpoint).netloc if "://" in endpoint else ""
    if not host:
        raise config_error("eventhubs sink: the connection string has no Endpoint=sb://<namespace>/")
    has_key = bool(fields.get("sharedaccesskeyname")) and bool(fields.get("sharedaccesskey"))
    if not has_key and not fields.get("sharedaccesssignature"):
        raise config_error(
            "eventhubs sink: the connection string needs SharedAccessKeyName and SharedAccessKey "
            "(or SharedAccessSignature)"
        )
    emulator_value = fields.get("usedevelopmentemulator")
    if emulator_value is not None and emulator_value != "true" and emulator_value.lower() == "true":
        raise config_error(
            f"eventhubs sink: UseDevelopmentEmulator={emulator_value} must be written 'true' in lower case: "
            "azure-eventhub compares it exactly and would silently use TLS on port 5671 instead"
        )
    return ConnectionStringInfo(host, fields.get("entitypath") or None, emulator_value == "true")


# --------------------------------------------------------------------------------------------------
# Clients and credentials (shared with the Event Hubs decision source)
# --------------------------------------------------------------------------------------------------


def read_connection_string(opts: EventHubsOptions) -> str:
    """The connection string the spec points at (read at each call, so a rotated key is picked up)."""
    if opts.connection_string_env is not None:
        value = os.environ.get(opts.connection_string_env, "")
        if not value.strip():
            raise config_error(
                f"eventhubs sink: environment variable {opts.connection_string_env} is not set or empty"
            )
        return value.strip()
    assert opts.connection_string_file is not None
    try:
        value = Path(opts.connection_string_file).read_text(encoding="utf-8")
    except OSError as err:
        raise config_error(
            f"eventhubs sink: cannot read connection_string_file {opts.connection_string_file}: "
            f"{err.strerror or type(err).__name__}"
        ) from None
    if not value.strip():
        raise config_error(f"eventhubs sink: connection_string_file {opts.connection_string_file} is empty")
    return value.strip()


def make_credential(opts: EventHubsOptions) -> Any:
    """The Entra ID credential the spec asks for (``credential=managed|default``, ``client_id``)."""
    try:
        from azure.identity import DefaultAzureCredential, ManagedIdentityCredential
    except ImportError as exc:
        raise config_error(
            f"eventhubs sink: credential={opts.credential} needs azure-identity ({exc}); "
            "pip install 'scheduled-events-bridge[eventhubs]'"
        ) from None
    client_id = opts.client_id
    if opts.credential == "managed":
        return ManagedIdentityCredential(client_id=client_id) if client_id else ManagedIdentityCredential()
    return (
        DefaultAzureCredential(managed_identity_client_id=client_id)
        if client_id
        else DefaultAzureCredential()
    )


def client_options(opts: EventHubsOptions) -> dict[str, Any]:
    """Keyword arguments every azure-eventhub client gets: short SDK retries, transport, user agent."""
    from azure.eventhub import TransportType

    return {
        "retry_total": opts.retry_total,
        "retry_backoff_factor": 0.5,
        "retry_backoff_max": 4,
        "transport_type": TransportType.AmqpOverWebsocket
        if opts.transport == "websockets"
        else TransportType.Amqp,
        "user_agent": f"se-bridge/{__version__}",
    }


def resolve_connection_string(opts: EventHubsOptions, text: str) -> tuple[ConnectionStringInfo, str]:
    """Check a connection string against the spec: its non-secret parts and the hub to use."""
    info = inspect_connection_string(text)
    if info.entity_path and opts.hub and info.entity_path != opts.hub:
        raise config_error(
            f"eventhubs sink: the spec names hub {opts.hub!r} but the connection string's EntityPath "
            f"is {info.entity_path!r}"
        )
    hub = opts.hub or info.entity_path
    if not hub:
        raise config_error(
            "eventhubs sink: no event hub named: put it in the spec's path or in the connection "
            "string's EntityPath"
        )
    return info, hub


# --------------------------------------------------------------------------------------------------
# Threads the SDK leaves blocked
# --------------------------------------------------------------------------------------------------


def unblock_thread(thread: threading.Thread) -> int:
    """Shut down the sockets a thread blocked in the SDK is waiting on; return how many.

    pyamqp blocks on ``recv`` without a timeout during SASL and TLS negotiation (see the module
    docstring) and holds its transport lock meanwhile, so neither a timeout nor ``client.close()`` can
    end that wait. The sockets are found in the thread's own stack frames (a local ``socket`` or an
    object with a ``sock`` attribute, which is how pyamqp's transports hold theirs); ``shutdown``
    makes the blocked ``recv`` return at once. Best effort by design: what cannot be found is left.
    """
    frame = sys._current_frames().get(thread.ident or -1)
    found: dict[int, socket.socket] = {}
    while frame is not None:
        for value in list(frame.f_locals.values()):
            candidates = [value, getattr(value, "sock", None)] if not isinstance(value, type) else []
            for candidate in candidates:
                if isinstance(candidate, socket.socket):
                    found[id(candidate)] = candidate
        frame = frame.f_back
    for sock in found.values():
        with contextlib.suppress(OSError, ValueError):
            sock.shutdown(socket.SHUT_RDWR)
    return len(found)


class Abandoned(Exception):
    """A call did not finish in time (or belongs to a sender the watchdog gave up on)."""

    def __init__(self, name: str, thread: threading.Thread | None = None) -> None:
        super().__init__(name)
        self.thread = thread


#: How long an abandoned thread is kept being unblocked before it is left alone.
REAP_SECONDS = 60.0


def call_with_deadline(fn: Callable[[], Any], timeout: float, name: str) -> Any:
    """Run ``fn`` in a daemon thread: its result, its exception, or :class:`Abandoned` (carrying the
    thread, still running) after ``timeout``."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise Abandoned(name, thread)
    if "error" in box:
        raise box["error"]
    return box.get("result")


def _unblock_until_exit(thread: threading.Thread, seconds: float) -> bool:
    """Keep unblocking ``thread`` until it exits: the SDK's own retry loop opens a new connection after
    the first one is shut down, which can hang in the same way. True if it exited."""
    deadline = time.monotonic() + seconds
    while thread.is_alive() and time.monotonic() < deadline:
        unblock_thread(thread)
        thread.join(0.2)
    return not thread.is_alive()


def _close_client(client: Any) -> None:
    def close() -> None:
        try:
            client.close()
        except Exception as exc:  # closing a broken client is expected to fail at times
            log.debug("closing an Event Hubs client failed", extra={"error": redact(exc)})

    closer = threading.Thread(target=close, name="eventhubs-close", daemon=True)
    closer.start()
    closer.join(2.0)
    if closer.is_alive():
        _unblock_until_exit(closer, 10.0)


def abandon(thread: threading.Thread | None, client: Any) -> threading.Thread:
    """In the background: unblock ``thread`` until it exits, then close ``client``. Never blocks the
    caller (``client.close()`` waits for the client's lock, which a hung thread holds)."""

    def reap() -> None:
        if thread is not None and thread.is_alive() and not _unblock_until_exit(thread, REAP_SECONDS):
            log.warning("an abandoned Event Hubs thread is still blocked", extra={"thread": thread.name})
        if client is not None:
            _close_client(client)

    reaper = threading.Thread(target=reap, name="eventhubs-reap", daemon=True)
    reaper.start()
    return reaper


# --------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------


def one_line(exc: BaseException, limit: int = 400) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return redact(text if len(text) <= limit else text[: limit - 3] + "...")


def identity_error(exc: BaseException) -> BaseException | None:
    """An azure-identity / azure-core authentication error anywhere in the exception chain."""
    try:
        from azure.core.exceptions import ClientAuthenticationError
    except ImportError:  # pragma: no cover - azure-core comes with azure-eventhub
        return None
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ClientAuthenticationError):
            return current
        current = current.__cause__ or current.__context__
    return None


def classify_error(exc: BaseException, where: str, *, opening: bool) -> SinkError:
    """Classify an SDK failure for ``where`` (endpoint/hub): at start a refused credential or a missing
    hub is permanent (the process stops with the message), later everything is retried."""
    if isinstance(exc, SinkError):
        if not exc.retryable and not opening:  # e.g. the connection string file vanished at run time
            return SinkError(str(exc), kind=exc.kind)
        return exc
    detail = one_line(exc)
    identity = identity_error(exc)
    if identity is not None:
        status = getattr(identity, "status_code", None)
        unavailable = type(identity).__name__ == "CredentialUnavailableError"
        refused = unavailable or status in (400, 401, 403)  # no identity, or one Entra ID refuses
        what = "credential refused: Entra ID gave no token" if refused else "Entra ID token request failed"
        return SinkError(
            f"{what} for {where}: {one_line(identity)}", kind="auth", retryable=not (opening and refused)
        )
    try:
        from azure.eventhub.exceptions import (
            AuthenticationError,
            ConnectError,
            ConnectionLostError,
            OperationTimeoutError,
        )
    except ImportError:  # pragma: no cover
        return SinkError(f"event hubs failure: {detail}", kind="error")
    condition = getattr(exc, "error", None) or ""
    if (
        isinstance(exc, AuthenticationError)
        or condition == "unauthorized-access"
        or "Status code: 401" in detail
    ):
        return SinkError(
            f"credential refused by the Event Hubs namespace for {where}: {detail}",
            kind="auth",
            retryable=not opening,
        )
    if condition == "not-found" or "Status code: 404" in detail:
        return SinkError(
            f"hub not found: event hub {where} does not exist (or the namespace is wrong): {detail}",
            kind="not_found",
            retryable=not opening,
        )
    if isinstance(exc, OperationTimeoutError):
        kind = "timeout"
    elif isinstance(exc, ConnectError | ConnectionLostError):
        kind = "connect"
    else:
        kind = "error"
    return SinkError(f"event hubs unreachable or failing ({where}): {detail}", kind=kind)


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
        self._credential: Any = None
        self._hub = self.options.hub
        self._where = f"{self.options.namespace}/{self.options.hub}"  # for messages: endpoint/hub
        self._endpoint_warned = False
        #: Sender threads the watchdog gave up on (tests check that they exit once unblocked).
        self.abandoned: list[threading.Thread] = []
        #: How many times the watchdog abandoned a send and dropped the client.
        self.watchdog_fired = 0
        self.partition_ids: list[str] = []

    # -- clients ----------------------------------------------------------------------------------

    def _read_connection_string(self) -> str:
        return read_connection_string(self.options)

    def _make_credential(self) -> Any:
        if self._credential is None:
            self._credential = make_credential(self.options)
        return self._credential

    def _build_client(self) -> Any:
        """A new producer client (connects lazily: building it contacts nothing)."""
        try:
            from azure.eventhub import EventHubProducerClient
        except ImportError as exc:
            raise config_error(
                f"eventhubs sink: azure-eventhub is not installed ({exc}); "
                "pip install 'scheduled-events-bridge[eventhubs]'"
            ) from None
        opts = self.options
        kwargs = client_options(opts)
        if not opts.uses_connection_string:
            return EventHubProducerClient(
                fully_qualified_namespace=opts.namespace,
                eventhub_name=opts.hub,
                credential=self._make_credential(),
                **kwargs,
            )
        text = self._read_connection_string()
        info, hub = resolve_connection_string(opts, text)
        self._hub = hub
        self._where = f"{info.host}/{hub}"
        spec_host = f"{opts.namespace}:{opts.port}" if opts.port else opts.namespace
        if spec_host and spec_host.lower() != info.host.lower() and not self._endpoint_warned:
            self._endpoint_warned = True
            log.warning(
                "the connection string's Endpoint wins over the spec's host",
                extra={"sink": self.name, "specHost": spec_host, "endpoint": info.host},
            )
        try:
            return EventHubProducerClient.from_connection_string(
                text, eventhub_name=None if info.entity_path else hub, **kwargs
            )
        except (ValueError, TypeError) as exc:
            # The SDK's parse errors are generic, but never echo anything derived from the secret.
            raise config_error(
                f"eventhubs sink: the connection string is not usable ({type(exc).__name__})"
            ) from None

    # -- errors -----------------------------------------------------------------------------------

    def _error(self, exc: BaseException, *, opening: bool) -> SinkError:
        """Classify an SDK failure: at start a refused credential or a missing hub is permanent."""
        return classify_error(exc, self._where, opening=opening)

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
                f"({self._where}); will retry",
                kind="timeout",
            ) from None
        except Exception as exc:
            abandon(None, client)
            raise self._error(exc, opening=True) from None
        self.partition_ids = list((props or {}).get("partition_ids") or [])
        log.info(
            "event hub reachable",
            extra={"sink": self.name, "hub": self._hub, "partitions": len(self.partition_ids)},
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
