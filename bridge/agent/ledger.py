"""What the relay did, durably: the decisions it answered and the StartRequests POST under way.

Two files in the state directory:

* ``relayed.json``: each ``decisionId`` the relay answered, with its answer. A repeat of a decision
  (an approver retrying after a crash or an outage) gets the same answer and no second POST. Bounded
  to the last ``LEDGER_SIZE`` decisions: decisions live minutes (``max_ttl``), so a forgotten one has
  expired long ago and cannot approve anything again.
* ``posting.json``: the POST the relay is about to send, written (fsynced) *before* it is sent. Why:
  an agent killed between its POST and IMDS's answer (a VM reboot does exactly that when the event it
  approved is the reboot) would otherwise forget that it may have approved the event. On restart such
  a POST is resolved against the first document (:meth:`bridge.agent.relay.Relay.resolve_interrupted`),
  and until then its events count as approved by this VM, so :mod:`bridge.agent.diff` reports one that
  vanished while ``Scheduled`` as ``completed``, not ``canceled``.

The relay handles one batch at a time (its lock), so there is at most one POST under way: the next
intent simply replaces the file. An intent whose decisions are all in the ledger was answered; it
needs no resolution and the file is left as it is (one fsync per batch saved).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from bridge.schemas import JsonObject, JsonValue, json_list, json_object
from bridge.support.fsutil import write_atomic

log = logging.getLogger(__name__)

LEDGER_SIZE = 2000


@dataclass(frozen=True, slots=True)
class IntendedDecision:
    """One decision a POST carries, and what the relay must say of it if the agent dies before IMDS
    answers: its events in request order, the results of those answered without the POST (refused,
    already started ...), and what its audit record names (meta, requester, component)."""

    decision_id: str
    event_ids: list[str]
    results: dict[str, JsonObject]
    meta: JsonObject
    requester: str
    component: str

    def to_json(self) -> JsonObject:
        return {
            "decisionId": self.decision_id,
            "eventIds": json_list(self.event_ids),
            "results": json_object(self.results),
            "meta": self.meta,
            "requester": self.requester,
            "component": self.component,
        }

    @classmethod
    def from_json(cls, data: object) -> IntendedDecision | None:
        """As the intent file kept it; None for an entry of another shape (it is left out)."""
        if not isinstance(data, dict) or not isinstance(data.get("decisionId"), str):
            return None
        events, results, meta = data.get("eventIds"), data.get("results"), data.get("meta")
        return cls(
            str(data["decisionId"]),
            [str(e) for e in events] if isinstance(events, list) else [],
            {str(e): r for e, r in results.items() if isinstance(r, dict)}
            if isinstance(results, dict)
            else {},
            meta if isinstance(meta, dict) else {},
            str(data.get("requester", "")),
            str(data.get("component", "agent")),
        )


@dataclass
class PostIntent:
    """A StartRequests POST about to be sent: its events, and each decision it carries."""

    post_id: str
    event_ids: list[str]
    decisions: list[IntendedDecision] = field(default_factory=list)

    def to_json(self) -> JsonObject:
        return {
            "post": self.post_id,
            "eventIds": json_list(self.event_ids),
            "decisions": json_list(d.to_json() for d in self.decisions),
        }

    @classmethod
    def from_json(cls, data: object) -> PostIntent | None:
        if not isinstance(data, dict) or not isinstance(data.get("post"), str):
            return None
        events = data.get("eventIds")
        decisions = data.get("decisions")
        if not isinstance(events, list) or not isinstance(decisions, list):
            return None
        intended = [IntendedDecision.from_json(d) for d in decisions]
        return cls(str(data["post"]), [str(e) for e in events], [d for d in intended if d is not None])


class DecisionLedger:
    """``relayed.json`` and ``posting.json`` (see the module docstring)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "relayed.json"
        self.posting_path = state_dir / "posting.json"
        self._entries: OrderedDict[str, JsonObject] = OrderedDict()
        kept = self._read(self.path)
        for item in kept if isinstance(kept, list) else []:
            if isinstance(item, dict) and isinstance(decision_id := item.get("decisionId"), str):
                self._entries[decision_id] = item
        intent = PostIntent.from_json(self._read(self.posting_path))
        self._posting = intent if intent is not None and not self._answered(intent) else None

    @staticmethod
    def _read(path: Path) -> JsonValue:
        try:
            data: JsonValue = orjson.loads(path.read_bytes())
            return data
        except FileNotFoundError:
            return None
        except orjson.JSONDecodeError as exc:
            log.error(f"{path.name} unreadable; starting without it", extra={"error": str(exc)})
            return None

    def _answered(self, intent: PostIntent) -> bool:
        return all(d.decision_id in self._entries for d in intent.decisions)

    def get(self, decision_id: str) -> JsonObject | None:
        return self._entries.get(decision_id)

    def put_many(self, answers: dict[str, JsonObject]) -> None:
        """Record the answers of one batch with one durable write."""
        for decision_id, answer in answers.items():
            self._entries[decision_id] = {"decisionId": decision_id, **answer}
        while len(self._entries) > LEDGER_SIZE:
            self._entries.popitem(last=False)
        write_atomic(self.path, orjson.dumps(list(self._entries.values())))
        if self._posting is not None and self._answered(self._posting):
            self._posting = None

    def intend(self, intent: PostIntent) -> None:
        """Durably note a POST before it is sent (an OSError means: do not send it)."""
        write_atomic(self.posting_path, orjson.dumps(intent.to_json()))
        self._posting = intent

    def interrupted(self) -> PostIntent | None:
        """The POST that was under way when the agent stopped, until it is resolved."""
        return self._posting

    def resolved(self) -> None:
        """The interrupted POST was resolved (its answers stored, or left for a retry): forget it."""
        write_atomic(self.posting_path, b"null")
        self._posting = None

    def approved(self, event_id: str) -> bool:
        """Whether this VM's relay approved the event, or sent (or was about to send) a POST for it
        that was not answered: IMDS may have taken it."""
        wanted = event_id.upper()
        if self._posting is not None and wanted in {e.upper() for e in self._posting.event_ids}:
            return True
        return any(
            str(r.get("eventId", "")).upper() == wanted and r.get("result") == "approved"
            for entry in reversed(self._entries.values())
            for r in _results(entry)
        )


def _results(entry: JsonObject) -> list[JsonObject]:
    results = entry.get("results")
    return [r for r in results if isinstance(r, dict)] if isinstance(results, list) else []
