"""The relay's answers, told: each decision's answer counted (``se_bridge_relay_requests_total``)
and published as an ``approval`` audit record through the agent's outbox.

A part of the relay (:mod:`bridge.agent.relay` takes requests in, :mod:`bridge.agent.posting` posts
them exactly once); here because both of them answer: a batch's decisions, and the decisions of a
POST that was interrupted by a restart and resolved after it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from bridge import records
from bridge.imds.instance import VmIdentity
from bridge.pipeline import Outbox, RecordMeta
from bridge.pipeline.storing import REFUSED
from bridge.relay_api import RelayAnswer
from bridge.schemas import JsonObject

if TYPE_CHECKING:
    from prometheus_client import Counter

log = logging.getLogger(__name__)


class RelayMetrics(Protocol):
    """What the relay counts (bridge.agent.metrics.AgentMetrics has it)."""

    @property
    def relay_requests(self) -> Counter: ...  # labelled (outcome, reason)


@dataclass(frozen=True, slots=True)
class DecisionMeta:
    """What the relay keeps of a decision beside its ids: checked (target, expiry), answered and
    audited (issuer, a coordinator's account). The ledger's intent stores it as :meth:`to_json`."""

    target: str | None = None
    issued_by: str | None = None
    expires_at: float | None = None  # Unix time
    coordination: JsonObject | None = field(default=None, compare=False)

    def to_json(self) -> JsonObject:
        body: JsonObject = {}
        for key, value in (
            ("target", self.target),
            ("issuedBy", self.issued_by),
            ("expiresAt", self.expires_at),
            ("coordination", self.coordination),
        ):
            if value is not None:
                body[key] = value
        return body

    @classmethod
    def from_json(cls, body: object) -> DecisionMeta:
        """As an intent of a previous run kept it (a field of another shape is dropped)."""
        if not isinstance(body, dict):
            return cls()
        target, issued_by = body.get("target"), body.get("issuedBy")
        expires, coordination = body.get("expiresAt"), body.get("coordination")
        return cls(
            target if isinstance(target, str) else None,
            issued_by if isinstance(issued_by, str) else None,
            float(expires) if isinstance(expires, int | float) else None,
            coordination if isinstance(coordination, dict) else None,
        )


class RelayAnswers:
    """Counts and audits answers (``identity``: this VM as it is now, for the audit record)."""

    def __init__(
        self,
        outbox: Outbox,
        identity: Callable[[], VmIdentity],
        metrics: RelayMetrics | None,
        api_version: str,
    ) -> None:
        self._outbox = outbox
        self._identity = identity
        self._metrics = metrics
        self.api_version = api_version

    def count(self, outcome: str, reason: str | None) -> None:
        if self._metrics is not None:
            self._metrics.relay_requests.labels(outcome, reason or "ok").inc()

    def audit(
        self,
        component: str,
        requester: str,
        answer: RelayAnswer,
        event_ids: list[str],
        meta: DecisionMeta,
        *,
        detail: str | None = None,
        start_requests_posted: int,
    ) -> None:
        """Publish the attempt as an approval record; best effort: the approval itself already
        happened (or was refused), and a refused append is logged with the record (its trace)."""
        record = records.approval_record(
            component,
            vm=self._identity(),
            api_version=self.api_version,
            decision_id=answer.decision_id,
            event_ids=event_ids,
            target=meta.target,
            issued_by=meta.issued_by,
            requester=requester,
            outcome=answer.outcome,
            reason=answer.reason,
            results=[r.to_json() | {"detail": r.detail} for r in answer.results],
            coordination=meta.coordination,
            detail=detail,
            start_requests_posted=start_requests_posted,
        )
        try:
            self._outbox.append(RecordMeta.of(record), records.encode(record))
        except REFUSED as exc:  # bridge.pipeline.storing
            log.error("audit record not admitted to the outbox", extra={"error": str(exc), "audit": record})
