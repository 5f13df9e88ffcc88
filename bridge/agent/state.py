"""What the agent remembers across restarts: the last published document and the VM identity.

The baseline is the document the *last admitted record* described. It is what the next poll is
diffed against, so an event that vanished while the agent was down (a reboot is often the very event
being reported) is still reported as ``completed`` or ``canceled``, and a restart never reports the
same change again under a new id.

Crash window: the record is appended to the outbox (fsynced) first, the baseline written second. If
the agent dies in between, the outbox's newest record is newer than ``baseline.json``; recovery then
takes the baseline from that record's ``raw`` document, so the change is not published twice.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson

from bridge.imds.document import DocumentError, EventsDocument, document_from_json
from bridge.imds.instance import VmIdentity
from bridge.pipeline import Outbox
from bridge.support.fsutil import write_atomic

log = logging.getLogger(__name__)


class BaselineStore:
    """``<state-dir>/baseline.json``: the last published document, written atomically and fsynced."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "baseline.json"

    def save(self, doc: EventsDocument, seq: int) -> None:
        data = {"version": 1, "seq": seq, "apiVersion": doc.api_version, "raw": doc.raw}
        write_atomic(self.path, orjson.dumps(data))

    def load(self, outbox: Outbox) -> EventsDocument | None:
        """The baseline, reconciled with the outbox (see the module docstring): the newest event
        record the outbox holds beyond what ``baseline.json`` describes wins (approval audit records
        in between are skipped)."""
        saved_seq, doc = self._read()
        for entry in reversed(outbox.on_disk_after(saved_seq)):
            try:
                record = orjson.loads(entry.payload)
                if record.get("recordType") != "scheduledEvents":
                    continue
                from_record = document_from_json(record["raw"], record["source"]["apiVersion"])
            except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, DocumentError) as exc:
                log.error(
                    "event record in the outbox unreadable; skipped for the baseline",
                    extra={"error": str(exc), "seq": entry.seq},
                )
                continue
            log.info(
                "baseline recovered from the outbox (agent stopped before saving it)",
                extra={"seq": entry.seq, "incarnation": from_record.incarnation},
            )
            return from_record
        return doc

    def _read(self) -> tuple[int, EventsDocument | None]:
        try:
            data: Any = orjson.loads(self.path.read_bytes())
            return int(data["seq"]), document_from_json(data["raw"], data["apiVersion"])
        except FileNotFoundError:
            return 0, None
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, DocumentError) as exc:
            # A damaged baseline must not stop the agent: start as on a first observation ("present"),
            # which re-reports current events under ids of their own rather than losing them.
            log.error("baseline.json unreadable, starting without a baseline", extra={"error": str(exc)})
            return 0, None


class IdentityCache:
    """``<state-dir>/identity.json``: the last identity read from IMDS, used if IMDS is slow at boot."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "identity.json"

    def load(self) -> VmIdentity | None:
        try:
            return VmIdentity.from_state(orjson.loads(self.path.read_bytes()))
        except FileNotFoundError:
            return None
        except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
            log.warning("identity.json unreadable, ignored", extra={"error": str(exc)})
            return None

    def save(self, identity: VmIdentity) -> None:
        write_atomic(self.path, orjson.dumps(identity.to_state()))
