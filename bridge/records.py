"""Every record shape the bridge publishes, in one place: what consumers read is decided here.

* ``scheduledEvents`` (``schemas/record.v1.schema.json``): one document change seen by the agent.
  ``recordId`` is derived from *what changed*, never from when it was seen: the VM, and the
  (incarnation, content digest) of the documents before and after. The same change therefore gets
  the same id after a crash, a restart or a resend, and consumers can deduplicate on it; a different
  change can never reuse an id.
* ``approval`` (``schemas/approval.v1.schema.json``): the outcome of one approval attempt, written by
  the agent's relay (``component`` ``agent`` or ``policy``) and by the approver (``approver``). An
  agent's attempt is an occurrence, not a derivable change: its id is random, fixed once in the
  outbox. An approver's record is the outcome *of a decision*, which any fleet approver instance may
  write (the owner of its partition, a standby: :mod:`bridge.approver.standby`): its id is derived
  from the decision (:func:`approver_record_id`), so two instances' records of one decision are one
  record to a consumer that deduplicates on ``recordId``.
* ``preparation`` (``schemas/preparation.v1.schema.json``): one VM's readiness for one event, after
  its prepare hook (:mod:`bridge.coordination`). Derivable like a change: the id comes from the VM,
  the event and the result, so a hook run again after a restart republishes the same id.
* ``heartbeat`` (``schemas/heartbeat.v1.schema.json``): the agent is alive and watching, every
  ``--heartbeat-interval`` seconds; scheduledEvents records come only with changes, so without it a
  quiet VM and a dead agent look the same.
* ``impact`` (``schemas/impact.v1.schema.json``): what one event did to the VM, measured by
  :mod:`bridge.agent.impact`; one per event, its id from the VM and the event.
* the ``/v1/document`` view of the agent's API: the current events as records show them.

Routing metadata next to each record comes from :meth:`bridge.pipeline.RecordMeta.of`, which reads
the envelope every shape here shares (``recordId``, ``recordType``, ``schemaVersion``,
``observedAt``, ``vm``).
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterable
from typing import Any, Protocol

import orjson

from bridge import __version__
from bridge.imds.document import EventsDocument
from bridge.imds.instance import VmIdentity
from bridge.timeutil import rfc3339

SCHEMA_VERSION = 1
SCHEDULED_EVENTS = "scheduledEvents"
APPROVAL = "approval"
PREPARATION = "preparation"
HEARTBEAT = "heartbeat"
IMPACT = "impact"
# Namespace of record ids (uuid5); fixed forever so ids stay comparable across versions of the agent.
RECORD_NAMESPACE = uuid.UUID("5b0f3d38-6c1e-4c61-9d43-5fd0d0f0a2b1")


class Transition(Protocol):
    """One event's change between two documents (``bridge.agent.diff.Change``)."""

    def to_json(self) -> dict[str, Any]: ...


def derived_id(*parts: str) -> str:
    """A record id derived from what the record is about (its parts joined by ``|``): the same
    thing gets the same id after a crash, a restart or a resend."""
    return str(uuid.uuid5(RECORD_NAMESPACE, "|".join(parts)))


def record_id(vm_key: str, previous: EventsDocument | None, current: EventsDocument) -> str:
    before = "initial" if previous is None else f"{previous.incarnation}:{previous.digest}"
    return derived_id(vm_key, before, f"{current.incarnation}:{current.digest}")


def _envelope(
    record_type: str,
    record_id: str,
    observed_at: float,
    vm: VmIdentity | None,
    api_version: str | None = None,
) -> dict[str, Any]:
    """The fields every record shares (what :meth:`bridge.pipeline.RecordMeta.of` routes on)."""
    source = {"agentVersion": __version__}
    if api_version is not None:
        source["apiVersion"] = api_version
    return {
        "schemaVersion": SCHEMA_VERSION,
        "recordType": record_type,
        "recordId": record_id,
        "observedAt": rfc3339(observed_at),
        "source": source,
        "vm": None if vm is None else vm.to_record(),
    }


def approver_record_id(decision_id: str | None, position: str, payload: bytes) -> str:
    """The id of an approver's audit record: per decision once it was proven valid (whichever
    instance, whichever re-read, its outcome is one record), per message otherwise (a refusal of the
    same bytes at the same position, by any instance)."""
    if decision_id is not None:
        return str(uuid.uuid5(RECORD_NAMESPACE, f"approver|decision|{decision_id}"))
    digest = hashlib.sha256(payload).hexdigest()
    return str(uuid.uuid5(RECORD_NAMESPACE, f"approver|message|{position}|{digest}"))


def events_view(vm: VmIdentity, document: EventsDocument) -> list[dict[str, Any]]:
    """The document's events as records carry them: normalized, with ``affectsThisVm``."""
    names = vm.names()
    return [{**e.to_json(), "affectsThisVm": vm.affects(e.resources, names)} for e in document.events]


def scheduled_events_record(
    vm: VmIdentity,
    previous: EventsDocument | None,
    current: EventsDocument,
    changes: Iterable[Transition],
    observed_at: float,
) -> dict[str, Any]:
    return {
        **_envelope(
            SCHEDULED_EVENTS, record_id(vm.key, previous, current), observed_at, vm, current.api_version
        ),
        "documentIncarnation": current.incarnation,
        "previousIncarnation": None if previous is None else previous.incarnation,
        "events": events_view(vm, current),
        "changes": [c.to_json() for c in changes],
        "raw": current.raw,
    }


def document_view(vm: VmIdentity, document: EventsDocument, observed_at: float) -> dict[str, Any]:
    """``GET /v1/document``: the current document, as a record would show it."""
    return {
        "observedAt": rfc3339(observed_at),
        "documentIncarnation": document.incarnation,
        "vm": vm.to_record(),
        "events": events_view(vm, document),
    }


def approval_record(
    component: str,
    *,
    decision_id: str | None,
    event_ids: list[str],
    outcome: str,
    reason: str | None,
    results: list[dict[str, Any]],
    vm: VmIdentity | None = None,
    api_version: str | None = None,
    target: str | None = None,
    issued_by: str | None = None,
    requester: str | None = None,
    detail: str | None = None,
    start_requests_posted: int | None = None,
    path: str | None = None,
    arm_correlation_id: str | None = None,
    coordination: dict[str, Any] | None = None,
    record_id: str | None = None,
    unverified: dict[str, str] | None = None,
    decision_reason: str | None = None,
) -> dict[str, Any]:
    """One approval attempt, by the agent's relay (with its VM and how many StartRequests it posted)
    or by the approver (``vm`` null: the decision may never have reached an agent; ``record_id``
    from :func:`approver_record_id`)."""
    record: dict[str, Any] = {
        **_envelope(APPROVAL, record_id or str(uuid.uuid4()), time.time(), vm, api_version),
        "component": component,
        "decisionId": decision_id,
        "eventIds": event_ids,
        "target": target,
        "issuedBy": issued_by,
        "requester": requester,
        "outcome": outcome,
        "reason": reason,
        "detail": detail,
        "results": results,
    }
    if start_requests_posted is not None:
        record["startRequestsPosted"] = start_requests_posted
    if path is not None:  # the approver's: which path carried the approval (relay, arm)
        record["path"] = path
        if path == "arm":
            record["armCorrelationId"] = arm_correlation_id
    if coordination is not None:  # a coordinated approval: who waited for whom, and why it ended
        record["coordination"] = coordination
    if decision_reason is not None:  # why the person decided, as they signed it (issue 33)
        record["decisionReason"] = decision_reason
    if unverified is not None:  # what a message refused before it was proven claimed to be
        record["unverified"] = unverified
    return record


def preparation_record(
    vm: VmIdentity,
    event: dict[str, Any],
    result: str,
    hook: dict[str, Any] | None,
    observed_at: float,
) -> dict[str, Any]:
    """``event`` as :meth:`ScheduledEvent.to_json` gives it; ``hook`` its run (``result``,
    ``exitCode``, ``seconds``) or None without a hook."""
    event_id = str(event["eventId"])
    return {
        **_envelope(PREPARATION, derived_id(vm.key, "preparation", event_id, result), observed_at, vm),
        "eventId": event_id,
        "eventType": event.get("eventType") or "",
        "notBefore": event.get("notBefore"),
        "resources": list(event.get("resources") or []),
        "result": result,
        "hook": hook,
    }


def heartbeat_record(
    vm: VmIdentity,
    document: EventsDocument | None,
    imds_ok: bool,
    interval: float,
    now: float,
) -> dict[str, Any]:
    """The agent is alive (``schemas/heartbeat.v1.schema.json``): one per interval, its id derived
    from the VM and the interval's number, so a heartbeat sent again after a crash is the same."""
    slot = int(now // interval)
    return {
        **_envelope(HEARTBEAT, derived_id(vm.key, "heartbeat", f"{interval:g}", str(slot)), now, vm),
        "intervalSeconds": interval,
        "documentIncarnation": None if document is None else document.incarnation,
        "openEvents": 0 if document is None else len(document.events),
        "imdsOk": imds_ok,
    }


def impact_record(vm: VmIdentity, event_id: str, measured: dict[str, Any], now: float) -> dict[str, Any]:
    """What one event did to the VM: ``measured`` as :mod:`bridge.agent.impact` measured it."""
    return {
        **_envelope(IMPACT, derived_id(vm.key, "impact", event_id.upper()), now, vm),
        "eventId": event_id,
        **measured,
    }


def encode(record: dict[str, Any]) -> bytes:
    """One line of JSON (orjson escapes control characters, so no raw newline can appear)."""
    return orjson.dumps(record)
