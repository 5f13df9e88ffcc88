"""Build the normalized record (``schemas/record.v1.schema.json``) for one document change.

``recordId`` is derived from *what changed*, never from when it was seen: the VM, and the
(incarnation, content digest) of the documents before and after. The same change therefore gets the
same id after a crash, a restart or a resend, and consumers can deduplicate on it; a different change
can never reuse an id.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from bridge import __version__
from bridge.agent.diff import Change
from bridge.imds.document import EventsDocument
from bridge.imds.instance import VmIdentity
from bridge.timeutil import rfc3339

SCHEMA_VERSION = 1
RECORD_TYPE = "scheduledEvents"
# Namespace of record ids (uuid5); fixed forever so ids stay comparable across versions of the agent.
RECORD_NAMESPACE = uuid.UUID("5b0f3d38-6c1e-4c61-9d43-5fd0d0f0a2b1")


def record_id(vm_key: str, previous: EventsDocument | None, current: EventsDocument) -> str:
    before = "initial" if previous is None else f"{previous.incarnation}:{previous.digest}"
    return str(uuid.uuid5(RECORD_NAMESPACE, f"{vm_key}|{before}|{current.incarnation}:{current.digest}"))


def build_record(
    vm: VmIdentity,
    previous: EventsDocument | None,
    current: EventsDocument,
    changes: list[Change],
    observed_at: float,
) -> dict[str, Any]:
    names = vm.names()
    return {
        "schemaVersion": SCHEMA_VERSION,
        "recordType": RECORD_TYPE,
        "recordId": record_id(vm.key, previous, current),
        "observedAt": rfc3339(observed_at),
        "source": {"agentVersion": __version__, "apiVersion": current.api_version},
        "vm": vm.to_record(),
        "documentIncarnation": current.incarnation,
        "previousIncarnation": None if previous is None else previous.incarnation,
        "events": [{**e.to_json(), "affectsThisVm": vm.affects(e.resources, names)} for e in current.events],
        "changes": [c.to_json() for c in changes],
        "raw": current.raw,
    }


def encode(record: dict[str, Any]) -> bytes:
    """One line of JSON (orjson escapes control characters, so no raw newline can appear)."""
    return orjson.dumps(record)
