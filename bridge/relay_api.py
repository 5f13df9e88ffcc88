"""The agent's relay API in one place: its paths, the request an approver sends, the answer's words.

Why one module: the API has two ends in two services that never import each other (the approver
posts, the agent answers), and each used to spell it out itself: the paths in the approver's router
and the agent's access policy, the request body built twice in the approver and parsed by hand in
the agent, the field limits in the decision schema, the audit code and the parser. A rule written
twice drifts; here it is written once and both ends import it (a leaf: it imports nothing of the
services, only the decision schema it reads the limits from).

A request is one decision (``RelayDecision.to_json()``) or, from an approver with several decisions
for one VM in hand, ``{"decisions": [...]}`` in their order; the answer to the list is
``{"answers": [...]}``, one per decision. Each answer carries an :data:`Outcome` and a result per
event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, cast, get_args

import orjson

from bridge.schemas import JsonObject, load_schema

#: The relay itself: approvals in, StartRequests out.
START_REQUESTS_PATH = "/v1/start-requests"
#: The agent's document (its VM identity and the current events), what a fleet approver learns from.
DOCUMENT_PATH = "/v1/document"
#: This VM's preparation reports per event, what peer coordinators ask.
PREPARATIONS_PATH = "/v1/preparations"
#: Paths that only read (the access policy's read token or a signature for remote callers).
READ_PATHS = frozenset({"/metrics", DOCUMENT_PATH, PREPARATIONS_PATH})

#: Events one decision may name (IMDS takes a list; a decision names one, a coordinator a few).
MAX_EVENTS_PER_REQUEST = 20
#: Decisions one request may carry (an approver's queued decisions for one VM).
MAX_DECISIONS_PER_REQUEST = 50
#: A relayed decision's signed object, at most (the approver reads decisions of at most 16 KiB).
MAX_PROOF_BYTES = 16 * 1024
#: A coordinator's account of whom it waited for, at most (copied into the audit record).
MAX_COORDINATION_BYTES = 16 * 1024

#: What became of a decision (the audit record's ``outcome``; approval.v1.schema.json lists them).
Outcome = Literal["approved", "partial", "refused", "failed", "unknown"]

#: What became of one event of a decision (the audit record's ``results[].result``).
Result = Literal[
    "approved",
    "alreadyStarted",
    "notFound",
    "notScheduled",
    "notThisVm",
    "targetMismatch",
    "expired",
    "unproven",
    "imdsError",
    "refused",
    "armError",
    "unknown",
]


RESULTS: frozenset[str] = frozenset(get_args(Result))
OUTCOMES: frozenset[str] = frozenset(get_args(Outcome))
#: Results that mean the event is released (approved now, or started already).
RELEASED: frozenset[str] = frozenset({"approved", "alreadyStarted"})


class RelayAnswerError(ValueError):
    """An answer an approver cannot read (not this API's shape): audited as such, never guessed at."""


@dataclass(frozen=True, slots=True)
class EventResult:
    """One event's result in an answer and in the audit record that copies it."""

    event_id: str
    result: Result
    detail: str | None = None

    def to_json(self) -> JsonObject:
        body: JsonObject = {"eventId": self.event_id, "result": self.result}
        if self.detail is not None:
            body["detail"] = self.detail
        return body

    @classmethod
    def from_json(cls, item: object) -> EventResult:
        """A result as an answer (or a ledger) carries it; :class:`RelayAnswerError` otherwise."""
        if not isinstance(item, dict) or not isinstance(item.get("eventId"), str):
            raise RelayAnswerError("a result without an eventId")
        if item.get("result") not in RESULTS:
            raise RelayAnswerError("a result is not one of the relay's result words")
        return cls(item["eventId"], cast(Result, item["result"]), _short(item.get("detail"), 500))


def outcome_of(results: tuple[EventResult, ...] | list[EventResult]) -> tuple[Outcome, str | None]:
    """A decision's outcome and reason from its events' results, the one rule (the agent's answer,
    its resolution after a restart): ``unknown`` when an interrupted POST cannot be told; approved
    when every event is released; ``partial`` when some are; ``failed`` when only IMDS failed;
    ``refused`` otherwise. The reason is the first result that is not a release."""
    kinds = [r.result for r in results]
    if "unknown" in kinds:
        return "unknown", "interruptedPost"
    failed = [k for k in kinds if k not in RELEASED]
    if not failed:
        return "approved", None
    if len(failed) < len(kinds):
        return "partial", failed[0]
    if all(k == "imdsError" for k in failed):
        return "failed", "imdsError"
    return "refused", failed[0]


@dataclass(frozen=True, slots=True)
class RelayAnswer:
    """What became of one relayed decision: the agent's answer (``POST /v1/start-requests``), the ARM
    path's, or the approver's reading of an agent's refusal; the approver audits them alike.

    Built by the agent's relay, parsed once by the approver (:meth:`from_json`); ``relay``, ``path``
    and ``arm_correlation_id`` are the approver's (which path carried it), never on the wire."""

    decision_id: str
    outcome: Outcome
    reason: str | None = None
    results: tuple[EventResult, ...] = ()
    detail: str | None = None
    document_incarnation: int | None = None
    #: Which StartRequests POST carried the decision (the agent's ledger keeps it): one id per batch.
    start_requests: str | None = None
    #: A repeat of a decision the agent had answered: answered from its ledger, nothing posted.
    repeat: bool = False
    relay: str | None = None
    path: str | None = None
    arm_correlation_id: str | None = None

    def to_json(self) -> JsonObject:
        """The answer as the agent sends it (and its ledger keeps it)."""
        body: JsonObject = {
            "decisionId": self.decision_id,
            "outcome": self.outcome,
            "reason": self.reason,
            "results": [r.to_json() for r in self.results],
        }
        if self.detail is not None:
            body["detail"] = self.detail
        if self.document_incarnation is not None:
            body["documentIncarnation"] = self.document_incarnation
        if self.start_requests is not None:
            body["startRequests"] = self.start_requests
        if self.repeat:
            body["repeat"] = True
        return body

    @classmethod
    def from_json(cls, body: object) -> RelayAnswer:
        """An answer as an agent sent it (or its ledger kept it); :class:`RelayAnswerError` names
        what is wrong, never quoting a value."""
        if not isinstance(body, dict):
            raise RelayAnswerError("the answer is not a JSON object")
        outcome, decision_id = body.get("outcome"), body.get("decisionId", "")
        if outcome not in OUTCOMES:
            raise RelayAnswerError("outcome is not one of " + ", ".join(sorted(OUTCOMES)))
        if not isinstance(decision_id, str):
            raise RelayAnswerError("decisionId is not a string")
        raw = body.get("results") or []
        if not isinstance(raw, list) or len(raw) > MAX_EVENTS_PER_REQUEST:
            raise RelayAnswerError(f"results must be a list of at most {MAX_EVENTS_PER_REQUEST}")
        results = [EventResult.from_json(item) for item in raw]
        incarnation = body.get("documentIncarnation")
        posted = body.get("startRequests")
        return cls(
            decision_id=decision_id,
            outcome=cast(Outcome, outcome),
            reason=_short(body.get("reason"), 128),
            results=tuple(results),
            detail=_short(body.get("detail"), 500),
            document_incarnation=incarnation if type(incarnation) is int else None,
            start_requests=posted if isinstance(posted, str) else None,
            repeat=body.get("repeat") is True,
        )


def _short(value: object, limit: int) -> str | None:
    return value[:limit] if isinstance(value, str) else None


_GUID_LENGTH = 36  # the decision schema's eventId is a GUID (a pattern, no maxLength)


def _field_limits() -> dict[str, tuple[int, int]]:
    """(min, max) length of the decision fields a relay request and an audit record carry, read from
    the decision schema (the one place they are declared)."""
    properties = load_schema("decision.v1.schema.json")["properties"]
    limits = {}
    for name in ("decisionId", "target", "issuedBy"):
        spec = properties[name]
        limits[name] = (int(spec.get("minLength", 1)), int(spec["maxLength"]))
    limits["eventId"] = (1, _GUID_LENGTH)  # IMDS refuses what is not a GUID; longer is never one
    return limits


#: name -> (min, max) length, from the decision schema.
FIELD_LIMITS = _field_limits()


def fits(name: str, value: object) -> bool:
    """Whether ``value`` is a string within the decision schema's bounds for ``name`` (a check, not
    a narrowing: a TypeGuard narrows its first argument, the name)."""
    low, high = FIELD_LIMITS[name]
    return isinstance(value, str) and low <= len(value) <= high


class RelayRequestError(ValueError):
    """A relay request the agent cannot read (answered 400, counted, never audited)."""


@dataclass(frozen=True, slots=True)
class RelayDecision:
    """One decision as the approver relays it: what the agent checks before it posts."""

    decision_id: str
    event_ids: tuple[str, ...]
    target: str | None = None
    issued_by: str | None = None
    expires_at: str | None = None  # RFC 3339, as the decision has it: the agent checks it too
    coordination: JsonObject | None = field(default=None, compare=False)
    #: The signed decision itself (``decision`` in the body): the agent proves it with its own public
    #: keys and takes the event, target and expiry from it, never from the fields above (issue 31).
    proof: JsonObject | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> JsonObject:
        body: JsonObject = {"decisionId": self.decision_id, "eventIds": list(self.event_ids)}
        for key, value in (
            ("target", self.target),
            ("issuedBy", self.issued_by),
            ("expiresAt", self.expires_at),
        ):
            if value is not None:
                body[key] = value
        if self.coordination is not None:
            body["coordination"] = self.coordination
        if self.proof is not None:
            body["decision"] = self.proof
        return body

    def expires_epoch(self) -> float | None:
        return None if self.expires_at is None else _timestamp(self.expires_at)

    @classmethod
    def from_json(cls, body: object) -> RelayDecision:
        """Parse and bound one decision of a request; :class:`RelayRequestError` names what is wrong."""
        if not isinstance(body, dict):
            raise RelayRequestError("body must be a JSON object")
        decision_id = body.get("decisionId")
        if not fits("decisionId", decision_id):
            low, high = FIELD_LIMITS["decisionId"]
            raise RelayRequestError(f"decisionId must be a string of {low} to {high} characters")
        event_ids = body.get("eventIds")
        if (
            not isinstance(event_ids, list)
            or not 1 <= len(event_ids) <= MAX_EVENTS_PER_REQUEST
            or not all(fits("eventId", e) for e in event_ids)
        ):
            raise RelayRequestError(
                f"eventIds must be a list of 1 to {MAX_EVENTS_PER_REQUEST} event id strings"
            )
        expires = body.get("expiresAt")
        if expires is not None:
            _timestamp(expires)
        proof = body.get("decision")
        if proof is not None and (not isinstance(proof, dict) or len(orjson.dumps(proof)) > MAX_PROOF_BYTES):
            raise RelayRequestError(
                f"decision must be a signed decision object of at most {MAX_PROOF_BYTES} bytes"
            )
        return cls(
            decision_id=str(decision_id),
            event_ids=tuple(dict.fromkeys(event_ids)),
            target=body["target"] if isinstance(body.get("target"), str) else None,
            issued_by=body["issuedBy"] if isinstance(body.get("issuedBy"), str) else None,
            expires_at=None if expires is None else str(expires),
            coordination=_coordination(body.get("coordination")),
            proof=proof,
        )


def request_body(decisions: list[JsonObject]) -> JsonObject:
    """The body that relays ``decisions`` (each a :meth:`RelayDecision.to_json`): one is sent as
    itself, several as ``{"decisions": [...]}``."""
    return decisions[0] if len(decisions) == 1 else {"decisions": [d for d in decisions]}


def parse_request(body: object) -> tuple[list[RelayDecision], bool]:
    """The decisions of a request and whether it was a list (answered with ``{"answers": [...]}``)."""
    if not (isinstance(body, dict) and "decisions" in body):
        return [RelayDecision.from_json(body)], False
    decisions = body["decisions"]
    if not isinstance(decisions, list) or not 1 <= len(decisions) <= MAX_DECISIONS_PER_REQUEST:
        raise RelayRequestError(f"decisions must be a list of 1 to {MAX_DECISIONS_PER_REQUEST} decisions")
    parsed = [RelayDecision.from_json(d) for d in decisions]
    if len({d.decision_id for d in parsed}) != len(parsed):
        raise RelayRequestError("a decisionId appears twice in one request")
    return parsed, True


def _timestamp(value: object) -> float:
    """A decision's ``expiresAt`` (RFC 3339, as the decision schema has it), checked by the agent
    too: a decision that waited for this agent (down, restarting) must not be approved after it
    expired."""
    try:
        return datetime.fromisoformat(str(value)).timestamp()
    except ValueError:
        raise RelayRequestError("expiresAt must be an RFC 3339 date and time") from None


def _coordination(account: object) -> JsonObject | None:
    """A coordinator's account of whom it waited for (bridge.coordination), copied to the audit
    record: bounded, and only in the shape the approval schema gives it (an audit record is never
    made invalid by a caller). Only an authenticated caller gets this far (the access policy)."""
    if account is None:
        return None
    from bridge.schemas import validate_document  # coordinated approvals are rare: compiled on use

    if len(orjson.dumps(account)) > MAX_COORDINATION_BYTES:
        raise RelayRequestError(f"coordination: at most {MAX_COORDINATION_BYTES} bytes")
    errors = validate_document(account, "approval.v1.schema.json", part="coordination")
    if errors:
        raise RelayRequestError(f"coordination: {errors[0]}"[:300])
    if not isinstance(account, dict):
        raise RelayRequestError("coordination must be an object")
    return account
