"""Parse and normalize a Scheduled Events document of any api-version.

IMDS has shipped seven shapes of the same document (2017-03-01 to 2020-07-01). This module turns any
of them into one normalized, immutable :class:`EventsDocument`, and refuses anything that is not a
Scheduled Events document with a :class:`DocumentError` whose ``reason`` is a short, bounded code
(it becomes a metric label). Nothing else ever escapes :func:`parse_document`: the agent must keep
polling whatever bytes arrive.

Quirks handled here, each seen in real answers or documented for an api-version:

* ``DocumentIncarnation`` is an integer in JSON captures but a string in old clients and fakes.
* ``NotBefore`` is RFC 1123 (2017-08-01+), ISO 8601 (2017-03-01) or ``""`` once Started.
* 2017-03-01 prefixes IaaS resource names with ``_``; later versions do not.
* ``Description`` (2019-04-01), ``EventSource`` (2019-08-01) and ``DurationInSeconds`` (2020-07-01)
  are missing from older answers; ``DurationInSeconds`` of -1 means "unknown".
* New ``EventType`` / ``EventStatus`` values must be carried through, never rejected.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from typing import Any

import orjson

from bridge.support.timeutil import format_datetime, parse_imds_time

DEFAULT_API_VERSION = "2020-07-01"
# Every published scheduledevents api-version, oldest first.
API_VERSIONS = (
    "2017-03-01",
    "2017-08-01",
    "2017-11-01",
    "2019-01-01",
    "2019-04-01",
    "2019-08-01",
    "2020-07-01",
)
# Before this version IaaS resource names carried a leading underscore.
_UNDERSCORE_UNTIL = "2017-08-01"

# ASCII digits only: str.isdigit() also accepts "²" or Arabic-Indic digits, which int() may refuse;
# and JSON's whitespace only: ``\s`` also matched "\x1f", which int() refuses (found by hypothesis).
_INTEGER = re.compile(r"[ \t\r\n]*-?[0-9]{1,18}[ \t\r\n]*\Z")

KNOWN_EVENT_TYPES = frozenset({"Freeze", "Reboot", "Redeploy", "Preempt", "Terminate"})
KNOWN_EVENT_STATUSES = frozenset({"Scheduled", "Started"})
SCHEDULED = "Scheduled"
STARTED = "Started"
#: How far an event has gone, IMDS's two statuses and the two outcomes only Azure's own channel tells
#: (bridge.azure): a later report of an earlier status never moves an event back (the console's board
#: and Azure's channel read this one table).
STATUS_RANK: dict[str, int] = {"Scheduled": 1, "Started": 2, "Completed": 3, "Canceled": 3}


class DocumentError(ValueError):
    """The answer is not a usable Scheduled Events document.

    ``reason`` is one of a closed set of codes (``invalid_json``, ``not_an_object``,
    ``missing_incarnation``, ``bad_incarnation``, ``missing_events``, ``bad_events``, ``bad_event``)
    so that it can label a metric; ``str(err)`` is the human explanation.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ScheduledEvent:
    """One event, normalized. Field names follow the record schema (camelCase in JSON)."""

    event_id: str
    event_type: str
    event_status: str
    resource_type: str | None
    resources: tuple[str, ...]
    not_before: str | None
    description: str | None
    event_source: str | None
    duration_in_seconds: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "eventId": self.event_id,
            "eventType": self.event_type,
            "eventStatus": self.event_status,
            "resourceType": self.resource_type,
            "resources": list(self.resources),
            "notBefore": self.not_before,
            "description": self.description,
            "eventSource": self.event_source,
            "durationInSeconds": self.duration_in_seconds,
        }


@dataclass(frozen=True, slots=True)
class EventsDocument:
    """A parsed document: normalized events plus the raw JSON exactly as IMDS sent it.

    ``digest`` identifies the *content* independently of the incarnation and of the order of the
    events array, so that "same incarnation, new content" and "new incarnation, same content" can
    both be told apart from "nothing happened".
    """

    incarnation: int
    events: tuple[ScheduledEvent, ...]
    raw: Any
    api_version: str
    digest: str
    warnings: tuple[str, ...] = ()
    #: Elements of ``Events`` that could not be read (kept out of ``events``, never the document):
    #: (index, its EventId when one was readable, why). One bad element used to hide every event.
    rejected: tuple[tuple[int, str | None, str], ...] = ()

    def by_id(self) -> dict[str, ScheduledEvent]:
        return {e.event_id: e for e in self.events}

    def keeping(self, previous: EventsDocument | None) -> EventsDocument:
        """This document with the last good version of each event it names but could not read:
        an element gone bad for a moment is not an event gone (no ``canceled`` or ``completed``
        for an event still there), nor a change to report."""
        if previous is None or not self.rejected:
            return self
        known = previous.by_id()
        carried = [known[i] for _, i, _ in self.rejected if i is not None and i in known]
        if not carried:
            return self
        events = (*self.events, *carried)
        return replace(self, events=events, digest=content_digest(events))


def parse_document(body: bytes | str, api_version: str = DEFAULT_API_VERSION) -> EventsDocument:
    """Parse an IMDS answer body. Raises only :class:`DocumentError`."""
    try:
        raw = orjson.loads(body)
    except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
        raise DocumentError("invalid_json", f"answer is not valid JSON: {str(exc)[:120]}") from None
    return document_from_json(raw, api_version)


def document_from_json(raw: Any, api_version: str = DEFAULT_API_VERSION) -> EventsDocument:
    """Validate and normalize already-decoded JSON. Raises only :class:`DocumentError`."""
    if not isinstance(raw, dict):
        raise DocumentError("not_an_object", f"document is a JSON {_json_type(raw)}, expected an object")
    if "DocumentIncarnation" not in raw:
        raise DocumentError("missing_incarnation", "document has no DocumentIncarnation")
    incarnation = _incarnation(raw["DocumentIncarnation"])
    if "Events" not in raw:
        raise DocumentError("missing_events", "document has no Events array")
    items = raw["Events"]
    if not isinstance(items, list):
        raise DocumentError("bad_events", f"Events is a JSON {_json_type(items)}, expected an array")
    strip_underscore = api_version < _UNDERSCORE_UNTIL
    warnings: list[str] = []
    events: list[ScheduledEvent] = []
    rejected: list[tuple[int, str | None, str]] = []
    seen: set[str] = set()
    for index, item in enumerate(items):
        try:
            event = _event(item, index, strip_underscore, warnings)
            if event.event_id in seen:
                raise DocumentError("bad_event", f"Events[{index}] repeats EventId {event.event_id[:64]!r}")
        except DocumentError as err:  # the other events stand: one bad element hides nothing else
            event_id = item.get("EventId") if isinstance(item, dict) else None
            readable = event_id if isinstance(event_id, str) and 0 < len(event_id) <= 128 else None
            rejected.append((index, readable, str(err)))
            warnings.append(f"{err}; element left out, the other events kept")
            continue
        seen.add(event.event_id)
        events.append(event)
    return EventsDocument(
        incarnation=incarnation,
        events=tuple(events),
        raw=raw,
        api_version=api_version,
        digest=content_digest(events),
        warnings=tuple(warnings),
        rejected=tuple(rejected),
    )


def content_digest(events: list[ScheduledEvent] | tuple[ScheduledEvent, ...]) -> str:
    """A short, stable hash of the events' normalized content, independent of their order."""
    canonical = sorted((e.to_json() for e in events), key=lambda e: e["eventId"])
    return hashlib.sha256(orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    return {
        bool: "boolean",
        int: "number",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
    }.get(type(value), type(value).__name__)


def _incarnation(value: object) -> int:
    # bool is an int subclass in Python; true/false is not an incarnation.
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and _INTEGER.match(value):
        return int(value)
    raise DocumentError("bad_incarnation", f"DocumentIncarnation {str(value)[:40]!r} is not an integer")


def _event(item: Any, index: int, strip_underscore: bool, warnings: list[str]) -> ScheduledEvent:
    where = f"Events[{index}]"
    if not isinstance(item, dict):
        raise DocumentError("bad_event", f"{where} is a JSON {_json_type(item)}, expected an object")
    event_id = _required_str(item, "EventId", where)
    event_type = _required_str(item, "EventType", where)
    event_status = _required_str(item, "EventStatus", where)
    resources_raw = item.get("Resources", [])
    if resources_raw is None:
        resources_raw = []
    if not isinstance(resources_raw, list) or not all(isinstance(r, str) for r in resources_raw):
        raise DocumentError("bad_event", f"{where}.Resources is not an array of strings")
    resources = tuple(r[1:] if strip_underscore and r.startswith("_") else r for r in resources_raw)
    not_before = _not_before(item.get("NotBefore"), where, warnings)
    duration = item.get("DurationInSeconds")
    if isinstance(duration, str) and _INTEGER.match(duration):
        duration = int(duration)
    if duration is not None and (not isinstance(duration, int) or isinstance(duration, bool)):
        raise DocumentError("bad_event", f"{where}.DurationInSeconds is not an integer")
    if duration is not None and duration < 0:
        duration = None  # -1: unknown or not applicable
    return ScheduledEvent(
        event_id=event_id,
        event_type=event_type,
        event_status=event_status,
        resource_type=_optional_str(item, "ResourceType", where),
        resources=resources,
        not_before=not_before,
        description=_optional_str(item, "Description", where),
        event_source=_optional_str(item, "EventSource", where),
        duration_in_seconds=duration,
    )


def _required_str(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise DocumentError("bad_event", f"{where}.{key} is missing or not a non-empty string")
    return value


def _optional_str(item: dict[str, Any], key: str, where: str) -> str | None:
    value = item.get(key)
    if value is None or isinstance(value, str):
        return value
    raise DocumentError("bad_event", f"{where}.{key} is not a string")


def _not_before(value: Any, where: str, warnings: list[str]) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise DocumentError("bad_event", f"{where}.NotBefore is not a string")
    try:
        dt = parse_imds_time(value)
    except ValueError:
        # One unreadable time must not hide the event: keep it with a null time (the raw document
        # still has the original text) and say so.
        warnings.append(f"{where}.NotBefore {value[:64]!r} is not RFC 1123 or ISO 8601; reported as null")
        return None
    return None if dt is None else format_datetime(dt)
