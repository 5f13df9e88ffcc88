"""Backoff with full jitter and ``Retry-After``, shared by the IMDS poller, IMDS POSTs and delivery.

A fleet of thousands of agents that lose IMDS or a broker at the same moment must not come back in
lock-step; "full jitter" (a uniform draw between 0 and the exponential cap) spreads them out. This is
the whole algorithm, so it stays a few lines rather than a dependency: callers own their loops (a
poll loop never "gives up"), they only need the next delay.

A server's ``Retry-After`` is honoured as a lower bound, but only up to ``max_retry_after``: IMDS
paths cap it at 10 s (a Spot VM gets 30 s of notice; a ``Retry-After: 86400`` must not stop polling
for a day), and a value that is not a finite, non-negative number of seconds or an HTTP date is
ignored rather than trusted (``inf`` would overflow a sleep, ``nan`` compares false to everything).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime


@dataclass
class Backoff:
    """Exponential backoff with full jitter: ``uniform(floor, min(cap, base * 2**attempt))``, raised
    to a server's ``Retry-After`` up to ``max_retry_after`` (``cap`` when not set)."""

    base: float = 0.5
    cap: float = 30.0
    floor: float = 0.0
    max_retry_after: float | None = None
    attempt: int = 0
    _rng: random.Random = field(default_factory=random.Random, repr=False)

    def next_delay(self, retry_after: float | None = None) -> float:
        """The delay before the next attempt, never above ``max(cap, max_retry_after)``."""
        ceiling = min(self.cap, self.base * (2 ** min(self.attempt, 30)))
        self.attempt += 1
        delay = self._rng.uniform(min(self.floor, ceiling), ceiling)
        bound = self.cap if self.max_retry_after is None else self.max_retry_after
        if retry_after is not None and math.isfinite(retry_after) and retry_after > delay:
            delay = max(delay, min(retry_after, bound))
        return delay

    def reset(self) -> None:
        self.attempt = 0


def parse_retry_after(value: str | None, limit: float, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds to wait, at most ``limit``; None when absent or unreadable.

    RFC 9110 allows delta-seconds (ASCII digits) or an HTTP date. A fraction (``1.5``) is accepted
    since some servers send one; ``inf``, ``nan``, signs, exponents and garbage are not."""
    if not value:
        return None
    text = value.strip()
    if text.isascii() and text.replace(".", "", 1).isdigit():
        seconds = min(float(text), limit)  # a 400-digit delta is a very long wait, not an error
    else:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:  # an HTTP date is always GMT
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return min(max(0.0, seconds), limit)
