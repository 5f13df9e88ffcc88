"""Approving through Azure Resource Manager when no agent of the event can be reached (issue 12).

Why: the VM-local relay is the first path (the agent checks the event against the VM's own
document and posts one StartRequest), but a VM that is frozen, isolated by an NSG, or whose agent
is down cannot be reached, and its decision used to end ``relayUnavailable`` while the platform
waited for ``NotBefore``. Azure accepts the same approval through ARM:

    POST {endpoint}/subscriptions/{s}/resourcegroups/{rg}/providers/Microsoft.Compute/{resourceType}/
         {resourceName}/providers/Microsoft.Maintenance/scheduledevents/{eventId}/acknowledge
         ?api-version=2025-11-01

no body, answered ``200 {"value": "Successfully Approved"}`` (Azure REST API specifications,
``specification/maintenance/resource-manager/Microsoft.Maintenance/Maintenance/routes.tsp`` and
``examples/2025-11-01/ScheduledEvents_Acknowledge.json``; ``az maintenance scheduledevents
acknowledge``). ``resourceType`` is ``virtualMachines`` or ``virtualMachineScaleSets`` (a scale-set
instance's events are acknowledged on its scale set).

The request carries an Entra ID token for ``{audience}/.default`` from azure-core's bearer-token
policy (a managed identity, workload identity or CLI credential: ``bridge.transports.azure``), goes
over verified TLS and never through a proxy. 429 (with its ``Retry-After``, capped) and 5xx are
retried within a deadline; every answer becomes an :class:`ArmAnswer` with the ARM correlation id,
which the audit record names. azure-core is imported when the first acknowledgement is made: an
approver that never falls back never loads it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from bridge.azure_ids import ScopeRefused, event_scope, parent_scope, parse_allowed_scope
from bridge.relay_api import Outcome
from bridge.support.retry import parse_retry_after
from bridge.transports.arm import arm_pipeline

DEFAULT_ENDPOINT = "https://management.azure.com"
#: The newest GA api-version of ScheduledEvents_Acknowledge (2025-11-01; previews 2023-10-01-preview,
#: 2025-10-01-preview). Configurable for sovereign clouds that lag behind.
ARM_API_VERSION = "2025-11-01"
MAX_RETRY_AFTER = 30.0

_GUID = re.compile(r"^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$")


@dataclass(frozen=True, slots=True)
class ArmAnswer:
    """What ARM said about one acknowledgement, as the approver audits it."""

    outcome: Outcome  # approved | refused | failed | unknown
    # None | armNotFound | armNotSupported | armConflict | armForbidden | armRejected | armPartial |
    # armUnexpected | armUnavailable | armScopeRefused
    reason: str | None
    detail: str | None
    status: int | None
    correlation_id: str | None


class ArmAcknowledger:
    """Acknowledges scheduled events through ARM (see the module docstring)."""

    def __init__(
        self,
        credential: Any,
        endpoint: str = DEFAULT_ENDPOINT,
        api_version: str = ARM_API_VERSION,
        *,
        audience: str | None = None,
        ca_file: str | None = None,
        timeout: float = 15.0,
        deadline: float = 30.0,
        allowed_scopes: tuple[str, ...] = (),
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._clock, self._sleep = clock, sleep  # the retry schedule's time (tests drive their own)
        self.endpoint = endpoint.rstrip("/")
        self.allowed_scopes = allowed_scopes
        self.allowed = tuple(parse_allowed_scope(scope) for scope in allowed_scopes)
        self.api_version = api_version
        self.scope = (audience or self.endpoint).rstrip("/") + "/.default"
        self._credential = credential
        self._verify: str | bool = ca_file or True  # TLS verification is never off
        self._timeout = timeout
        self._deadline = deadline
        self._client: Any = None

    def _pipeline(self) -> Any:
        if self._client is None:
            self._client = arm_pipeline(self._credential, self.endpoint, self.scope)
        return self._client

    def url(self, resource_id: str, event_id: str, parent_id: str | None = None) -> str:
        """The acknowledgement's URL: on the event's parent when Azure's own channel named it (a
        Flexible scale set's or an availability set's VMs), else on the VM's scope."""
        if not _GUID.match(event_id):
            raise ValueError("eventId must be a GUID")
        scope = parent_scope(parent_id, self.allowed) if parent_id else event_scope(resource_id, self.allowed)
        return (
            f"{self.endpoint}{scope}/providers/Microsoft.Maintenance/"
            f"scheduledevents/{event_id}/acknowledge?api-version={quote(self.api_version, safe='')}"
        )

    def acknowledge(self, resource_id: str, event_id: str, parent_id: str | None = None) -> ArmAnswer:
        """One acknowledgement, retried on 429/5xx/connection errors until the deadline."""
        from azure.core.exceptions import AzureError, ClientAuthenticationError
        from azure.core.rest import HttpRequest

        try:
            url = self.url(resource_id, event_id, parent_id)
        except ScopeRefused as exc:
            return ArmAnswer("refused", "armScopeRefused", str(exc), None, None)
        except ValueError as exc:
            return ArmAnswer("refused", "armRejected", str(exc), None, None)
        give_up = self._clock() + self._deadline
        delay, last = 0.5, "no attempt"
        while True:
            try:
                response = self._pipeline().send_request(
                    HttpRequest("POST", url),
                    connection_verify=self._verify,
                    connection_timeout=self._timeout,
                    read_timeout=self._timeout,
                )
            except ClientAuthenticationError as exc:
                return ArmAnswer("failed", "armUnavailable", f"no token: {type(exc).__name__}", None, None)
            except AzureError as exc:
                last, wait = f"{type(exc).__name__}", delay
            else:
                answer = _answer(response)
                if answer is not None:
                    return answer
                last = f"HTTP {response.status_code}"
                wait = parse_retry_after(response.headers.get("Retry-After"), MAX_RETRY_AFTER) or delay
            if self._clock() + wait > give_up:
                return ArmAnswer("failed", "armUnavailable", f"{last}; gave up after retries", None, None)
            self._sleep(wait)
            delay = min(delay * 2, 8.0)


def _answer(response: Any) -> ArmAnswer | None:
    """The final answer for a response, None when it is worth retrying (429, 5xx).

    Approved only on what means approved (issue 34): 200, and 204 (no content), and a 207 whose body
    carries no error; Microsoft's CLI extension for this API models a 207 with an ``{"Error":
    {"Code": ...}}`` body, so a 207 is classified by its body. Another 2xx is ``unknown`` (nothing
    says what it did). 405 ``NotImplemented`` (the acknowledge API is not available in the
    resource's region) has its own reason. Error bodies are read whatever their casing (``error`` and
    ``Error`` both occur)."""
    status = response.status_code
    correlation = response.headers.get("x-ms-correlation-request-id") or response.headers.get(
        "x-ms-request-id"
    )
    if status == 429 or status >= 500:
        return None
    detail, error = _error_text(response)
    if status in (200, 204) or (status == 207 and not error):
        return ArmAnswer("approved", None, detail, status, correlation)
    if status == 207:
        return ArmAnswer("refused", "armPartial", detail, status, correlation)
    if 200 <= status < 300:
        return ArmAnswer("unknown", "armUnexpected", detail or f"HTTP {status}", status, correlation)
    reason = {
        404: "armNotFound",
        405: "armNotSupported",
        409: "armConflict",
        401: "armForbidden",
        403: "armForbidden",
    }.get(status, "armRejected")
    return ArmAnswer("refused", reason, detail, status, correlation)


def _member(body: dict[str, Any], name: str) -> Any:
    """``body[name]`` whatever its casing (ARM answers ``error`` and ``Error``, ``code`` and ``Code``)."""
    wanted = name.lower()
    return next(
        (value for key, value in body.items() if isinstance(key, str) and key.lower() == wanted), None
    )


def _error_text(response: Any) -> tuple[str | None, bool]:
    """(``value`` of a success or ``code: message`` of an ARM error, bounded and never the token;
    whether the body is an error)."""
    try:
        body = response.json()
    except Exception:  # not JSON: ARM errors are JSON, anything else is summarised by its status
        return None, False
    if not isinstance(body, dict):
        return None, False
    error = _member(body, "error")
    if isinstance(error, dict):
        return f"{_member(error, 'code')}: {_member(error, 'message')}"[:300], True
    value = _member(body, "value")
    return (value[:300] if isinstance(value, str) else None), False
