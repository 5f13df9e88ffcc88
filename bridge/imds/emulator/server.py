"""HTTP front end of the emulator: IMDS paths with IMDS's request rules, plus the ``/_emulator/`` control API.

Why it is built this way:

* ``ThreadingHTTPServer`` with HTTP/1.1 keep-alive and an explicit ``Content-Length`` on every answer,
  because the agent keeps one connection open and polls it once per second, like on a real VM.
* The IMDS request path is kept lean (the emulator runs inside the CPU benchmark): headers and body are
  written with a single ``write``, status lines are precomputed, the document comes from a per-version
  cache, and logging is skipped entirely unless the logger is at DEBUG.
* Checks run in a fixed order so every rejection is deterministic: rate limit (429), X-Forwarded-For (400),
  unknown path (404), verb (405), ``Metadata: true`` header (400), api-version (400).
"""

import contextlib
import email.utils
import functools
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl

import orjson

from .fleet import Fleet
from .profile import VmProfile
from .protocol import (
    BODY_BAD_API_VERSION,
    BODY_FORWARDED,
    BODY_METHOD_NOT_ALLOWED,
    BODY_MISSING_METADATA,
    BODY_NOT_FOUND,
    BODY_TOO_MANY,
    INSTANCE_VERSION_SET,
    INSTANCE_VERSIONS,
    JSON_CONTENT_TYPE,
    SCHEDULED_EVENTS_SHAPES,
    STATUS_LINES,
    TEXT_CONTENT_TYPE,
    is_guid,
)
from .scenarios import SCENARIOS
from .state import FAULT_KINDS, FAULT_STATUS, ConflictError, EmulatorState

logger = logging.getLogger(__name__)

_MAX_BODY = 1 << 20
_SCHEDULED_PATH = "/metadata/scheduledevents"
_INSTANCE_PATH = "/metadata/instance"
_VERSIONS_PATH = "/metadata/versions"
_CT_CACHE: dict[str, bytes] = {JSON_CONTENT_TYPE: f"Content-Type: {JSON_CONTENT_TYPE}\r\n".encode()}
_VERSIONS_BODY = orjson.dumps({"apiVersions": list(INSTANCE_VERSIONS)})
_date_cache: tuple[int, bytes] = (0, b"")


def _date_header() -> bytes:
    """``Date:`` header, formatted at most once per second (formatting is the costliest header)."""
    global _date_cache
    now = int(time.time())
    cached = _date_cache
    if cached[0] == now:
        return cached[1]
    value = f"Date: {email.utils.formatdate(now, usegmt=True)}\r\n".encode("ascii")
    _date_cache = (now, value)
    return value


def _status_line(status: int) -> bytes:
    line = STATUS_LINES.get(status)
    return line if line is not None else f"HTTP/1.1 {status} Status {status}\r\n".encode("ascii")


class _BadRequest(Exception):
    """A control API request with a malformed body (HTTP 400)."""


def _error_body(message: str, **extra: object) -> bytes:
    return orjson.dumps({"error": message, **extra})


def _number(data: dict[str, object], key: str, default: float | None = None) -> float | None:
    value = data.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _BadRequest(f"{key} must be a number")
    return float(value)


def _integer(data: dict[str, object], key: str, default: int | None = None) -> int | None:
    value = data.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _BadRequest(f"{key} must be an integer")
    return value


def _string(data: dict[str, object], key: str, default: str | None = None) -> str | None:
    value = data.get(key, default)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _BadRequest(f"{key} must be a string")
    return value


class _VmHost:
    """What the server needs to answer one VM: its state, its instance document, its approvals."""

    def __init__(self, state: EmulatorState, approve: Callable[[list[str]], None] | None = None) -> None:
        self.state = state
        self.approve = approve or state.approve
        self._instance_doc = state.vm.instance_document()
        self._instance_cache: dict[tuple[str, str], tuple[int, bytes, str]] = {}

    def instance_answer(self, subpath: str, fmt: str) -> tuple[int, bytes, str]:
        """``/metadata/instance[/a/b/0/c]`` with ``format=json`` (default) or ``format=text``.

        The profile is immutable, so answers are cached per (path, format).
        """
        key = (subpath, fmt)
        cached = self._instance_cache.get(key)
        if cached is not None:
            return cached
        node: Any = self._instance_doc
        for segment in (s for s in subpath.split("/") if s):
            if isinstance(node, dict) and segment in node:
                node = node[segment]
            elif isinstance(node, list) and segment.isdigit() and int(segment) < len(node):
                node = node[int(segment)]
            else:
                return 404, BODY_NOT_FOUND, JSON_CONTENT_TYPE
        if fmt == "text":
            if isinstance(node, dict):
                text = "\n".join(k + "/" if isinstance(v, dict | list) else k for k, v in node.items())
            elif isinstance(node, list):
                text = "\n".join(f"{i}/" for i in range(len(node)))
            else:
                text = str(node)
            answer = (200, text.encode(), TEXT_CONTENT_TYPE)
        else:
            answer = (200, orjson.dumps(node), JSON_CONTENT_TYPE)
        self._instance_cache[key] = answer
        return answer


class _HTTPServer(ThreadingHTTPServer):
    """Threading server that tracks open connections so ``stop()`` can close idle keep-alive sockets.

    ``hosts`` maps a path prefix's VM name to the VM: ``""`` alone for one VM (no prefix), the fleet's
    names for a fleet (``/vm/<name>/...``).
    """

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self, address: tuple[str, int], hosts: dict[str, _VmHost], fleet: Fleet | None = None
    ) -> None:
        self.hosts = hosts
        self.fleet = fleet
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn(), a reverse DNS lookup that can stall start-up.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that hang up mid-answer are normal (timeouts, drop tests): no traceback on stderr.
        logger.debug("connection error from %s", client_address, exc_info=True)

    def track(self, conn: socket.socket) -> None:
        with self._connections_lock:
            self._connections.add(conn)

    def untrack(self, conn: socket.socket) -> None:
        with self._connections_lock:
            self._connections.discard(conn)

    def close_connections(self) -> None:
        with self._connections_lock:
            conns = list(self._connections)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def route(self, path: str) -> tuple[_VmHost | None, str]:
        """The VM a request path is for, and the path without its ``/vm/<name>`` prefix."""
        if path.startswith("/vm/"):
            name, _, rest = path[len("/vm/") :].partition("/")
            return self.hosts.get(name) if name else None, "/" + rest
        return self.hosts.get(""), path


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    vm: _VmHost  # set per request by _dispatch
    # Idle keep-alive connections are closed after two minutes so abandoned clients cannot pile up threads.
    timeout = 120
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.untrack(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default stderr access log; per-request JSON lines go to the DEBUG logger instead."""

    # Every verb goes through one dispatcher so unsupported ones get IMDS's 405 instead of a 501.
    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def do_PATCH(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_OPTIONS(self) -> None:
        self._dispatch()

    # ------------------------------------------------------------------ plumbing

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str | None = JSON_CONTENT_TYPE,
        extra: bytes = b"",
        trickle: float | None = None,
    ) -> None:
        self._status = status
        ct = b""
        if content_type is not None:
            ct = _CT_CACHE.get(content_type) or f"Content-Type: {content_type}\r\n".encode("latin-1")
        head = b"".join(
            (
                _status_line(status),
                ct,
                b"Content-Length: %d\r\n" % len(body),
                _date_header(),
                b"Connection: close\r\n" if self.close_connection else b"",
                extra,
                b"\r\n",
            )
        )
        data = head if self.command == "HEAD" else head + body
        if trickle is None:
            self.wfile.write(data)
        else:
            self._trickle(data, trickle)

    def _trickle(self, data: bytes, per_byte: float) -> None:
        """Send ``data`` one byte every ``per_byte`` seconds, status line and headers included.

        This is the slow-answer attack a per-``recv`` socket timeout cannot see (every byte resets it):
        it lets tests prove a client bounds the *whole* exchange. No Nagle, so each byte leaves at once.
        A client that gives up makes the next write fail, which ends this handler (logged at DEBUG).
        """
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(len(data)):
            time.sleep(per_byte)
            self.wfile.write(data[i : i + 1])

    def _read_body(self) -> bytes | None:
        """Read (and so drain) any request body, or answer the error and return None.

        Draining matters on keep-alive: an unread body would be parsed as the next request.
        """
        headers = self.headers
        if "chunked" in (headers.get("Transfer-Encoding") or "").lower():
            return self._read_chunked()
        length = headers.get("Content-Length")
        if length is None:
            return b""
        try:
            n = int(length)
        except ValueError:
            n = -1
        if n < 0:
            self.close_connection = True
            self._send(400, _error_body("Bad request. Invalid Content-Length"))
            return None
        if n > _MAX_BODY:
            self.close_connection = True
            self._send(413, _error_body("Payload too large"))
            return None
        return self.rfile.read(n) if n else b""

    def _read_chunked(self) -> bytes | None:
        chunks: list[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                size = -1
            if size < 0 or total + size > _MAX_BODY:
                self.close_connection = True
                self._send(400, _error_body("Bad request. Invalid chunked body"))
                return None
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            chunks.append(self.rfile.read(size))
            self.rfile.readline(1024)
            total += size

    def _dispatch(self) -> None:
        debug = logger.isEnabledFor(logging.DEBUG)
        started = time.perf_counter() if debug else 0.0
        self._status = 0
        body = self._read_body()
        if body is None:
            return
        path, _, query = self.path.partition("?")
        if self.server.fleet is not None and (path + "/").startswith("/_emulator/fleet/"):
            self._fleet_control(path, body)
            return
        vm, path = self.server.route(path)
        if vm is None:
            self._send(404, BODY_NOT_FOUND)
            return
        self.vm = vm
        if path == "/_emulator" or path.startswith("/_emulator/"):
            self._control(path, body)
            return
        self._imds(path, query, body)
        if debug:
            logger.debug(
                orjson.dumps(
                    {
                        "msg": "imds request",
                        "method": self.command,
                        "path": self.path,
                        "status": self._status,
                        "ms": round((time.perf_counter() - started) * 1000, 3),
                    }
                ).decode()
            )

    # ------------------------------------------------------------------ IMDS

    def _reject(self, status: int, body: bytes, extra: bytes = b"") -> None:
        self.vm.state.count_rejected(status)
        self._send(status, body, JSON_CONTENT_TYPE, extra)

    def _imds(self, path: str, query: str, body: bytes) -> None:
        route = self._checked_route(path)
        if route is None:
            return
        state = self.vm.state
        if route == _VERSIONS_PATH:  # the only IMDS path that needs no api-version
            state.count_other()
            self._send(200, _VERSIONS_BODY)
            return
        params = self._query(query)
        versions = params.get("api-version", ())
        version = versions[0] if len(versions) == 1 else ""
        if route == _SCHEDULED_PATH:
            if version not in SCHEDULED_EVENTS_SHAPES:
                self._reject(400, BODY_BAD_API_VERSION)
            elif self.command == "GET":
                self._scheduled_get(version)
            else:
                self._approve(body)
            return
        if version not in INSTANCE_VERSION_SET:
            self._reject(400, BODY_BAD_API_VERSION)
            return
        fmt = params.get("format", ("json",))[-1]
        status, answer, content_type = self.vm.instance_answer(path[len(_INSTANCE_PATH) :], fmt)
        if status == 200:
            state.count_instance()
        else:
            state.count_rejected(status)
        self._send(status, answer, content_type)

    def _checked_route(self, path: str) -> str | None:
        """The normalised route once the request passed IMDS's checks in IMDS's order (rate limit,
        proxy header, path, method, ``Metadata: true``); None once a refusal was sent."""
        if not self.vm.state.admit():
            self._send(429, BODY_TOO_MANY)
            return None
        if "X-Forwarded-For" in self.headers:
            self._reject(400, BODY_FORWARDED)
            return None
        route = path.lower()
        if len(route) > 1 and route.endswith("/"):
            route = route[:-1]
        if route == _SCHEDULED_PATH:
            allowed: tuple[str, ...] = ("GET", "POST")
        elif route in (_INSTANCE_PATH, _VERSIONS_PATH) or route.startswith(_INSTANCE_PATH + "/"):
            allowed = ("GET",)
        else:
            self._reject(404, BODY_NOT_FOUND)
            return None
        if self.command not in allowed:
            self._reject(405, BODY_METHOD_NOT_ALLOWED, b"Allow: " + ", ".join(allowed).encode() + b"\r\n")
            return None
        metadata = self.headers.get("Metadata")
        if metadata is None or metadata.strip().lower() != "true":
            self._reject(400, BODY_MISSING_METADATA)
            return None
        return route

    @staticmethod
    def _query(query: str) -> dict[str, tuple[str, ...]]:
        if query.startswith("api-version=") and "&" not in query and "%" not in query and "+" not in query:
            return {"api-version": (query[12:],)}  # the one query every poll sends
        params: dict[str, tuple[str, ...]] = {}
        for key, value in parse_qsl(query, keep_blank_values=True):
            params[key] = (*params.get(key, ()), value)
        return params

    def _scheduled_get(self, version: str) -> None:
        state = self.vm.state
        reply = state.scheduled_get(version)
        if reply.drop:
            # Close without a single byte: the client sees the connection reset / remote end closed.
            self.close_connection = True
            self._status = 0
            return
        if reply.trickle:
            trickle: float | None = reply.delay  # the delay is spread over the bytes, not waited first
        else:
            trickle = None
            if reply.delay:
                time.sleep(reply.delay)
        extra = b"" if reply.retry_after is None else b"Retry-After: %s\r\n" % reply.retry_after.encode()
        self._send(reply.status, reply.body, reply.content_type, extra, trickle)
        if reply.incarnation is not None:
            state.mark_served(reply.incarnation)

    def _approve(self, body: bytes) -> None:
        """Validate a StartRequests POST exactly as strictly as IMDS: 400 for anything malformed."""
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            self._reject(400, _error_body("Bad request. Request body is not valid JSON"))
            return
        requests = doc.get("StartRequests") if isinstance(doc, dict) else None
        if not isinstance(requests, list):
            self._reject(400, _error_body("Bad request. StartRequests is missing or is not a list"))
            return
        ids: list[str] = []
        for item in requests:
            event_id = item.get("EventId") if isinstance(item, dict) else None
            if not isinstance(event_id, str):
                self._reject(400, _error_body("Bad request. Each StartRequest needs an EventId string"))
                return
            if not is_guid(event_id):
                self._reject(400, _error_body("Bad request. EventId is not a valid GUID"))
                return
            ids.append(event_id)
        # "DocumentIncarnation" (2017-03-01 clients send it, as a string) is accepted and ignored.
        fault = self.vm.state.take_post_fault()
        kind = fault.kind if fault is not None else ""
        if kind in FAULT_STATUS:
            status, error = FAULT_STATUS[kind]
            self._send(status, error, JSON_CONTENT_TYPE)
            return
        if kind != "drop":
            self.vm.approve(ids)
        if kind in ("drop", "lost"):
            self.close_connection = True  # not a byte of answer: the client cannot tell what happened
            self._status = 0
            return
        if kind == "slow":
            assert fault is not None
            time.sleep(fault.delay)
        self._send(200, b"", None)

    # ------------------------------------------------------------------ control API

    def _json(self, status: int, payload: object) -> None:
        self._send(status, orjson.dumps(payload))

    def _control(self, path: str, body: bytes) -> None:
        route = [p for p in path.split("/") if p][1:]
        self._answer_control(body, lambda data: self._control_route(self.command, route, data))

    def _fleet_control(self, path: str, body: bytes) -> None:
        """``/_emulator/fleet``: GET the fleet's state; ``/_emulator/fleet/events``: POST a shared event."""
        fleet = self.server.fleet
        assert fleet is not None
        route = "/".join(p for p in path.split("/") if p)
        handlers: dict[str, dict[str, Callable[[dict[str, object]], ControlAnswer]]] = {
            "_emulator/fleet": {"GET": lambda data: (200, fleet.snapshot())},
            "_emulator/fleet/events": {"POST": lambda data: _add_fleet_event(fleet, data)},
        }
        verbs = handlers.get(route)
        if verbs is None:
            self._json(404, {"error": "unknown control path"})
        elif self.command not in verbs:
            self._json(405, {"error": f"{self.command} not allowed here"})
        else:
            self._answer_control(body, lambda data: self._json(*verbs[self.command](data)))

    def _answer_control(self, body: bytes, answer: Callable[[dict[str, object]], None]) -> None:
        """Parse a control request's JSON body and run ``answer``; errors become 400/404/409."""
        try:
            data: dict[str, object] = {}
            if body.strip():
                try:
                    parsed = orjson.loads(body)
                except orjson.JSONDecodeError as exc:
                    raise _BadRequest(f"body is not valid JSON: {exc}") from None
                if not isinstance(parsed, dict):
                    raise _BadRequest("body must be a JSON object")
                data = parsed
            answer(data)
        except _BadRequest as exc:
            self._json(400, {"error": str(exc)})
        except ValueError as exc:
            self._json(400, {"error": str(exc)})
        except ConflictError as exc:
            self._json(409, {"error": str(exc)})
        except KeyError as exc:
            self._json(404, {"error": f"unknown event {exc.args[0]}"})

    def _control_route(self, method: str, route: list[str], data: dict[str, object]) -> None:
        """Answer with the route's handler: 404 for an unknown path, 405 for a known path and another verb."""
        path, params = _control_path(route)
        handlers = _CONTROL_ROUTES.get(path)
        if handlers is None:
            self._json(404, {"error": "unknown control path"})
        elif method not in handlers:
            self._json(405, {"error": f"{method} not allowed here"})
        else:
            self._json(*handlers[method](self.vm.state, data, *params))


# ---------------------------------------------------------------------- control API routes
# One function per route: (HTTP status, JSON answer) from the state and the request's JSON body. A
# malformed body raises _BadRequest (400); the state's ValueError (400), ConflictError (409) and
# KeyError (unknown event, 404) are answered by _Handler._control.

ControlAnswer = tuple[int, object]
ControlRoute = Callable[..., ControlAnswer]  # (state, body, *path parameters)

_EVENT_ACTION_PATH = "events/{eventId}/{action}"


def _control_path(route: list[str]) -> tuple[str, tuple[str, ...]]:
    """The key of ``route`` in :data:`_CONTROL_ROUTES` and its path parameters (``""``: no route)."""
    if len(route) == 1:
        return route[0], ()
    if len(route) == 3 and route[0] == "events":
        return _EVENT_ACTION_PATH, (route[1], route[2])
    return "", ()


def _required_number(data: dict[str, object], key: str) -> float:
    value = _number(data, key)
    if value is None:
        raise _BadRequest(f"{key} is required")
    return value


def _get_state(state: EmulatorState, data: dict[str, object]) -> ControlAnswer:
    return 200, state.snapshot()


def _get_scenarios(state: EmulatorState, data: dict[str, object]) -> ControlAnswer:
    return 200, {name: s.summary for name, s in SCENARIOS.items()}


def _event_fields(data: dict[str, object]) -> dict[str, Any]:
    """The ``add_event`` arguments of an ``events`` POST body (one VM's or the fleet's)."""
    event_type = _string(data, "eventType")
    if not event_type:
        raise _BadRequest("eventType is required")
    resources = data.get("resources")
    if resources is not None and (
        not isinstance(resources, list) or not all(isinstance(r, str) for r in resources)
    ):
        raise _BadRequest("resources must be a list of strings")
    return {
        "event_type": event_type,
        "event_source": _string(data, "eventSource", "Platform") or "",
        "description": _string(data, "description", "") or "",
        "duration": _integer(data, "durationInSeconds", -1) or 0,
        "resources": resources,
        "status": _string(data, "status", "Scheduled") or "",
        "notice_seconds": _number(data, "noticeSeconds"),
        "started_seconds": _number(data, "startedSeconds", 600.0) or 0.0,
        "event_id": _string(data, "eventId"),
    }


def _add_event(state: EmulatorState, data: dict[str, object]) -> ControlAnswer:
    event_id = state.add_event(**_event_fields(data))
    return 201, {"eventId": event_id, "documentIncarnation": state.incarnation}


def _add_fleet_event(fleet: Fleet, data: dict[str, object]) -> ControlAnswer:
    fields = _event_fields(data)
    if not fields["resources"]:
        raise _BadRequest("resources (the VMs of the availability set the event is for) is required")
    event_id = fleet.add_event(**fields)
    return 201, {"eventId": event_id, "addedAt": fleet.snapshot_event(event_id)["addedAt"]}


#: ``POST /_emulator/events/<id>/<action>``: the action on one event, returning the new incarnation.
_EVENT_ACTIONS: dict[str, Callable[[EmulatorState, str, dict[str, object]], int]] = {
    "cancel": lambda state, event_id, data: state.cancel_event(event_id),
    "reschedule": lambda state, event_id, data: state.reschedule_event(
        event_id, _required_number(data, "noticeSeconds")
    ),
    "start": lambda state, event_id, data: state.start_event(event_id),
    "complete": lambda state, event_id, data: state.complete_event(event_id),
}


def _event_action(state: EmulatorState, data: dict[str, object], event_id: str, action: str) -> ControlAnswer:
    act = _EVENT_ACTIONS.get(action)
    if act is None:
        return 404, {"error": f"unknown action {action!r}"}
    return 200, {"eventId": event_id, "documentIncarnation": act(state, event_id, data)}


def _add_fault(state: EmulatorState, data: dict[str, object]) -> ControlAnswer:
    kind = data.get("kind")
    if isinstance(kind, int) and not isinstance(kind, bool):
        kind = str(kind)
    if not isinstance(kind, str):
        raise _BadRequest(f"kind is required, one of {', '.join(FAULT_KINDS)}")
    count = _integer(data, "count")
    duration = _number(data, "durationSeconds")
    delay = _number(data, "delaySeconds")  # None: the kind's default
    retry_after = _string(data, "retryAfter")
    state.add_fault(kind, count, duration, delay, retry_after, on=_string(data, "on") or "get")
    return 200, {"kind": kind, "faults": state.snapshot()["faults"]}


def _clear_faults(state: EmulatorState, data: dict[str, object]) -> ControlAnswer:
    state.clear_faults()
    return 200, {"faults": []}


def _start_scenario(state: EmulatorState, data: dict[str, object]) -> ControlAnswer:
    name = _string(data, "name")
    if name is None or name not in SCENARIOS:
        raise _BadRequest(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    state.start_scenario(name, _number(data, "speed"))
    return 200, {"scenario": name, "speed": state.speed, "documentIncarnation": state.incarnation}


def _advance(state: EmulatorState, data: dict[str, object]) -> ControlAnswer:
    state.advance(_required_number(data, "seconds"))
    snap = state.snapshot()
    return 200, {
        "clockOffsetSeconds": snap["clockOffsetSeconds"],
        "clock": snap["clock"],
        "documentIncarnation": snap["documentIncarnation"],
    }


def _reset(state: EmulatorState, data: dict[str, object]) -> ControlAnswer:
    state.reset()
    return 200, {"documentIncarnation": state.incarnation}


def _set_raw(state: EmulatorState, data: dict[str, object]) -> ControlAnswer:
    text = _string(data, "body")
    if text is None:
        raise _BadRequest("body (the exact text to serve) is required")
    status = _integer(data, "status", 200) or 200
    if not 200 <= status <= 599 or status in (204, 304):
        raise _BadRequest("status must be 200-599 and allow a body (not 204/304)")
    content_type = _string(data, "contentType", JSON_CONTENT_TYPE) or JSON_CONTENT_TYPE
    state.set_raw(text.encode(), status, content_type)
    return 200, {"raw": True, "status": status, "length": len(text.encode())}


def _clear_raw(state: EmulatorState, data: dict[str, object]) -> ControlAnswer:
    state.clear_raw()
    return 200, {"raw": False}


#: Path under /_emulator/ -> verb -> route (docs/emulator.md lists them).
_CONTROL_ROUTES: dict[str, dict[str, ControlRoute]] = {
    "state": {"GET": _get_state},
    "scenarios": {"GET": _get_scenarios},
    "events": {"POST": _add_event},
    _EVENT_ACTION_PATH: {"POST": _event_action},
    "faults": {"POST": _add_fault, "DELETE": _clear_faults},
    "scenario": {"POST": _start_scenario},
    "advance": {"POST": _advance},
    "reset": {"POST": _reset},
    "raw": {"PUT": _set_raw, "DELETE": _clear_raw},
}


class EmulatorServer:
    """A running (or startable) IMDS Scheduled Events emulator.

    >>> srv = EmulatorServer(scenario="live-migration", speed=60).start()
    >>> srv.url  # doctest: +SKIP
    'http://127.0.0.1:40123'
    >>> srv.stop()

    ``state`` is the live :class:`EmulatorState`, for in-process tests that prefer calling
    ``srv.state.advance(900)`` to an HTTP round trip.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        scenario: str = "idle",
        speed: float = 1.0,
        rate_limit: float = 5.0,
        vm: VmProfile | None = None,
        approval_delay: float = 1.0,
        initial_incarnation: int = 1,
        fleet: list[VmProfile] | None = None,
        hold_until_served: bool = False,
    ) -> None:
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
        if fleet is not None and (vm is not None or scenario != "idle"):
            raise ValueError("a fleet emulator takes its VMs from the fleet and starts idle")
        if vm is None:
            # Terminate notifications only exist for scale-set instances, so that scenario brings its profile.
            scale_set = SCENARIOS[scenario].scale_set
            vm = fleet[0] if fleet else VmProfile.scale_set() if scale_set else VmProfile()
        self.host = host
        self.port = port
        self.scenario = scenario
        self.vm = vm
        options: dict[str, Any] = {
            "speed": speed,
            "approval_delay": approval_delay,
            "initial_incarnation": initial_incarnation,
            "rate_limit": rate_limit,
            "hold_until_served": hold_until_served,
        }
        #: The fleet (``/vm/<name>/...``, ``/_emulator/fleet``) or None for one VM served without a prefix.
        self.fleet = Fleet(fleet, **options) if fleet else None
        if self.fleet is None:
            self.state = EmulatorState(vm=vm, **options)
            self._hosts = {"": _VmHost(self.state)}
        else:
            self.state = self.fleet.states[vm.compute_name]  # the first VM, for in-process callers
            self._hosts = {
                name: _VmHost(state, functools.partial(self.fleet.approve, name))
                for name, state in self.fleet.states.items()
            }
        self._httpd: _HTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self._stopped = False

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("EmulatorServer is not started")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> "EmulatorServer":
        """Bind, start serving and the ticker in daemon threads, then start the scenario's timeline."""
        if self._httpd is not None:
            return self
        try:
            httpd = _HTTPServer((self.host, self.port), self._hosts, self.fleet)
        except OSError as exc:  # "Address already in use" alone does not say which address
            raise OSError(exc.errno, f"cannot listen on {self.host}:{self.port}: {exc.strerror}") from None
        self._httpd = httpd
        self.port = httpd.server_port
        serve = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.5}, name="imds-emulator-http", daemon=True
        )
        serve.start()
        if self.fleet is not None:
            self._threads = [serve, *self.fleet.run_tickers()]
            return self
        ticker = threading.Thread(target=self.state.run_ticker, name="imds-emulator-ticker", daemon=True)
        self._threads = [serve, ticker]
        ticker.start()
        self.state.start_scenario(self.scenario)
        return self

    def vm_url(self, name: str) -> str:
        """The IMDS base URL of one fleet VM (its agent's ``--imds-url``)."""
        if self.fleet is None or name not in self.fleet.states:
            raise KeyError(name)
        return f"{self.url}/vm/{name}"

    def stop(self) -> None:
        """Stop serving, close open keep-alive connections and the ticker. Safe to call twice."""
        httpd = self._httpd
        if httpd is None or self._stopped:
            return
        self._stopped = True
        # serve_forever only notices shutdown() between selector polls (0.5 s); a throw-away connection
        # wakes the selector at once, so stopping takes milliseconds (tests stop a server per test).
        stopper = threading.Thread(target=httpd.shutdown, name="imds-emulator-stop", daemon=True)
        stopper.start()
        wake_host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        while stopper.is_alive():
            with contextlib.suppress(OSError):
                socket.create_connection((wake_host, self.port), timeout=0.2).close()
            stopper.join(0.05)
        httpd.close_connections()
        httpd.server_close()
        if self.fleet is not None:
            self.fleet.stop_tickers()
        else:
            self.state.stop_ticker()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads = []

    def __enter__(self) -> "EmulatorServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["EmulatorServer"]
