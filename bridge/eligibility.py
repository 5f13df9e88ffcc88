"""Whether an event may be approved now for a decision: one rule for every path that approves.

The agent's relay applies it to the event as its IMDS document shows it; the approver applies it
before it acknowledges an event through Azure Resource Manager (no agent reached), to the event as
the agents' records showed it. Before this module the ARM path skipped the target rule: a decision
for a VM the event does not name, refused by every agent (``targetMismatch``), was acknowledged
through ARM and audited ``approved`` (issue 19). Now both paths refuse the same decisions with the
same result words (the approval schema's ``results[].result``).

Checked in this order, the first failure being the refusal:

==================  =========================================================================
``expired``         the decision's ``expiresAt`` passed (it may have waited for an agent)
``notFound``        the event is not known (not in the document; never reported by an agent)
``alreadyStarted``  ``Started``: not an error, approval has nothing left to do
``notScheduled``    any other status
``notThisVm``       the event does not name the VM that would approve it (``require_this_vm``)
``targetMismatch``  the decision's ``target`` is neither that VM nor named in the event's Resources
==================  =========================================================================
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from bridge.relay_api import Result

SCHEDULED = "Scheduled"
STARTED = "Started"


@dataclass(frozen=True, slots=True)
class EventFacts:
    """What the checker knows of an event: its status and the VMs its ``Resources`` names."""

    status: str
    resources: Sequence[str]


@dataclass(frozen=True, slots=True)
class Refusal:
    result: Result  # a results[].result word of the approval schema
    detail: str


def check_event(
    event: EventFacts | None,
    *,
    approver_names: Collection[str],
    target: str | None,
    expires_at: float | None,
    now: float,
    require_this_vm: bool = True,
) -> Refusal | None:
    """None when the event may be approved for this decision, else why not (see the module).

    ``approver_names``: every lower-cased name of the VM that would approve (the agent's own VM; for
    ARM, the VM whose scope is acknowledged)."""
    if expires_at is not None and expires_at <= now:
        return Refusal("expired", "the decision expired before it could be acted on")
    if event is None:
        return Refusal("notFound", "no such event in the current document")
    if event.status == STARTED:
        return Refusal("alreadyStarted", "the event has already started")
    if event.status != SCHEDULED:
        return Refusal("notScheduled", f"status is {event.status}")
    resources = {r.lower() for r in event.resources}
    if require_this_vm and not resources & set(approver_names):
        return Refusal("notThisVm", "Resources does not name this VM")
    if target and target.lower() not in {*approver_names, *resources}:
        return Refusal(
            "targetMismatch",
            f"the decision is for {target!r}, which is neither this VM nor in the event's Resources",
        )
    return None
