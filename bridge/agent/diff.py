"""Classify what happened to each event between two documents.

IMDS never reports ``Completed`` or ``Canceled``: a finished or canceled event simply disappears from
``Events``. The meaning of a disappearance therefore depends on the status the event had when it was
last seen, which is why the previous document is persisted across restarts (an event that vanished
while the agent was down is still reported, as ``completed`` or ``canceled``).

Transitions (the ``change`` field of a record):

==========================  ==========================================================================
``present``                 already there at the agent's very first observation (no persisted state)
``scheduled``               new, ``Scheduled``
``startedWithoutNotice``    new and already ``Started`` (hardware failure: IMDS skips ``Scheduled``)
``appeared``                new with a status IMDS did not document (kept, never rejected)
``started``                 ``Scheduled`` -> ``Started`` (approved, or NotBefore reached)
``statusChanged``           any other status change (not documented; reported as it happened)
``updated``                 same status, other fields changed (e.g. NotBefore moved)
``completed``               gone after ``Started``; or gone while ``Scheduled`` after this VM approved
                            it, or once its NotBefore had passed (see below)
``canceled``                gone while ``Scheduled`` before its NotBefore (Azure withdrew it)
``removed``                 gone with an undocumented status
==========================  ==========================================================================

A ``Scheduled`` event that disappears while the agent was watching is ``canceled``: IMDS starts every
event at its NotBefore at the latest and keeps it ``Started`` for minutes, which a 1-second poll
cannot miss. After a gap in observation (the agent was down, typically for the very reboot or
redeploy the event announced) the last status seen is stale: an event last seen ``Scheduled`` whose
NotBefore has passed went through ``Started`` unseen, so it is reported ``completed`` with
``previousStatus: Scheduled`` (which tells a consumer that the start itself was not observed); one
whose NotBefore is still ahead was withdrawn, ``canceled``.

An event this VM approved (its relay's ledger says so, :mod:`bridge.agent.ledger`) that disappears
while last seen ``Scheduled`` is ``completed`` too, watching or not: approval starts it, and a
``Started`` state can be missed (the agent stopped right after its StartRequest, as the reboot it
approved makes it; or an accelerated emulator). Reporting it ``canceled`` would tell a dashboard that
maintenance was called off while the VM rebooted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from bridge.imds.document import SCHEDULED, STARTED, EventsDocument, ScheduledEvent
from bridge.schemas import JsonObject

#: The ``change`` of a record (the table above; record.v1.schema.json lists the same words).
Transition = Literal[
    "present", "scheduled", "startedWithoutNotice", "appeared", "started", "statusChanged", "updated",
    "completed", "canceled", "removed",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Change:
    event_id: str
    change: Transition
    event_type: str
    previous_status: str | None
    event_status: str | None  # None: the event is gone

    def to_json(self) -> JsonObject:
        return {
            "eventId": self.event_id,
            "change": self.change,
            "eventType": self.event_type,
            "previousStatus": self.previous_status,
            "eventStatus": self.event_status,
        }


def diff(
    previous: EventsDocument | None,
    current: EventsDocument,
    observed_at: float | None = None,
    *,
    continuous: bool = True,
    approved: Callable[[str], bool] | None = None,
) -> list[Change]:
    """Changes from ``previous`` (None at the very first observation) to ``current``, seen at
    ``observed_at`` (Unix time; now when omitted). ``continuous`` is False when the agent was not
    watching between the two (restart, long outage); ``approved`` tells whether this VM approved an
    event: see the module docstring.

    Events keep the order of the current document; disappeared events follow in their previous order.
    """
    if previous is None:
        return [Change(e.event_id, "present", e.event_type, None, e.event_status) for e in current.events]
    before = previous.by_id()
    changes: list[Change] = []
    for event in current.events:
        old = before.get(event.event_id)
        if old is None:
            changes.append(_appeared(event))
        elif old.event_status != event.event_status:
            kind: Transition = (
                "started"
                if (old.event_status, event.event_status) == (SCHEDULED, STARTED)
                else "statusChanged"
            )
            changes.append(
                Change(event.event_id, kind, event.event_type, old.event_status, event.event_status)
            )
        elif old != event:
            changes.append(
                Change(event.event_id, "updated", event.event_type, old.event_status, event.event_status)
            )
    still_there = {e.event_id for e in current.events}
    when = time.time() if observed_at is None else observed_at
    for old in previous.events:
        if old.event_id not in still_there:
            gone = _gone(old, when, continuous, approved)
            changes.append(Change(old.event_id, gone, old.event_type, old.event_status, None))
    return changes


def _gone(
    event: ScheduledEvent, observed_at: float, continuous: bool, approved: Callable[[str], bool] | None
) -> Transition:
    if event.event_status == STARTED:
        return "completed"
    if event.event_status == SCHEDULED:
        if approved is not None and approved(event.event_id):
            return "completed"  # approved here: it started, whether or not a poll saw it Started
        if continuous or event.not_before is None:
            return "canceled"
        due = datetime.fromisoformat(event.not_before).timestamp() <= observed_at
        return "completed" if due else "canceled"
    return "removed"


def _appeared(event: ScheduledEvent) -> Change:
    kind: Transition = (
        "scheduled"
        if event.event_status == SCHEDULED
        else "startedWithoutNotice"
        if event.event_status == STARTED
        else "appeared"
    )
    return Change(event.event_id, kind, event.event_type, None, event.event_status)


def is_change(previous: EventsDocument | None, current: EventsDocument) -> bool:
    """A document change: first observation, another incarnation, or the same incarnation with other
    content (an incarnation that goes backwards or repeats with new content must not be missed)."""
    return (
        previous is None or previous.incarnation != current.incarnation or previous.digest != current.digest
    )
