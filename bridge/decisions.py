"""Decisions: their canonical form, signatures (Ed25519, or HMAC during a migration), and the checks
that prove one valid.

A leaf every end imports (issue 31, 32): the signers (``se-bridge decide``, the console, the signer
Function) sign here; the approvers validate here; and the **agent verifies the same decision again
here** before it posts a StartRequest, so that no secret held on a VM can approve for another VM.
That is why the fleet's decisions are signed with Ed25519: agents and approvers hold only public
keys (a public key proves, it cannot sign), the signers hold the private keys. An HMAC key proves
and signs alike, so an agent never accepts one (:func:`verify_for_agent`); approvers still accept
HMAC decisions during a migration window (docs/security.md), which agents then take only within
their own ``relay_legacy_until``.

Approvals change production VMs, so the rule is *deny anything not proven valid*. A decision is valid
only when every check passes, in this order (the first failure is the refusal reason):

1. ``schema``       it matches ``schemas/decision.v1.schema.json``;
2. ``unsigned`` / ``unknownKey`` / ``badSignature``
                    it carries a signature by a configured key: ``Ed25519`` under a public key, or
                    ``HMAC-SHA256`` under a shared key (unsigned decisions are refused unless
                    ``allow_unsigned`` was set explicitly, for labs; a signature whose ``alg`` does
                    not match the kind of key its ``keyId`` names is ``badSignature``);
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
signature value is the lowercase hex of the 64-byte Ed25519 signature of those bytes (``alg:
"Ed25519"``) or of their HMAC-SHA256 (``alg: "HMAC-SHA256"``), under the key ``signature.keyId``
names. Ed25519 keys are PEM files (``se-bridge keygen`` writes a pair: ``PRIVATE KEY`` for a
signer, ``PUBLIC KEY`` for agents and approvers).

A decision is read strictly (I-JSON, RFC 7493): a member repeated in one object is refused, since a
reader that keeps the first and one that keeps the last would see two different decisions under
one signature; ``expiresAt`` must come after ``issuedAt``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Union

from bridge.schemas import JsonObject, JsonValue
from bridge.signing import MIN_KEY_BYTES, KeyRing

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

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


def canonical(decision: Mapping[str, Any]) -> bytes:
    """RFC 8785 canonical JSON of the decision without its signature (see the module docstring).
    A value RFC 8785 cannot represent (NaN, an integer beyond 2**53) is a ``ValueError``."""
    import rfc8785

    body = {k: v for k, v in decision.items() if k != "signature"}
    try:
        return bytes(rfc8785.dumps(body))
    except (rfc8785.CanonicalizationError, TypeError) as exc:
        raise ValueError(f"not canonicalizable (RFC 8785): {exc}") from None


def loads_strict(payload: bytes) -> JsonValue:
    """JSON whose objects repeat no member (I-JSON); ``ValueError`` naming the first repeated one."""

    def no_repeats(pairs: list[tuple[str, JsonValue]]) -> JsonObject:
        out: JsonObject = {}
        for key, value in pairs:
            if key in out:
                raise ValueError(f"member {key[:64]!r} appears twice in one object")
            out[key] = value
        return out

    parsed: JsonValue = json.loads(payload, object_pairs_hook=no_repeats)
    return parsed


#: What signs a decision: an Ed25519 private key, or (migration only) an HMAC key's bytes.
SigningKey = Union[bytes, "Ed25519PrivateKey"]
#: What proves one: an Ed25519 public key, or (approvers during a migration) an HMAC key's bytes.
VerifyingKey = Union[bytes, "PublicKey", "Ed25519PublicKey"]

ED25519 = "Ed25519"
HMAC_SHA256 = "HMAC-SHA256"
_PRIVATE_PEM = b"-----BEGIN PRIVATE KEY-----"
_PUBLIC_PEM = b"-----BEGIN PUBLIC KEY-----"
#: The DER SubjectPublicKeyInfo of every Ed25519 public key (RFC 8410), before its 32 key bytes.
_ED25519_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")


@dataclass(frozen=True, slots=True)
class PublicKey:
    """An Ed25519 public key, its 32 bytes read from the PEM without the crypto library.

    Why not PyCA's key object at once: every agent holds these keys, and importing ``cryptography``
    costs an agent some 7 MiB of RSS (29.5 -> 36.8 MiB measured, docs/performance.md) for a check
    it makes a few times a day. The library (well kept, not hand-written crypto) is imported only
    when a decision is verified."""

    raw: bytes

    def verify(self, signature: bytes, data: bytes) -> None:
        """``cryptography.exceptions.InvalidSignature`` when ``signature`` is not over ``data``."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        Ed25519PublicKey.from_public_bytes(self.raw).verify(signature, data)


def _public_from_pem(data: bytes, where: str) -> PublicKey:
    import base64
    import binascii

    body = b"".join(line for line in data.splitlines() if line and not line.startswith(b"-----"))
    try:
        der = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"key file {where} is not a readable PEM key") from None
    if len(der) != len(_ED25519_SPKI_PREFIX) + 32 or not der.startswith(_ED25519_SPKI_PREFIX):
        raise ValueError(f"key file {where} holds a PEM key that is not Ed25519")
    return PublicKey(der[len(_ED25519_SPKI_PREFIX) :])


def sign(decision: Mapping[str, JsonValue], key_id: str, key: SigningKey) -> JsonObject:
    """``decision`` with its ``signature``: Ed25519 for a private key, HMAC-SHA256 for bytes."""
    body = canonical(decision)
    if isinstance(key, bytes):
        alg, value = HMAC_SHA256, hmac.new(key, body, hashlib.sha256).hexdigest()
    else:
        alg, value = ED25519, key.sign(body).hex()
    return {**decision, "signature": {"alg": alg, "keyId": key_id, "value": value}}


def generate_key_pair() -> tuple[bytes, bytes]:
    """A new Ed25519 pair as PEM: (private PKCS#8, public SubjectPublicKeyInfo)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = Ed25519PrivateKey.generate()
    return (
        private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        public_pem(private),
    )


def public_pem(private: Ed25519PrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def parse_key(data: bytes, where: str) -> SigningKey | VerifyingKey:
    """A key file's content: an Ed25519 private or public key (PEM), or an HMAC key (at least 32
    bytes of text). ``ValueError`` naming ``where`` (never the content) otherwise."""
    data = data.strip()
    if data.startswith(_PUBLIC_PEM):
        return _public_from_pem(data, where)  # no crypto library at start (PublicKey says why)
    if data.startswith(_PRIVATE_PEM):
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        try:
            key: Any = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError):
            raise ValueError(f"key file {where} is not a readable PEM key") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"key file {where} holds a PEM key that is not Ed25519")
        return key
    if len(data) < MIN_KEY_BYTES:
        raise ValueError(f"key file {where} holds {len(data)} bytes; at least {MIN_KEY_BYTES} are required")
    return data


def load_signing_key(where: str | Path) -> SigningKey:
    """What ``decide``, the console and the signer sign with: a private Ed25519 key, or an HMAC key
    (migration). A *public* key is refused: it cannot sign."""
    from bridge.signing import load_key_bytes

    key = parse_key(load_key_bytes(str(where)), str(where))
    if _is_public(key):
        raise ValueError(f"key file {where} holds a public key, which cannot sign (give the private key)")
    return key  # type: ignore[return-value]


class DecisionKeys:
    """The keys that prove decisions, by key id: Ed25519 public keys (a private key's public half is
    taken), and HMAC keys where the holder allows them (approvers, during a migration)."""

    def __init__(self, keys: dict[str, VerifyingKey] | None = None) -> None:
        self._keys = dict(keys or {})

    @classmethod
    def from_specs(cls, specs: list[str] | tuple[str, ...], *, public_only: bool = False) -> DecisionKeys:
        """``KEYID=PATH`` items (PATH may be a Key Vault secret identifier). ``public_only``: refuse
        HMAC and private keys (what an agent holds must not be able to sign for any VM)."""
        from bridge.signing import load_key_bytes

        keys: dict[str, VerifyingKey] = {}
        for spec in specs:
            key_id, sep, path = spec.partition("=")
            if not sep or not key_id or not path:
                raise ValueError("each key must be given as KEYID=PATH")
            key = parse_key(load_key_bytes(path), path)
            if public_only and not _is_public(key):
                raise ValueError(
                    f"key {key_id}: {path} is not an Ed25519 public key; an agent holds only public "
                    "decision keys (a shared or private key on a VM could sign for every VM)"
                )
            keys[key_id] = _verifying(key)
        return cls(keys)

    def get(self, key_id: str) -> VerifyingKey | None:
        return self._keys.get(key_id)

    def ids(self) -> list[str]:
        return sorted(self._keys)

    def __bool__(self) -> bool:
        return bool(self._keys)


def _verifying(key: SigningKey | VerifyingKey) -> VerifyingKey:
    """What proves what ``key`` signs: itself (HMAC, public), or a private key's public half."""
    if isinstance(key, bytes | PublicKey):
        return key
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return key.public_key() if isinstance(key, Ed25519PrivateKey) else key


def _is_public(key: object) -> bool:
    if isinstance(key, PublicKey):
        return True
    if "cryptography" not in sys.modules:
        return False  # no PyCA key object can exist yet
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    return isinstance(key, Ed25519PublicKey)


def _signature_matches(key: VerifyingKey, alg: str, signed: bytes, value: str) -> bool:
    if isinstance(key, bytes):
        if alg != HMAC_SHA256:
            return False
        return hmac.compare_digest(hmac.new(key, signed, hashlib.sha256).hexdigest(), value)
    if alg != ED25519 or len(value) != 128:
        return False
    from cryptography.exceptions import InvalidSignature

    try:
        key.verify(bytes.fromhex(value), signed)
    except (InvalidSignature, ValueError):
        return False
    return True


def new_decision(
    event_id: str,
    target: str,
    issued_by: str,
    ttl: float,
    reason: str | None = None,
    now: float | None = None,
    action: str = "approve",
) -> JsonObject:
    issued = datetime.now(UTC) if now is None else datetime.fromtimestamp(now, UTC)
    expires = datetime.fromtimestamp(issued.timestamp() + ttl, UTC)
    decision: JsonObject = {
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
    reason: str | None = None  # the person's words (kept in the audit trail)
    #: The signed decision object as proven, relayed whole so that the agent proves it again itself.
    proof: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

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
            reason=valid.get("reason"),
            proof=valid if valid.get("signature") is not None else None,
        )

    def claims(self) -> dict[str, str]:
        """Its identity as the audit record names it (the decision schema's member names), and the
        reason its signer gave (issue 33: it never reached the audit trail)."""
        claims = {
            "decisionId": self.decision_id,
            "eventId": self.event_id,
            "target": self.target,
            "issuedBy": self.issued_by,
        }
        if self.reason:  # the person's words, signed with the decision: kept in the audit trail
            claims["reason"] = self.reason
        return claims


@dataclass(frozen=True)
class ValidationPolicy:
    keys: KeyRing | DecisionKeys
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
        # The members only, never their values: this text reaches audit records and chat messages,
        # and the values are whatever the writer of an unproven message chose (issue 31).
        members = sorted({error.split(":", 1)[0] for error in errors})
        raise DecisionRefused("schema", "not a valid decision (decision.v1): " + ", ".join(members[:5]))
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
        if not _signature_matches(key, signature["alg"], signed_bytes, signature["value"]):
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


def verify_for_agent(
    decision: Any, keys: DecisionKeys, now: float, *, max_skew: float = 300.0, max_ttl: float = 7 * 86400.0
) -> Decision:
    """The agent's own proof of a relayed decision (issue 31): every check an approver makes, under
    the agent's public keys only: an HMAC signature, or none, is ``unknownKey``/``unsigned`` here
    whatever the approver accepted. A decline is never relayed, so one here is refused too."""
    if not isinstance(decision, dict):
        raise DecisionRefused("schema", "the relayed decision is not a JSON object")
    if not decision.get("signature"):
        raise DecisionRefused("unsigned", "the relayed decision is not signed")
    valid = validate(decision, ValidationPolicy(keys, max_skew=max_skew, max_ttl=max_ttl), now)
    if valid.action != "approve":
        raise DecisionRefused("schema", "a declined decision approves nothing", authentic=True)
    return valid


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
