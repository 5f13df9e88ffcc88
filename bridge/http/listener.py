"""A small, bounded HTTP/1.1 listener for a service's API (health, metrics, the relay).

Why not ``http.server.ThreadingHTTPServer`` as it is: it starts a thread for every connection, lets
a client hold that thread as long as it sends a byte before each 30 s receive timeout (a byte every
5 s holds it forever), listens with a backlog of 5, and reads a chunked body as empty and the chunks
as a second request. An agent runs on every VM, and its relay API is what approves a reboot, so the
listener has hard bounds instead:

* **connections**: at most ``max_connections`` are served at once, each by a thread. A connection
  beyond that goes to one *triage* thread that waits at most ``triage_seconds`` for the head of its
  request, answers ``/healthz`` and ``/readyz`` itself and ``503`` to anything else, so a probe still
  gets its answer under a flood of slow clients; beyond ``triage_max`` waiting connections the
  oldest is answered ``503`` to make room (a slow client gives way to a new one, which is likelier a
  probe). So the listener never holds more than ``max_connections + triage_max + 16`` sockets. (Over TLS,
  triage cannot talk before a handshake: it closes.)
* **a deadline for the whole request** (TLS handshake, request line, headers, body), not per
  receive: a connection that has not delivered its request in time is cut. A kept-alive connection
  also gets ``idle_seconds`` to start its next request.
* **bodies** need ``Content-Length`` (at most ``max_body`` bytes); ``Transfer-Encoding`` is refused
  (411) and the connection closed, so no body byte is ever parsed as a request.
* the listen backlog is 128, so a burst of connections waits in the kernel instead of being dropped.
* **strict requests**: exactly one well-formed ``Host`` (``host[:port]``: no user info, nothing
  after it; HTTP/1.0 too), one ``Content-Length`` at most, and no query string (no route takes one,
  and a request signature covers the path alone): anything else is a 400 before any route.

It serves TCP (IPv4, IPv6; optionally TLS) or a Unix socket (``unix:/path``, mode 0660): over a Unix
socket the peer's uid is known (``SO_PEERCRED``) and file permissions decide who may connect.

What a request may do is the service's business: it passes a ``guard`` that sees every request
(method, path, headers, body, peer) before its route and may refuse it.
"""

from __future__ import annotations

import contextlib
import http
import http.client
import io
import logging
import os
import re
import selectors
import socket
import socketserver
import ssl
import stat
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import orjson

from bridge.http.netaddr import is_loopback

#: Triage connections: socket -> (bytes read so far, deadline, peer address).
_Heads = dict[socket.socket, tuple[bytearray, float, object]]

log = logging.getLogger(__name__)

Response = tuple[int, bytes, str]  # status, body, content type


@dataclass
class Request:
    method: str
    path: str  # without the query
    headers: Message  # http.server parses them into an http.client.HTTPMessage
    body: bytes
    client: str  # the peer's address, or "unix"
    peer_uid: int | None  # over a Unix socket
    local: bool  # over loopback or a Unix socket
    requester: str = ""  # who the guard found it came from (audit records)


Route = Callable[[Request], Response]
Guard = Callable[[Request], Response | None]  # a refusal, or None to go on


@dataclass(frozen=True)
class Limits:
    max_connections: int = 64
    request_seconds: float = 10.0  # handshake + request line + headers + body
    idle_seconds: float = 5.0  # a kept-alive connection's wait for its next request
    triage_seconds: float = 0.5  # for the head of a request beyond the cap
    triage_max: int = 64  # connections waiting in triage; the oldest gives way to a new one
    max_body: int = 64 * 1024
    backlog: int = 128


HEALTH_PATHS = frozenset({"/healthz", "/readyz"})
_TRIAGE_QUEUE = 16  # accepted connections handed to triage that it has not picked up yet
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 17\r\n"
    b"Connection: close\r\nRetry-After: 1\r\n\r\n"
    b'{"error":"busy"}\n'
)


@dataclass
class _Deadlines:
    """Cuts connections that passed their deadline; one thread, asleep while nothing is due."""

    due: dict[socket.socket, float] = field(default_factory=dict)
    cond: threading.Condition = field(default_factory=threading.Condition)
    thread: threading.Thread | None = None
    closed: bool = False
    expired: Callable[[], None] | None = None

    def arm(self, sock: socket.socket, seconds: float) -> None:
        with self.cond:
            self.due[sock] = time.monotonic() + seconds
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="http-deadlines", daemon=True)
                self.thread.start()
            self.cond.notify()

    def disarm(self, sock: socket.socket) -> None:
        with self.cond:
            self.due.pop(sock, None)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify()

    def _run(self) -> None:
        while True:
            with self.cond:
                if self.closed:
                    return
                if not self.due:
                    self.cond.wait()
                    continue
                now = time.monotonic()
                nearest = min(self.due.values())
                if nearest > now:
                    self.cond.wait(nearest - now)
                    continue
                late = [s for s, at in self.due.items() if at <= now]
                for sock in late:
                    del self.due[sock]
            for sock in late:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # the handler's read returns at once
                if self.expired is not None:
                    self.expired()


class _Handler(BaseHTTPRequestHandler):
    server: _Bounded  # type: ignore[assignment]  # it only ever runs under _Bounded (typeshed: BaseServer)
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        srv = self.server
        srv.deadlines.arm(self.request, srv.limits.request_seconds)
        if isinstance(self.request, ssl.SSLSocket):
            try:  # deferred from accept, under the deadline: a slow client cannot stall the listener
                self.request.do_handshake()
            except BaseException:
                srv.deadlines.disarm(self.request)
                raise
        super().setup()
        self._first = True

    def handle_one_request(self) -> None:
        if not self._first:  # a kept-alive connection: its next request must come, and come whole
            self.server.deadlines.arm(
                self.request, self.server.limits.idle_seconds + self.server.limits.request_seconds
            )
        self._first = False
        super().handle_one_request()

    def finish(self) -> None:
        self.server.deadlines.disarm(self.request)
        with contextlib.suppress(OSError):
            super().finish()

    def do_GET(self) -> None:
        self._serve(b"")

    def do_POST(self) -> None:
        if "Transfer-Encoding" in self.headers:
            self._refuse(411, "chunked bodies are not accepted: send Content-Length", "chunked")
            return
        length_text = self.headers.get("Content-Length") or ""
        if not (length_text.isascii() and length_text.isdigit()):
            self._refuse(411, "Content-Length is required", "length")
            return
        length = int(length_text)
        if length > self.server.limits.max_body:
            self._refuse(413, f"body larger than {self.server.limits.max_body} bytes", "length")
            return
        body = self.rfile.read(length)
        if len(body) != length:  # the client left, or its deadline cut it
            self.close_connection = True
            return
        self._serve(body)

    def _serve(self, body: bytes) -> None:
        srv = self.server
        srv.deadlines.disarm(self.request)  # the request is in; the route may take its time (IMDS)
        malformed = _malformed(self.headers, self.path)
        if malformed is not None:
            self._refuse(400, malformed, "malformed")
            return
        path = self.path
        request = Request(
            self.command, path, self.headers, body, *srv.peer(self.request, self.client_address)
        )
        self._send(*srv.answer(request))

    def _refuse(self, status: int, message: str, reason: str, retry_after: bool = False) -> None:
        self.server.count_refusal(reason)
        self.close_connection = True
        extra = {"Retry-After": "1"} if retry_after else {}
        self._send(status, orjson.dumps({"error": message}), "application/json", extra)

    def _send(self, status: int, body: bytes, ctype: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s", format % args)


class _Bounded(socketserver.ThreadingMixIn):
    """The admission rules of the module docstring, shared by the TCP and Unix servers."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = Limits.backlog
    limits: Limits
    routes: dict[tuple[str, str], Route]
    guard: Guard | None
    deadlines: _Deadlines
    triage: _Triage
    on_refused: Callable[[str], None] | None

    def init_bounds(self) -> None:
        self._slots = threading.Lock()
        self._active = 0

    @property
    def active(self) -> int:
        return self._active

    def count_refusal(self, reason: str) -> None:
        if self.on_refused is not None:
            self.on_refused(reason)

    def answer(self, request: Request) -> Response:
        """The guard, then the route: what every request gets, served or triaged."""
        try:
            refusal = self.guard(request) if self.guard is not None else None
            if refusal is not None:
                return refusal
            route = self.routes.get((request.method, request.path))
            if route is not None:
                return route(request)
            if any(path == request.path for _, path in self.routes):
                return 405, b'{"error":"method not allowed"}', "application/json"
            return 404, b'{"error":"not found"}', "application/json"
        except Exception:  # an endpoint bug must not take the listener down, nor leak a traceback
            log.exception("HTTP endpoint failed", extra={"path": request.path})
            return 500, b'{"error":"internal error"}', "application/json"

    def process_request(self, request: Any, client_address: object) -> None:
        with self._slots:
            admitted = self._active < self.limits.max_connections
            if admitted:
                self._active += 1
        if admitted:
            super().process_request(request, client_address)
        elif isinstance(request, ssl.SSLSocket) or not self.triage.add(request, client_address):
            self.count_refusal("busy")
            self.shutdown_request(request)  # type: ignore[attr-defined]

    def process_request_thread(self, request: Any, client_address: object) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._slots:
                self._active -= 1

    def handle_error(self, request: Any, client_address: object) -> None:
        log.debug("HTTP connection ended with an error", exc_info=True)

    def peer(self, sock: socket.socket, client_address: object) -> tuple[str, int | None, bool]:
        # A TCP peer is (host, port[, flowinfo, scope_id]): the host is what is judged.
        host = str(client_address[0]) if isinstance(client_address, tuple) and client_address else ""
        return host, None, is_loopback(host)


class _Triage:
    """Connections beyond the cap, all in one thread (created on first use): read the head of the
    request for at most ``triage_seconds``, answer a health probe, ``503`` anything else, close."""

    def __init__(self, server: _Bounded) -> None:
        self._server = server
        self._lock = threading.Lock()
        self._pending: list[tuple[socket.socket, object]] = []
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread: threading.Thread | None = None

    def add(self, sock: socket.socket, client_address: object) -> bool:
        dropped = None
        with self._lock:
            if len(self._pending) >= _TRIAGE_QUEUE:  # the triage thread is behind: the oldest goes
                dropped = self._pending.pop(0)[0]
            self._pending.append((sock, client_address))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="http-triage", daemon=True)
                self._thread.start()
        if dropped is not None:
            self._server.count_refusal("busy")
            self._server.shutdown_request(dropped)  # type: ignore[attr-defined]
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.close()

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ)
        heads: _Heads = {}
        while True:
            timeout = None if not heads else max(0.0, min(d for _, d, _ in heads.values()) - time.monotonic())
            for key, _ in selector.select(timeout):
                sock = key.fileobj
                if sock is self._wake_r:
                    if not self._wake_r.recv(4096):
                        return  # closed: the listener stopped
                    self._take_pending(selector, heads)
                    continue
                assert isinstance(sock, socket.socket)
                buf, _, address = heads[sock]
                try:
                    data = sock.recv(8192)
                except OSError:
                    data = b""
                buf += data
                if not data or b"\r\n\r\n" in buf or len(buf) > 16384:
                    self._finish(selector, heads, sock, buf, address)
            now = time.monotonic()
            for sock, (buf, deadline, address) in list(heads.items()):
                if deadline <= now:
                    self._finish(selector, heads, sock, buf, address)

    def _take_pending(self, selector: selectors.BaseSelector, heads: _Heads) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        deadline = time.monotonic() + self._server.limits.triage_seconds
        for sock, address in pending:
            sock.setblocking(False)
            heads[sock] = (bytearray(), deadline, address)
            selector.register(sock, selectors.EVENT_READ)
        while len(heads) > self._server.limits.triage_max:  # dicts keep insertion order: oldest first
            oldest = next(iter(heads))
            self._finish(selector, heads, oldest, bytearray(), heads[oldest][2])

    def _finish(
        self,
        selector: selectors.BaseSelector,
        heads: _Heads,
        sock: socket.socket,
        buf: bytearray,
        address: object,
    ) -> None:
        selector.unregister(sock)
        del heads[sock]
        response = self._answer(bytes(buf), sock, address)
        with contextlib.suppress(OSError):
            sock.setblocking(True)
            sock.settimeout(1.0)
            sock.sendall(response)
        self._server.shutdown_request(sock)  # type: ignore[attr-defined]

    def _answer(self, head: bytes, sock: socket.socket, address: object) -> bytes:
        line, _, rest = head.partition(b"\r\n")
        parts = line.split(b" ")
        path = parts[1].split(b"?", 1)[0].decode("latin-1") if len(parts) == 3 else ""
        if parts[:1] != [b"GET"] or path not in HEALTH_PATHS or b"\r\n\r\n" not in head:
            self._server.count_refusal("busy")
            return _BUSY
        headers = http.client.parse_headers(io.BytesIO(rest.split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n"))
        request = Request("GET", path, headers, b"", *self._server.peer(sock, address))
        status, body, ctype = self._server.answer(request)
        reason = http.HTTPStatus(status).phrase
        return (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n"
        ).encode("latin-1") + body


class _TCPServer(_Bounded, socketserver.TCPServer):
    allow_reuse_address = True


class _TCP6Server(_TCPServer):
    address_family = socket.AF_INET6


class _UnixServer(_Bounded, socketserver.UnixStreamServer):
    def peer(self, sock: socket.socket, client_address: object) -> tuple[str, int | None, bool]:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        return "unix", uid, True


class Listener:
    """Serves ``routes`` ((method, path) -> route) on ``address`` ("host:port" or "unix:/path")."""

    def __init__(
        self,
        address: str,
        routes: dict[tuple[str, str], Route],
        *,
        guard: Guard | None = None,
        tls: tuple[str, str] | None = None,
        limits: Limits | None = None,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        self.limits = limits or Limits()
        self.unix_path: Path | None = None
        if address.startswith("unix:"):
            if tls is not None:
                raise ValueError("TLS is for TCP listeners; a Unix socket is protected by its file mode")
            self.unix_path = Path(address[len("unix:") :])
            self._server: _Bounded = self._bind_unix(self.unix_path)
        else:
            from bridge.http.netaddr import parse_listen

            host, port = parse_listen(address)
            server_class = _TCP6Server if ":" in host else _TCPServer
            self._server = server_class((host, port), _Handler)
        srv = self._server
        srv.init_bounds()
        srv.limits, srv.routes, srv.guard, srv.on_refused = self.limits, routes, guard, on_refused
        srv.deadlines = _Deadlines(expired=lambda: srv.count_refusal("timeout"))
        srv.triage = _Triage(srv)
        if tls is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(*tls)
            srv.socket = context.wrap_socket(
                srv.socket,
                server_side=True,
                do_handshake_on_connect=False,
            )
        # serve_forever wakes every poll_interval to check for shutdown; 2 s keeps an idle agent idle
        # and still stops promptly on SIGTERM.
        self._thread = threading.Thread(
            target=srv.serve_forever,
            kwargs={"poll_interval": 2.0},
            name="http-api",
            daemon=True,
        )

    def _bind_unix(self, path: Path) -> _UnixServer:
        if path.exists():
            if not stat.S_ISSOCK(path.stat().st_mode):
                raise OSError(f"{path} exists and is not a socket")
            probe = socket.socket(socket.AF_UNIX)
            try:
                probe.connect(str(path))
            except OSError:
                path.unlink()  # left by a process that is gone
            else:
                raise OSError(f"{path} is in use by another process")
            finally:
                probe.close()
        server = _UnixServer(str(path), _Handler)
        os.chmod(path, 0o660)  # the service's group may connect (the local approver); nobody else
        return server

    @property
    def address(self) -> Any:
        """(host, port) of a TCP listener, or the socket path."""
        if self.unix_path is not None:
            return str(self.unix_path)
        host, port = self._server.server_address[:2]  # type: ignore[attr-defined]
        return str(host), int(port)

    @property
    def active_connections(self) -> int:
        return self._server.active

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()  # type: ignore[attr-defined]
        self._server.server_close()
        self._server.deadlines.close()
        self._server.triage.close()
        if self.unix_path is not None:
            with contextlib.suppress(OSError):
                self.unix_path.unlink()


#: A Host header: a name, an IPv4 or a bracketed IPv6 address, and an optional port; nothing else
#: (no ``@``, no path, no second value).
_HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::[0-9]{1,5})?")


def _malformed(headers: Message, target: str) -> str | None:
    """What makes a request one a strict server answers 400 (issue 23): not exactly one well-formed
    ``Host`` (HTTP/1.0 requests included), ``Content-Length`` given twice (request smuggling), or a
    query string (no route takes one, and signatures cover the path alone)."""
    hosts = headers.get_all("Host") or []
    if len(hosts) != 1 or not _HOST.fullmatch(hosts[0].strip()):
        return "exactly one Host header, host[:port], is required"
    if len(headers.get_all("Content-Length") or []) > 1:
        return "Content-Length given more than once"
    if "?" in target or "#" in target:
        return "query strings are not accepted"
    return None


def json_response(status: int, payload: object) -> Response:
    return status, orjson.dumps(payload), "application/json"


def probe_routes(
    alive: Callable[[], tuple[bool, Mapping[str, object]]],
    ready: Callable[[], tuple[bool, str]],
    registry: Any,
) -> dict[tuple[str, str], Route]:
    """``/healthz``, ``/readyz`` and ``/metrics``, the same on every service: liveness from
    ``alive()`` (a :class:`~bridge.pipeline.health.Health` report), readiness with its reason, and the
    Prometheus text of ``registry``."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    def healthz(_: Request) -> Response:
        ok, body = alive()
        return json_response(200 if ok else 503, body)

    def readyz(_: Request) -> Response:
        ok, reason = ready()
        return json_response(200 if ok else 503, {"ready": ok, "reason": reason})

    def metrics(_: Request) -> Response:
        return 200, generate_latest(registry), CONTENT_TYPE_LATEST

    return {("GET", "/healthz"): healthz, ("GET", "/readyz"): readyz, ("GET", "/metrics"): metrics}
