"""Backoff with full jitter, shared by the IMDS poller, IMDS POSTs and sink delivery.

A fleet of thousands of agents that lose IMDS or a broker at the same moment must not come back in
lock-step; "full jitter" (a uniform draw between 0 and the exponential cap) spreads them out. This is
the whole algorithm, so it stays a dozen lines rather than a dependency: callers own their loops
(a poll loop never "gives up"), they only need the next delay.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Exponential backoff with full jitter: ``uniform(floor, min(cap, base * 2**attempt))``."""

    base: float = 0.5
    cap: float = 30.0
    floor: float = 0.0
    attempt: int = 0
    _rng: random.Random = field(default_factory=random.Random, repr=False)

    def next_delay(self, retry_after: float | None = None) -> float:
        """The delay before the next attempt; a server's ``Retry-After`` is a lower bound."""
        ceiling = min(self.cap, self.base * (2 ** min(self.attempt, 30)))
        self.attempt += 1
        delay = self._rng.uniform(min(self.floor, ceiling), ceiling)
        if retry_after is not None and retry_after > delay:
            delay = min(retry_after, max(self.cap, retry_after))
        return delay

    def reset(self) -> None:
        self.attempt = 0
