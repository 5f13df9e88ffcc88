"""The console's web side: three pages (the fleet, an event, the history), a JSON API they read,
server-sent events that keep them live, and the one state change: a signed decision.

The pages are static files (``static/``): HTML shells with no inline script or style, one script,
one stylesheet, nothing from a CDN (the Content-Security-Policy below allows nothing else). They
read ``/api/me`` (who is signed in, whether they may approve, the CSRF token), ``/api/fleet``,
``/api/events/{id}`` and ``/api/history``, and follow ``/api/stream``.

``POST /api/decisions`` is how a person approves (or declines) a Scheduled event: the body names the
event, the VM it is for, a reason (required) and the VMs the person confirmed it releases (the
page's second click lists them; the server checks they are exactly the event's ``Resources``). The
decision is signed with the console's key, ``issuedBy`` the signed-in person, and published to the
decisions topic; the page then sees its audit record arrive on the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from importlib import resources
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from bridge.console import fleet_pages
from bridge.console.access import SESSION_COOKIE, Access, Person
from bridge.console.board import Board, Message, Sent
from bridge.decisions import SigningKey, new_decision, sign
from bridge.schemas import JsonObject
from bridge.support.timeutil import epoch_of

log = logging.getLogger(__name__)

#: Strict: this origin only, no inline script or style, no frames, no plug-ins.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-store",
}
PAGES = {"/": "index.html", "/history": "history.html"}
STATIC = {"console.js": "text/javascript", "console.css": "text/css"}
#: Server-sent messages a slow page may have queued before it is dropped (it reconnects and reloads).
MAX_QUEUED = 2000
KEEPALIVE = 15.0
MAX_REASON = 2048


class Stream:
    """Fans the board's messages out to every open page (one queue each, on the server's loop)."""

    def __init__(self, changes: Callable[[], int]) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.queues: set[asyncio.Queue[bytes | None]] = set()
        self._changes = changes  # the board's count of messages announced

    def publish(self, message: Message) -> None:
        """From the reader's thread: hand the message to the loop, which queues it for each page."""
        if self.loop is None or not self.queues:
            return
        data = b"data: " + orjson.dumps(message) + b"\n\n"
        with contextlib.suppress(RuntimeError):  # the loop is closing
            self.loop.call_soon_threadsafe(self._fan_out, data)

    def _fan_out(self, data: bytes) -> None:
        for queue in list(self.queues):
            try:
                queue.put_nowait(data)
            except asyncio.QueueFull:  # this page cannot keep up: end its stream, it reconnects
                self.queues.discard(queue)
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait(None)

    def follow(self) -> AsyncIterator[bytes]:
        """A page's stream, its queue registered now. Its first message, ``hello``, carries the
        board's count of messages at that moment: every later one reaches the page; an earlier one
        may not, and the page compares the count with its data's (``/api/fleet``'s ``changes``) to
        know whether it must load them again."""
        self.loop = asyncio.get_running_loop()
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(MAX_QUEUED)
        self.queues.add(queue)
        hello = b"data: " + orjson.dumps({"type": "hello", "changes": self._changes()}) + b"\n\n"
        return self._drain(queue, hello)

    async def _drain(self, queue: asyncio.Queue[bytes | None], hello: bytes) -> AsyncIterator[bytes]:
        try:
            yield b"retry: 2000\n\n" + hello
            while True:
                try:
                    data = await asyncio.wait_for(queue.get(), KEEPALIVE)
                except TimeoutError:
                    yield b": keepalive\n\n"
                    continue
                if data is None:
                    return
                yield data
        finally:
            self.queues.discard(queue)


class Console:
    def __init__(
        self,
        board: Board,
        access: Access,
        publish: Callable[[Mapping[str, object]], None],
        signing_key: tuple[str, SigningKey],
        *,
        ready: Callable[[], tuple[bool, str]] = lambda: (True, "ok"),
        metrics: Callable[[], bytes] = lambda: b"",
        decision_ttl: float = 900.0,
        on_decision: Callable[[str], None] = lambda _outcome: None,
    ) -> None:
        self.board = board
        self.access = access
        self._publish = publish  # (decision) -> None once the topic confirmed it; SinkError otherwise
        self._key_id, self._key = signing_key
        self._ready = ready
        self._metrics = metrics
        self._on_decision = on_decision
        self.decision_ttl = decision_ttl
        self.stream = Stream(lambda: board.announced.count)
        board.announced.listeners.append(self.stream.publish)

    def app(self) -> Starlette:
        routes = [
            Route("/healthz", self.healthz),
            Route("/readyz", self.readyz),
            Route("/metrics", self.metrics),
            Route("/", self.page),
            Route("/history", self.page),
            Route("/events/{event_id}", self.event_page),
            Route("/static/{name}", self.static),
            Route("/favicon.ico", lambda request: Response(status_code=204)),
            Route("/api/me", self.me),
            Route("/api/fleet", self.fleet),
            Route("/api/fleet/events", self.fleet_events),
            Route("/api/events/{event_id}", self.event),
            Route("/api/history", self.history),
            Route("/api/stream", self.follow),
            Route("/api/decisions", self.decide, methods=["POST"]),
        ]
        middleware = [Middleware(_HostCheck, access=self.access), Middleware(_SecurityHeaders)]
        return Starlette(routes=routes, middleware=middleware, lifespan=self._lifespan)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.stream.loop = asyncio.get_running_loop()  # the reader's thread hands messages to it
        yield

    # -- probes ----------------------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"alive": True})

    async def readyz(self, request: Request) -> Response:
        ok, reason = self._ready()
        return JSONResponse({"ready": ok, "reason": reason}, status_code=200 if ok else 503)

    async def metrics(self, request: Request) -> Response:
        """Prometheus with the read token (``--read-token-file``), or a signed-in person: the figures
        name the fleet's size and the console's activity (issue 31: they needed no sign-in)."""
        if not self.access.metrics_reader(request.headers) and self._person(request) is None:
            return _unauthorized()
        return Response(self._metrics(), media_type="text/plain; version=0.0.4")

    # -- pages -----------------------------------------------------------------------------------

    def _person(self, request: Request) -> Person | None:
        return self.access.person(request.headers, request.cookies)

    async def page(self, request: Request) -> Response:
        token = request.query_params.get("token")
        if token is not None:  # lab mode: the printed token, once, for a session cookie
            session = self.access.lab_login(token)
            if session is None:
                return _unauthorized()
            response: Response = RedirectResponse(request.url.path, status_code=303)
            response.set_cookie(SESSION_COOKIE, session, httponly=True, samesite="strict")
            return response
        if self._person(request) is None:
            return _unauthorized()
        return _static(PAGES[request.url.path], "text/html; charset=utf-8")

    async def event_page(self, request: Request) -> Response:
        if self._person(request) is None:
            return _unauthorized()
        return _static("event.html", "text/html; charset=utf-8")

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return JSONResponse({"error": "not found"}, status_code=404)
        return _static(name, STATIC[name])

    # -- the API ---------------------------------------------------------------------------------

    async def me(self, request: Request) -> Response:
        person = self._person(request)
        if person is None:
            return _unauthorized()
        return _json({
            "name": person.name, "canApprove": person.can_approve, "via": person.via,
            "csrf": self.access.csrf_token(person), "silentAfter": self.board.silent_after,
        })  # fmt: skip

    async def fleet(self, request: Request) -> Response:
        """The fleet page's first answer: counts, groups, the soonest events (issue 33: it was the whole
        fleet, 3.4 MB at 10 000 VMs). ``events=0``: the page's refresh of counts and groups."""
        if self._person(request) is None:
            return _unauthorized()
        params = request.query_params
        query, group_by = params.get("q", "")[:128], params.get("group", "resourceGroup")[:32]
        opened = [name[:256] for name in params.getlist("open")[: fleet_pages.MAX_OPEN]]
        limit = _bounded(params.get("events", ""), fleet_pages.FIRST_EVENTS, fleet_pages.MAX_PAGE)
        # Built and encoded off the event loop: at 200 000 VMs the whole fleet took 13.8 s, and
        # /healthz, every page and the live stream waited for it (issue 33).
        return await asyncio.get_running_loop().run_in_executor(
            None, lambda: _json(self.board.fleet(query=query, group_by=group_by, opened=opened, limit=limit))
        )

    async def fleet_events(self, request: Request) -> Response:
        """The next open events after the page's cursor (``after``), ``limit`` at most."""
        if self._person(request) is None:
            return _unauthorized()
        params = request.query_params
        query, after = params.get("q", "")[:128], params.get("after", "")[:256]
        limit = _bounded(params.get("limit", ""), fleet_pages.MAX_PAGE, fleet_pages.MAX_PAGE)
        return await asyncio.get_running_loop().run_in_executor(
            None, lambda: _json(self.board.fleet_events(query, after, limit))
        )

    async def event(self, request: Request) -> Response:
        if self._person(request) is None:
            return _unauthorized()
        event_id = request.path_params["event_id"][:128]
        found = await asyncio.get_running_loop().run_in_executor(None, self.board.event, event_id)
        return (
            _json(found) if found is not None else JSONResponse({"error": "no such event"}, status_code=404)
        )

    async def history(self, request: Request) -> Response:
        if self._person(request) is None:
            return _unauthorized()
        try:
            days = min(max(float(request.query_params.get("days", "30")), 1.0), 366.0)
        except ValueError:
            days = 30.0
        group = request.query_params.get("group", "")[:128]
        return await asyncio.get_running_loop().run_in_executor(
            None, lambda: _json(self.board.history(days, group))
        )

    async def follow(self, request: Request) -> Response:
        if self._person(request) is None:
            return _unauthorized()
        return StreamingResponse(self.stream.follow(), media_type="text/event-stream")

    async def decide(self, request: Request) -> Response:
        """Sign and publish one decision (module docstring). 403 for what the person may not do."""
        person = self._person(request)
        if person is None:
            return _unauthorized()
        refused = self.access.check_change(person, request.headers, _origin(request))
        if refused is not None:
            self._on_decision("forbidden")
            return JSONResponse({"error": refused}, status_code=403)
        try:
            body = orjson.loads(await _bounded_body(request))
            decision = self._decision(body, person)
        except BodyTooLarge:
            self._on_decision("invalid")
            return JSONResponse({"error": f"a decision request is at most {MAX_BODY} bytes"}, status_code=413)
        except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
            self._on_decision("invalid")
            return JSONResponse({"error": str(exc)[:300]}, status_code=400)
        try:
            await asyncio.get_running_loop().run_in_executor(None, self._publish, decision)
        except Exception as exc:  # the topic did not take it: say so, nothing was decided
            self._on_decision("unpublished")
            log.error(
                "decision not published", extra={"error": str(exc), "decisionId": decision["decisionId"]}
            )
            return JSONResponse(
                {"error": "the decisions topic did not confirm the decision"}, status_code=503
            )
        expires = epoch_of(decision.get("expiresAt")) or 0.0
        mine = Sent.now(str(decision["eventId"]), str(decision["action"]), expires, person.name)
        sent = self.board.published(str(decision["decisionId"]), mine)
        self._on_decision(str(decision["action"]))
        log.info(
            "decision published",
            extra={"decisionId": decision["decisionId"], "eventId": decision["eventId"],
                   "action": decision["action"], "issuedBy": person.name},
        )  # fmt: skip
        # What it waits for, at once: an event none of whose agents reports can only be retried by
        # the approvers until the decision expires (or acknowledged through ARM): the page says so.
        return JSONResponse(sent, status_code=202)

    def _decision(self, body: object, person: Person) -> JsonObject:
        """The signed decision a request asks for, once everything in it was checked."""
        if not isinstance(body, dict):
            raise ValueError("expected a JSON object")
        action = body.get("action", "approve")
        reason = body.get("reason")
        if action not in ("approve", "decline"):
            raise ValueError("action must be approve or decline")
        if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON:
            raise ValueError("a reason is required")
        event = self.board.scheduled(str(body.get("eventId", "")))
        if event is None:
            raise ValueError("no such Scheduled event: only a Scheduled event is approved or declined")
        target, confirmed = body.get("target"), body.get("confirm")
        if not isinstance(target, str) or target.lower() not in event.names():
            raise ValueError("target must be one of the VMs the event names")
        # What approving through the target releases, as the target's own agent reported the event
        # (issue 31: another VM's record rewrote Resources and a confirm of one VM released three).
        released = event.released(target)
        if not isinstance(confirmed, list) or sorted(map(str, confirmed)) != sorted(released):
            raise ValueError("confirm must list exactly the VMs the decision releases")
        draft = new_decision(
            event.event_id, target, person.name, self.decision_ttl, reason.strip(), action=action
        )
        draft["decisionId"] = f"console-{uuid.uuid4()}"
        return sign(draft, self._key_id, self._key)


#: Paths any Host may ask: the platform's probes name the pod's address, and they reveal nothing.
PROBES = frozenset({"/healthz", "/readyz"})


class _HostCheck(BaseHTTPMiddleware):
    """A request must name this console in ``Host`` (issue 31: ``Host: evil.example``, what a
    DNS-rebinding page sends, was served); the probes are exempt."""

    def __init__(self, app: Any, access: Access) -> None:
        super().__init__(app)
        self.access = access

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        if request.url.path not in PROBES and not self.access.host_allowed(request.headers.get("host")):
            return JSONResponse({"error": "this console is not served under that name"}, status_code=421)
        return await call_next(request)


class _SecurityHeaders(BaseHTTPMiddleware):
    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await call_next(request)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response


#: A decision request's body, at most (a reason of MAX_REASON characters and a few VM names).
MAX_BODY = 64 * 1024


class BodyTooLarge(ValueError):
    pass


async def _bounded_body(request: Request) -> bytes:
    """The body, refused before it is read when its declared length is over :data:`MAX_BODY`, and
    while it is read when it grows past it (issue 31: a 300 MB body was read whole, RSS +900 MB)."""
    declared = request.headers.get("content-length")
    if declared is not None and (
        not declared.isascii() or not declared.isdigit() or int(declared) > MAX_BODY
    ):
        raise BodyTooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _origin(request: Request) -> str:
    """This console's own origin, as the browser names it (scheme and Host of the request)."""
    forwarded = request.headers.get("x-forwarded-proto")
    scheme = forwarded if forwarded in ("http", "https") else request.url.scheme
    return f"{scheme}://{request.headers.get('host', '')}"


def _json(payload: object) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json")


def _unauthorized() -> Response:
    return JSONResponse(
        {"error": "sign in through the console's front door (docs/console.md)"}, status_code=401
    )


def _static(name: str, media_type: str) -> Response:
    return Response((resources.files("bridge.console") / "static" / name).read_bytes(), media_type=media_type)


__all__ = ["Console", "Stream"]


def _bounded(text: str, default: int, most: int) -> int:
    """A page size from the query string: ``default`` when absent or not a number, 0..``most``."""
    try:
        return min(max(int(text), 0), most) if text else default
    except ValueError:
        return default
