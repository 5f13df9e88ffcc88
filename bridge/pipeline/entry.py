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
from typing import Any, NamedTuple

import orjson

CONTENT_TYPE = "application/json"


class RecordMeta(NamedTuple):
    """Routing metadata of one record. ``key`` is the VM id (the VM name when the id is unknown, the
    record id when neither is), so one VM's records land on one partition and stay in order.

    A named tuple: immutable, and built on every read of a record, where a frozen dataclass would
    cost three times as much."""

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
        if not isinstance(vm, Mapping):
            vm = {}
        record_id = _text(record.get("recordId")) or ""
        vm_id, vm_name = _text(vm.get("vmId")), _text(vm.get("name"))
        version = record.get("schemaVersion", 1)
        return cls(
            record_id,
            _text(record.get("recordType")) or "",
            vm_id or vm_name or record_id,
            version if type(version) is int else 0,
            vm_id,
            vm_name,
            _text(vm.get("resourceId")),
            _text(record.get("observedAt")),
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
        return cls.of({**record, "recordId": record_id or record.get("recordId")})

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
        return {
            "id": self.record_id,
            "t": self.record_type,
            "k": self.key,
            "v": self.schema_version,
            "vm": self.vm_id,
            "n": self.vm_name,
            "r": self.resource_id,
            "o": self.observed_at,
        }

    @classmethod
    def from_header(cls, header: Mapping[str, Any]) -> RecordMeta:
        """Inverse of :meth:`to_header`; ``ValueError`` when a field is missing or has the wrong type
        (on every read of a record: kept to a few dictionary lookups)."""
        try:
            meta = cls(
                header["id"],
                header["t"],
                header["k"],
                header.get("v", 1),
                header.get("vm"),
                header.get("n"),
                header.get("r"),
                header.get("o"),
            )
        except (KeyError, TypeError):
            raise ValueError("frame header lacks id, t or k") from None
        if type(meta.record_id) is not str or type(meta.key) is not str or type(meta.record_type) is not str:
            raise ValueError("frame header: id, t and k must be strings")
        return meta


class Entry:
    """One durable record as a sink receives it: its outbox position, metadata and bytes.

    Read from the outbox, ``meta`` is decoded from the frame header the first time a sink asks for
    it: a file sink, which only writes the payload, never pays for it. Treat it as immutable."""

    __slots__ = ("_header", "_meta", "appended_at", "payload", "seq")

    def __init__(
        self, seq: int, meta: RecordMeta | None, appended_at: float, payload: bytes, header: bytes = b""
    ) -> None:
        self.seq = seq
        self.appended_at = appended_at  # Unix time the record became durable
        self.payload = payload
        self._meta = meta
        self._header = header  # the frame header (JSON), when ``meta`` is not known yet

    @property
    def meta(self) -> RecordMeta:
        if self._meta is None:
            try:
                self._meta = RecordMeta.from_header(orjson.loads(self._header))
            except (orjson.JSONDecodeError, ValueError, AttributeError):
                # The CRC matched, so this is a header of another version: route by the payload.
                self._meta = RecordMeta.of_payload("", self.payload)
        return self._meta

    @property
    def record_id(self) -> str:
        return self.meta.record_id

    @property
    def key(self) -> str:
        return self.meta.key

    def __repr__(self) -> str:
        return f"Entry(seq={self.seq}, meta={self._meta or self._header!r}, payload={self.payload[:60]!r})"


def _text(value: object) -> str | None:
    return value if type(value) is str and value else None
