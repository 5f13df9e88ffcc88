"""Wire-level facts of Azure IMDS that the emulator reproduces.

Everything in this module is copied from Microsoft's public Scheduled Events documentation (current English
page, api-version 2020-07-01, plus the 2017 preview page for the oldest shape) and from real captures. It is
kept here, inside the package, because the emulator is the project's independent oracle: it must neither
read the shared reference notes at run time nor import the agent's own parser.
"""

import calendar
import re
import time
from dataclasses import dataclass
from http import HTTPStatus

import orjson

# Every JSON answer of IMDS carries this content type.
JSON_CONTENT_TYPE = "application/json; charset=utf-8"
TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True)
class DocumentShape:
    """Which fields a scheduledevents document carries for one api-version.

    The internal state is version-independent; only rendering looks at this, so a client polling with an
    old api-version sees exactly the older shape while another client on 2020-07-01 sees the full one.
    """

    legacy: bool  # 2017-03-01 preview: ISO 8601 NotBefore and "_"-prefixed resource names
    description: bool  # Description was added in 2019-04-01
    source: bool  # EventSource was added in 2019-08-01
    duration: bool  # DurationInSeconds was added in 2020-07-01


# Published scheduledevents api-versions and what each added (docs: "Version and region availability"):
#   2017-03-01 preview: NotBefore as ISO 8601 (2016-09-19T18:29:47Z), IaaS resource names prefixed with "_";
#              approval samples also send "DocumentIncarnation" as a string.
#   2017-08-01 underscore prefix removed; Metadata header enforced for all requests.
#   2017-11-01 EventType Preempt (Spot eviction, 30 s minimum notice).
#   2019-01-01 EventType Terminate (scale-set terminate notification, 5-15 min user-configurable).
#   2019-04-01 Description.   2019-08-01 EventSource.   2020-07-01 DurationInSeconds (-1 = unknown).
SCHEDULED_EVENTS_SHAPES: dict[str, DocumentShape] = {
    "2017-03-01": DocumentShape(legacy=True, description=False, source=False, duration=False),
    "2017-08-01": DocumentShape(legacy=False, description=False, source=False, duration=False),
    "2017-11-01": DocumentShape(legacy=False, description=False, source=False, duration=False),
    "2019-01-01": DocumentShape(legacy=False, description=False, source=False, duration=False),
    "2019-04-01": DocumentShape(legacy=False, description=True, source=False, duration=False),
    "2019-08-01": DocumentShape(legacy=False, description=True, source=True, duration=False),
    "2020-07-01": DocumentShape(legacy=False, description=True, source=True, duration=True),
}
SCHEDULED_EVENTS_VERSIONS: tuple[str, ...] = tuple(SCHEDULED_EVENTS_SHAPES)

# The instance endpoint's published api-versions (IMDS "Supported API versions" list).
INSTANCE_VERSIONS: tuple[str, ...] = (
    "2017-03-01",
    "2017-04-02",
    "2017-08-01",
    "2017-10-01",
    "2017-12-01",
    "2018-02-01",
    "2018-04-02",
    "2018-10-01",
    "2019-02-01",
    "2019-03-11",
    "2019-04-30",
    "2019-06-01",
    "2019-06-04",
    "2019-08-01",
    "2019-08-15",
    "2019-11-01",
    "2020-06-01",
    "2020-07-15",
    "2020-09-01",
    "2020-10-01",
    "2020-12-01",
    "2021-01-01",
    "2021-02-01",
    "2021-03-01",
    "2021-05-01",
    "2021-10-01",
    "2021-11-01",
    "2021-11-15",
    "2021-12-13",
    "2023-07-01",
    "2023-11-15",
    "2024-03-15",
    "2024-07-17",
    "2025-04-07",
)
INSTANCE_VERSION_SET: frozenset[str] = frozenset(INSTANCE_VERSIONS)

# The three newest versions, as listed by the real 400 answer for a bad api-version.
NEWEST_VERSIONS: tuple[str, ...] = ("2025-04-07", "2024-07-17", "2024-03-15")


def _error(message: str, **extra: object) -> bytes:
    return orjson.dumps({"error": message, **extra})


# Bodies seen in real captures (exact text matters: clients log and sometimes match them).
BODY_BAD_API_VERSION = _error(
    "Bad request. api-version is invalid or was not specified in the request. "
    "For more information refer to aka.ms/azureimds",
    **{"newest-versions": list(NEWEST_VERSIONS)},
)
BODY_MISSING_METADATA = _error("Bad request. Required metadata header not specified")
# The following bodies are the emulator's own wording: IMDS documents the status codes, not the bodies.
BODY_FORWARDED = _error("Bad request. X-Forwarded-For header is not allowed")
BODY_TOO_MANY = _error("Too many requests")
BODY_NOT_FOUND = _error("Not found")
BODY_METHOD_NOT_ALLOWED = _error("Method not allowed")
BODY_INTERNAL = _error("Internal server error")
BODY_UNAVAILABLE = _error("Service unavailable")
BODY_GONE = _error("Gone. Retry after some time for a max of 70 seconds")

_GUID = re.compile(r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}")


def is_guid(value: str) -> bool:
    """True for the 8-4-4-4-12 hex form IMDS uses for EventIds (either case, as the docs show both)."""
    return _GUID.fullmatch(value) is not None


def rfc1123(epoch: float) -> str:
    """NotBefore as IMDS renders it since 2017-08-01, e.g. ``Mon, 11 Apr 2022 22:26:58 GMT``.

    Formatted by hand rather than with ``email.utils`` or ``strftime`` so the output never depends on the
    process locale, and truncated to the second: the event never starts before the printed time.
    """
    t = time.gmtime(int(epoch))
    return (
        f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year:04d} "
        f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT"
    )


def iso8601(epoch: float) -> str:
    """NotBefore as the 2017-03-01 preview rendered it, e.g. ``2016-09-19T18:29:47Z``."""
    t = time.gmtime(int(epoch))
    return f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}Z"


def parse_iso8601(text: str) -> float:
    """Inverse of :func:`iso8601`, for tests and tools reading the control API's internal view."""
    return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")

# Precomputed status lines keep the hot request path free of enum lookups.
STATUS_LINES: dict[int, bytes] = {
    s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode("ascii") for s in HTTPStatus
}
