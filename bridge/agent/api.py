"""The agent's small HTTP listener: health, readiness, metrics and the current document.

Loopback by default: it is meant for the local Prometheus scraper, a load balancer probe and the
VM-local approver. Endpoints:

* ``GET /healthz``: 200 while the process runs its loops (liveness; never depends on IMDS).
* ``GET /readyz``: 200 after the first successful poll, 503 while IMDS has failed for longer than
  ``ready_max_failure`` seconds (with the reason in the JSON body).
* ``GET /metrics``: Prometheus text format.
* ``GET /v1/document``: the current normalized document, with ``affectsThisVm`` per event.
* ``POST /v1/start-requests``: the relay (see :mod:`bridge.agent.relay`); requests from anything but
  loopback must be signed (:mod:`bridge.signing`).
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger("bridge.api")

Route = Callable[[], tuple[int, bytes, str]]
# A POST route gets the request headers, the body and the client's address.
PostRoute = Callable[[Any, bytes, str], tuple[int, bytes, str]]
MAX_BODY = 64 * 1024


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    timeout = 30  # a silent client cannot hold a handler thread for ever

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(self.timeout)
            self.request.do_handshake()  # deferred from accept (see AgentApi)
        super().setup()

    def do_GET(self) -> None:
        route = self.server.routes.get(self.path.split("?", 1)[0])
        if route is None:
            self._send(404, orjson.dumps({"error": "not found"}), "application/json")
            return
        try:
            status, body, ctype = route()
        except Exception:  # an endpoint bug must not take the listener down
            log.exception("HTTP endpoint failed", extra={"path": self.path})
            status, body, ctype = 500, b'{"error":"internal error"}', "application/json"
        self._send(status, body, ctype)

    def do_POST(self) -> None:
        route = self.server.post_routes.get(self.path.split("?", 1)[0])
        if route is None:
            status = 405 if self.path.split("?", 1)[0] in self.server.routes else 404
            self._send(
                status,
                orjson.dumps({"error": "not found" if status == 404 else "method not allowed"}),
                "application/json",
            )
            return
        try:
            length = int(self.headers.get("Content-Length") or "0")
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self.close_connection = True
            self._send(413 if length > MAX_BODY else 411, b'{"error":"body length"}', "application/json")
            return
        body = self.rfile.read(length)
        try:
            status, payload, ctype = route(self.headers, body, self.client_address[0])
        except Exception:
            log.exception("HTTP endpoint failed", extra={"path": self.path})
            status, payload, ctype = 500, b'{"error":"internal error"}', "application/json"
        self._send(status, payload, ctype)

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s", format % args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    routes: dict[str, Route]
    post_routes: dict[str, PostRoute]


class _Server6(_Server):
    address_family = socket.AF_INET6


class AgentApi:
    """Serves ``routes`` (path -> callable returning status, body, content type) in a thread."""

    def __init__(
        self,
        host: str,
        port: int,
        routes: dict[str, Route],
        post_routes: dict[str, PostRoute] | None = None,
        tls: tuple[str, str] | None = None,
    ) -> None:
        server_class = _Server6 if ":" in host else _Server
        self._server = server_class((host, port), _Handler)
        self._server.routes = routes
        self._server.post_routes = post_routes or {}
        if tls is not None:
            # The handshake runs in the request's thread (not in accept), so a slow or silent client
            # cannot stall the listener.
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(*tls)
            self._server.socket = context.wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False
            )
        # serve_forever wakes every poll_interval to check for shutdown; 2 s keeps an idle agent idle
        # and still stops promptly on SIGTERM.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 2.0}, name="http-api", daemon=True
        )

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def json_route(fn: Callable[[], tuple[int, Any]]) -> Route:
    def route() -> tuple[int, bytes, str]:
        status, payload = fn()
        return status, orjson.dumps(payload), "application/json"

    return route


def metrics_route(registry: Any) -> Route:
    return lambda: (200, generate_latest(registry), CONTENT_TYPE_LATEST)
