"""A decisions-source message before it is validated: what may be read of it, and how.

Routing (a message's lane) needs its target before the decision is proven valid; these helpers read
it without trusting it, and never parse a message too large to be a decision.
"""

from __future__ import annotations

from typing import Any

import orjson

#: A decision is a few hundred bytes; anything far larger is refused before it is parsed.
MAX_MESSAGE_BYTES = 16 * 1024


def peek(fields: dict[str, Any] | None, name: str) -> str | None:
    """A string field of a message not validated yet (routing and claims only: never trusted)."""
    value = fields.get(name) if fields else None
    return value if isinstance(value, str) else None


def lane_of(fields: dict[str, Any] | None) -> str:
    """The lane of a message: its target VM (case-insensitive); unreadable messages share one lane."""
    return (peek(fields, "target") or "").lower()


def loads_object(payload: bytes) -> dict[str, Any] | None:
    try:
        value = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
