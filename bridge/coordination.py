"""Coordinated approval: approve an event only when every VM it names is ready.

Why: approving an event lets it proceed for *all* the VMs in its ``Resources`` (an availability set,
a scale set's update domain). The documentation advises choosing one VM to coordinate; without that,
the first VM whose prepare hook finishes releases every other VM, prepared or not.

This module is the rule, shared by both coordinators (the fleet approver,
:mod:`bridge.approver.coordinator`, and the agents' peer coordinator, :mod:`bridge.agent.coordinator`),
so they cannot disagree. It is pure: who reported what is the caller's knowledge, and the clock is
passed in.

* **Members** are the VMs in the event's ``Resources``. A member *runs the agent* when the
  coordinator knows it (the fleet approver has seen a record of it; a peer answered its API during
  this event). Members without the agent cannot report and are not waited for; the audit record
  lists them.
* **Ready** when every member that runs the agent reported ``prepared``. ``prepareFailed`` is not
  ready: the VM said it is not safe to go.
* **Deadline**: ``deadline`` seconds before ``NotBefore``, a verdict is due whatever was reported:
  ``approve`` (the platform would start the event at ``NotBefore`` anyway; approving now gives the
  prepared VMs the time back) or ``platform`` (approve nothing: the platform proceeds at
  ``NotBefore``, and every VM gets its full notice).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

PREPARED = "prepared"
PREPARE_FAILED = "prepareFailed"
DEADLINE_POLICIES = ("approve", "platform")
#: The decision id of a coordinated approval: one per event, so every coordinator (a takeover, a
#: second fleet approver instance) asks for the *same* decision and the agents' ledgers and the
#: approver's decision store answer a repeat without a second StartRequest.
DECISION_PREFIX = "coordinated-"


@dataclass(frozen=True)
class CoordinationPolicy:
    deadline: float = 120.0  # seconds before NotBefore when a verdict is due
    on_deadline: Literal["approve", "platform"] = "approve"

    @classmethod
    def of(cls, deadline: float, on_deadline: str) -> CoordinationPolicy:
        """From settings (``on_deadline`` a word the setting's parser checked; checked again here)."""
        if on_deadline == "approve":
            return cls(deadline, "approve")
        if on_deadline == "platform":
            return cls(deadline, "platform")
        raise ValueError(f"on_deadline must be one of {', '.join(DEADLINE_POLICIES)}")

    def __post_init__(self) -> None:
        if self.on_deadline not in DEADLINE_POLICIES:
            raise ValueError(f"on_deadline must be one of {', '.join(DEADLINE_POLICIES)}")
        if self.deadline < 0:
            raise ValueError("deadline must be >= 0 seconds")


@dataclass(frozen=True)
class Verdict:
    """What to do about one event now: ``wait``, ``approve`` or ``leave`` (to the platform)."""

    action: Literal["wait", "approve", "leave"]
    why: str  # allPrepared | deadline | waiting
    waited_for: tuple[str, ...]  # members that run the agent
    prepared: tuple[str, ...]
    pending: tuple[str, ...]  # run the agent, not prepared yet (or prepareFailed)
    failed: tuple[str, ...]  # reported prepareFailed
    without_agent: tuple[str, ...]  # members nobody knows an agent of: not waited for
    silent: tuple[str, ...] = ()  # waited for, never answered (pending too): down, partitioned, starting

    def to_json(self, coordinator: str, on_deadline: str) -> dict[str, Any]:
        """The audit record's ``coordination`` block: who waited for whom, and why it ended."""
        account = {
            "coordinator": coordinator,
            "why": self.why,
            "onDeadline": on_deadline,
            "waitedFor": list(self.waited_for),
            "prepared": list(self.prepared),
            "pending": list(self.pending),
            "prepareFailed": list(self.failed),
            "withoutAgent": list(self.without_agent),
        }
        if self.silent:
            account["silent"] = list(self.silent)
        return account

    def left_detail(self) -> str:
        """The audit detail of a verdict that leaves the event to the platform."""
        return f"not approved: {', '.join(self.pending)} not prepared at the deadline"[:500]


def members(resources: Sequence[str]) -> list[str]:
    """The event's VMs in the order every coordinator uses (lower-cased, sorted, unique)."""
    return sorted({str(r).lower() for r in resources if r})


def assess(
    resources: Sequence[str],
    reports: Mapping[str, str | None],
    not_before: str | None,
    now: float,
    policy: CoordinationPolicy,
    silent: Collection[str] = (),
) -> Verdict:
    """The verdict for one event. ``reports`` has an entry (lower-cased name) for each member that
    runs the agent, or is expected to: its last report (``prepared``, ``prepareFailed``), or None
    before any. ``silent``: expected members that never answered (waited for like the others, and
    named as such in the audit: a silent VM may be the one about to be rebooted unprepared)."""
    names = members(resources)
    waited = tuple(n for n in names if n in reports)
    prepared = tuple(n for n in waited if reports[n] == PREPARED)
    failed = tuple(n for n in waited if reports[n] == PREPARE_FAILED)
    pending = tuple(n for n in waited if reports[n] != PREPARED)
    without = tuple(n for n in names if n not in reports)
    quiet = tuple(n for n in pending if n in silent)

    def verdict(action: Literal["wait", "approve", "leave"], why: str) -> Verdict:
        return Verdict(action, why, waited, prepared, pending, failed, without, quiet)

    if waited and not pending:
        return verdict("approve", "allPrepared")
    due = deadline_at(not_before, policy)
    if due is not None and now >= due:
        return verdict("approve" if policy.on_deadline == "approve" else "leave", "deadline")
    return verdict("wait", "waiting")


def deadline_at(not_before: str | None, policy: CoordinationPolicy) -> float | None:
    """When the verdict is due (epoch seconds), or None without a usable ``NotBefore``."""
    if not not_before:
        return None
    try:
        return datetime.fromisoformat(not_before).timestamp() - policy.deadline
    except ValueError:
        return None


def decision_id(event_id: str) -> str:
    return (DECISION_PREFIX + event_id)[:128]
