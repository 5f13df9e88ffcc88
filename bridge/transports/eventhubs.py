"""``eventhubs://<namespace>.servicebus.windows.net/<hub>[?options]``: what the Event Hubs sink and the
Event Hubs decision source share (Azure Event Hubs over AMQP 1.0, the official ``azure-eventhub`` SDK).

Why one module for both directions: ``se-bridge decide --sink X`` publishes decisions where
``se-bridge approver --source X`` reads them, so ``X`` must mean the same thing to both. What the
spec says and how it is checked (:func:`parse_spec`), how a connection string is inspected without
ever being shown, how an SDK client is built with Entra ID or a connection string
(:class:`HubConnection`), how a call the SDK can hang for ever is abandoned, and what an SDK failure
means (:func:`classify_error`) therefore live here, once. The sink (:mod:`bridge.sinks.eventhubs`)
adds a producer and its delivery options (``send_timeout``, ``max_in_flight``: part of the one spec
syntax, a source checks and ignores them); the source (:mod:`bridge.streams.eventhubs`) a
consumer, its consumer group and its checkpoint store. Each passes its
:class:`~bridge.transports.base.Owner`, so a refusal reads "eventhubs sink: ..." or "eventhubs
source: ...".

* **Secrets stay out.** The connection string is never in the spec (``connection_string_env`` /
  ``connection_string_file``, a :class:`~bridge.transports.secrets.SecretRef` read each time a client
  is built, so a rotated key is picked up); every error text goes through :func:`redact`; Entra ID
  (managed identity, the default chain) needs no secret at all and is the default.
* **The SDK can hang for ever.** azure-eventhub 5.15.1 (pyamqp) reads the SASL handshake with a
  socket in blocking mode without timeout (``Transport.block()``), and wraps TLS the same way: a port
  that accepts TCP but never answers hangs the call, whatever its ``timeout``. :func:`call_with_deadline`
  gives such a call up, and :func:`abandon` unblocks the thread left behind by shutting down the
  sockets found in its stack frames, then closes the client, in the background.
* **Local emulators and test peers.** A connection string with ``UseDevelopmentEmulator=true`` makes
  the SDK use plain AMQP on the endpoint's port (the spec's host and port are then only a label: the
  connection string's ``Endpoint`` wins). The SDK compares the value with ``"true"`` exactly, so
  ``True`` silently means TLS on port 5671: that is refused here with an explanation.

No SDK is imported at module level: azure-eventhub and azure-identity are loaded by the functions
that build clients and credentials, when an ``eventhubs://`` spec is opened.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import SplitResult, unquote, urlsplit

from bridge import __version__
from bridge.errors import BridgeError
from bridge.support.redaction import redact
from bridge.transports.azure import EXTRA_HINT, IDENTITIES, check_client_id, make_credential
from bridge.transports.base import Owner, numeric_option, query_options
from bridge.transports.secrets import SecretRef

log = logging.getLogger(__name__)

USAGE = "eventhubs://<namespace>.servicebus.windows.net/<hub>[?options]"
#: Where and how to connect: what every client of the spec uses.
CONNECTION_OPTIONS: dict[str, str] = {
    "credential": "managed (default: ManagedIdentityCredential) or default (DefaultAzureCredential)",
    "client_id": "client id (UUID) of a user-assigned managed identity",
    "connection_string_env": "name of the environment variable holding the connection string",
    "connection_string_file": "absolute path of a file holding the connection string",
    "open_timeout": "seconds the start-up check (hub properties) may take (default 10)",
    "retry_total": "the SDK's own retries per operation (default 1: the bridge backs off itself)",
    "transport": "amqp (default, TCP 5671) or websockets (AMQP over WebSockets, TCP 443)",
}
#: How the sink sends (a source checks them and ignores them: one spec serves both directions).
SENDER_OPTIONS: dict[str, str] = {
    "send_timeout": "seconds one batch may take before it is abandoned and the client rebuilt (default 30)",
    "max_in_flight": "records submitted before the first is confirmed (default 500)",
}
#: Every query option of the hub part, with what it does (the refusal of an unknown option lists them).
OPTIONS: dict[str, str] = {**CONNECTION_OPTIONS, **SENDER_OPTIONS}
CREDENTIALS = IDENTITIES
TRANSPORTS = ("amqp", "websockets")

_HUB = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,254}[A-Za-z0-9])?$")
_SECRET_OPTIONS = (
    "connection_string",
    "connectionstring",
    "sharedaccesskey",
    "key",
    "sas",
    "password",
    "secret",
)
_SECRET_HINT = "connection_string_env=VARIABLE, connection_string_file=/path or credential=managed"

E = TypeVar("E", bound=BridgeError)


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
    connection_string: SecretRef | None = None  # connection_string_env / connection_string_file
    send_timeout: float = 30.0
    open_timeout: float = 10.0
    max_in_flight: int = 500
    retry_total: int = 1
    transport: str = "amqp"

    @property
    def uses_connection_string(self) -> bool:
        return self.connection_string is not None


def secret_hint(name: str) -> str | None:
    """How to give the secret a refused option name would carry (None: not a secret's name)."""
    return _SECRET_HINT if name in _SECRET_OPTIONS else None


def parse_spec(
    spec: str,
    owner: Owner,
    extra: Mapping[str, str] | None = None,
    secrets: Callable[[str], str | None] = secret_hint,
) -> tuple[EventHubsOptions, dict[str, str]]:
    """Validate an ``eventhubs://`` spec. Every mistake is a permanent error of ``owner`` naming the
    option (never echoing a value that could be a secret), so a wrong spec stops the process at start.

    ``extra`` are the caller's own options (a source's consumer group and checkpoint store): accepted
    here and returned as given, for the caller to check. ``secrets`` says which other names to refuse
    as secrets (see :func:`~bridge.transports.base.query_options`)."""
    parts, host, port = _address(spec, owner)
    hub = _hub(parts.path, owner)
    values = query_options(parts.query, owner, {**OPTIONS, **(extra or {})}, secrets)
    credential, client_id, connection_string = _authentication(values, host, port, hub, owner)
    transport = values.get("transport", "amqp").lower()
    if transport not in TRANSPORTS:
        raise owner.refuse(f"transport must be one of {', '.join(TRANSPORTS)}")
    options = EventHubsOptions(
        namespace=host,
        port=port,
        hub=hub,
        credential=credential,
        client_id=client_id,
        connection_string=connection_string,
        send_timeout=numeric_option(
            owner, "send_timeout", values.get("send_timeout", "30"), 0.1, 3600, float
        ),
        open_timeout=numeric_option(
            owner, "open_timeout", values.get("open_timeout", "10"), 0.1, 3600, float
        ),
        max_in_flight=numeric_option(
            owner, "max_in_flight", values.get("max_in_flight", "500"), 1, 100_000, int
        ),
        retry_total=numeric_option(owner, "retry_total", values.get("retry_total", "1"), 0, 10, int),
        transport=transport,
    )
    return options, {name: value for name, value in values.items() if name not in OPTIONS}


def _address(spec: str, owner: Owner) -> tuple[SplitResult, str, int | None]:
    parts = urlsplit(spec.strip())
    if parts.scheme.lower() != "eventhubs":
        raise owner.error(f"{owner.label} needs {USAGE}")
    if "@" in parts.netloc:
        raise owner.refuse(
            "no credentials in the address; use credential=managed, "
            "connection_string_env=NAME or connection_string_file=/path"
        )
    try:
        return parts, parts.hostname or "", parts.port
    except ValueError:
        raise owner.refuse(f"the port of {parts.netloc!r} is not a number") from None


def _hub(path: str, owner: Owner) -> str:
    hub = unquote(path.strip("/"))
    if hub and not _HUB.match(hub):
        raise owner.refuse(
            f"the path must be one event hub name (letters, digits, '.', '_', '-'), got {hub!r}"
        )
    return hub


def _authentication(
    values: dict[str, str], host: str, port: int | None, hub: str, owner: Owner
) -> tuple[str | None, str | None, SecretRef | None]:
    """``(credential, client_id, connection string)``: a connection string, or Entra ID (the default)."""
    credential = values.get("credential", "").lower() or None
    client_id = values.get("client_id") or None
    connection_string = SecretRef.from_options(
        owner,
        "connection_string",
        values.get("connection_string_env") or None,
        values.get("connection_string_file") or None,
    )
    if connection_string is not None:
        if credential or client_id:
            raise owner.refuse("credential / client_id (Entra ID) and connection_string_* exclude each other")
        return None, None, connection_string
    credential = credential or "managed"
    if credential not in CREDENTIALS:
        raise owner.refuse(f"credential must be one of {', '.join(CREDENTIALS)}")
    if not host:
        raise owner.refuse(f"the namespace is missing: {USAGE}")
    if port is not None:
        raise owner.refuse(
            "a port is only meaningful with a local emulator's connection string "
            "(UseDevelopmentEmulator=true); Entra ID always uses the namespace's TLS port"
        )
    if not hub:
        raise owner.refuse(f"the event hub name is missing: {USAGE}")
    return credential, check_client_id(owner, "client_id", client_id), None


# --------------------------------------------------------------------------------------------------
# Connection strings
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConnectionStringInfo:
    """The non-secret parts of a connection string (what may be logged or compared)."""

    host: str  # host[:port] of the Endpoint
    entity_path: str | None
    emulator: bool


def inspect_connection_string(text: str, owner: Owner) -> ConnectionStringInfo:
    """Check a connection string without ever echoing it; a permanent refusal when unusable."""
    fields: dict[str, str] = {}
    for part in text.strip().split(";"):
        key, sep, value = part.partition("=")
        if sep:
            fields[key.strip().lower()] = value.strip()
    endpoint = fields.get("endpoint", "")
    host = urlsplit(endpoint).netloc if "://" in endpoint else ""
    if not host:
        raise owner.refuse("the connection string has no Endpoint=sb://<namespace>/")
    has_key = bool(fields.get("sharedaccesskeyname")) and bool(fields.get("sharedaccesskey"))
    if not has_key and not fields.get("sharedaccesssignature"):
        raise owner.refuse(
            "the connection string needs SharedAccessKeyName and SharedAccessKey (or SharedAccessSignature)"
        )
    emulator_value = fields.get("usedevelopmentemulator")
    if emulator_value is not None and emulator_value != "true" and emulator_value.lower() == "true":
        raise owner.refuse(
            f"UseDevelopmentEmulator={emulator_value} must be written 'true' in lower case: "
            "azure-eventhub compares it exactly and would silently use TLS on port 5671 instead"
        )
    return ConnectionStringInfo(host, fields.get("entitypath") or None, emulator_value == "true")


def resolve_connection_string(
    opts: EventHubsOptions, text: str, owner: Owner
) -> tuple[ConnectionStringInfo, str]:
    """Check a connection string against the spec: its non-secret parts and the hub to use."""
    info = inspect_connection_string(text, owner)
    if info.entity_path and opts.hub and info.entity_path != opts.hub:
        raise owner.refuse(
            f"the spec names hub {opts.hub!r} but the connection string's EntityPath is {info.entity_path!r}"
        )
    hub = opts.hub or info.entity_path
    if not hub:
        raise owner.refuse(
            "no event hub named: put it in the spec's path or in the connection string's EntityPath"
        )
    return info, hub


# --------------------------------------------------------------------------------------------------
# Clients
# --------------------------------------------------------------------------------------------------


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


class HubConnection:
    """How the clients of one ``eventhubs://`` spec reach their hub: with the spec's Entra ID
    credential (built once, on first use) or its connection string (read again for every client, so a
    rotated key is picked up). ``hub`` and ``where`` (``endpoint/hub``, for messages) follow what the
    connection string says once it has been read.

    ``logger`` and ``log_extra`` are the caller's: the one warning this class logs (the connection
    string's Endpoint is not the spec's host) reads as the sink's or the source's.
    """

    def __init__(
        self,
        options: EventHubsOptions,
        owner: Owner,
        logger: logging.Logger = log,
        log_extra: Mapping[str, Any] | None = None,
    ) -> None:
        self.options = options
        self.owner = owner
        self.hub = options.hub
        self.where = f"{options.namespace}/{options.hub}"
        self.credential: Any = None
        self._log = logger
        self._log_extra = dict(log_extra or {})
        self._endpoint_warned = False

    def azure_credential(self) -> Any:
        """The Entra ID credential the spec asks for (``credential=managed|default``, ``client_id``)."""
        if self.credential is None:
            opts = self.options
            assert opts.credential is not None
            self.credential = make_credential(self.owner, "credential", opts.credential, opts.client_id)
        return self.credential

    def connection_string(self) -> tuple[str, ConnectionStringInfo]:
        """The connection string, read now and checked against the spec (never shown)."""
        ref = self.options.connection_string
        assert ref is not None
        text = ref.resolve(self.owner).strip()
        info, self.hub = resolve_connection_string(self.options, text, self.owner)
        self.where = f"{info.host}/{self.hub}"
        return text, info

    def build(self, client_class: str, **kwargs: Any) -> Any:
        """A new SDK client (``"EventHubProducerClient"`` or ``"EventHubConsumerClient"``) with the
        common options plus ``kwargs``. Building one contacts nothing: it connects lazily."""
        try:
            import azure.eventhub
        except ImportError as exc:
            raise self.owner.refuse(f"azure-eventhub is not installed ({exc}); {EXTRA_HINT}") from None
        cls = getattr(azure.eventhub, client_class)
        opts = self.options
        kwargs = {**client_options(opts), **kwargs}
        if not opts.uses_connection_string:
            return cls(
                fully_qualified_namespace=opts.namespace,
                eventhub_name=opts.hub,
                credential=self.azure_credential(),
                **kwargs,
            )
        text, info = self.connection_string()
        self._warn_endpoint(info)
        try:
            return cls.from_connection_string(
                text, eventhub_name=None if info.entity_path else self.hub, **kwargs
            )
        except (ValueError, TypeError) as exc:
            # The SDK's parse errors are generic, but never echo anything derived from the secret.
            raise self.owner.refuse(f"the connection string is not usable ({type(exc).__name__})") from None

    def _warn_endpoint(self, info: ConnectionStringInfo) -> None:
        opts = self.options
        spec_host = f"{opts.namespace}:{opts.port}" if opts.port else opts.namespace
        if spec_host and spec_host.lower() != info.host.lower() and not self._endpoint_warned:
            self._endpoint_warned = True
            self._log.warning(
                "the connection string's Endpoint wins over the spec's host",
                extra={**self._log_extra, "specHost": spec_host, "endpoint": info.host},
            )

    def classify(self, exc: BaseException, error: type[E], *, opening: bool) -> E:
        """:func:`classify_error` for this hub."""
        return classify_error(exc, self.where, error, opening=opening)


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


def classify_error(exc: BaseException, where: str, error: type[E], *, opening: bool) -> E:
    """Classify an SDK failure for ``where`` (endpoint/hub) as the caller's ``error`` type: at start a
    refused credential or a missing hub is permanent (the process stops with the message), later
    everything is retried (it is not about one record or one decision)."""
    if isinstance(exc, BridgeError):  # our own refusal, e.g. the connection string file vanished
        if isinstance(exc, error) and (exc.retryable or opening):
            return exc
        return error(str(exc), kind=exc.kind, retryable=exc.retryable or not opening)
    detail = one_line(exc)
    identity = identity_error(exc)
    if identity is not None:
        status = getattr(identity, "status_code", None)
        unavailable = type(identity).__name__ == "CredentialUnavailableError"
        refused = unavailable or status in (400, 401, 403)  # no identity, or one Entra ID refuses
        what = "credential refused: Entra ID gave no token" if refused else "Entra ID token request failed"
        return error(
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
        return error(f"event hubs failure: {detail}", kind="error", retryable=True)
    condition = getattr(exc, "error", None) or ""
    if (
        isinstance(exc, AuthenticationError)
        or condition == "unauthorized-access"
        or "Status code: 401" in detail
    ):
        return error(
            f"credential refused by the Event Hubs namespace for {where}: {detail}",
            kind="auth",
            retryable=not opening,
        )
    if condition == "not-found" or "Status code: 404" in detail:
        return error(
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
    return error(f"event hubs unreachable or failing ({where}): {detail}", kind=kind, retryable=True)
