"""HTTP client for IMDS: one persistent connection, no proxy, the IMDS request budget respected.

Why ``http.client`` and not ``requests`` here: the poll path runs once a second on every VM of a
fleet, so it is the hot path of the whole product. A single kept-alive ``HTTPConnection`` costs a
fraction of the CPU of a ``requests`` call, and it cannot be routed through a proxy by an
``HTTP_PROXY`` variable (IMDS requests must never go through a proxy; ``requests`` honours the
environment unless told not to). ``X-Forwarded-For`` is never sent: IMDS rejects it.

Timeouts: the very first request may take up to two minutes (Scheduled Events switches itself on at
the first call, and switches off again after 24 h without one), so it gets ``first_timeout``; after
that IMDS answers in milliseconds and a short ``timeout`` detects a hung connection quickly.

Errors are raised as :class:`ImdsError` with a bounded ``kind`` (metric label) and never end the
process; callers decide when to try again (see :mod:`bridge.agent.poller`).
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

from bridge import __version__
from bridge.imds.document import DEFAULT_API_VERSION
from bridge.imds.instance import INSTANCE_API_VERSION
from bridge.retry import Backoff, parse_retry_after

DEFAULT_IMDS_URL = "http://169.254.169.254"
#: The longest wait a ``Retry-After`` from IMDS can impose (docs/operations.md: "never longer than
#: 10 s": a Spot eviction gives 30 s of notice).
IMDS_MAX_RETRY_AFTER = 10.0
SCHEDULED_EVENTS_PATH = "/metadata/scheduledevents"
INSTANCE_PATH = "/metadata/instance"


class ImdsError(Exception):
    """An IMDS request that did not produce a 2xx answer.

    ``kind`` is one of: ``timeout``, ``connection``, ``http_400``, ``http_404``, ``http_405``,
    ``http_410``, ``http_429``, ``http_5xx``, ``http_other``.
    """

    def __init__(self, kind: str, message: str, status: int | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.retry_after = retry_after

    @property
    def transient(self) -> bool:
        """True when trying again later can succeed (IMDS's documented retryable answers)."""
        return self.kind in {"timeout", "connection", "http_410", "http_429", "http_5xx"}


@dataclass(frozen=True, slots=True)
class ImdsResponse:
    status: int
    body: bytes
    received_at: float  # wall clock, for observedAt
    received_mono: float  # monotonic, for latency measurements


class RateLimiter:
    """Spaces requests at least ``1/rate`` seconds apart (IMDS allows ~5 requests/s per VM in all).

    A strict spacing rather than a bursty token bucket: IMDS counts requests in any one-second window,
    and the agent shares that budget with every other IMDS user on the VM.
    """

    def __init__(self, rate: float) -> None:
        self._interval = 1.0 / rate if rate > 0 else 0.0
        self._next = 0.0
        self._lock = threading.Lock()

    def acquire(self) -> None:
        if not self._interval:
            return
        with self._lock:
            now = time.monotonic()
            wait = self._next - now
            if wait > 0:
                time.sleep(wait)
                now += wait
            self._next = now + self._interval


class ImdsClient:
    """GET and POST Scheduled Events, GET instance metadata, over one kept-alive connection."""

    def __init__(
        self,
        base_url: str = DEFAULT_IMDS_URL,
        api_version: str = DEFAULT_API_VERSION,
        *,
        timeout: float = 5.0,
        first_timeout: float = 120.0,
        max_rps: float = 5.0,
        metrics: Any = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"IMDS URL must be http://host[:port], got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.api_version = api_version
        self._host = parts.hostname
        self._port = parts.port or 80
        self._prefix = parts.path.rstrip("/")
        self._timeout = timeout
        self._first_timeout = first_timeout
        self._awake: set[str] = set()  # operations that have answered once
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()
        self._limiter = RateLimiter(max_rps)
        self._metrics = metrics
        self._metric_children: dict[str, tuple[Any, Any]] = {}
        self._events_path = f"{self._prefix}{SCHEDULED_EVENTS_PATH}?api-version={api_version}"
        self._headers = {
            "Metadata": "true",
            "Accept": "application/json",
            "User-Agent": f"se-bridge/{__version__}",
        }

    # -- public operations ----------------------------------------------------------------------

    def get_scheduled_events(self) -> ImdsResponse:
        """One poll. Returns the 200 answer; raises :class:`ImdsError` for anything else."""
        return self._request("GET", self._events_path, None, "get_events")

    def post_start_requests(self, event_ids: Iterable[str], *, deadline: float = 30.0) -> ImdsResponse:
        """Approve events (``StartRequests``), retrying transient answers until ``deadline`` seconds.

        IMDS answers 200 for any valid EventId, even one another VM already approved, so a retry
        after a lost answer is harmless. A 400 (malformed) is not retried.
        """
        body = orjson.dumps({"StartRequests": [{"EventId": e} for e in event_ids]})
        path = f"{self._prefix}{SCHEDULED_EVENTS_PATH}?api-version={self.api_version}"
        backoff = Backoff(base=0.25, cap=5.0, max_retry_after=IMDS_MAX_RETRY_AFTER)
        give_up = time.monotonic() + deadline
        while True:
            try:
                return self._request("POST", path, body, "post_start_requests")
            except ImdsError as err:
                delay = backoff.next_delay(err.retry_after)
                if not err.transient or time.monotonic() + delay > give_up:
                    raise
                time.sleep(delay)

    def get_instance(self) -> Any:
        """Instance metadata (JSON), for the VM identity."""
        resp = self._request(
            "GET", f"{self._prefix}{INSTANCE_PATH}?api-version={INSTANCE_API_VERSION}", None, "get_instance"
        )
        try:
            return orjson.loads(resp.body)
        except orjson.JSONDecodeError as exc:
            raise ImdsError("http_other", f"instance metadata is not JSON: {exc}") from None

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _series(self, op: str) -> tuple[Any, Any]:
        """The labelled metric children of an operation, looked up once (this is the poll path)."""
        series = self._metric_children.get(op)
        if series is None:
            series = (self._metrics.imds_requests.labels(op), self._metrics.imds_latency.labels(op))
            self._metric_children[op] = series
        return series

    # -- transport ------------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: bytes | None, op: str) -> ImdsResponse:
        self._limiter.acquire()
        with self._lock:
            started = time.monotonic()
            try:
                # Each IMDS service wakes up on its first call (Scheduled Events may take two minutes):
                # an operation gets the long timeout until it has answered once.
                timeout = self._timeout if op in self._awake else max(self._first_timeout, self._timeout)
                resp = self._exchange(method, path, body, timeout)
            finally:
                if self._metrics is not None:
                    count, latency = self._series(op)
                    count.inc()
                    latency.observe(time.monotonic() - started)
        if 200 <= resp.status < 300:
            self._awake.add(op)
            return resp
        raise _http_error(resp)

    def _exchange(self, method: str, path: str, body: bytes | None, timeout: float) -> ImdsResponse:
        headers = self._headers if body is None else {**self._headers, "Content-Type": "application/json"}
        reused = self._conn is not None
        for attempt in (1, 2):
            conn = self._connection(timeout)
            try:
                conn.request(method, path, body=body, headers=headers)
                r = conn.getresponse()
                data = r.read()
                if r.will_close:
                    self._drop()
                return (
                    ImdsResponse(r.status, data, time.time(), time.monotonic())
                    if r.status < 300
                    else (
                        _ErrorResponse(
                            r.status, data, time.time(), time.monotonic(), r.getheader("Retry-After")
                        )
                    )
                )
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self._drop()
                # A kept-alive connection the server closed while idle fails on first use; that is
                # not an IMDS failure, so try once more on a fresh connection.
                if attempt == 1 and reused:
                    continue
                raise ImdsError("connection", f"IMDS connection failed: {exc.__class__.__name__}") from None
            except TimeoutError:
                self._drop()
                raise ImdsError("timeout", f"IMDS did not answer within {timeout:g} s") from None
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                raise ImdsError(
                    "connection", f"IMDS request failed: {exc.__class__.__name__}: {exc}"
                ) from None
        raise AssertionError("unreachable")

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        elif self._conn.timeout != timeout:
            self._conn.timeout = timeout
            if self._conn.sock is not None:
                self._conn.sock.settimeout(timeout)
        return self._conn

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


@dataclass(frozen=True, slots=True)
class _ErrorResponse(ImdsResponse):
    retry_after_header: str | None = None


def _http_error(resp: ImdsResponse) -> ImdsError:
    status = resp.status
    if status == 410:
        kind = "http_410"
    elif status == 429:
        kind = "http_429"
    elif status >= 500:
        kind = "http_5xx"
    elif status in (400, 404, 405):
        kind = f"http_{status}"
    else:
        kind = "http_other"
    retry_after = parse_retry_after(getattr(resp, "retry_after_header", None), IMDS_MAX_RETRY_AFTER)
    detail = resp.body[:200].decode("utf-8", "replace").strip()
    return ImdsError(kind, f"IMDS answered {status}: {detail}", status=status, retry_after=retry_after)
