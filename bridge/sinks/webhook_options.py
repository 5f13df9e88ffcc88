"""A webhook sink's spec, read once: the target URL exactly as given, and the options after ``#``
(never sent over HTTP), checked with a message naming the option. Secrets never come from the spec
(it is logged and a metric label): the HMAC key, the Event Grid key and secret header values come
from an environment variable or a file named in it. See :mod:`bridge.sinks.webhook` for why."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from urllib.parse import SplitResult, parse_qsl, unquote, unquote_plus, urlsplit, urlunsplit

from bridge.http.netaddr import is_loopback
from bridge.pipeline import SinkError
from bridge.sinks.base import config_error, owner
from bridge.sinks.chat import ChatOptions
from bridge.sinks.webhook_formats import FORMATS
from bridge.support.redaction import secrets_in
from bridge.transports.base import Owner
from bridge.transports.secrets import SecretRef

EVENT_GRID_KEY_HEADER = "aeg-sas-key"
DEFAULT_TIMEOUT = 10.0
MAX_TIMEOUT = 300.0
#: Secrets shorter than this are not masked in messages (a flag, a tenant number would mask innocent text).
MIN_SCRUB_CHARS = 8

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
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


class WebhookOptions:
    """The spec of one webhook sink, parsed (``name``: how the sink is shown, never the URL)."""

    def __init__(self, spec: str) -> None:
        parts = urlsplit(spec.strip())
        self.scheme = parts.scheme.lower()
        # Shown everywhere (logs, the sink_info label, errors, dead letters) as scheme, host and a
        # fingerprint: a webhook URL is a secret as a whole (Alertmanager treats it so), whatever
        # its host. The table of secret shapes stays the second line of defence for free text.
        self.name = display_name(spec)
        if self.scheme not in ("http", "https"):
            raise self.error(f"webhook sink needs an http(s):// URL, got {self.name!r}")
        try:
            host = parts.hostname
            port = parts.port
        except ValueError as exc:  # a port that is not a number
            raise self.error(f"webhook URL {self.name!r} is malformed: {exc}") from None
        if not host:
            raise self.error(f"webhook URL {self.name!r} has no host")
        self.host = host
        self.port = port
        self.loopback = is_loopback(host)
        #: What is POSTed to: the spec without its fragment, query and encoding untouched.
        self.url = urlunsplit((self.scheme, parts.netloc, parts.path or "/", parts.query, ""))

        options = self._parse_options(parts.fragment)
        self.format = options.pop("format", "json").lower()
        if self.format not in FORMATS:
            raise self.error(f"format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        self.timeout = self._parse_timeout(options.pop("timeout", None))
        self.allow_http = self._parse_bool("allow_http", options.pop("allow_http", "false"))
        if self.scheme == "http" and not (self.loopback or self.allow_http):
            raise self.error(
                f"refusing plain http:// to {host}: records and signatures would cross the network "
                "unencrypted. Use https://, or add #allow_http=true to the spec if this network is "
                "trusted (http:// is accepted without it only for loopback hosts)"
            )
        self.ca_file = self._parse_ca(options.pop("ca_file", None), options.pop("verify", None))
        self.proxy = self._parse_proxy(options.pop("proxy", None))
        try:
            self.chat = ChatOptions.take(options, self.format)
        except ValueError as exc:
            raise self.error(str(exc)) from None
        self.hmac_source = self._secret_source("hmac_key", "HMAC key", options)
        self.aeg_source = self._secret_source("aeg_key", "Event Grid key", options)
        if self.aeg_source is not None and self.format != "eventgrid":
            raise self.error("aeg_key_env/aeg_key_file only apply to format=eventgrid")
        self.static_headers: dict[str, str] = {}
        self.secret_headers: dict[str, SecretRef] = {}
        for key, value in options.items():
            kind, _, header = key.partition(".")
            self._add_header(kind, header, value)
        # Values masked in every message the sink produces, beyond what redact() recognises: a
        # server may echo the URL's `sig` (decoded, or not after `&`) or a header in its error body.
        self.url_secrets = _url_secrets(parts)

    def error(self, message: str) -> SinkError:
        """A configuration error naming this sink (its URL redacted), for the options and the sink."""
        return config_error(f"webhook sink {self.name}: {message}")

    @property
    def owner(self) -> Owner:
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
                raise self.error(
                    "options after '#' must be name=value pairs joined by '&' (%-encode '&', '#', spaces)"
                )
            pairs.append((unquote(key), unquote(value)))
        options: dict[str, str] = {}
        for key, value in pairs:
            if key in options:
                raise self.error(f"option {key!r} is given twice")
            known = key in _SIMPLE_OPTIONS or key.partition(".")[0] in ("header", "header_env", "header_file")
            if not known:
                if key.lower() in ("insecure_skip_verify", "insecure", "verify_ssl", "tls_skip_verify"):
                    raise self.error(
                        f"{key} is not offered: TLS verification stays on; for a private CA give "
                        "ca_file=/path/ca.pem"
                    )
                raise self.error(
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
            raise self.error(f"timeout must be seconds in (0, {MAX_TIMEOUT:g}], got {value!r}")
        return timeout

    def _parse_bool(self, name: str, value: str) -> bool:
        v = value.strip().lower()
        if v in _TRUE:
            return True
        if v in _FALSE:
            return False
        raise self.error(f"{name} must be true or false, got {value!r}")

    def _parse_ca(self, ca_file: str | None, verify: str | None) -> str | None:
        if verify is not None:
            v = verify.strip().lower()
            if v in _FALSE:
                raise self.error(
                    "verify=false is not offered: TLS verification stays on; for a private CA give "
                    "ca_file=/path/ca.pem"
                )
            if v not in _TRUE:
                if ca_file is not None:
                    raise self.error("give the CA bundle once: ca_file=PATH (verify=PATH is an alias)")
                ca_file = verify
        if ca_file is not None and not ca_file:
            raise self.error("ca_file is empty")
        return ca_file

    def _parse_proxy(self, proxy: str | None) -> str | None:
        if proxy is None:
            return None
        p = urlsplit(proxy)
        if p.scheme not in ("http", "https") or not p.hostname:
            raise self.error(f"proxy must be http://host:port or https://host:port, got {proxy!r}")
        if p.username or p.password:
            raise self.error(
                "proxy credentials do not belong in the spec (it is logged): set them in HTTPS_PROXY "
                "in the agent's environment instead"
            )
        return proxy

    def _secret_source(self, prefix: str, what: str, options: dict[str, str]) -> SecretRef | None:
        # Paths are taken as given (relative ones too) and variable names are not checked here: a
        # name no environment holds is refused at open(), as not set.
        env, file = options.pop(f"{prefix}_env", None), options.pop(f"{prefix}_file", None)
        return SecretRef.from_options(self.owner, prefix, env, file, what=what, strict=False)

    def _add_header(self, kind: str, header: str, value: str) -> None:
        if not _TOKEN.match(header):
            raise self.error(f"{kind}.NAME needs a valid HTTP header name, got {header!r}")
        lower = header.lower()
        if lower in _RESERVED_HEADERS or lower.startswith("x-se-bridge-") or lower == EVENT_GRID_KEY_HEADER:
            raise self.error(f"header {header} is set by the sink and cannot be configured")
        if any(h.lower() == lower for h in (*self.static_headers, *self.secret_headers)):
            raise self.error(f"header {header} is configured twice")
        if kind == "header":
            if _SENSITIVE_HEADER.search(header):
                raise self.error(
                    f"header {header} looks like a credential and the spec is logged: put the value in "
                    f"an environment variable and give header_env.{header}=VARIABLE (or header_file.{header}"
                    "=/path)"
                )
            check_header_value(header, value, self.error)
            self.static_headers[header] = value
        else:
            env, path = (value, None) if kind == "header_env" else (None, value)
            ref = SecretRef(f"{kind}.{header}", env=env, path=path, what=f"header {header}")
            self.secret_headers[header] = ref.checked(self.owner, strict=False)


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


def check_header_value(header: str, value: str, error: Callable[[str], SinkError]) -> None:
    if any(c in value for c in "\r\n\0"):
        raise error(f"the value of header {header} contains a line break")
    try:
        value.encode("latin-1")  # what HTTP/1.1 header values can carry (http.client encodes so)
    except UnicodeEncodeError:
        raise error(f"the value of header {header} has characters HTTP headers cannot carry") from None
