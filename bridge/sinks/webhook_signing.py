"""The webhook signature (docs/sink-webhook.md): ``X-SE-Bridge-Signature: sha256=<hex>``, an
HMAC-SHA256 over ``<timestamp>.<body>`` with the key the receiver shares, and the timestamp beside
it, so a receiver can refuse a replay outside its window. Each attempt is signed anew."""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "X-SE-Bridge-Signature"
TIMESTAMP_HEADER = "X-SE-Bridge-Timestamp"
#: A shorter key is refused when the sink opens (e.g. ``openssl rand -hex 32``).
MIN_HMAC_KEY_BYTES = 32


def sign(key: bytes, body: bytes, timestamp: int | None = None) -> dict[str, str]:
    """The signature headers for ``body``."""
    ts = str(int(time.time()) if timestamp is None else timestamp)
    digest = hmac.new(key, ts.encode() + b"." + body, hashlib.sha256).hexdigest()
    return {TIMESTAMP_HEADER: ts, SIGNATURE_HEADER: f"sha256={digest}"}
