"""What a webhook sink POSTs for one record, by ``format``: the record itself (``json``), a
CloudEvent, an Event Grid event, or a message a person reads in a chat (``teams``, ``slack``,
``template``: :mod:`bridge.sinks.chat`).

CloudEvents are built by hand rather than with the ``cloudevents`` package: its 1.x and 2.x APIs
differ (both are allowed by the dependency range), its serializer re-encodes the record with the
standard ``json`` module and writes ``time`` from a ``datetime`` with microseconds, whereas here the
record's durable bytes are embedded verbatim (``orjson.Fragment``) and ``time`` is ``observedAt``
exactly. The tests parse what this module sends with the package, as an independent check.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import orjson

from bridge.pipeline import CONTENT_TYPE, Entry
from bridge.records.fields import Refused
from bridge.records.ids import APPROVAL, RECONCILIATION, SCHEDULED_EVENTS
from bridge.records.reader import Reader
from bridge.sinks.chat import CHAT_FORMATS, ChatOptions, chat_body

FORMATS = ("json", "cloudevents", "eventgrid", *CHAT_FORMATS)
EVENT_TYPE = "com.scheduled-events-bridge.record.v1"
CLOUDEVENTS_CONTENT_TYPE = "application/cloudevents+json"


class WebhookFormat:
    """One sink's format; :meth:`encode` gives a record's body and content type."""

    def __init__(self, name: str, chat: ChatOptions) -> None:
        self.name = name
        self.chat = chat
        #: Chat formats read each record (typed, schema-checked) to word a message.
        self._reader = Reader(types=(SCHEDULED_EVENTS, APPROVAL, RECONCILIATION))

    def encode(self, entry: Entry) -> tuple[bytes, str] | None:
        """The request body and its content type for ``entry``; None for a record a chat format does
        not post (nothing a person needs to read)."""
        if self.name == "json":
            return entry.payload, CONTENT_TYPE
        if self.name in CHAT_FORMATS:
            record = self._reader.read_bytes(entry.payload)
            if record is None or isinstance(record, Refused):
                return None  # counted and logged by the reader: not a record a person reads
            body = chat_body(record, self.name, self.chat)
            return None if body is None else (body, CONTENT_TYPE)
        meta = entry.meta
        name = meta.vm_name or meta.vm_id or "unknown"
        source = meta.resource_id or f"/se-bridge/vm/{quote(name, safe='')}"
        observed_at = meta.observed_at
        data = orjson.Fragment(entry.payload)  # the durable bytes, not a re-encoding
        if self.name == "cloudevents":
            event: dict[str, Any] = {
                "specversion": "1.0",
                "id": entry.record_id,
                "source": source,
                "type": EVENT_TYPE,
                "subject": name,
                "datacontenttype": CONTENT_TYPE,
            }
            if observed_at:
                event["time"] = observed_at
            event["data"] = data
            return orjson.dumps(event), CLOUDEVENTS_CONTENT_TYPE
        grid_event = {
            "id": entry.record_id,
            "eventType": EVENT_TYPE,
            # Event Grid has no `source`: subscribers filter on subject prefixes, and the resource id
            # lets them select a subscription or resource group.
            "subject": source,
            "eventTime": observed_at or _now_rfc3339(),
            "data": data,
            "dataVersion": str(meta.schema_version),
        }
        return orjson.dumps([grid_event]), CONTENT_TYPE


def _now_rfc3339() -> str:
    from bridge.support.timeutil import rfc3339

    return rfc3339(time.time())
