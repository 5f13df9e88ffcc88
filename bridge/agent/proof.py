"""The agent's own proof of every relayed decision (issue 31: nobody but an approver approves).

Before this module the agent believed whoever held the relay key: a relay request named a
``decisionId`` and events, and the agent posted the StartRequest. Fleet agents share nothing now
that can sign a decision: the relay request carries the **signed decision itself** (Ed25519, as the
console, ``se-bridge decide`` or the signer made it, or as the fleet approver's coordinator signed
it), and the agent proves it with public keys only (:func:`bridge.decisions.verify_for_agent`):
known key, schema, unexpired, an approval; then the event, target and expiry checked against its own
document are the ones *the decision* names, never what the request said beside it. Root on one VM
holds its relay key and the public keys: neither can make another VM's agent post anything.

The migration from shared keys (``relay_legacy_until``): a request without a decision is acted on
until that moment, counted (``se_bridge_relay_requests_total{reason="legacy"}``) and logged, so an
operator sees which approvers still send them; after it, refused ``unproven``.

A refusal here never touches the relay's ledger: a request that proves nothing must not burn the
``decisionId`` of the real decision that may follow it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from datetime import datetime

from bridge.decisions import DecisionKeys, DecisionRefused, verify_for_agent
from bridge.relay_api import RelayDecision
from bridge.support.observability import ErrorStreak

log = logging.getLogger(__name__)

#: How far ahead ``relay_legacy_until`` may lie: a migration window, not a way of life.
MAX_LEGACY_WINDOW = 31 * 86400.0


@dataclass(frozen=True, slots=True)
class Unproven:
    """Why a relayed decision was not acted on (answered, counted, never audited by the agent)."""

    detail: str


class DecisionProver:
    def __init__(self, keys: DecisionKeys, legacy_until: float | None = None) -> None:
        self.keys = keys
        self.legacy_until = legacy_until
        self._refused = ErrorStreak(log, "refusing relayed decisions this agent cannot prove")

    @classmethod
    def from_settings(cls, specs: tuple[str, ...], legacy_until: str | None, now: float) -> DecisionProver:
        """``ValueError`` naming the setting for a key that is not public, or a window too long."""
        keys = DecisionKeys.from_specs(specs, public_only=True)
        until = None
        if legacy_until:
            try:
                until = datetime.fromisoformat(legacy_until.replace("Z", "+00:00")).timestamp()
            except ValueError:
                raise ValueError(f"relay_legacy_until: {legacy_until!r} is not an RFC 3339 time") from None
            if until - now > MAX_LEGACY_WINDOW:
                raise ValueError("relay_legacy_until: at most 31 days ahead (a migration window)")
        return cls(keys, until)

    def legacy_open(self, now: float) -> bool:
        return self.legacy_until is not None and now < self.legacy_until

    def prove(self, request: RelayDecision, now: float | None = None) -> RelayDecision | Unproven:
        """The decision to act on, as its signed object says it; :class:`Unproven` otherwise."""
        now = time.time() if now is None else now
        if request.proof is None:
            if self.legacy_open(now):
                log.warning(
                    "relay request without a signed decision acted on (migration window)",
                    extra={"decisionId": request.decision_id, "until": self.legacy_until},
                )
                return request
            return self._unproven(request, "the request carries no signed decision")
        try:
            valid = verify_for_agent(request.proof, self.keys, now)
        except DecisionRefused as refusal:
            return self._unproven(request, f"{refusal.reason}: {refusal.detail}")
        if valid.decision_id != request.decision_id or request.event_ids != (valid.event_id,):
            return self._unproven(request, "the request does not name what its signed decision names")
        self._refused.success()
        return replace(
            request,
            target=valid.target,
            issued_by=valid.issued_by,
            expires_at=valid.expires_at,
        )

    def _unproven(self, request: RelayDecision, detail: str) -> Unproven:
        self._refused.failure("unproven", detail, decisionId=request.decision_id[:128])
        return Unproven(f"not proven by this agent: {detail}")
