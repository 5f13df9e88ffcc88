"""``https://host/path[?target query]#options``: POST each record to a webhook, one request per record.

Why it looks like this:

* **The spec is the target URL, options go in the fragment.** Targets such as Logic Apps HTTP
  triggers, Power Automate, Azure Functions or Slack-style hooks carry their own query (Logic Apps
  needs ``api-version``, ``sp``, ``sv`` and the secret ``sig``), so sink options in the query would
  collide with it or be sent to the server. The fragment (``#format=cloudevents&timeout=5``) is
  never sent over HTTP, so the URL before ``#`` is used exactly as given and the options stay local.
* **Secrets never come from the spec.** The spec is logged and exported as a metric label (through
  :func:`~bridge.support.redaction.redact`, which masks ``sig=``, user info and the path tokens of Slack,
  Teams, Discord and ``/hooks/`` URLs); the HMAC key, the Event Grid key and
  secret header values come from an environment variable or a file named in the spec. An inline
  ``header.Authorization=...`` is refused rather than risk printing it.
* **Records are rare and the connection goes stale.** A Scheduled Events document changes a few
  times per maintenance, so the kept-alive connection has usually been closed by the server or a
  load balancer (Azure LB: 4 min idle; Node.js: 5 s) by the next record. A POST that dies on a
  dropped connection before any answer is retried once at once on a fresh connection; the record's
  deterministic id makes the rare duplicate harmless. Everything else is left to the delivery
  worker's backoff, which honours ``Retry-After``.
* **Classification follows what can change on its own**: connection errors, timeouts, TLS failures,
  408, 429 and 5xx are transient (retried, the queue waits); any other 4xx (and a redirect, which is
  not followed: a POST must not silently become a GET or carry the signature to another host) is
  permanent and the record goes to the dead-letter file with the status and a short, redacted
  excerpt of the answer. A TLS failure is transient on purpose: a certificate is fixed by the
  server's owner, and dead-lettering every record meanwhile would lose the whole backlog.
* **TLS verification is always on** (a private CA via ``ca_file``; there is no way to turn it off),
  and ``http://`` is refused unless the host is loopback or ``allow_http=true`` says so.
* **Proxies**: unlike IMDS (never proxied), a webhook leaves the VM, often through a corporate proxy,
  so ``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY`` apply (``requests``' ``trust_env``), or ``proxy=``.
  A loopback target never goes through an environment proxy.

CloudEvents are built by hand rather than with the ``cloudevents`` package: its 1.x and 2.x APIs
differ (both are allowed by the dependency range), its serializer re-encodes the record with the
standard ``json`` module and writes ``time`` from a ``datetime`` with microseconds, whereas here the
record's durable bytes are embedded verbatim (``orjson.Fragment``) and ``time`` is ``observedAt``
exactly. The tests parse what this module sends with the package, as an independent check.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import ssl
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import SplitResult, parse_qsl, quote, unquote, unquote_plus, urlsplit, urlunsplit

import orjson
import requests
import urllib3

from bridge import __version__
from bridge.http.netaddr import is_loopback
from bridge.pipeline import CONTENT_TYPE, Entry, SinkError, SynchronousSink
from bridge.records.fields import Refused
from bridge.records.ids import APPROVAL, RECONCILIATION, SCHEDULED_EVENTS
from bridge.records.reader import Reader
from bridge.sinks.base import config_error, owner
from bridge.sinks.chat import CHAT_FORMATS, ChatOptions, chat_body
from bridge.support.redaction import secrets_in
from bridge.support.retry import parse_retry_after
from bridge.transports.base import Owner
from bridge.transports.secrets import SecretRef

FORMATS = ("json", "cloudevents", "eventgrid", *CHAT_FORMATS)
#: CloudEvents ``type`` and Event Grid ``eventType`` of every record.
EVENT_TYPE = "com.scheduled-events-bridge.record.v1"
CLOUDEVENTS_CONTENT_TYPE = "application/cloudevents+json"
SIGNATURE_HEADER = "X-SE-Bridge-Signature"
TIMESTAMP_HEADER = "X-SE-Bridge-Timestamp"
RECORD_ID_HEADER = "X-SE-Bridge-Record-Id"
EVENT_GRID_KEY_HEADER = "aeg-sas-key"
MIN_HMAC_KEY_BYTES = 32
DEFAULT_TIMEOUT = 10.0
MAX_TIMEOUT = 300.0
#: A server's Retry-After is honoured up to this many seconds (a typo of a day must not stall a VM's
#: notifications for a day; the worker retries again after this anyway).
MAX_RETRY_AFTER = 300.0
#: How much of an answer is read (enough for any error body; a bigger body is cut and the connection
#: dropped rather than reused), and how much of it goes into an error message.
MAX_ANSWER_BYTES = 64 * 1024
EXCERPT_CHARS = 200
MIN_SCRUB_CHARS = 8

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
# Header names whose value is a credential: such a value must come from header_env/header_file.
_SENSITIVE_HEADER = re.compile(
    r"(?i)(authoriz|cookie|key|token|secret|signature|passw|sas|credential|session)"
)
# Headers the sink sets itself.
_RESERVED_HEADERS = {"content-type", "content-length", "host", "transfer-encoding", "connection"}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_SIMPLE_OPTIONS = {
    "format",
    "timeout",
    "hmac_key_env",
    "hmac_key_file",
    "aeg_key_env",
    "aeg_key_file",
    "ca_file",
    "verify",
    "allow_http",
    "proxy",
    "console_url",
    "one_per_set",
    "template_file",
}


class WebhookSink(SynchronousSink):
    """POST one record per request over one kept-alive ``requests.Session``."""

    scheme = "https"

    def __init__(self, spec: str) -> None:
        parts = urlsplit(spec.strip())
        # The sink id carries the real scheme (http-... / https-...): two sinks that differ only by it
        # are two destinations.
        self.scheme = parts.scheme.lower()
        super().__init__(spec)
        # Shown everywhere (logs, the sink_info label, errors, dead letters) as scheme, host and a
        # fingerprint: a webhook URL is a secret as a whole (Alertmanager treats it so), whatever
        # its host. The table of secret shapes stays the second line of defence for free text.
        self.name = display_name(spec)
        if self.scheme not in ("http", "https"):
            raise self._config_error(f"webhook sink needs an http(s):// URL, got {self.name!r}")
        try:
            host = parts.hostname
            port = parts.port
        except ValueError as exc:  # a port that is not a number
            raise self._config_error(f"webhook URL {self.name!r} is malformed: {exc}") from None
        if not host:
            raise self._config_error(f"webhook URL {self.name!r} has no host")
        self.host = host
        self.port = port
        self.loopback = is_loopback(host)
        #: What is POSTed to: the spec without its fragment, query and encoding untouched.
        self.url = urlunsplit((self.scheme, parts.netloc, parts.path or "/", parts.query, ""))

        options = self._parse_options(parts.fragment)
        self.format = options.pop("format", "json").lower()
        #: Chat formats read each record (typed, schema-checked) to word a message.
        self._reader = Reader(types=(SCHEDULED_EVENTS, APPROVAL, RECONCILIATION))
        if self.format not in FORMATS:
            raise self._config_error(f"format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        self.timeout = self._parse_timeout(options.pop("timeout", None))
        self.allow_http = self._parse_bool("allow_http", options.pop("allow_http", "false"))
        if self.scheme == "http" and not (self.loopback or self.allow_http):
            raise self._config_error(
                f"refusing plain http:// to {host}: records and signatures would cross the network "
                "unencrypted. Use https://, or add #allow_http=true to the spec if this network is "
                "trusted (http:// is accepted without it only for loopback hosts)"
            )
        self.ca_file = self._parse_ca(options.pop("ca_file", None), options.pop("verify", None))
        self.proxy = self._parse_proxy(options.pop("proxy", None))
        try:
            self.chat = ChatOptions.take(options, self.format)
        except ValueError as exc:
            raise self._config_error(str(exc)) from None
        self._hmac_source = self._secret_source("hmac_key", "HMAC key", options)
        self._aeg_source = self._secret_source("aeg_key", "Event Grid key", options)
        if self._aeg_source is not None and self.format != "eventgrid":
            raise self._config_error("aeg_key_env/aeg_key_file only apply to format=eventgrid")
        self._static_headers: dict[str, str] = {}
        self._secret_headers: dict[str, SecretRef] = {}
        for key, value in options.items():
            kind, _, header = key.partition(".")
            self._add_header(kind, header, value)

        self._session: requests.Session | None = None
        self._headers: dict[str, str] = {}
        self._hmac_key: bytes | None = None
        # Values masked in every message this sink produces, beyond what redact() recognises: a
        # server may echo the URL's `sig` (decoded, or not after `&`) or a header in its error body.
        self._url_secrets = _url_secrets(parts)
        self._secrets: list[str] = [v for v in self._url_secrets if len(v) >= MIN_SCRUB_CHARS]

    # -- configuration ------------------------------------------------------------------------------

    def _config_error(self, message: str) -> SinkError:
        return config_error(f"webhook sink {self.name}: {message}")

    @property
    def _owner(self) -> Owner:
        """This sink as the transport helpers speak for it (``webhook sink <redacted URL>: ...``). The
        secret readers say "for header Authorization, ..." rather than "header Authorization: ...",
        which redaction would take for a header line and mask to its end."""
        return owner(f"webhook sink {self.name}")

    def _parse_options(self, fragment: str) -> dict[str, str]:
        if not fragment:
            return {}
        # Like a query string, but '+' stays a '+' (a path or a header value may hold one): only
        # %-escapes are decoded.
        pairs = []
        for pair in fragment.split("&"):
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise self._config_error(
                    "options after '#' must be name=value pairs joined by '&' (%-encode '&', '#', spaces)"
                )
            pairs.append((unquote(key), unquote(value)))
        options: dict[str, str] = {}
        for key, value in pairs:
            if key in options:
                raise self._config_error(f"option {key!r} is given twice")
            known = key in _SIMPLE_OPTIONS or key.partition(".")[0] in ("header", "header_env", "header_file")
            if not known:
                if key.lower() in ("insecure_skip_verify", "insecure", "verify_ssl", "tls_skip_verify"):
                    raise self._config_error(
                        f"{key} is not offered: TLS verification stays on; for a private CA give "
                        "ca_file=/path/ca.pem"
                    )
                raise self._config_error(
                    f"unknown option {key!r} (known: {', '.join(sorted(_SIMPLE_OPTIONS))}, header.NAME, "
                    "header_env.NAME, header_file.NAME)"
                )
            options[key] = value
        return options

    def _parse_timeout(self, value: str | None) -> float:
        if value is None:
            return DEFAULT_TIMEOUT
        try:
            timeout = float(value)
        except ValueError:
            timeout = -1.0
        if not 0 < timeout <= MAX_TIMEOUT:
            raise self._config_error(f"timeout must be seconds in (0, {MAX_TIMEOUT:g}], got {value!r}")
        return timeout

    def _parse_bool(self, name: str, value: str) -> bool:
        v = value.strip().lower()
        if v in _TRUE:
            return True
        if v in _FALSE:
            return False
        raise self._config_error(f"{name} must be true or false, got {value!r}")

    def _parse_ca(self, ca_file: str | None, verify: str | None) -> str | None:
        if verify is not None:
            v = verify.strip().lower()
            if v in _FALSE:
                raise self._config_error(
                    "verify=false is not offered: TLS verification stays on; for a private CA give "
                    "ca_file=/path/ca.pem"
                )
            if v not in _TRUE:
                if ca_file is not None:
                    raise self._config_error(
                        "give the CA bundle once: ca_file=PATH (verify=PATH is an alias)"
                    )
                ca_file = verify
        if ca_file is not None and not ca_file:
            raise self._config_error("ca_file is empty")
        return ca_file

    def _parse_proxy(self, proxy: str | None) -> str | None:
        if proxy is None:
            return None
        p = urlsplit(proxy)
        if p.scheme not in ("http", "https") or not p.hostname:
            raise self._config_error(f"proxy must be http://host:port or https://host:port, got {proxy!r}")
        if p.username or p.password:
            raise self._config_error(
                "proxy credentials do not belong in the spec (it is logged): set them in HTTPS_PROXY "
                "in the agent's environment instead"
            )
        return proxy

    def _secret_source(self, prefix: str, what: str, options: dict[str, str]) -> SecretRef | None:
        # Paths are taken as given (relative ones too) and variable names are not checked here: a
        # name no environment holds is refused at open(), as not set.
        env, file = options.pop(f"{prefix}_env", None), options.pop(f"{prefix}_file", None)
        return SecretRef.from_options(self._owner, prefix, env, file, what=what, strict=False)

    def _add_header(self, kind: str, header: str, value: str) -> None:
        if not _TOKEN.match(header):
            raise self._config_error(f"{kind}.NAME needs a valid HTTP header name, got {header!r}")
        lower = header.lower()
        if lower in _RESERVED_HEADERS or lower.startswith("x-se-bridge-") or lower == EVENT_GRID_KEY_HEADER:
            raise self._config_error(f"header {header} is set by the sink and cannot be configured")
        if any(h.lower() == lower for h in (*self._static_headers, *self._secret_headers)):
            raise self._config_error(f"header {header} is configured twice")
        if kind == "header":
            if _SENSITIVE_HEADER.search(header):
                raise self._config_error(
                    f"header {header} looks like a credential and the spec is logged: put the value in "
                    f"an environment variable and give header_env.{header}=VARIABLE (or header_file.{header}"
                    "=/path)"
                )
            _check_header_value(header, value, self._config_error)
            self._static_headers[header] = value
        else:
            env, path = (value, None) if kind == "header_env" else (None, value)
            ref = SecretRef(f"{kind}.{header}", env=env, path=path, what=f"header {header}")
            self._secret_headers[header] = ref.checked(self._owner, strict=False)

    # -- life cycle ----------------------------------------------------------------------------------

    def open(self) -> None:
        """Read the secrets and check the CA bundle (all permanent when wrong); no network: a webhook
        has nothing to handshake with before the first record, and an unreachable one is transient."""
        if self._session is not None:
            return
        headers = {"User-Agent": f"se-bridge/{__version__}", "Accept": "*/*", **self._static_headers}
        secrets: list[str] = []
        for header, ref in self._secret_headers.items():
            value = ref.resolve(self._owner)
            _check_header_value(header, value, self._config_error)
            headers[header] = value
            secrets.append(value)
        if self._aeg_source is not None:
            key = self._aeg_source.resolve(self._owner)
            _check_header_value(EVENT_GRID_KEY_HEADER, key, self._config_error)
            headers[EVENT_GRID_KEY_HEADER] = key
            secrets.append(key)
        hmac_key = None
        if self._hmac_source is not None:
            hmac_key = self._hmac_source.resolve(self._owner).encode()
            if len(hmac_key) < MIN_HMAC_KEY_BYTES:
                raise self._config_error(
                    f"HMAC key is {len(hmac_key)} bytes, at least {MIN_HMAC_KEY_BYTES} are needed "
                    "(e.g. openssl rand -hex 32)"
                )
            secrets.append(hmac_key.decode())
        if self.ca_file is not None:
            try:
                ssl.create_default_context(cafile=self.ca_file)
            except FileNotFoundError:
                raise self._config_error(f"ca_file {self.ca_file} does not exist") from None
            except (OSError, ssl.SSLError) as exc:
                raise self._config_error(f"ca_file {self.ca_file} is not a PEM CA bundle: {exc}") from None
        session = requests.Session()
        session.trust_env = True  # HTTPS_PROXY / NO_PROXY / REQUESTS_CA_BUNDLE apply to webhooks
        adapter = requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=1, max_retries=0)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        self._headers = headers
        self._hmac_key = hmac_key
        # Short values (a flag, a tenant number) would mask innocent text: only credential-sized ones.
        words = [w for value in secrets for w in value.split()]  # "Bearer <token>" -> also "<token>"
        found = {v for v in (*self._url_secrets, *secrets, *words) if len(v) >= MIN_SCRUB_CHARS}
        self._secrets = sorted(found, key=len, reverse=True)
        self._session = session

    def close(self, timeout: float = 5.0) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    # -- delivery ------------------------------------------------------------------------------------

    def encode(self, entry: Entry) -> tuple[bytes, str] | None:
        """The request body and its content type for ``entry`` in the configured format; None for a
        record a chat format does not post (bridge.sinks.chat)."""
        if self.format == "json":
            return entry.payload, CONTENT_TYPE
        if self.format in CHAT_FORMATS:
            record = self._reader.read_bytes(entry.payload)
            if record is None or isinstance(record, Refused):
                return None  # counted and logged by the reader: not a record a person reads
            body = chat_body(record, self.format, self.chat)
            return None if body is None else (body, CONTENT_TYPE)
        meta = entry.meta
        name = meta.vm_name or meta.vm_id or "unknown"
        source = meta.resource_id or f"/se-bridge/vm/{quote(name, safe='')}"
        observed_at = meta.observed_at
        data = orjson.Fragment(entry.payload)  # the durable bytes, not a re-encoding
        if self.format == "cloudevents":
            event: dict[str, Any] = {
                "specversion": "1.0",
                "id": entry.record_id,
                "source": source,
                "type": EVENT_TYPE,
                "subject": name,
                "datacontenttype": CONTENT_TYPE,
            }
            if observed_at:
                event["time"] = observed_at
            event["data"] = data
            return orjson.dumps(event), CLOUDEVENTS_CONTENT_TYPE
        grid_event = {
            "id": entry.record_id,
            "eventType": EVENT_TYPE,
            # Event Grid has no `source`: subscribers filter on subject prefixes, and the resource id
            # lets them select a subscription or resource group.
            "subject": source,
            "eventTime": observed_at or _now_rfc3339(),
            "data": data,
            "dataVersion": str(meta.schema_version),
        }
        return orjson.dumps([grid_event]), CONTENT_TYPE

    def sign(self, body: bytes, timestamp: int | None = None) -> dict[str, str]:
        """The signature headers for ``body`` (empty without an HMAC key). See docs/sink-webhook.md."""
        if self._hmac_key is None:
            return {}
        ts = str(int(time.time()) if timestamp is None else timestamp)
        digest = hmac.new(self._hmac_key, ts.encode() + b"." + body, hashlib.sha256).hexdigest()
        return {TIMESTAMP_HEADER: ts, SIGNATURE_HEADER: f"sha256={digest}"}

    def deliver(self, entry: Entry) -> None:
        if self._session is None:
            self.open()
        encoded = self.encode(entry)
        if encoded is None:
            return  # nothing a person needs to read: acknowledged without a post
        body, content_type = encoded
        headers = {**self._headers, "Content-Type": content_type, RECORD_ID_HEADER: entry.record_id}
        try:
            try:
                status, answer_headers, answer = self._post(body, headers)
            except requests.RequestException as err:
                if not _dropped_before_answer(err):
                    raise
                # Most likely a kept-alive connection the server closed while idle: once more, at once,
                # on a new connection (the failed one was discarded).
                status, answer_headers, answer = self._post(body, headers)
        except requests.RequestException as err:
            raise self._transport_error(err) from None
        if 200 <= status < 300:
            return
        raise self._status_error(status, answer_headers, answer)

    def _post(
        self, body: bytes, headers: dict[str, str]
    ) -> tuple[int, requests.structures.CaseInsensitiveDict[str], bytes]:
        assert self._session is not None
        headers.update(self.sign(body))  # each attempt signed anew
        response = self._session.post(
            self.url,
            data=body,
            headers=headers,
            timeout=self.timeout,
            verify=self.ca_file or True,
            proxies=self._proxies(),
            allow_redirects=False,
            stream=True,
        )
        answer = bytearray()
        try:
            # The status decides; a body cut short after it (or a huge one) only costs the connection.
            for chunk in response.iter_content(8192):
                answer += chunk
                if len(answer) >= MAX_ANSWER_BYTES:
                    break
        except requests.RequestException:
            pass
        finally:
            response.close()
        return response.status_code, response.headers, bytes(answer)

    def _proxies(self) -> dict[str, str]:
        if self.proxy:
            return {"http": self.proxy, "https": self.proxy}
        if self.loopback:  # a proxy cannot reach this machine's loopback: never use one from the env
            return {"http": "", "https": "", "all": ""}
        return {}

    # -- errors --------------------------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:  # longest first (see _url_secrets)
            text = text.replace(secret, "***")
        return text

    def _transport_error(self, err: requests.RequestException) -> SinkError:
        reason = self._scrub(_root_cause(err))
        if isinstance(err, requests.exceptions.SSLError):
            return SinkError(f"TLS with {self.name} failed: {reason}", kind="tls")
        if isinstance(err, requests.exceptions.ProxyError):
            return SinkError(f"proxy for {self.name} failed: {reason}", kind="proxy")
        if isinstance(err, requests.Timeout) or _wraps(err, urllib3.exceptions.ReadTimeoutError):
            return SinkError(
                f"POST to {self.name} timed out after {self.timeout:g} s: {reason}", kind="timeout"
            )
        if isinstance(err, requests.ConnectionError):
            return SinkError(f"POST to {self.name} failed: {reason}", kind="connection")
        return SinkError(f"POST to {self.name} failed: {reason}", kind="request")

    def _status_error(
        self, status: int, headers: requests.structures.CaseInsensitiveDict[str], answer: bytes
    ) -> SinkError:
        excerpt = self._scrub(_excerpt(answer))
        detail = f": {excerpt}" if excerpt else ""
        if status in (408, 429) or status >= 500:
            kind = "http_5xx" if status >= 500 else f"http_{status}"
            retry_after = parse_retry_after(headers.get("Retry-After"), MAX_RETRY_AFTER)
            return SinkError(f"{self.name} answered {status}{detail}", kind=kind, retry_after=retry_after)
        if 300 <= status < 400:
            location = self._scrub(headers.get("Location", "")[:EXCERPT_CHARS])
            return SinkError(
                f"{self.name} answered {status}; redirects are not followed, configure the final URL. "
                f"Location: {location or '-'}",
                kind="http_3xx",
                retryable=False,
            )
        return SinkError(
            f"{self.name} refused the record with {status}{detail}", kind=f"http_{status}", retryable=False
        )


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------


def display_name(spec: str) -> str:
    """How a webhook sink is shown: ``scheme://host[:port]/<hidden:fingerprint>``, the fingerprint
    the first 8 hex digits of the SHA-256 of the whole spec (two sinks to one host stay apart; a
    rotated token shows as another fingerprint). Path, query, user info and options never appear."""
    parts = urlsplit(spec.strip())
    try:
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        host, port = "?", ""
    host = f"[{host}]" if ":" in host else host
    fingerprint = hashlib.sha256(spec.strip().encode()).hexdigest()[:8]
    return f"{(parts.scheme or '?').lower()}://{host}{port}/<hidden:{fingerprint}>"


def _url_secrets(parts: SplitResult) -> list[str]:
    """What of the target URL must never appear in a message, raw and decoded: its path and query
    whole (an HTTP library's error names the URL it failed on), every path segment and query value
    long enough to be a token (a server may echo one alone), the password, and what :func:`redact`
    recognises. Longest first, so a value is never half-replaced."""
    found: set[str] = set()
    if parts.password:
        found.add(parts.password)
    url = urlunsplit((parts.scheme, parts.netloc, parts.path, parts.query, ""))
    pieces = [*secrets_in(url), parts.path, parts.query, f"{parts.path}?{parts.query}" if parts.query else ""]
    pieces += [segment for segment in parts.path.split("/") if len(segment) >= MIN_SCRUB_CHARS]
    pieces += [value for _, value in parse_qsl(parts.query) if len(value) >= MIN_SCRUB_CHARS]
    for value in pieces:
        for v in (value, *value.split("/")):
            found.update((v, unquote(v), unquote_plus(v)))
    found.discard("")
    found.discard("/")
    return sorted(found, key=len, reverse=True)


def _check_header_value(header: str, value: str, error: Callable[[str], SinkError]) -> None:
    if any(c in value for c in "\r\n\0"):
        raise error(f"the value of header {header} contains a line break")
    try:
        value.encode("latin-1")  # what HTTP/1.1 header values can carry (http.client encodes so)
    except UnicodeEncodeError:
        raise error(f"the value of header {header} has characters HTTP headers cannot carry") from None


def _dropped_before_answer(err: requests.RequestException) -> bool:
    """The connection broke after the request was sent and before any byte of an answer (the server
    closed an idle kept-alive connection, or reset it): worth one immediate try on a new one."""
    return (
        isinstance(err, requests.ConnectionError)
        and not isinstance(err, requests.exceptions.SSLError | requests.exceptions.ProxyError)
        and _wraps(err, urllib3.exceptions.ProtocolError)
    )


def _wraps(err: BaseException, cls: type[BaseException]) -> bool:
    return bool(err.args) and isinstance(err.args[0], cls)


def _root_cause(err: BaseException) -> str:
    """The innermost exception's text: ``Connection refused``, not three layers of pool wrappers that
    repeat the URL."""
    seen: set[int] = set()
    current: BaseException = err
    while id(current) not in seen:
        seen.add(id(current))
        nxt = getattr(current, "reason", None)
        if not isinstance(nxt, BaseException):
            nxt = current.__cause__
        if (
            not isinstance(nxt, BaseException)
            and current.args
            and isinstance(current.args[-1], BaseException)
        ):
            nxt = current.args[-1]
        if not isinstance(nxt, BaseException):
            break
        current = nxt
    text = str(current) or type(current).__name__
    return f"{type(current).__name__}: {text}"[: EXCERPT_CHARS * 2]


def _excerpt(answer: bytes) -> str:
    text = answer[: EXCERPT_CHARS * 4].decode("utf-8", "replace")
    text = re.sub(r"[\x00-\x1f\x7f]+", " ", text)
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1] + "…"


def _now_rfc3339() -> str:
    from bridge.support.timeutil import rfc3339

    return rfc3339(time.time())
