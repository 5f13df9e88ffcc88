"""Every record shape the bridge publishes, in one place: what consumers read is decided here.

One module per record type, each with its ``build(...)`` (the writer's) and ``read(raw)`` (every
reader's: the type's schema checked once, a frozen, slotted value out):

* :mod:`.scheduled_events` (``record.v1``): one document change seen by an agent.
* :mod:`.approval`: the outcome of one approval attempt (agent, policy, coordinator, approver).
* :mod:`.preparation`: one VM's readiness for one event, after its prepare hook.
* :mod:`.heartbeat`: the agent is alive and watching.
* :mod:`.impact`: what one event did to the VM.
* :mod:`.azure`: the readers of Azure's channel's records (their builders need the channel's own
  types and live in :mod:`bridge.azure.records`).

:class:`.reader.Reader` is how a service reads a stream: it dispatches on ``recordType``, verifies
signatures once, and counts what it refuses. Routing metadata next to each record comes from
:meth:`bridge.pipeline.RecordMeta.of`, which reads the envelope every shape here shares.
"""

from __future__ import annotations

from bridge.records.approval import approver_record_id
from bridge.records.approval import build as approval_record
from bridge.records.fields import Refused, VmRef
from bridge.records.heartbeat import build as heartbeat_record
from bridge.records.ids import (
    APPROVAL,
    AZURE_EVENT,
    HEARTBEAT,
    IMPACT,
    PREPARATION,
    RECONCILIATION,
    RECORD_NAMESPACE,
    SCHEDULED_EVENTS,
    SCHEMA_VERSION,
    derived_id,
    encode,
)
from bridge.records.impact import build as impact_record
from bridge.records.preparation import build as preparation_record
from bridge.records.scheduled_events import Transition, document_view, events_view, record_id
from bridge.records.scheduled_events import build as scheduled_events_record

__all__ = [
    "APPROVAL",
    "AZURE_EVENT",
    "HEARTBEAT",
    "IMPACT",
    "PREPARATION",
    "RECONCILIATION",
    "RECORD_NAMESPACE",
    "SCHEDULED_EVENTS",
    "SCHEMA_VERSION",
    "Refused",
    "Transition",
    "VmRef",
    "approval_record",
    "approver_record_id",
    "derived_id",
    "document_view",
    "encode",
    "events_view",
    "heartbeat_record",
    "impact_record",
    "preparation_record",
    "record_id",
    "scheduled_events_record",
]
