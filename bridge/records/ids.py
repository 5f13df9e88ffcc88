"""What every record shape shares on the writing side: the type words, the envelope, derived ids,
the encoding. ``recordId`` is derived from what a record is about whenever that is derivable, so the
same thing gets the same id after a crash, a restart or a resend, and consumers deduplicate on it."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

import orjson

from bridge import __version__
from bridge.schemas import JsonObject
from bridge.support.timeutil import rfc3339

if TYPE_CHECKING:  # the writer's types; readers (sinks, services) never load the IMDS layer
    from bridge.imds.instance import VmIdentity


SCHEMA_VERSION = 1
SCHEDULED_EVENTS = "scheduledEvents"
APPROVAL = "approval"
PREPARATION = "preparation"
HEARTBEAT = "heartbeat"
IMPACT = "impact"
AZURE_EVENT = "azureScheduledEvent"
RECONCILIATION = "reconciliation"
# Namespace of record ids (uuid5); fixed forever so ids stay comparable across versions of the agent.
RECORD_NAMESPACE = uuid.UUID("5b0f3d38-6c1e-4c61-9d43-5fd0d0f0a2b1")


def derived_id(*parts: str) -> str:
    """A record id derived from what the record is about (its parts joined by ``|``): the same
    thing gets the same id after a crash, a restart or a resend."""
    return str(uuid.uuid5(RECORD_NAMESPACE, "|".join(parts)))


def envelope(
    record_type: str,
    record_id: str,
    observed_at: float,
    vm: VmIdentity | None,
    api_version: str | None = None,
) -> JsonObject:
    """The fields every record shares (what :meth:`bridge.pipeline.RecordMeta.of` routes on)."""
    source: JsonObject = {"agentVersion": __version__}
    if api_version is not None:
        source["apiVersion"] = api_version
    return {
        "schemaVersion": SCHEMA_VERSION,
        "recordType": record_type,
        "recordId": record_id,
        "observedAt": rfc3339(observed_at),
        "source": source,
        "vm": None if vm is None else vm.to_record(),
    }


def encode(record: Mapping[str, object]) -> bytes:
    """One line of JSON (orjson escapes control characters, so no raw newline can appear)."""
    return orjson.dumps(record)
