"""``approval`` records (``schemas/approval.v1.schema.json``): the outcome of one approval attempt,
written by an agent's relay (``component`` agent, policy or coordinator) and by the approver
(``approver``). An agent's attempt is an occurrence, not a derivable change: its id is random, fixed
once in the outbox. An approver's record is the outcome *of a decision*, which any fleet approver
instance may write (the owner of its partition, a standby: :mod:`bridge.approver.standby`): its id
is derived from the decision (:func:`approver_record_id`), so two instances' records of one decision
are one record to a consumer that deduplicates on ``recordId``.

Read here by the console (an approver's audit counts only when an approver signed it: the reader
verifies that signature, once, and says by which key in ``signed_by``)."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bridge.records.fields import Envelope, check, optional_text, stamp, text, vm_of
from bridge.records.ids import APPROVAL, RECORD_NAMESPACE, envelope
from bridge.relay_api import EventResult
from bridge.schemas import JsonObject, json_list, json_object

if TYPE_CHECKING:  # the writer's types; readers (sinks, services) never load the IMDS layer
    from bridge.imds.instance import VmIdentity


SCHEMA = "approval.v1.schema.json"


def approver_record_id(decision_id: str | None, position: str, payload: bytes) -> str:
    """The id of an approver's audit record: per decision once it was proven valid (whichever
    instance, whichever re-read, its outcome is one record), per message otherwise (a refusal of the
    same bytes at the same position, by any instance)."""
    if decision_id is not None:
        return str(uuid.uuid5(RECORD_NAMESPACE, f"approver|decision|{decision_id}"))
    digest = hashlib.sha256(payload).hexdigest()
    return str(uuid.uuid5(RECORD_NAMESPACE, f"approver|message|{position}|{digest}"))


def build(
    component: str,
    *,
    decision_id: str | None,
    event_ids: list[str],
    outcome: str,
    reason: str | None,
    results: list[JsonObject],
    vm: VmIdentity | None = None,
    api_version: str | None = None,
    target: str | None = None,
    issued_by: str | None = None,
    requester: str | None = None,
    detail: str | None = None,
    start_requests_posted: int | None = None,
    path: str | None = None,
    arm_correlation_id: str | None = None,
    coordination: JsonObject | None = None,
    record_id: str | None = None,
    unverified: dict[str, str] | None = None,
    decision_reason: str | None = None,
) -> JsonObject:
    """One approval attempt, by the agent's relay (with its VM and how many StartRequests it posted)
    or by the approver (``vm`` null: the decision may never have reached an agent; ``record_id``
    from :func:`approver_record_id`)."""
    record: JsonObject = {
        **envelope(APPROVAL, record_id or str(uuid.uuid4()), time.time(), vm, api_version),
        "component": component,
        "decisionId": decision_id,
        "eventIds": json_list(event_ids),
        "target": target,
        "issuedBy": issued_by,
        "requester": requester,
        "outcome": outcome,
        "reason": reason,
        "detail": detail,
        "results": json_list(results),
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
        record["unverified"] = json_object(unverified)
    return record


@dataclass(frozen=True, slots=True)
class Approval(Envelope):
    component: str
    decision_id: str | None
    event_ids: tuple[str, ...]
    target: str | None
    issued_by: str | None
    requester: str | None
    outcome: str
    reason: str | None
    detail: str | None
    results: tuple[EventResult, ...]
    path: str | None
    decision_reason: str | None
    #: A coordinated approval's account (schema-checked; shown as it came).
    coordination: Mapping[str, object] | None
    #: What a refused message claimed to be (never proven): its decisionId, eventId, target, issuedBy.
    unverified: Mapping[str, str]
    #: The key id an approver's signature verified with (None: unsigned, or not by a known key).
    signed_by: str | None = None


def read(raw: Mapping[str, object], signed_by: str | None = None) -> Approval:
    f = check(raw, SCHEMA)
    vm = raw.get("vm")
    coordination = f.opt_obj("coordination")
    unverified = f.opt_obj("unverified")
    return Approval(
        record_id=f.string("recordId"),
        observed_at=stamp(raw["observedAt"]),
        vm=None if vm is None else vm_of(vm),
        component=f.string("component"),
        decision_id=optional_text(raw["decisionId"], 128),
        event_ids=tuple(f.strings("eventIds")),
        target=optional_text(raw.get("target"), 128),
        issued_by=optional_text(raw.get("issuedBy"), 256),
        requester=optional_text(raw.get("requester"), 256),
        outcome=f.string("outcome"),
        reason=optional_text(raw.get("reason"), 128),
        detail=optional_text(raw.get("detail"), 500),
        results=tuple(EventResult.from_json(dict(r.raw)) for r in f.objs("results")),
        path=optional_text(raw.get("path"), 16),
        decision_reason=optional_text(raw.get("decisionReason"), 2048),
        coordination=None if coordination is None else coordination.raw,
        unverified={k: text(v, 256) for k, v in (unverified.raw if unverified else {}).items()},
        signed_by=signed_by,
    )
