"""The emulator's version-independent state machine: events, incarnation, clock, faults and counters.

Design notes (the *why*):

* One ``threading.Condition`` guards everything. IMDS traffic is tiny (about 5 requests per second per VM)
  and every critical section is a few dictionary operations, so a single lock is simpler to reason about
  than finer locking and cannot deadlock.
* Time is the emulator clock: wall clock plus an offset that ``advance`` increases, so a test can jump
  15 minutes instantly while NotBefore stays a real, parseable timestamp.
* Transitions are evaluated lazily on every request *and* by a background ticker that sleeps exactly until
  the next deadline (``Condition.wait`` with a timeout; no polling loop). Lazy evaluation makes answers
  exact even if the ticker is late; the ticker keeps ``/_emulator/state`` current between requests.
* When the clock jumps past several deadlines, they are applied one by one in chronological order, each
  with its own incarnation, so the outcome equals what real time would have produced.
* The rendered document is cached per api-version and dropped on every change: between changes a poll
  costs one dictionary lookup, which keeps the emulator cheap inside the CPU benchmark.
* ``hold_until_served`` (demos and tests): a timed transition waits until the current document was
  served to a client at least once. Real IMDS keeps a Started event for minutes and a 1 s poll never
  misses it; at 120x the same event lasts half a second, and whether a client saw it would depend on
  the machine's speed. Held, every state of the timeline is seen by a polling client whatever the
  load, while the clock (NotBefore) still runs as usual.
"""

import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from .profile import VmProfile
from .protocol import (
    BODY_GONE,
    BODY_INTERNAL,
    BODY_TOO_MANY,
    BODY_UNAVAILABLE,
    JSON_CONTENT_TYPE,
    SCHEDULED_EVENTS_SHAPES,
    is_guid,
    iso8601,
    rfc1123,
)
from .scenarios import (
    DEFAULT_NOTICE_SECONDS,
    DEFAULT_STARTED_SECONDS,
    FALLBACK_NOTICE_SECONDS,
    SCENARIOS,
    EventSpec,
)

SCHEDULED = "Scheduled"
STARTED = "Started"

FAULT_KINDS: tuple[str, ...] = (
    "429",
    "500",
    "503",
    "410",
    "slow",
    "garbage",
    "truncated",
    "wrong-types",
    "drop",
    "trickle",
    "lost",
)
#: What a StartRequests POST can meet (``on="post"``): an error answer (not taken), ``drop`` (connection
#: closed, not taken), ``slow`` (taken, answered after the delay), ``lost`` (taken, never answered: the
#: connection closes). ``slow`` and ``lost`` are how an agent dies between its POST and the answer.
POST_FAULT_KINDS: tuple[str, ...] = ("429", "500", "503", "drop", "slow", "lost")
# delaySeconds when a fault is queued without one: a 2 s answer for "slow", one byte a second for
# "trickle" (an answer of ~200 bytes then takes minutes: far past any client timeout).
_DEFAULT_DELAY: dict[str, float] = {"trickle": 1.0}
_FALLBACK_DELAY = 2.0
FAULT_STATUS: dict[str, tuple[int, bytes]] = {
    "429": (429, BODY_TOO_MANY),
    "500": (500, BODY_INTERNAL),
    "503": (503, BODY_UNAVAILABLE),
    "410": (410, BODY_GONE),
}
# What a captive portal or a broken proxy in front of IMDS might answer: 200, JSON content type, not JSON.
GARBAGE_BODY = b"<html><head><title>502 Bad Gateway</title></head><body>upstream error</body></html>"

# EventIds are uuid5(namespace, "<scenario>/<run>/<index>"): stable across processes so tests repeat, and
# different on every run of a scenario inside one emulator so an agent's dedupe never hides a re-run.
EVENT_ID_NAMESPACE = uuid.UUID("3c5e8f0a-7b1d-4e2a-9f64-1d2b3c4d5e6f")

# Bounded bookkeeping: a long benchmark must not grow memory without limit.
_HISTORY_LIMIT = 10_000


class ConflictError(Exception):
    """The control request is valid but the event is in the wrong state (HTTP 409)."""


class Reply(NamedTuple):
    """What the HTTP layer must send for one scheduledevents GET."""

    status: int
    body: bytes
    content_type: str | None
    incarnation: int | None  # set only for state documents: marks "firstServed" once written
    delay: float = 0.0  # "slow" fault: sleep this long (outside the lock) before answering
    drop: bool = False  # "drop" fault: close the connection without any response
    retry_after: str | None = None  # a fault's Retry-After header, sent as given (even nonsense)
    trickle: bool = False  # "trickle" fault: send the whole answer one byte every ``delay`` seconds


@dataclass(slots=True)
class Event:
    """Internal, version-independent view of one scheduled event (times on the emulator clock)."""

    event_id: str
    event_type: str
    source: str
    description: str
    duration: int
    resources: tuple[str, ...]
    status: str
    appeared_at: float
    not_before: float  # meaningful while Scheduled
    started_for: float  # emulator seconds the event stays Started
    start_due: float  # min(NotBefore, approval + delay); inf when it will never start by itself
    cancel_at: float | None = None
    started_at: float | None = None
    ends_at: float | None = None
    approved_at: float | None = None

    def deadline(self) -> tuple[float, str]:
        """Next transition of this event and its kind ("cancel", "start" or "leave")."""
        if self.status == SCHEDULED:
            if self.cancel_at is not None and self.cancel_at <= self.start_due:
                return self.cancel_at, "cancel"
            return self.start_due, "start"
        return (self.ends_at if self.ends_at is not None else math.inf), "leave"


@dataclass(slots=True)
class _Pending:
    """A scenario event that has not appeared yet."""

    due: float
    event_id: str
    spec: EventSpec
    speed: float


@dataclass(slots=True)
class _Fault:
    kind: str
    remaining: int | None  # None: unlimited until ``until``
    until: float | None  # time.monotonic() deadline, None: until the count is used up
    delay: float
    retry_after: str | None = None
    on: str = "get"  # "get": scheduledevents GETs; "post": StartRequests POSTs


class EmulatorState:
    """All mutable emulator state behind one lock. The HTTP layer only calls these methods."""

    def __init__(
        self,
        *,
        vm: VmProfile,
        speed: float = 1.0,
        approval_delay: float = 1.0,
        initial_incarnation: int = 1,
        rate_limit: float = 5.0,
        clock: Callable[[], float] = time.time,
        hold_until_served: bool = False,
    ) -> None:
        if speed <= 0:
            raise ValueError("speed must be > 0")
        if approval_delay < 0:
            raise ValueError("approval_delay must be >= 0")
        if rate_limit < 0:
            raise ValueError("rate_limit must be >= 0 (0 disables it)")
        self.vm = vm
        self._cond = threading.Condition(threading.Lock())
        self._clock = clock
        self._initial_speed = speed
        self._speed = speed
        self._approval_delay = approval_delay
        self._rate_limit = rate_limit
        self._offset = 0.0
        self._incarnation = initial_incarnation
        self._events: dict[str, Event] = {}  # key: upper-case EventId, insertion order = document order
        self._pending: list[_Pending] = []  # sorted by due
        self._known_ids: dict[str, str] = {}  # upper-case id -> id as served; ids never repeat
        self._scenario = "idle"
        self._runs: dict[str, int] = {}
        self._injected = 0
        self._next_due = math.inf
        self._doc_cache: dict[str, bytes] = {}
        self._faults: list[_Fault] = []
        self._raw: tuple[int, bytes, str] | None = None
        self._window: deque[float] = deque()
        self._stopping = False
        self._history: deque[dict[str, object]] = deque(maxlen=_HISTORY_LIMIT)
        self._first_served: dict[int, float] = {}
        self._hold = hold_until_served
        self._served = 0  # the newest incarnation fully written to a client (hold_until_served)
        self._reset_counters()
        self._history.append(
            {"incarnation": initial_incarnation, "changedAt": time.time(), "reason": "initial"}
        )

    # ------------------------------------------------------------------ helpers (lock held by caller)

    def _reset_counters(self) -> None:
        self._count_get = 0
        self._count_post = 0
        self._count_instance = 0
        self._count_other = 0
        self._rejected: dict[str, int] = {}
        self._fault_counts: dict[str, int] = {}
        self._raw_served = 0
        self._start_requests: dict[str, int] = {}  # key: upper-case id
        self._start_request_log: deque[dict[str, object]] = deque(maxlen=_HISTORY_LIMIT)
        self._unknown_start_requests = 0

    def _now(self) -> float:
        return self._clock() + self._offset

    def _bump(self, reason: str, event_id: str | None = None) -> None:
        """Every change of the events array increments DocumentIncarnation by exactly one."""
        self._incarnation += 1
        self._doc_cache.clear()
        entry: dict[str, object] = {
            "incarnation": self._incarnation,
            "changedAt": time.time(),
            "reason": reason,
        }
        if event_id is not None:
            entry["eventId"] = event_id
        self._history.append(entry)

    def _recompute_next_due(self) -> None:
        due = self._pending[0].due if self._pending else math.inf
        for ev in self._events.values():
            d = ev.deadline()[0]
            if d < due:
                due = d
        previous = self._next_due
        self._next_due = due
        if due < previous:
            self._cond.notify_all()  # wake the ticker: it may be sleeping towards a later deadline

    def _evaluate(self, now: float) -> None:
        """Apply every transition due at or before ``now``, oldest first."""
        if now < self._next_due:
            return
        while not self._held():
            due = math.inf
            kind = ""
            target: Event | None = None
            if self._pending:
                due, kind = self._pending[0].due, "appear"
            for ev in self._events.values():
                d, k = ev.deadline()
                if d < due:
                    due, kind, target = d, k, ev
            if due > now:
                break
            if kind == "appear":
                pending = self._pending.pop(0)
                self._appear(pending.event_id, pending.spec, pending.speed, at=pending.due)
            elif target is not None and kind == "start":
                approved = target.approved_at is not None and due < target.not_before
                self._start(
                    target, at=due, reason="started after approval" if approved else "started at NotBefore"
                )
            elif target is not None:
                del self._events[target.event_id.upper()]
                self._bump("canceled while Scheduled" if kind == "cancel" else "completed", target.event_id)
        self._recompute_next_due()

    def _held(self) -> bool:
        """Whether timed transitions wait: ``hold_until_served`` and the current document not served."""
        return self._hold and self._served < self._incarnation

    def _appear(self, event_id: str, spec: EventSpec, speed: float, *, at: float) -> Event:
        resources = (self.vm.compute_name, *self.vm.sibling_names(spec.siblings))
        return self._add(
            event_id=event_id,
            event_type=spec.event_type,
            source=spec.source,
            description=spec.description,
            duration=spec.duration,
            resources=resources,
            status=STARTED if spec.notice is None else SCHEDULED,
            notice=(spec.notice or 0.0) / speed,
            started_for=spec.started_for / speed,
            cancel_after=None if spec.cancel_after is None else spec.cancel_after / speed,
            at=at,
        )

    def _add(
        self,
        *,
        event_id: str,
        event_type: str,
        source: str,
        description: str,
        duration: int,
        resources: tuple[str, ...],
        status: str,
        notice: float,
        started_for: float,
        cancel_after: float | None,
        at: float,
    ) -> Event:
        ev = Event(
            event_id=event_id,
            event_type=event_type,
            source=source,
            description=description,
            duration=duration,
            resources=resources,
            status=status,
            appeared_at=at,
            not_before=at + notice,
            started_for=started_for,
            # A platform-canceled event never starts by itself: its cancellation comes first.
            start_due=math.inf if cancel_after is not None else at + notice,
            cancel_at=None if cancel_after is None else at + cancel_after,
        )
        if status == STARTED:
            ev.started_at = at
            ev.ends_at = at + started_for
        self._events[event_id.upper()] = ev
        self._known_ids[event_id.upper()] = event_id
        self._bump(f"appeared {status} ({event_type})", event_id)
        return ev

    def _start(self, ev: Event, *, at: float, reason: str) -> None:
        ev.status = STARTED
        ev.started_at = at
        ev.ends_at = at + ev.started_for
        ev.start_due = math.inf
        self._bump(reason, ev.event_id)

    def _render(self, version: str) -> bytes:
        shape = SCHEDULED_EVENTS_SHAPES[version]
        events: list[dict[str, object]] = []
        for ev in self._events.values():
            scheduled = ev.status == SCHEDULED
            if shape.legacy:
                resources = ["_" + r for r in ev.resources]
                not_before = iso8601(ev.not_before) if scheduled else ""
            else:
                resources = list(ev.resources)
                not_before = rfc1123(ev.not_before) if scheduled else ""
            # Key order of the documentation sample.
            item: dict[str, object] = {
                "EventId": ev.event_id,
                "EventStatus": ev.status,
                "EventType": ev.event_type,
                "ResourceType": "VirtualMachine",
                "Resources": resources,
                "NotBefore": not_before,
            }
            if shape.description:
                item["Description"] = ev.description
            if shape.source:
                item["EventSource"] = ev.source
            if shape.duration:
                item["DurationInSeconds"] = ev.duration
            events.append(item)
        body = orjson.dumps({"DocumentIncarnation": self._incarnation, "Events": events})
        self._doc_cache[version] = body
        return body

    def _take_fault(self, on: str = "get") -> _Fault | None:
        if not self._faults:
            return None
        mono = time.monotonic()
        self._faults = [
            f for f in self._faults if not ((f.until is not None and mono >= f.until) or f.remaining == 0)
        ]
        for f in self._faults:
            if f.on != on:
                continue
            if f.remaining is not None:
                f.remaining -= 1
            return f
        return None

    def take_post_fault(self) -> _Fault | None:
        """The fault the next StartRequests POST meets (``add_fault(..., on="post")``), counted."""
        with self._cond:
            fault = self._take_fault("post")
            if fault is not None:
                key = f"post-{fault.kind}"
                self._fault_counts[key] = self._fault_counts.get(key, 0) + 1
            return fault

    def _new_event_id(self, key: str) -> str:
        return str(uuid.uuid5(EVENT_ID_NAMESPACE, key)).upper()

    # ------------------------------------------------------------------ IMDS request path

    def admit(self) -> bool:
        """Sliding one-second window rate limit over all IMDS requests (IMDS allows about 5/s per VM).

        Rejected requests do not enter the window, so a client that backs off recovers after a second.
        """
        if self._rate_limit <= 0:
            return True
        mono = time.monotonic()
        with self._cond:
            window = self._window
            cutoff = mono - 1.0
            while window and window[0] <= cutoff:
                window.popleft()
            if len(window) + 1 > self._rate_limit:
                self._rejected["429"] = self._rejected.get("429", 0) + 1
                return False
            window.append(mono)
            return True

    def count_rejected(self, status: int) -> None:
        key = str(status)
        with self._cond:
            self._rejected[key] = self._rejected.get(key, 0) + 1

    def count_instance(self) -> None:
        with self._cond:
            self._count_instance += 1

    def count_other(self) -> None:
        with self._cond:
            self._count_other += 1

    def scheduled_get(self, version: str) -> Reply:
        """Answer one well-formed scheduledevents GET: injected fault, raw override or the document."""
        with self._cond:
            self._count_get += 1
            fault = self._take_fault() if self._faults else None
            delay = 0.0
            trickle = False
            if fault is not None:
                self._fault_counts[fault.kind] = self._fault_counts.get(fault.kind, 0) + 1
                kind = fault.kind
                if kind in FAULT_STATUS:
                    status, body = FAULT_STATUS[kind]
                    return Reply(status, body, JSON_CONTENT_TYPE, None, retry_after=fault.retry_after)
                if kind == "drop":
                    return Reply(0, b"", None, None, drop=True)
                if kind == "garbage":
                    return Reply(200, GARBAGE_BODY, JSON_CONTENT_TYPE, None)
                if kind == "slow":
                    delay = fault.delay
                elif kind == "trickle":
                    delay = fault.delay
                    trickle = True
            if self._raw is not None:
                self._raw_served += 1
                status, body, content_type = self._raw
                return Reply(status, body, content_type, None, delay, trickle=trickle)
            now = self._clock() + self._offset
            if now >= self._next_due:
                self._evaluate(now)
            body = self._doc_cache.get(version) or self._render(version)
            if fault is not None:
                if fault.kind == "truncated":
                    # HTTP-level correct (Content-Length matches), JSON cut: half an object never parses.
                    return Reply(200, body[: max(1, len(body) // 2)], JSON_CONTENT_TYPE, None)
                if fault.kind == "wrong-types":
                    wrong = orjson.dumps({"DocumentIncarnation": self._incarnation, "Events": {}})
                    return Reply(200, wrong, JSON_CONTENT_TYPE, None)
            return Reply(200, body, JSON_CONTENT_TYPE, self._incarnation, delay, trickle=trickle)

    def mark_served(self, incarnation: int) -> None:
        """Remember when a document with this incarnation was first fully written to a client.

        The benchmark measures detection latency from this moment, which excludes the client's poll phase.
        """
        if self._hold:
            with self._cond:
                if incarnation > self._served:
                    self._served = incarnation
                    self._cond.notify_all()  # the ticker applies what waited for this document
        if incarnation in self._first_served:  # racy read is fine: the write below re-checks under the lock
            return
        stamp = time.time()
        with self._cond:
            if incarnation not in self._first_served:
                if len(self._first_served) >= _HISTORY_LIMIT:
                    self._first_served.pop(next(iter(self._first_served)))
                self._first_served[incarnation] = stamp

    def approve(self, event_ids: list[str], *, posted: bool = True) -> None:
        """Handle one valid StartRequests POST (``posted=False``: another VM of the event approved it).

        Always succeeds (IMDS answers 200 for any valid EventId, even an already approved or started one).
        A Scheduled event starts after the approval delay (scaled by speed), or at NotBefore if earlier.
        An approval through one VM releases the event for every VM it names: a fleet emulator calls
        this with ``posted=False`` on the others, which changes their events but not their counters.
        """
        with self._cond:
            self._count_post += posted
            now = self._now()
            self._evaluate(now)
            if posted:  # when each StartRequests POST arrived, for timelines (the demo's)
                self._start_request_log.append({"at": time.time(), "eventIds": list(event_ids)})
            for key in dict.fromkeys(i.upper() for i in event_ids):  # one count per POST naming an id
                if posted and key not in self._known_ids:
                    self._unknown_start_requests += 1
                    continue
                if posted:
                    self._start_requests[key] = self._start_requests.get(key, 0) + 1
                ev = self._events.get(key)
                if ev is None or ev.status != SCHEDULED or ev.approved_at is not None:
                    continue
                ev.approved_at = now
                if ev.cancel_at is None:
                    ev.start_due = min(ev.start_due, now + self._approval_delay / self._speed)
            self._recompute_next_due()

    # ------------------------------------------------------------------ control API

    def add_event(
        self,
        *,
        event_type: str,
        event_source: str = "Platform",
        description: str = "",
        duration: int = -1,
        resources: list[str] | None = None,
        status: str = SCHEDULED,
        notice_seconds: float | None = None,
        started_seconds: float = DEFAULT_STARTED_SECONDS,
        event_id: str | None = None,
    ) -> str:
        """Inject one event now. Durations are scenario seconds (divided by the current speed)."""
        if status not in (SCHEDULED, STARTED):
            raise ValueError("status must be 'Scheduled' or 'Started'")
        if event_id is not None and not is_guid(event_id):
            raise ValueError("eventId must be a GUID")
        notice = notice_seconds
        if notice is None:
            notice = DEFAULT_NOTICE_SECONDS.get(event_type, FALLBACK_NOTICE_SECONDS)
        if notice < 0 or started_seconds < 0:
            raise ValueError("noticeSeconds and startedSeconds must be >= 0")
        with self._cond:
            if event_id is None:
                event_id = self._new_event_id(f"injected/{self._injected}")
                self._injected += 1
            if event_id.upper() in self._known_ids:
                raise ConflictError(f"eventId {event_id} was already used")
            now = self._now()
            self._evaluate(now)
            self._add(
                event_id=event_id,
                event_type=event_type,
                source=event_source,
                description=description,
                duration=duration,
                resources=tuple(resources) if resources is not None else (self.vm.compute_name,),
                status=status,
                notice=notice / self._speed,
                started_for=started_seconds / self._speed,
                cancel_after=None,
                at=now,
            )
            self._recompute_next_due()
            return event_id

    def _find(self, event_id: str) -> Event:
        ev = self._events.get(event_id.upper())
        if ev is None:
            raise KeyError(event_id)
        return ev

    def cancel_event(self, event_id: str) -> int:
        """The platform withdraws a Scheduled event: it leaves the document without ever starting."""
        with self._cond:
            self._evaluate(self._now())
            ev = self._find(event_id)
            if ev.status != SCHEDULED:
                raise ConflictError("only a Scheduled event can be canceled")
            del self._events[event_id.upper()]
            self._bump("canceled while Scheduled", ev.event_id)
            self._recompute_next_due()
            return self._incarnation

    def reschedule_event(self, event_id: str, notice_seconds: float) -> int:
        """Move NotBefore to now + notice (scenario seconds): a change, so incarnation + 1."""
        if notice_seconds < 0:
            raise ValueError("noticeSeconds must be >= 0")
        with self._cond:
            now = self._now()
            self._evaluate(now)
            ev = self._find(event_id)
            if ev.status != SCHEDULED:
                raise ConflictError("only a Scheduled event can be rescheduled")
            ev.not_before = now + notice_seconds / self._speed
            if ev.cancel_at is None:
                ev.start_due = ev.not_before
                if ev.approved_at is not None:
                    ev.start_due = min(ev.start_due, ev.approved_at + self._approval_delay / self._speed)
            self._bump("NotBefore moved", ev.event_id)
            self._recompute_next_due()
            return self._incarnation

    def start_event(self, event_id: str) -> int:
        with self._cond:
            now = self._now()
            self._evaluate(now)
            ev = self._find(event_id)
            if ev.status != SCHEDULED:
                raise ConflictError("event is already Started")
            self._start(ev, at=now, reason="started by control API")
            self._recompute_next_due()
            return self._incarnation

    def complete_event(self, event_id: str) -> int:
        with self._cond:
            self._evaluate(self._now())
            ev = self._find(event_id)
            del self._events[event_id.upper()]
            self._bump("completed by control API", ev.event_id)
            self._recompute_next_due()
            return self._incarnation

    def add_fault(
        self,
        kind: str,
        count: int | None = None,
        duration_seconds: float | None = None,
        delay_seconds: float | None = None,
        retry_after: str | None = None,
        on: str = "get",
    ) -> None:
        """Queue a fault for the next ``count`` scheduledevents GETs (or all of them for a duration);
        ``on="post"``: for StartRequests POSTs instead (:data:`POST_FAULT_KINDS`).

        Faults are test tools, so their duration and delay are real seconds, never scaled by speed.
        ``delay_seconds`` is the wait of ``slow`` (default 2) and the time per byte of ``trickle``
        (default 1); other kinds ignore it.
        ``retry_after`` is sent verbatim as a ``Retry-After`` header on an error answer (tests send
        what a misbehaving server might: ``86400``, ``inf``, a date).
        """
        if on not in ("get", "post"):
            raise ValueError("on must be 'get' or 'post'")
        kinds = POST_FAULT_KINDS if on == "post" else tuple(k for k in FAULT_KINDS if k != "lost")
        if kind not in kinds:
            raise ValueError(f"unknown fault kind {kind!r} on {on}; expected one of {', '.join(kinds)}")
        if count is not None and count < 1:
            raise ValueError("count must be >= 1")
        if duration_seconds is not None and duration_seconds <= 0:
            raise ValueError("durationSeconds must be > 0")
        if delay_seconds is None:
            delay_seconds = _DEFAULT_DELAY.get(kind, _FALLBACK_DELAY)
        if delay_seconds < 0 or not math.isfinite(delay_seconds):
            raise ValueError("delaySeconds must be a finite number >= 0")
        if retry_after is not None and (not retry_after.isprintable() or len(retry_after) > 100):
            raise ValueError("retryAfter must be printable text of at most 100 characters")
        remaining = count if count is not None else (None if duration_seconds is not None else 1)
        until = None if duration_seconds is None else time.monotonic() + duration_seconds
        with self._cond:
            self._faults.append(_Fault(kind, remaining, until, delay_seconds, retry_after, on))

    def clear_faults(self) -> None:
        with self._cond:
            self._faults.clear()

    def set_raw(self, body: bytes, status: int = 200, content_type: str = JSON_CONTENT_TYPE) -> None:
        with self._cond:
            self._raw = (status, body, content_type)

    def clear_raw(self) -> None:
        with self._cond:
            self._raw = None

    def start_scenario(self, name: str, speed: float | None = None) -> None:
        """Replace the running scenario, starting now.

        Current events and not-yet-appeared steps are dropped (one incarnation bump when events were
        visible); DocumentIncarnation keeps increasing, it never resets.
        """
        scenario = SCENARIOS.get(name)
        if scenario is None:
            raise KeyError(name)
        if speed is not None and speed <= 0:
            raise ValueError("speed must be > 0")
        with self._cond:
            if speed is not None:
                self._speed = speed
            now = self._now()
            self._evaluate(now)
            self._pending.clear()
            if self._events:
                count = len(self._events)
                self._events.clear()
                self._bump(f"scenario {name} started: {count} event(s) withdrawn")
            run = self._runs.get(name, 0)
            self._runs[name] = run + 1
            self._scenario = name
            for index, step in enumerate(scenario.steps):
                event_id = self._new_event_id(f"{name}/{run}/{index}")
                self._pending.append(_Pending(now + step.at / self._speed, event_id, step.spec, self._speed))
            self._pending.sort(key=lambda p: p.due)
            self._recompute_next_due()
            self._evaluate(now)  # steps at 0 appear at once

    def advance(self, seconds: float) -> None:
        """Jump the emulator clock forward; every deadline passed on the way is applied in order."""
        if seconds < 0 or not math.isfinite(seconds):
            raise ValueError("seconds must be a finite number >= 0")
        with self._cond:
            self._offset += seconds
            self._evaluate(self._now())
            self._cond.notify_all()

    def reset(self) -> None:
        """Back to an idle emulator: no events, faults, raw override or counters; clock offset 0.

        DocumentIncarnation is *not* reset (a running agent must never see it go backwards unintentionally;
        use the raw override for that) and EventIds are never reused.
        """
        with self._cond:
            self._pending.clear()
            if self._events:
                count = len(self._events)
                self._events.clear()
                self._bump(f"reset: {count} event(s) withdrawn")
            self._faults.clear()
            self._raw = None
            self._window.clear()
            self._offset = 0.0
            self._speed = self._initial_speed
            self._scenario = "idle"
            self._reset_counters()
            self._doc_cache.clear()
            self._recompute_next_due()
            self._cond.notify_all()

    # ------------------------------------------------------------------ views

    @property
    def speed(self) -> float:
        return self._speed

    @property
    def incarnation(self) -> int:
        with self._cond:
            self._evaluate(self._now())
            return self._incarnation

    def now(self) -> float:
        """Current emulator clock (epoch seconds)."""
        with self._cond:
            return self._now()

    def _request_counts(self) -> dict[str, Any]:
        return {
            "get": self._count_get,
            "post": self._count_post,
            "instance": self._count_instance,
            "other": self._count_other,
            "rejected": dict(self._rejected),
            "faults": dict(self._fault_counts),
            "raw": self._raw_served,
        }

    def request_counts(self) -> dict[str, Any]:
        """The ``requests`` block of :meth:`snapshot`, without rendering the rest."""
        with self._cond:
            return self._request_counts()

    def snapshot(self) -> dict[str, Any]:
        """The ``GET /_emulator/state`` answer."""
        with self._cond:
            now = self._now()
            self._evaluate(now)
            events = []
            for ev in self._events.values():
                events.append(
                    {
                        "eventId": ev.event_id,
                        "eventType": ev.event_type,
                        "eventStatus": ev.status,
                        "eventSource": ev.source,
                        "description": ev.description,
                        "durationInSeconds": ev.duration,
                        "resources": list(ev.resources),
                        "appearedAt": iso8601(ev.appeared_at),
                        "notBefore": iso8601(ev.not_before),
                        "notBeforeEpoch": ev.not_before,
                        "startedAt": None if ev.started_at is None else iso8601(ev.started_at),
                        "endsAt": None if ev.ends_at is None else iso8601(ev.ends_at),
                        "cancelAt": None if ev.cancel_at is None else iso8601(ev.cancel_at),
                        "approved": ev.approved_at is not None,
                    }
                )
            return {
                "documentIncarnation": self._incarnation,
                "scenario": self._scenario,
                "speed": self._speed,
                "clock": now,
                "clockOffsetSeconds": self._offset,
                "events": events,
                "pendingSteps": len(self._pending),
                "nextTransitionIn": None if math.isinf(self._next_due) else max(0.0, self._next_due - now),
                "startRequests": {self._known_ids[k]: n for k, n in self._start_requests.items()},
                "unknownStartRequests": self._unknown_start_requests,
                "startRequestLog": list(self._start_request_log),
                "requests": self._request_counts(),
                "faults": [
                    {
                        "kind": f.kind,
                        "on": f.on,
                        "remaining": f.remaining,
                        "expiresIn": None if f.until is None else max(0.0, f.until - time.monotonic()),
                    }
                    for f in self._faults
                ],
                "raw": self._raw is not None,
                "history": list(self._history),
                "firstServed": {str(k): v for k, v in self._first_served.items()},
                "vm": {"name": self.vm.compute_name, "computerName": self.vm.computer_name},
            }

    # ------------------------------------------------------------------ ticker

    def run_ticker(self) -> None:
        """Apply transitions at their deadlines so ``state`` is current even without IMDS traffic.

        Sleeps on the condition until the next deadline (capped at 30 s as a guard against wall-clock
        jumps); any change that brings a deadline closer notifies it. No busy loop.
        """
        with self._cond:
            while not self._stopping:
                now = self._now()
                self._evaluate(now)
                # Held, the next transition waits for mark_served, which notifies: no busy loop.
                wait = 30.0 if self._held() else self._next_due - now
                self._cond.wait(timeout=min(max(wait, 0.001), 30.0))

    def stop_ticker(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
