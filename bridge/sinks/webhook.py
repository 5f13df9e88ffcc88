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

The sink is four modules, one concern each: :mod:`.webhook_options` (the spec, read once),
:mod:`.webhook_formats` (what is POSTed), :mod:`.webhook_signing` (the signature headers),
:mod:`.webhook_errors` (how a failure is classified); this one opens the session and delivers.
"""

from __future__ import annotations

import ssl

import requests

from bridge import __version__
from bridge.pipeline import Entry, SynchronousSink
from bridge.sinks.webhook_errors import MAX_RETRY_AFTER, dropped_before_answer, status_error, transport_error
from bridge.sinks.webhook_formats import EVENT_TYPE, FORMATS, WebhookFormat
from bridge.sinks.webhook_options import (
    EVENT_GRID_KEY_HEADER,
    MIN_SCRUB_CHARS,
    WebhookOptions,
    check_header_value,
    display_name,
)
from bridge.sinks.webhook_signing import MIN_HMAC_KEY_BYTES, sign

__all__ = ["EVENT_TYPE", "FORMATS", "MAX_RETRY_AFTER", "WebhookSink", "display_name"]

#: How much of an answer is read (enough for any error body; a bigger body is cut and the connection
#: dropped rather than reused).
MAX_ANSWER_BYTES = 64 * 1024
RECORD_ID_HEADER = "X-SE-Bridge-Record-Id"


class WebhookSink(SynchronousSink):
    """POST one record per request over one kept-alive ``requests.Session``."""

    scheme = "https"

    def __init__(self, spec: str) -> None:
        options = WebhookOptions(spec)
        # The sink id carries the real scheme (http-... / https-...): two sinks that differ only by it
        # are two destinations.
        self.scheme = options.scheme
        super().__init__(spec)
        self.options = options
        self.name = options.name
        self.host, self.port, self.loopback, self.url = (
            options.host,
            options.port,
            options.loopback,
            options.url,
        )
        self.format, self.timeout, self.allow_http = options.format, options.timeout, options.allow_http
        self.ca_file, self.proxy, self.chat = options.ca_file, options.proxy, options.chat
        self._format = WebhookFormat(options.format, options.chat)
        self._session: requests.Session | None = None
        self._headers: dict[str, str] = {}
        self._hmac_key: bytes | None = None
        self._url_secrets = options.url_secrets
        self._secrets: list[str] = [v for v in self._url_secrets if len(v) >= MIN_SCRUB_CHARS]
        self._config_error = options.error
        self._owner = options.owner

    # -- life cycle ----------------------------------------------------------------------------------

    def open(self) -> None:
        """Read the secrets and check the CA bundle (all permanent when wrong); no network: a webhook
        has nothing to handshake with before the first record, and an unreachable one is transient."""
        if self._session is not None:
            return
        headers = {"User-Agent": f"se-bridge/{__version__}", "Accept": "*/*", **self.options.static_headers}
        secrets: list[str] = []
        for header, ref in self.options.secret_headers.items():
            value = ref.resolve(self._owner)
            check_header_value(header, value, self._config_error)
            headers[header] = value
            secrets.append(value)
        if self.options.aeg_source is not None:
            key = self.options.aeg_source.resolve(self._owner)
            check_header_value(EVENT_GRID_KEY_HEADER, key, self._config_error)
            headers[EVENT_GRID_KEY_HEADER] = key
            secrets.append(key)
        hmac_key = None
        if self.options.hmac_source is not None:
            hmac_key = self.options.hmac_source.resolve(self._owner).encode()
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
        """The request body and its content type for ``entry`` (bridge.sinks.webhook_formats)."""
        return self._format.encode(entry)

    def sign(self, body: bytes, timestamp: int | None = None) -> dict[str, str]:
        """The signature headers for ``body`` (empty without an HMAC key). See docs/sink-webhook.md."""
        return {} if self._hmac_key is None else sign(self._hmac_key, body, timestamp)

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
                if not dropped_before_answer(err):
                    raise
                # Most likely a kept-alive connection the server closed while idle: once more, at once,
                # on a new connection (the failed one was discarded).
                status, answer_headers, answer = self._post(body, headers)
        except requests.RequestException as err:
            raise transport_error(err, self.name, self.timeout, self._scrub) from None
        if 200 <= status < 300:
            return
        raise status_error(status, answer_headers, answer, self.name, self._scrub)

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
