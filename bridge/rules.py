"""Auto-approve rules (``--auto-approve 'type=Freeze|Reboot,source=User,max_duration=9'``).

A leaf module on purpose: the configuration loader parses rules at start-up to refuse a wrong one
with a message naming the setting, and the agent's local policy matches events against them. Both
need the same parser, and a configuration must not import the agent's code (the layers point one way), so
the rule lives here, below both, importing nothing of the bridge at run time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only for the annotation: a rule matches anything shaped like an event
    from bridge.imds.document import ScheduledEvent

__all__ = ["ApprovalRule"]


@dataclass(frozen=True)
class ApprovalRule:
    """``type=Freeze|Reboot,source=User,max_duration=9``: every given condition must hold."""

    text: str
    types: frozenset[str] | None = None
    sources: frozenset[str] | None = None
    max_duration: int | None = None  # DurationInSeconds known and strictly below this

    @classmethod
    def parse(cls, text: str) -> ApprovalRule:
        """The rule ``text`` means; ValueError (naming the rule) for anything it cannot mean, so a
        typo is refused at start-up instead of approving more, or less, than intended."""
        types = sources = None
        max_duration = None
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = part.partition("=")
            values = frozenset(v.strip() for v in value.split("|") if v.strip())
            if not sep or not values:
                raise ValueError(f"auto-approve rule {text!r}: expected key=value[,key=value]")
            if key == "type":
                types = values
            elif key == "source":
                sources = values
            elif key == "max_duration" and value.strip().isdigit():
                max_duration = int(value)
            else:
                raise ValueError(
                    f"auto-approve rule {text!r}: unknown condition {key!r} "
                    "(type=, source=, max_duration=<seconds>)"
                )
        if types is None and sources is None and max_duration is None:
            raise ValueError(f"auto-approve rule {text!r} has no condition")
        return cls(text, types, sources, max_duration)

    def matches(self, event: ScheduledEvent) -> bool:
        if self.types is not None and event.event_type not in self.types:
            return False
        if self.sources is not None and event.event_source not in self.sources:
            return False
        return self.max_duration is None or (
            event.duration_in_seconds is not None and event.duration_in_seconds < self.max_duration
        )
