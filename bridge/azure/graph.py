"""Resource Graph, the second input of Azure's channel (and the only one for a team that cannot run
Event Grid): the ``maintenanceresources`` table holds one row per scheduled event, updated in place at
each state change (Completed and Canceled included), so a poll returns every known event and the
tracker (bridge.azure.tracker) keeps only what changed.

    POST {endpoint}/providers/Microsoft.ResourceGraph/resources?api-version=2024-04-01
    {"subscriptions": [...], "query": QUERY, "options": {"resultFormat": "objectArray", "$top": 1000,
     "$skipToken": <from the previous page>}}

answered ``{"totalRecords", "count", "data": [rows], "$skipToken"?}`` (azure-rest-api-specs,
Microsoft.ResourceGraph stable/2024-04-01, ``ResourcesNextPageQuery.json``). Resource Graph throttles
per user: 15 queries per 5 s window, told in ``x-ms-user-quota-remaining`` and
``x-ms-user-quota-resets-after`` (``hh:mm:ss``); a 429 carries ``Retry-After``. The reader waits for the
window to reset when the quota is spent (before it is refused) and honours both on a 429, within a
deadline per poll: a poll that cannot finish raises :class:`GraphUnavailable` and the next one starts
over (rows are state, not a stream: nothing is lost by asking again).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from bridge.errors import BridgeError
from bridge.support.retry import parse_retry_after
from bridge.transports.arm import arm_pipeline

API_VERSION = "2024-04-01"
DEFAULT_ENDPOINT = "https://management.azure.com"
QUERY = (
    "maintenanceresources | where type == 'microsoft.maintenance/scheduledevents' "
    "| project id, name, type, location, resourceGroup, subscriptionId, properties"
)
PAGE = 1000
MAX_WAIT = 60.0
#: Pages and rows one poll reads at most: a fleet's open events are thousands, a page holds PAGE rows.
MAX_PAGES = 200
MAX_ROWS = 200_000
_QUOTA_PART = re.compile(r"[0-9]{1,6}(?:\.[0-9]{1,6})?", re.ASCII)


class GraphUnavailable(BridgeError):
    """A poll that could not be finished (throttled past its deadline, refused, unreachable)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="graph", retryable=True)


class ResourceGraphReader:
    def __init__(
        self,
        credential: Any,
        subscriptions: tuple[str, ...],
        endpoint: str = DEFAULT_ENDPOINT,
        *,
        audience: str | None = None,
        ca_file: str | None = None,
        timeout: float = 30.0,
        deadline: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.subscriptions = subscriptions
        self.endpoint = endpoint.rstrip("/")
        self.scope = (audience or self.endpoint).rstrip("/") + "/.default"
        self._credential = credential
        self._verify: str | bool = ca_file or True  # TLS verification is never off
        self._timeout = timeout
        self._deadline = deadline
        self._clock, self._sleep = clock, sleep
        self._client: Any = None
        self._next_allowed = 0.0  # when the quota window resets, once it is spent

    def rows(self) -> list[dict[str, Any]]:
        """Every row of the query, all pages."""
        give_up = self._clock() + self._deadline
        rows: list[dict[str, Any]] = []
        skip: str | None = None
        for _ in range(MAX_PAGES):
            page = self._page(skip, give_up)
            data = page.get("data")
            if not isinstance(data, list):
                raise GraphUnavailable("Resource Graph answered without a data array")
            rows += [row for row in data if isinstance(row, dict)]
            if len(rows) > MAX_ROWS:
                raise GraphUnavailable(f"Resource Graph answered more than {MAX_ROWS} rows; the poll gave up")
            skip = page.get("$skipToken") if isinstance(page.get("$skipToken"), str) else None
            if not skip:
                return rows
        # An endless $skipToken (issue 31: 48 -> 1 197 MB in 36 s) is refused, not followed.
        raise GraphUnavailable(f"Resource Graph answered more than {MAX_PAGES} pages; the poll gave up")

    def _page(self, skip: str | None, give_up: float) -> dict[str, Any]:
        from azure.core.exceptions import AzureError
        from azure.core.rest import HttpRequest

        options: dict[str, Any] = {"resultFormat": "objectArray", "$top": PAGE}
        if skip:
            options["$skipToken"] = skip
        body = {"subscriptions": list(self.subscriptions), "query": QUERY, "options": options}
        url = f"{self.endpoint}/providers/Microsoft.ResourceGraph/resources?api-version={API_VERSION}"
        while True:
            self._wait(self._next_allowed - self._clock(), give_up, "quota spent")
            if self._client is None:
                self._client = arm_pipeline(self._credential, self.endpoint, self.scope)
            try:
                response = self._client.send_request(
                    HttpRequest("POST", url, json=body),
                    connection_verify=self._verify,
                    connection_timeout=self._timeout,
                    read_timeout=self._timeout,
                )
            except AzureError as exc:
                raise GraphUnavailable(f"Resource Graph unreachable: {type(exc).__name__}") from None
            self._quota(response.headers)
            if response.status_code == 429:
                wait = parse_retry_after(response.headers.get("Retry-After"), MAX_WAIT)
                self._wait(wait if wait is not None else 5.0, give_up, "throttled (429)")
                continue
            if response.status_code != 200:
                raise GraphUnavailable(f"Resource Graph answered {response.status_code}: {_error(response)}")
            answer = response.json()
            if not isinstance(answer, dict):
                raise GraphUnavailable("Resource Graph answered something that is not an object")
            return answer

    def _quota(self, headers: Any) -> None:
        """Spent the window's quota? Then wait for its reset before the next query."""
        remaining = headers.get("x-ms-user-quota-remaining")
        resets = _duration(headers.get("x-ms-user-quota-resets-after"))
        if remaining is not None and remaining.strip() == "0" and resets is not None:
            self._next_allowed = self._clock() + min(resets, MAX_WAIT)

    def _wait(self, seconds: float, give_up: float, why: str) -> None:
        if seconds <= 0:
            return
        if self._clock() + seconds > give_up:
            raise GraphUnavailable(f"Resource Graph {why}: the poll gave up (next poll starts over)")
        self._sleep(seconds)


def _duration(value: str | None) -> float | None:
    """``hh:mm:ss`` (the quota headers' format) as seconds."""
    if not value:
        return None
    parts = value.strip().split(":")
    # ASCII digits only: float() takes "nan", "inf" and "1e9" (issue 31: a `nan` header)
    if len(parts) != 3 or not all(_QUOTA_PART.fullmatch(p) for p in parts):
        return None
    numbers = [float(p) for p in parts]
    return numbers[0] * 3600 + numbers[1] * 60 + numbers[2]


def _error(response: Any) -> str:
    try:
        error = response.json().get("error") or {}
        return f"{error.get('code')}: {error.get('message')}"[:300]
    except Exception:  # not JSON: the status says enough
        return "no error body"
