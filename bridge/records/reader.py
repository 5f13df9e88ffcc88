"""One reader for every record a stream carries: the type's schema checked once, a frozen typed
value out, or a :class:`~bridge.records.fields.Refused` counted by type and reason.

Why here and not in each consumer: the console, the fleet approver, Azure's channel and the chat
formats each used to read records by key with their own guards (four ``_text`` helpers, four
behaviours), and none checked the schemas that exist. A record is read at the boundary, where it
comes off a stream, and signatures (Azure's channel, the approvers' audits) are verified there, once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

import orjson

from bridge.records import approval, azure, heartbeat, impact, preparation, scheduled_events
from bridge.records.fields import REFUSAL_REASONS, RecordInvalid, Refused
from bridge.records.ids import (
    APPROVAL,
    AZURE_EVENT,
    HEARTBEAT,
    IMPACT,
    PREPARATION,
    RECONCILIATION,
    SCHEDULED_EVENTS,
)
from bridge.signing import KeyRing, verify_record

if TYPE_CHECKING:
    from prometheus_client.core import CounterMetricFamily

log = logging.getLogger(__name__)

Record = (
    scheduled_events.ScheduledEvents
    | heartbeat.Heartbeat
    | preparation.Preparation
    | approval.Approval
    | impact.Impact
    | azure.AzureEvent
    | azure.Finding
)

#: A typed record's ``recordType`` word.
RECORD_TYPES: dict[type, str] = {
    scheduled_events.ScheduledEvents: SCHEDULED_EVENTS,
    heartbeat.Heartbeat: HEARTBEAT,
    preparation.Preparation: PREPARATION,
    approval.Approval: APPROVAL,
    impact.Impact: IMPACT,
    azure.AzureEvent: AZURE_EVENT,
    azure.Finding: RECONCILIATION,
}
#: Record types this reader knows; anything else is refused as ``unknownType`` (under ``unknown``).
TYPES = (SCHEDULED_EVENTS, HEARTBEAT, PREPARATION, APPROVAL, IMPACT, AZURE_EVENT, RECONCILIATION)
#: A record larger than this is refused before it is parsed (the largest an agent writes is a
#: scheduledEvents record with its raw document: well under 64 KiB).
MAX_RECORD_BYTES = 256 * 1024

#: Seconds between two log lines about refusals of one (type, reason).
LOG_EVERY = 60.0


def _signer(keys: KeyRing, raw: Mapping[str, object]) -> str | None:
    """The key id a record's signature verifies with; None when unsigned or not proven."""
    if not keys or not isinstance(raw.get("signature"), Mapping):
        return None
    try:
        verify_record(keys, dict(raw))
    except PermissionError:
        return None
    signature = raw.get("signature")
    return str(signature.get("keyId")) if isinstance(signature, Mapping) else None


class Reader:
    """Reads raw records (bytes or parsed JSON). ``azure_keys``: the keys Azure's channel signs with;
    ``approver_keys``: the approvers' ``--sign-key`` (their audits count only when they verify).
    ``types``: the record types this consumer wants; others are skipped without being checked
    (``None``), so a fleet approver does not pay a schema check for every heartbeat."""

    def __init__(
        self,
        *,
        azure_keys: KeyRing | None = None,
        approver_keys: KeyRing | None = None,
        types: tuple[str, ...] = TYPES,
    ) -> None:
        self.azure_keys = azure_keys or KeyRing()
        self.approver_keys = approver_keys or KeyRing()
        self.types = frozenset(types)
        self._lock = threading.Lock()
        #: (recordType, reason) -> records refused: a metric with bounded labels.
        self.refused: dict[tuple[str, str], int] = {
            (t, r): 0 for t in (*TYPES, "unknown") for r in REFUSAL_REASONS
        }
        self._logged: dict[tuple[str, str], tuple[float, int]] = {}
        self._readers: dict[str, Callable[[Mapping[str, object]], Record]] = {
            SCHEDULED_EVENTS: scheduled_events.read,
            HEARTBEAT: heartbeat.read,
            PREPARATION: preparation.read,
            IMPACT: impact.read,
            APPROVAL: self._approval,
            AZURE_EVENT: lambda raw: azure.read_event(raw, _signer(self.azure_keys, raw)),
            RECONCILIATION: lambda raw: azure.read_finding(raw, _signer(self.azure_keys, raw)),
        }

    def _approval(self, raw: Mapping[str, object]) -> approval.Approval:
        signed = _signer(self.approver_keys, raw) if raw.get("component") == "approver" else None
        return approval.read(raw, signed)

    def read_bytes(self, payload: bytes) -> Record | Refused | None:
        if len(payload) > MAX_RECORD_BYTES:
            return self._refused(Refused("unknown", "tooLarge", f"{len(payload)} bytes"))
        try:
            raw = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return self._refused(Refused("unknown", "notObject", "not JSON"))
        return self.read(raw)

    def read(self, raw: object) -> Record | Refused | None:
        """The typed record; :class:`Refused` when it breaks its schema; None when its type is one
        this consumer does not want."""
        if not isinstance(raw, Mapping):
            return self._refused(Refused("unknown", "notObject", "not a JSON object"))
        kind = raw.get("recordType")
        reader = self._readers.get(kind) if isinstance(kind, str) else None
        if reader is None:
            return self._refused(Refused("unknown", "unknownType", "recordType not known"))
        if kind not in self.types:
            return None
        try:
            return reader(raw)
        except RecordInvalid as exc:
            return self._refused(Refused(str(kind), exc.reason, str(exc)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # the schema let it through
            return self._refused(Refused(str(kind), "schema", type(exc).__name__))

    def collect(self) -> Iterator[CounterMetricFamily]:
        """``se_bridge_records_refused_total{recordType,reason}``: register the reader itself with a
        Prometheus registry (labels bounded: the known types and ``unknown``, five reasons)."""
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(
            "se_bridge_records_refused",
            "Records read from a stream and refused (schema, size, type), by record type and reason.",
            labels=["recordType", "reason"],
        )
        with self._lock:
            counts = sorted(self.refused.items())
        for (kind, reason), count in counts:
            family.add_metric([kind, reason], count)
        yield family

    def _refused(self, refused: Refused) -> Refused:
        """Counted always; logged at most once a minute per (type, reason), with how many since: a
        hostile stream must not turn into a flood of log lines."""
        key = (refused.record_type, refused.reason)
        now = time.monotonic()
        with self._lock:
            self.refused[key] = self.refused.get(key, 0) + 1
            last, since = self._logged.get(key, (-LOG_EVERY, 0))
            due = now - last >= LOG_EVERY
            self._logged[key] = (now, 0) if due else (last, since + 1)
        if due:
            log.warning(
                "record refused",
                extra={
                    "recordType": refused.record_type,
                    "reason": refused.reason,
                    "detail": refused.detail,
                    "refusedSinceLastLine": since,
                },
            )
        return refused


def event_ids(record: Record) -> tuple[str, ...]:
    """The events a record is about, in order, once each (as the record spells them)."""
    if isinstance(record, scheduled_events.ScheduledEvents):
        found = [e.event_id for e in record.events] + [c.event_id for c in record.changes]
    elif isinstance(record, approval.Approval):
        found = list(record.event_ids)
    elif isinstance(record, azure.AzureEvent):
        found = [record.event.event_id]
    elif isinstance(record, heartbeat.Heartbeat):
        found = []
    else:
        found = [record.event_id]
    return tuple(dict.fromkeys(found))
