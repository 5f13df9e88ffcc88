"""The agent's small HTTP listener: health, readiness, metrics and the current document.

Loopback by default: it is meant for the local Prometheus scraper, a load balancer probe and the
VM-local approver. Endpoints:

* ``GET /healthz``: 200 while the process runs its loops (liveness; never depends on IMDS).
* ``GET /readyz``: 200 after the first successful poll, 503 while IMDS has failed for longer than
  ``ready_max_failure`` seconds (with the reason in the JSON body).
* ``GET /metrics``: Prometheus text format.
* ``GET /v1/document``: the current normalized document, with ``affectsThisVm`` per event.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger("bridge.api")

Route = Callable[[], tuple[int, bytes, str]]


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

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
        self._send(405, orjson.dumps({"error": "method not allowed"}), "application/json")

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


class AgentApi:
    """Serves ``routes`` (path -> callable returning status, body, content type) in a thread."""

    def __init__(self, host: str, port: int, routes: dict[str, Route]) -> None:
        self._server = _Server((host, port), _Handler)
        self._server.routes = routes
        self._thread = threading.Thread(target=self._server.serve_forever, name="http-api", daemon=True)

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
