"""HTTP client for IMDS: one persistent connection, no proxy, the IMDS request budget respected.

Why ``http.client`` and not ``requests`` here: the poll path runs once a second on every VM of a
fleet, so it is the hot path of the whole product. A single kept-alive ``HTTPConnection`` costs a
fraction of the CPU of a ``requests`` call, and it cannot be routed through a proxy by an
``HTTP_PROXY`` variable (IMDS requests must never go through a proxy; ``requests`` honours the
environment unless told not to). ``X-Forwarded-For`` is never sent: IMDS rejects it.

Timeouts: the very first request may take up to two minutes (Scheduled Events switches itself on at
the first call, and switches off again after 24 h without one), so it gets ``first_timeout``; after
that IMDS answers in milliseconds and a short ``timeout`` detects a hung connection quickly.

The timeout is a deadline for the **whole exchange** (connect, request, status line, headers, body),
not a per-``recv`` limit: a socket timeout alone restarts with every byte, so an endpoint on
169.254.169.254 that answers one byte per second would hold the poll forever and ``/readyz`` would
keep saying ready. The deadline costs no thread and no wake-up: the connection's socket
(:class:`_DeadlineSocket`) checks the time left before each ``recv``/``send`` and lowers its own
timeout as the deadline approaches. The answer is also capped at :data:`MAX_ANSWER_BYTES`, so a
hostile endpoint cannot make the agent buffer without bound.

Errors are raised as :class:`ImdsError` with a bounded ``kind`` (metric label) and never end the
process; callers decide when to try again (see :mod:`bridge.agent.poller`).
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

from bridge import __version__
from bridge.errors import BridgeError
from bridge.imds.document import DEFAULT_API_VERSION
from bridge.imds.instance import INSTANCE_API_VERSION
from bridge.support.retry import Backoff, parse_retry_after

DEFAULT_IMDS_URL = "http://169.254.169.254"
#: The longest wait a ``Retry-After`` from IMDS can impose (docs/operations.md: "never longer than
#: 10 s": a Spot eviction gives 30 s of notice).
IMDS_MAX_RETRY_AFTER = 10.0
SCHEDULED_EVENTS_PATH = "/metadata/scheduledevents"
INSTANCE_PATH = "/metadata/instance"
#: The largest answer body accepted. A Scheduled Events document is a few KB (instance metadata a few
#: more); anything near this is not IMDS, and buffering it without a bound would let whatever answers
#: on 169.254.169.254 exhaust the agent's memory.
MAX_ANSWER_BYTES = 1 << 20
#: How far the socket's own timeout may drift from the time left before the deadline before it is set
#: again. Setting it is a syscall (``ioctl(FIONBIO)`` in CPython), so a normal exchange, whose reads
#: all come within microseconds of the request, never pays it; a trickling one is cut off at most this
#: much after (or before) its deadline.
DEADLINE_SLACK = 0.05


class ImdsError(BridgeError):
    """An IMDS request that did not produce a 2xx answer.

    ``kind`` is one of: ``timeout``, ``connection``, ``http_400``, ``http_404``, ``http_405``,
    ``http_410``, ``http_429``, ``http_5xx``, ``http_other``. ``timeout`` means the whole exchange
    did not finish within the operation's timeout (a silent *or* a trickling endpoint);
    ``http_other`` also covers an answer larger than :data:`MAX_ANSWER_BYTES`. ``retryable`` follows
    IMDS's documentation: timeouts, connection failures, 410, 429 and 5xx.
    """

    def __init__(self, kind: str, message: str, status: int | None = None, retry_after: float | None = None):
        super().__init__(message, kind=kind, retryable=kind in RETRYABLE_KINDS, retry_after=retry_after)
        self.status = status


RETRYABLE_KINDS = frozenset({"timeout", "connection", "http_410", "http_429", "http_5xx"})


@dataclass(frozen=True, slots=True)
class ImdsResponse:
    status: int
    body: bytes
    received_at: float  # wall clock, for observedAt
    received_mono: float  # monotonic, for latency measurements


#: IMDS's own limit: about 5 requests per second for the whole VM (docs/operations.md).
IMDS_LIMIT = 5


class RateLimiter:
    """The agent's IMDS budget: ``rate`` requests in any window of ``WINDOW`` seconds, StartRequests
    first, and never more than IMDS's own limit.

    IMDS counts requests in any one-second window (about 5 per VM for all of IMDS) and the agent shares
    that budget with every other IMDS user on the VM. The agent's default rate (``imds_max_rps``, 4)
    keeps a margin below the limit, and the window is a little longer than IMDS's (``WINDOW``) for the
    jitter between our clock and IMDS's. Requests are also paced ``WINDOW / rate`` apart (262 ms at
    4/s): four requests at once would leave the next one waiting a whole window, and an approval
    arriving then would wait a second for its POST; paced, it waits at most one slot (issue 19).
    Below 1 per second the requests are spaced ``1/rate`` apart.

    ``priority`` requests (StartRequests: an approval waits on them, a poll only repeats what the
    next poll sees anyway) take the next free slot before any waiting ordinary request, and are paced
    and counted only against each other: a StartRequest right after a poll goes at once, and the
    budget is theirs whole while they stream. An ordinary request (a poll) uses what they leave; one
    that has waited ``STARVED`` seconds behind them goes anyway, *beside* them: it is the one request
    over the budget that IMDS's own limit still allows (``ceiling``: ``rate`` + 1, at most
    :data:`IMDS_LIMIT`). So a stream of approvals neither stops the polls nor loses a slot to them:
    each decision waits at most one slot (issue 19 item 4). The price, only while StartRequests use
    the whole budget, is the margin: one request in ``STARVED`` seconds over ``rate``, still within
    IMDS's 5 a second (docs/performance.md). At ``rate`` 5 there is no room beside the budget, and a
    starved poll takes a StartRequest's slot instead.
    """

    WINDOW = 1.05
    STARVED = 2.0  # seconds a poll waits at most behind StartRequests

    def __init__(self, rate: float) -> None:
        self._cap = int(rate) if rate >= 1 else 1
        self._ceiling = max(self._cap, min(self._cap + 1, IMDS_LIMIT))
        self._window = self.WINDOW if rate >= 1 else (1.0 / rate if rate > 0 else 0.0)
        self._spacing = self._window / self._cap
        self._sent: deque[tuple[float, bool]] = deque()  # (when, priority) within the last window
        self._last_priority: float | None = None
        self._urgent = 0  # priority requests waiting for a slot
        self._cond = threading.Condition()

    def acquire(self, priority: bool = False) -> None:
        if not self._window:
            return
        with self._cond:
            if priority:
                self._urgent += 1
            since = time.monotonic()
            try:
                while True:
                    now = time.monotonic()
                    starved = now - since >= self.STARVED
                    if not priority and self._urgent and not starved:
                        self._cond.wait(self.STARVED - (now - since))
                        continue
                    wait = self._wait(now, priority, starved)
                    if wait <= 0:
                        self._record(now, priority)
                        return
                    self._cond.wait(wait)
            finally:
                if priority:
                    self._urgent -= 1
                    self._cond.notify_all()

    def _wait(self, now: float, priority: bool = False, starved: bool = False) -> float:
        """Seconds until a request may go (0: now)."""
        self._expire(now)
        sent = self._sent
        until_ceiling = sent[0][0] + self._window - now if len(sent) >= self._ceiling else 0.0
        if priority:
            paced = self._last_priority + self._spacing - now if self._last_priority is not None else 0.0
            priority_sent = [when for when, is_priority in sent if is_priority]  # at most ``ceiling``
            if len(priority_sent) >= self._cap:
                paced = max(paced, priority_sent[-self._cap] + self._window - now)
            return max(0.0, paced, until_ceiling)
        if starved and self._ceiling > self._cap:
            return max(0.0, until_ceiling)  # beside the StartRequests, within IMDS's own limit
        paced = sent[-1][0] + self._spacing - now if sent else 0.0
        if len(sent) >= self._cap:
            paced = max(paced, sent[len(sent) - self._cap][0] + self._window - now)
        return max(0.0, paced)

    def _expire(self, now: float) -> None:
        sent = self._sent
        while sent and now - sent[0][0] >= self._window:
            sent.popleft()

    def _record(self, now: float, priority: bool) -> None:
        self._sent.append((now, priority))
        if priority:
            self._last_priority = now


class ImdsClient:
    """GET and POST Scheduled Events, GET instance metadata, over one kept-alive connection."""

    def __init__(
        self,
        base_url: str = DEFAULT_IMDS_URL,
        api_version: str = DEFAULT_API_VERSION,
        *,
        timeout: float = 5.0,
        first_timeout: float = 120.0,
        max_rps: float = 4.0,
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
        self._conn: _DeadlineConnection | None = None
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

    def wait_for_slot(self) -> None:
        """Take the next request slot of the IMDS budget now, for a StartRequests POST that will say
        ``reserved=True`` (a caller gathers what to post while it waits)."""
        self._limiter.acquire(priority=True)

    def post_start_requests(
        self, event_ids: Iterable[str], *, deadline: float = 30.0, reserved: bool = False
    ) -> ImdsResponse:
        """Approve events (``StartRequests``), retrying transient answers until ``deadline`` seconds.
        ``reserved``: the first attempt uses the slot :meth:`wait_for_slot` took.

        IMDS answers 200 for any valid EventId, even one another VM already approved, so a retry
        after a lost answer is harmless. A 400 (malformed) is not retried.
        """
        body = orjson.dumps({"StartRequests": [{"EventId": e} for e in event_ids]})
        path = f"{self._prefix}{SCHEDULED_EVENTS_PATH}?api-version={self.api_version}"
        backoff = Backoff(base=0.25, cap=5.0, max_retry_after=IMDS_MAX_RETRY_AFTER)
        give_up = time.monotonic() + deadline
        while True:
            try:
                return self._request("POST", path, body, "post_start_requests", slot_taken=reserved)
            except ImdsError as err:
                reserved = False  # a retry waits for a slot of its own
                delay = backoff.next_delay(err.retry_after)
                if not err.retryable or time.monotonic() + delay > give_up:
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

    def _request(
        self, method: str, path: str, body: bytes | None, op: str, *, slot_taken: bool = False
    ) -> ImdsResponse:
        if not slot_taken:
            self._limiter.acquire(priority=method == "POST")
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
        # One deadline for the whole request, retry on a stale keep-alive included: ``timeout`` bounds
        # how long the poll loop can be held, whatever the endpoint does.
        deadline = time.monotonic() + timeout
        for attempt in (1, 2):
            conn = self._connection(deadline)
            r: http.client.HTTPResponse | None = None
            try:
                conn.request(method, path, body=body, headers=headers)
                r = conn.getresponse()
                length = r.length  # Content-Length; None when chunked or delimited by the close
                if length is not None and length > MAX_ANSWER_BYTES:
                    raise _TooLarge(f"Content-Length: {length}")
                # A known length is read in one go (the normal IMDS answer: the hot path is unchanged);
                # otherwise one byte more than the cap tells "too large" from "just fits".
                data = r.read() if length is not None else r.read(MAX_ANSWER_BYTES + 1)
                if len(data) > MAX_ANSWER_BYTES:
                    raise _TooLarge("no Content-Length, and more was sent")
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
                self._drop(r)
                # A kept-alive connection the server closed while idle fails on first use; that is
                # not an IMDS failure, so try once more on a fresh connection.
                if attempt == 1 and reused:
                    continue
                raise ImdsError("connection", f"IMDS connection failed: {exc.__class__.__name__}") from None
            except TimeoutError:
                self._drop(r)
                raise ImdsError("timeout", f"IMDS did not answer completely within {timeout:g} s") from None
            except _TooLarge as exc:
                self._drop(r)  # the rest of the answer is never read: the connection is unusable
                raise ImdsError(
                    "http_other", f"IMDS answer larger than {MAX_ANSWER_BYTES} bytes ({exc}); refused"
                ) from None
            except (OSError, http.client.HTTPException) as exc:
                self._drop(r)
                raise ImdsError(
                    "connection", f"IMDS request failed: {exc.__class__.__name__}: {exc}"
                ) from None
        raise AssertionError("unreachable")

    def _connection(self, deadline: float) -> _DeadlineConnection:
        conn = self._conn
        if conn is None:
            conn = self._conn = _DeadlineConnection(self._host, self._port)
        conn.set_deadline(deadline)
        return conn

    def _drop(self, response: http.client.HTTPResponse | None = None) -> None:
        """Close the connection, and the answer being read if any.

        An answer the server delimits by closing the connection owns the socket (``http.client``
        hands it over), so closing the connection alone would leave it open, still receiving, until
        the answer object is collected: a failed read must close both.
        """
        if response is not None:
            response.close()
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class _TooLarge(Exception):
    """An answer over :data:`MAX_ANSWER_BYTES` (internal: becomes an :class:`ImdsError`)."""


# The base methods, looked up once: ``super()`` and attribute lookups are a measurable share of the few
# hundred nanoseconds each checked call adds to a poll (see _DeadlineSocket).
_monotonic = time.monotonic
_base_recv_into = socket.socket.recv_into
_base_recv = socket.socket.recv
_base_sendall = socket.socket.sendall
_base_send = socket.socket.send


class _DeadlineSocket(socket.socket):
    """A socket whose every ``recv``/``send`` ends by ``deadline`` (``time.monotonic()``), in total.

    ``http.client`` reads through ``sock.makefile()``, whose raw reads call ``recv_into`` on this
    object, so checking here covers the status line, the headers and the body alike; it sends with
    ``sendall``. A normal poll makes one call of each. Before each call: one clock read and two
    comparisons; the socket's timeout is set again (a syscall) only when it is more than
    :data:`DEADLINE_SLACK` away from the time left, which in a normal exchange it never is (every
    read comes within microseconds of the request).
    """

    __slots__ = ("_armed", "deadline")

    deadline: float
    _armed: float  # the timeout currently set on the socket

    def _arm(self) -> None:
        left = self.deadline - _monotonic()
        if left <= 0.0:
            raise TimeoutError("IMDS answer deadline passed")
        if not -DEADLINE_SLACK <= left - self._armed <= DEADLINE_SLACK:
            self.settimeout(left)
            self._armed = left

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        self._arm()
        return _base_recv_into(self, buffer, nbytes, flags)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self._arm()
        return _base_recv(self, bufsize, flags)

    def sendall(self, data: Any, flags: int = 0) -> None:
        self._arm()
        _base_sendall(self, data, flags)

    def send(self, data: Any, flags: int = 0) -> int:
        self._arm()
        return _base_send(self, data, flags)


class _DeadlineConnection(http.client.HTTPConnection):
    """``HTTPConnection`` on a :class:`_DeadlineSocket`, connected within the request's deadline.

    ``http.client`` has no hook for the socket class, so ``connect`` is replaced: the stdlib's
    ``create_connection`` (address resolution, error handling) opens the socket, whose descriptor is
    then adopted by a :class:`_DeadlineSocket` (no new connection, no extra round trip).
    """

    sock: _DeadlineSocket | None  # only ``connect`` below creates it
    source_address: tuple[str, int] | None  # set by HTTPConnection.__init__ (typeshed omits it)

    def __init__(self, host: str, port: int) -> None:
        super().__init__(host, port)
        self.deadline = 0.0

    def set_deadline(self, deadline: float) -> None:
        self.deadline = deadline
        sock = self.sock
        if sock is not None:
            sock.deadline = deadline

    def connect(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0.0:
            raise TimeoutError("IMDS answer deadline passed")
        plain = socket.create_connection((self.host, self.port), left, self.source_address)
        sock = _DeadlineSocket(plain.family, plain.type, plain.proto, plain.detach())
        sock.deadline = self.deadline
        sock._armed = left
        try:
            # The adopted descriptor is non-blocking already; this puts the object in step with it.
            sock.settimeout(left)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as HTTPConnection.connect
        except OSError:
            sock.close()
            raise
        self.sock = sock


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
