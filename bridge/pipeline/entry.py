"""What flows through the pipeline: a durable payload and the routing metadata next to it.

Why the metadata travels beside the payload: every transport needs the same few fields (the message
key that keeps one VM's records on one partition, the record type and id for headers, the VM name
and resource id a CloudEvent's ``source``/``subject`` are built from, the observation time). The
producer knows them when it builds the record, so it states them once; the outbox stores them in the
frame header, and no sink parses a record again to find them (as Vector keeps an event's metadata
beside its payload).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

CONTENT_TYPE = "application/json"


@dataclass(frozen=True, slots=True)
class RecordMeta:
    """Routing metadata of one record. ``key`` is the VM id (the VM name when the id is unknown, the
    record id when neither is), so one VM's records land on one partition and stay in order."""

    record_id: str
    record_type: str
    key: str
    schema_version: int = 1
    vm_id: str | None = None
    vm_name: str | None = None
    resource_id: str | None = None
    observed_at: str | None = None  # RFC 3339, as in the record

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> RecordMeta:
        """The metadata of a record built by this product (the envelope every record shape shares:
        ``recordId``, ``recordType``, ``schemaVersion``, ``observedAt`` and an optional ``vm``)."""
        vm = record.get("vm")
        vm = vm if isinstance(vm, Mapping) else {}
        record_id = _text(record.get("recordId")) or ""
        vm_id, vm_name = _text(vm.get("vmId")), _text(vm.get("name"))
        version = record.get("schemaVersion", 1)
        return cls(
            record_id=record_id,
            record_type=_text(record.get("recordType")) or "",
            key=vm_id or vm_name or record_id,
            schema_version=version if isinstance(version, int) and not isinstance(version, bool) else 0,
            vm_id=vm_id,
            vm_name=vm_name,
            resource_id=_text(vm.get("resourceId")),
            observed_at=_text(record.get("observedAt")),
        )

    @classmethod
    def of_payload(cls, record_id: str, payload: bytes) -> RecordMeta:
        """Metadata read back from a payload: only for frames written before the frame header
        carried it (outbox format 1). Never fails: an unreadable payload keys on its record id."""
        try:
            record = orjson.loads(payload)
        except orjson.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            return cls(record_id=record_id, record_type="", key=record_id, schema_version=0)
        meta = cls.of({**record, "recordId": record_id})
        return meta

    def headers(self) -> dict[str, str]:
        """Message headers / application properties every transport sends."""
        return {
            "recordType": self.record_type,
            "schemaVersion": str(self.schema_version),
            "vmId": self.vm_id or "",
            "recordId": self.record_id,
            "contentType": CONTENT_TYPE,
        }

    def to_header(self) -> dict[str, Any]:
        """The compact form stored in a frame header (short keys: it is written once per record)."""
        out: dict[str, Any] = {"id": self.record_id, "t": self.record_type, "k": self.key}
        if self.schema_version != 1:
            out["v"] = self.schema_version
        for short, value in (
            ("vm", self.vm_id),
            ("n", self.vm_name),
            ("r", self.resource_id),
            ("o", self.observed_at),
        ):
            if value is not None:
                out[short] = value
        return out

    @classmethod
    def from_header(cls, header: Mapping[str, Any]) -> RecordMeta:
        """Inverse of :meth:`to_header`; ``ValueError`` when a field has the wrong type."""
        record_id, record_type, key = header.get("id"), header.get("t"), header.get("k")
        version = header.get("v", 1)
        if not (isinstance(record_id, str) and isinstance(record_type, str) and isinstance(key, str)):
            raise ValueError("frame header lacks id, t or k")
        if not isinstance(version, int):
            raise ValueError("frame header v is not an integer")
        optional = [header.get(k) for k in ("vm", "n", "r", "o")]
        if not all(v is None or isinstance(v, str) for v in optional):
            raise ValueError("frame header has a non-string field")
        return cls(record_id, record_type, key, version, *optional)


@dataclass(frozen=True, slots=True)
class Entry:
    """One durable record as a sink receives it: its outbox position, metadata and bytes."""

    seq: int
    meta: RecordMeta
    appended_at: float  # Unix time the record became durable
    payload: bytes

    @property
    def record_id(self) -> str:
        return self.meta.record_id

    @property
    def key(self) -> str:
        return self.meta.key


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
