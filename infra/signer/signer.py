"""Sign one approval decision for the example Logic App: the Function's logic, without the Functions
runtime (``function_app.py`` is the thin HTTP wrapper), so the test suite runs it as it is.

Why a Function: a Consumption Logic App's inline code takes at most 1,024 characters (Logic Apps
limits), and the workflow language has no HMAC; the approvers' own signing code
(``bridge.decisions``: canonical JSON, Ed25519; HMAC-SHA256 during a migration) is what must
produce the signature, so the Function runs it. ``SE_DECISION_KEY`` holds the Ed25519 private key
(PEM, ``se-bridge keygen``): agents act only on Ed25519 decisions. The key never enters the
workflow: the Function's app setting ``SE_DECISION_KEY`` is a Key Vault reference
(``@Microsoft.KeyVault(SecretUri=...)``) the platform resolves with the Function's managed identity.

Request (the workflow's ``Decision_fields``): ``{"decisionId", "eventId", "target", "issuedBy",
"ttlSeconds", "reason"}``; answer: the signed decision (``schemas/decision.v1.schema.json``), or
``{"error": ...}`` with 400 (a bad request) or 500 (the Function is misconfigured: no key). What it
would sign is checked against the decision schema the approvers check it with: it never signs a
decision they would refuse as malformed (a ``decisionId`` with a space, a 3,000-character reason).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from bridge.decisions import SCHEMA_FILE, PublicKey, new_decision, parse_key, sign
from bridge.schemas import validate_document

MIN_KEY_BYTES = 32
MAX_BODY_BYTES = 16 * 1024
REQUIRED = ("eventId", "target", "issuedBy")
OPTIONAL = ("decisionId", "reason")


class BadRequest(ValueError):
    pass


def handle(body: bytes, env: Mapping[str, str], now: float | None = None) -> tuple[int, dict[str, Any]]:
    """(HTTP status, answer) for one request body."""
    key_text = (env.get("SE_DECISION_KEY") or "").strip().encode("utf-8")
    key_id = env.get("SE_DECISION_KEY_ID") or ""
    try:
        key = parse_key(key_text, "SE_DECISION_KEY") if len(key_text) >= MIN_KEY_BYTES else None
    except ValueError:
        key = None
    if key is None or isinstance(key, PublicKey) or not key_id:  # a public key cannot sign
        # Never say more: the answer goes back to the workflow's run history.
        return 500, {"error": "the signer has no usable key (SE_DECISION_KEY, SE_DECISION_KEY_ID)"}
    try:
        fields = _fields(body, max_ttl=float(env.get("SE_DECISION_MAX_TTL_SECONDS") or 3600))
    except BadRequest as exc:
        return 400, {"error": str(exc)}
    event_id, target, issued_by = fields["eventId"], fields["target"], fields["issuedBy"]
    decision = new_decision(event_id, target, issued_by, fields["ttlSeconds"], fields.get("reason"), now)
    if fields.get("decisionId"):
        decision["decisionId"] = fields["decisionId"]  # deterministic per event and VM: a rerun is a replay
    signed = sign(decision, key_id, key)
    errors = validate_document(signed, SCHEMA_FILE)
    if errors:
        return 400, {"error": "; ".join(errors[:3])}
    return 200, signed


def _fields(body: bytes, max_ttl: float) -> dict[str, Any]:
    if len(body) > MAX_BODY_BYTES:
        raise BadRequest(f"body over {MAX_BODY_BYTES} bytes")
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("body is not JSON") from None
    if not isinstance(data, dict):
        raise BadRequest("body must be a JSON object")
    out: dict[str, Any] = {}
    for name in (*REQUIRED, *OPTIONAL):  # types here; lengths and patterns: the schema, on the result
        value = data.get(name)
        if value is None and name in OPTIONAL:
            continue
        if not isinstance(value, str):
            raise BadRequest(f"{name} must be a string")
        out[name] = value
    ttl = data.get("ttlSeconds")
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 60 <= ttl <= max_ttl:
        raise BadRequest(f"ttlSeconds must be a number from 60 to {max_ttl:.0f}")
    out["ttlSeconds"] = float(ttl)
    return out
