"""Decisions: their canonical form, HMAC signatures, and the checks that prove one valid.

Approvals change production VMs, so the rule is *deny anything not proven valid*. A decision is valid
only when every check passes, in this order (the first failure is the refusal reason):

1. ``schema``       it matches ``schemas/decision.v1.schema.json``;
2. ``unsigned`` / ``unknownKey`` / ``badSignature``
                    it carries an HMAC-SHA256 signature by a configured key (unsigned decisions are
                    refused unless ``allow_unsigned`` was set explicitly, for labs);
3. ``issuerNotAllowed``  its ``issuedBy`` is on the allow-list, when one is configured;
4. ``expired`` / ``issuedInFuture`` / ``ttlTooLong``
                    ``expiresAt`` is in the future, ``issuedAt`` not in the future beyond the allowed
                    clock skew, and the decision does not live longer than ``max_ttl``;
5. ``replayed``     its ``decisionId`` was not used before (checked by the approver's store).

Canonical form (what is signed), so that a Logic App, a script or another language can produce a
valid decision: the decision object **without** its ``signature`` member, serialized as RFC 8785
JSON Canonicalization Scheme (the ``rfc8785`` package: keys sorted by UTF-16 code units, ES6 number
formatting, so ``1.0`` is ``1``). For the decision's fields (strings and one small integer) that is
also what ``json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` gives, or
``JSON.stringify`` of an object whose keys were inserted in sorted order in JavaScript. The
signature value is the lowercase hex HMAC-SHA256 of those bytes under the key named by
``signature.keyId``.

A decision is read strictly (I-JSON, RFC 7493): a member repeated in one object is refused, since a
reader that keeps the first and one that keeps the last would see two different decisions under
one signature; ``expiresAt`` must come after ``issuedAt``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from bridge.signing import KeyRing

SCHEMA_FILE = "decision.v1.schema.json"


class DecisionRefused(Exception):
    """A decision that is not proven valid. ``reason`` is a short code (audit records, metrics).
    ``authentic``: its signature was proven before it was refused (expired, issuer not allowed...),
    so what it says of itself (its decisionId, eventId) may be repeated in the audit as its own."""

    def __init__(self, reason: str, detail: str, *, authentic: bool = False) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.authentic = authentic


def canonical(decision: dict[str, Any]) -> bytes:
    """RFC 8785 canonical JSON of the decision without its signature (see the module docstring).
    A value RFC 8785 cannot represent (NaN, an integer beyond 2**53) is a ``ValueError``."""
    import rfc8785

    body = {k: v for k, v in decision.items() if k != "signature"}
    try:
        return bytes(rfc8785.dumps(body))
    except (rfc8785.CanonicalizationError, TypeError) as exc:
        raise ValueError(f"not canonicalizable (RFC 8785): {exc}") from None


def loads_strict(payload: bytes) -> Any:
    """JSON whose objects repeat no member (I-JSON); ``ValueError`` naming the first repeated one."""

    def no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise ValueError(f"member {key[:64]!r} appears twice in one object")
            out[key] = value
        return out

    return json.loads(payload, object_pairs_hook=no_repeats)


def sign(decision: dict[str, Any], key_id: str, key: bytes) -> dict[str, Any]:
    value = hmac.new(key, canonical(decision), hashlib.sha256).hexdigest()
    return {**decision, "signature": {"alg": "HMAC-SHA256", "keyId": key_id, "value": value}}


def new_decision(
    event_id: str,
    target: str,
    issued_by: str,
    ttl: float,
    reason: str | None = None,
    now: float | None = None,
    action: str = "approve",
) -> dict[str, Any]:
    issued = datetime.now(UTC) if now is None else datetime.fromtimestamp(now, UTC)
    expires = datetime.fromtimestamp(issued.timestamp() + ttl, UTC)
    decision: dict[str, Any] = {
        "schemaVersion": 1,
        "recordType": "decision",
        "decisionId": str(uuid.uuid4()),
        "eventId": event_id,
        "action": action,
        "target": target,
        "issuedBy": issued_by,
        "issuedAt": _fmt(issued),
        "expiresAt": _fmt(expires),
    }
    if reason:
        decision["reason"] = reason
    return decision


Action = Literal["approve", "decline"]


@dataclass(frozen=True, slots=True)
class Decision:
    """A decision proven valid, parsed once: every step after validation (routing, the relay
    request, the ARM path, the parking, the audit record) reads these fields, never the message
    again. A coordinated approval (bridge.approver.coordinated) is one too, issued by the fleet's
    coordinator: it has no signature and no expiry of its own."""

    decision_id: str
    event_id: str
    target: str
    issued_by: str
    action: Action = "approve"
    expires_at: str | None = None  # as signed (the agent checks it too)
    expires: float = float("inf")  # ``expires_at`` as Unix time

    @classmethod
    def of(cls, valid: Mapping[str, Any]) -> Decision:
        """The fields of a decision object the schema and the signature proved."""
        expires_at = valid.get("expiresAt")
        return cls(
            decision_id=valid["decisionId"],
            event_id=valid["eventId"],
            target=valid["target"],
            issued_by=valid["issuedBy"],
            action="decline" if valid.get("action") == "decline" else "approve",
            expires_at=expires_at,
            expires=_timestamp(expires_at),
        )

    def claims(self) -> dict[str, str]:
        """Its identity as the audit record names it (the decision schema's member names)."""
        return {
            "decisionId": self.decision_id,
            "eventId": self.event_id,
            "target": self.target,
            "issuedBy": self.issued_by,
        }


@dataclass(frozen=True)
class ValidationPolicy:
    keys: KeyRing
    allow_unsigned: bool = False
    issuers: frozenset[str] = frozenset()  # empty: any issuer
    max_skew: float = 300.0
    max_ttl: float = 24 * 3600.0


def warm_up() -> None:
    """Import the validator and compile the decision schema now (about 0.1 s with the package's
    imports), which the first decision after a start would otherwise wait for."""
    from bridge.schemas import validate_document

    validate_document({}, SCHEMA_FILE)


def validate(decision: Any, policy: ValidationPolicy, now: float) -> Decision:
    """Return the decision when every check passes; raise :class:`DecisionRefused` otherwise."""
    from bridge.schemas import validate_document

    errors = validate_document(decision, SCHEMA_FILE)
    if errors:
        raise DecisionRefused("schema", "; ".join(errors[:3]))
    signature = decision.get("signature")
    if signature is None:
        if not policy.allow_unsigned:
            raise DecisionRefused("unsigned", "decision is not signed (unsigned decisions are refused)")
    else:
        key = policy.keys.get(signature["keyId"])
        if key is None:
            raise DecisionRefused("unknownKey", f"signature key id {signature['keyId']!r} is not configured")
        try:
            signed_bytes = canonical(decision)
        except ValueError as exc:
            raise DecisionRefused("schema", str(exc)) from None
        expected = hmac.new(key, signed_bytes, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, signature["value"]):
            raise DecisionRefused("badSignature", "signature does not match the decision")
    authentic = signature is not None  # from here on, a refusal names a decision that is its own
    if policy.issuers and decision["issuedBy"] not in policy.issuers:
        detail = f"issuer {decision['issuedBy']!r} is not allowed"
        raise DecisionRefused("issuerNotAllowed", detail, authentic=authentic)
    issued, expires = _parse(decision, "issuedAt"), _parse(decision, "expiresAt")
    for reason, refused, detail in (
        ("schema", expires <= issued, "expiresAt is not after issuedAt"),
        ("expired", expires <= now, f"decision expired at {decision['expiresAt']}"),
        (
            "issuedInFuture",
            issued > now + policy.max_skew,
            f"issuedAt {decision['issuedAt']} is in the future",
        ),
        (
            "ttlTooLong",
            expires - issued > policy.max_ttl,
            f"decision lives longer than {policy.max_ttl:.0f} s",
        ),
    ):
        if refused:
            raise DecisionRefused(reason, detail, authentic=authentic)
    return Decision.of(decision)  # proven a decision object above (schema, then signature)


def _timestamp(text: str | None) -> float:
    """An ``expiresAt`` as Unix time (``inf`` for none: never expires)."""
    try:
        return datetime.fromisoformat(str(text)).timestamp() if text else float("inf")
    except (ValueError, OverflowError):
        return float("inf")


def _fmt(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def _parse(decision: dict[str, Any], field: str) -> float:
    """A timestamp the schema's pattern admitted may still be no date (``2026-02-30T10:00:00Z``):
    that is a refusal, never an exception (which would hold the source on this message)."""
    text = decision[field]
    try:
        return datetime.fromisoformat(text).timestamp()
    except (ValueError, OverflowError):
        raise DecisionRefused("schema", f"{field} {text!r} is not a valid date and time") from None
