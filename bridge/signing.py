"""Shared HMAC keys and request signing (relay API), used by the agent and the approver.

Keys are shared secrets held in files (at least 32 bytes of text), named by a key id so they can be
rotated: configure the new id next to the old one, switch the signers, then remove the old id.

Relay requests from anything but loopback must be signed (headers below), and are accepted only
inside a replay window with a nonce never seen before::

    X-SE-Bridge-Key-Id:    <key id>
    X-SE-Bridge-Timestamp: <Unix seconds>
    X-SE-Bridge-Nonce:     <random, 16-64 characters>
    X-SE-Bridge-Signature: sha256=<lowercase hex HMAC-SHA256(key, timestamp + "." + nonce + "." + body)>
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Mapping
from pathlib import Path

MIN_KEY_BYTES = 32
REPLAY_WINDOW = 300.0

H_KEY_ID = "X-SE-Bridge-Key-Id"
H_TIMESTAMP = "X-SE-Bridge-Timestamp"
H_NONCE = "X-SE-Bridge-Nonce"
H_SIGNATURE = "X-SE-Bridge-Signature"


class KeyRing:
    """HMAC keys by key id."""

    def __init__(self, keys: dict[str, bytes] | None = None) -> None:
        self._keys = dict(keys or {})

    @classmethod
    def from_specs(cls, specs: list[str] | tuple[str, ...]) -> KeyRing:
        """``KEYID=PATH`` items; each file holds the shared secret as text (at least 32 bytes)."""
        keys: dict[str, bytes] = {}
        for spec in specs:
            key_id, sep, path = spec.partition("=")
            if not sep or not key_id or not path:
                raise ValueError("each key must be given as KEYID=PATH")
            keys[key_id] = load_key(Path(path))
        return cls(keys)

    def get(self, key_id: str) -> bytes | None:
        return self._keys.get(key_id)

    def first(self) -> tuple[str, bytes] | None:
        return next(iter(self._keys.items()), None)

    def ids(self) -> list[str]:
        return sorted(self._keys)

    def __bool__(self) -> bool:
        return bool(self._keys)


def load_key(path: Path) -> bytes:
    try:
        key = path.read_bytes().strip()
    except OSError as exc:
        raise ValueError(f"cannot read key file {path}: {exc.strerror}") from None
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"key file {path} holds {len(key)} bytes; at least {MIN_KEY_BYTES} are required")
    return key


def request_signature(key: bytes, timestamp: str, nonce: str, body: bytes) -> str:
    return "sha256=" + hmac.new(key, f"{timestamp}.{nonce}.".encode() + body, hashlib.sha256).hexdigest()


def sign_request(key_id: str, key: bytes, body: bytes, now: float | None = None) -> dict[str, str]:
    """Headers that authenticate ``body`` to an agent's relay API."""
    timestamp = str(int(time.time() if now is None else now))
    nonce = secrets.token_hex(16)
    return {
        H_KEY_ID: key_id,
        H_TIMESTAMP: timestamp,
        H_NONCE: nonce,
        H_SIGNATURE: request_signature(key, timestamp, nonce, body),
    }


class RequestVerifier:
    """Checks signed relay requests: known key, fresh timestamp, unseen nonce, matching signature."""

    def __init__(self, keys: KeyRing, window: float = REPLAY_WINDOW) -> None:
        self.keys = keys
        self.window = window
        self._nonces: dict[str, float] = {}
        self._lock = threading.Lock()

    def verify(self, headers: Mapping[str, str], body: bytes, now: float | None = None) -> str:
        """Return the key id of a valid request; raise ``PermissionError`` with the reason otherwise."""
        now = time.time() if now is None else now
        key_id, ts, nonce, sig = (headers.get(h) for h in (H_KEY_ID, H_TIMESTAMP, H_NONCE, H_SIGNATURE))
        if not (key_id and ts and nonce and sig):
            raise PermissionError("unsigned request (signature headers required from a non-loopback address)")
        key = self.keys.get(key_id)
        if key is None:
            raise PermissionError("unknown key id")
        if not ts.isdigit() or abs(now - int(ts)) > self.window:
            raise PermissionError("timestamp outside the replay window")
        if not 16 <= len(nonce) <= 64:
            raise PermissionError("nonce must be 16 to 64 characters")
        if not hmac.compare_digest(request_signature(key, ts, nonce, body), sig):
            raise PermissionError("bad signature")
        with self._lock:
            for old in [n for n, expiry in self._nonces.items() if expiry < now]:
                del self._nonces[old]
            if nonce in self._nonces:
                raise PermissionError("replayed nonce")
            self._nonces[nonce] = now + 2 * self.window
        return key_id
