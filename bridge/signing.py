"""Shared HMAC keys and request signing (relay API), used by the agent and the approver.

Keys are shared secrets held in files (at least 32 bytes of text), named by a key id so they can be
rotated: configure the new id next to the old one, switch the signers, then remove the old id.

A signed request carries::

    X-SE-Bridge-Key-Id:    <key id>
    X-SE-Bridge-Timestamp: <Unix seconds>
    X-SE-Bridge-Nonce:     <random, 16-64 characters [A-Za-z0-9_-]>
    X-SE-Bridge-Signature: sha256=<lowercase hex HMAC-SHA256(key, "<ts>.<nonce>.<METHOD>.<path>." + body)>

The method and the path are signed (a signature for ``GET /metrics`` cannot be replayed as a POST to
the relay), the timestamp must lie in the replay window, and each nonce is accepted once. The nonces
seen are kept in the state directory (``relay-nonces.jsonl``) for as long as their requests could be
replayed, so a captured request cannot be replayed after the agent restarts either.

Every value is checked to be ASCII before use: a header is text the caller chose, and a non-ASCII
digit or signature must be a refusal (401), never an exception.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import threading
import time
from collections.abc import Mapping
from email.message import Message
from pathlib import Path
from typing import Any

import orjson

from bridge.schemas import JsonObject, JsonValue
from bridge.support.fsutil import append_durably, write_atomic

log = logging.getLogger(__name__)

MIN_KEY_BYTES = 32
REPLAY_WINDOW = 300.0

H_KEY_ID = "X-SE-Bridge-Key-Id"
H_TIMESTAMP = "X-SE-Bridge-Timestamp"
H_NONCE = "X-SE-Bridge-Nonce"
H_SIGNATURE = "X-SE-Bridge-Signature"

# Matched with fullmatch (``$`` would accept a trailing newline); ASCII classes only.
_NONCE = re.compile(r"[A-Za-z0-9_-]{16,64}")
_SIGNATURE = re.compile(r"sha256=[0-9a-f]{64}")
_TIMESTAMP = re.compile(r"[0-9]{1,12}")


def _object_mac(key: bytes, kind: bytes, body: Mapping[str, object]) -> str:
    """HMAC-SHA256 of a JSON object, keys sorted (orjson, recursively), prefixed by its ``kind``
    (``record.``, ``answer.``) so that a signature of one kind of object never proves another."""
    return hmac.new(
        key, kind + b"." + orjson.dumps(body, option=orjson.OPT_SORT_KEYS), hashlib.sha256
    ).hexdigest()


def _sign_object(key_id: str, key: bytes, kind: bytes, body: Mapping[str, JsonValue]) -> JsonObject:
    return {**body, "signature": {"keyId": key_id, "value": _object_mac(key, kind, body)}}


def _proven_object(keys: KeyRing, kind: bytes, signed: object) -> JsonObject:
    """``signed`` without its signature once a known key proves it; ``PermissionError`` saying why
    (named after ``kind``) otherwise."""
    what = kind.decode()
    if not isinstance(signed, dict) or not isinstance(signed.get("signature"), dict):
        raise PermissionError(f"unsigned {what}")
    signature = signed["signature"]
    key = keys.get(str(signature.get("keyId")))
    if key is None:
        raise PermissionError(f"{what} signed with an unknown key")
    body = {k: v for k, v in signed.items() if k != "signature"}
    if not hmac.compare_digest(_object_mac(key, kind, body), str(signature.get("value"))):
        raise PermissionError(f"bad {what} signature")
    return body


def sign_record(key_id: str, key: bytes, record: Mapping[str, JsonValue]) -> JsonObject:
    """``record`` signed by its producer (Azure's channel, bridge.azure): records on the events stream
    are written by every agent, so a consumer that *acts* on one (the fleet approver's ARM path) must
    know it came from the service it trusts. Any ``signature`` it had is replaced."""
    return _sign_object(key_id, key, b"record", {k: v for k, v in record.items() if k != "signature"})


def verify_record(keys: KeyRing, record: object) -> JsonObject:
    """The record without its signature once proven by a known key; ``PermissionError`` otherwise."""
    return _proven_object(keys, b"record", record)


class KeyRing:
    """HMAC keys by key id."""

    def __init__(self, keys: dict[str, bytes] | None = None) -> None:
        self._keys = dict(keys or {})

    @classmethod
    def from_specs(cls, specs: list[str] | tuple[str, ...]) -> KeyRing:
        """``KEYID=PATH`` items; each file holds the shared secret as text (at least 32 bytes). PATH
        may be a Key Vault secret identifier (:mod:`bridge.transports.keyvault`), read now with the
        managed identity."""
        keys: dict[str, bytes] = {}
        for spec in specs:
            key_id, sep, path = spec.partition("=")
            if not sep or not key_id or not path:
                raise ValueError("each key must be given as KEYID=PATH")
            keys[key_id] = load_key_from(path)
        return cls(keys)

    def get(self, key_id: str) -> bytes | None:
        return self._keys.get(key_id)

    def first(self) -> tuple[str, bytes] | None:
        return next(iter(self._keys.items()), None)

    def ids(self) -> list[str]:
        return sorted(self._keys)

    def __bool__(self) -> bool:
        return bool(self._keys)


def load_key_bytes(where: str) -> bytes:
    """A key's raw text, from a file or from Key Vault when ``where`` is a secret identifier;
    ``ValueError`` naming where (never the content) when it cannot be read."""
    from bridge.transports import keyvault

    if not keyvault.is_secret_url(where):
        try:
            return Path(where).read_bytes()
        except OSError as exc:
            raise ValueError(f"cannot read key file {where}: {exc.strerror}") from None
    try:
        return keyvault.read_secret(where).encode("utf-8")
    except keyvault.KeyVaultError as exc:
        raise ValueError(f"cannot read key {exc}") from None


def load_key_from(where: str) -> bytes:
    """A shared (HMAC) key from a file, or from Key Vault when ``where`` is a secret identifier."""
    from bridge.transports import keyvault

    key = load_key_bytes(where).strip()
    if len(key) < MIN_KEY_BYTES:
        shown = where.split("?", 1)[0] if keyvault.is_secret_url(where) else f"file {where}"
        raise ValueError(f"key {shown} holds {len(key)} bytes; at least {MIN_KEY_BYTES} are required")
    return key


def load_key(path: Path) -> bytes:
    return load_key_from(str(path))


def request_signature(key: bytes, timestamp: str, nonce: str, method: str, path: str, body: bytes) -> str:
    message = f"{timestamp}.{nonce}.{method.upper()}.{path}.".encode() + body
    return "sha256=" + hmac.new(key, message, hashlib.sha256).hexdigest()


def sign_request(
    key_id: str, key: bytes, method: str, path: str, body: bytes = b"", now: float | None = None
) -> dict[str, str]:
    """Headers that authenticate ``METHOD path`` with ``body`` to an agent's API."""
    timestamp = str(int(time.time() if now is None else now))
    nonce = secrets.token_hex(16)
    return {
        H_KEY_ID: key_id,
        H_TIMESTAMP: timestamp,
        H_NONCE: nonce,
        H_SIGNATURE: request_signature(key, timestamp, nonce, method, path, body),
    }


def sign_peer_answer(
    private: Any, nonce: str, answer: Mapping[str, JsonValue], now: float | None = None
) -> JsonObject:
    """``answer`` signed by this agent's own Ed25519 key (:mod:`bridge.agent.peerkeys`) for the request
    whose nonce was ``nonce``; the public key rides along for the asker to pin (issue 31: the relay key,
    which every agent holds, let any of them answer in another peer's name)."""
    from cryptography.hazmat.primitives import serialization

    public = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    body = {**answer, "answeredAt": int(time.time() if now is None else now), "nonce": nonce,
            "answerKey": public.hex()}  # fmt: skip
    signed = b"peer-answer." + orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    return {**body, "signature": {"alg": "Ed25519", "value": private.sign(signed).hex()}}


def verify_peer_answer(nonce: str, answer: object, now: float | None = None) -> JsonObject:
    """The answer (with its ``answerKey``) once its Ed25519 signature under the key it carries is
    proven, for that nonce, within the replay window; ``PermissionError`` otherwise. Whose key it is
    the caller decides (a pin: :class:`bridge.agent.peerkeys.PeerPins`)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if not isinstance(answer, dict) or not isinstance(answer.get("signature"), dict):
        raise PermissionError("unsigned answer")
    signature = answer["signature"]
    body = {k: v for k, v in answer.items() if k != "signature"}
    key, value = body.get("answerKey"), signature.get("value")
    if signature.get("alg") != "Ed25519" or not isinstance(key, str) or not isinstance(value, str):
        raise PermissionError("answer not signed with a peer's own key")
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(key)).verify(
            bytes.fromhex(value), b"peer-answer." + orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
        )
    except (InvalidSignature, ValueError):
        raise PermissionError("bad answer signature") from None
    if body.get("nonce") != nonce:
        raise PermissionError("answer to another request")
    answered = body.get("answeredAt")
    now = time.time() if now is None else now
    if not isinstance(answered, int) or abs(now - answered) > REPLAY_WINDOW:
        raise PermissionError("answer outside the replay window")
    return body


class NonceStore:
    """The nonces accepted within the replay window, in memory and (with a path) on disk.

    ``<state-dir>/relay-nonces.jsonl`` is append-only, one ``{"nonce", "expires"}`` per accepted
    request, fsynced before the request is acted on; read back at start (expired lines dropped) and
    rewritten when it has grown to several times what is still live. Signed requests are rare (one
    per approval), so an fsync each costs nothing that matters."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._expiry: dict[str, float] = {}
        self._lines = 0
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        now = time.time()
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        for line in data.splitlines():
            self._lines += 1
            try:
                item = orjson.loads(line)
                nonce, expires = str(item["nonce"]), float(item["expires"])
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                continue  # a torn last line after a crash
            if expires > now:
                self._expiry[nonce] = expires

    def claim(self, nonce: str, expires: float, now: float) -> bool:
        """Record ``nonce``; False if it was seen before and has not expired. Raises OSError when it
        cannot be made durable (the request is then refused: better than a replayable approval)."""
        for old in [n for n, e in self._expiry.items() if e < now]:
            del self._expiry[old]
        if nonce in self._expiry:
            return False
        if self.path is not None:
            append_durably(self.path, orjson.dumps({"nonce": nonce, "expires": expires}) + b"\n")
            self._lines += 1
            if self._lines > 1000 and self._lines > 4 * len(self._expiry):
                self._compact(now)
        self._expiry[nonce] = expires
        return True

    def _compact(self, now: float) -> None:
        assert self.path is not None
        live = [{"nonce": n, "expires": e} for n, e in self._expiry.items() if e >= now]
        write_atomic(self.path, b"".join(orjson.dumps(item) + b"\n" for item in live))
        self._lines = len(live)


class RequestVerifier:
    """Checks signed requests: known key, fresh timestamp, unseen nonce, matching signature."""

    def __init__(
        self, keys: KeyRing, window: float = REPLAY_WINDOW, nonces: NonceStore | None = None
    ) -> None:
        self.keys = keys
        self.window = window
        self._nonces = nonces or NonceStore()
        self._lock = threading.Lock()

    def verify(
        self,
        headers: Mapping[str, str] | Message,
        method: str,
        path: str,
        body: bytes,
        now: float | None = None,
    ) -> str:
        """Return the key id of a valid request; raise ``PermissionError`` with the reason otherwise."""
        now = time.time() if now is None else now
        key_id, ts, nonce, sig = (headers.get(h) for h in (H_KEY_ID, H_TIMESTAMP, H_NONCE, H_SIGNATURE))
        if not (key_id and ts and nonce and sig):
            raise PermissionError("unsigned request (the relay key's signature headers are required)")
        key = self.keys.get(key_id)
        if key is None:
            raise PermissionError("unknown key id")
        if not _TIMESTAMP.fullmatch(ts) or abs(now - int(ts)) > self.window:
            raise PermissionError("timestamp outside the replay window")
        if not _NONCE.fullmatch(nonce):
            raise PermissionError("nonce must be 16 to 64 characters of [A-Za-z0-9_-]")
        if not _SIGNATURE.fullmatch(sig):
            raise PermissionError("bad signature")
        if not hmac.compare_digest(request_signature(key, ts, nonce, method, path, body), sig):
            raise PermissionError("bad signature")
        with self._lock:
            try:
                fresh = self._nonces.claim(nonce, now + 2 * self.window, now)
            except OSError as exc:
                log.error("cannot record a relay nonce; request refused", extra={"error": str(exc)})
                raise PermissionError("nonce cannot be recorded (state directory not writable)") from None
        if not fresh:
            raise PermissionError("replayed nonce")
        return key_id
