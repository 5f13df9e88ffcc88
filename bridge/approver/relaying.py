"""Decisions for one VM to an agent of their event: the relay request, fleet failover, ARM.

One relay request carries a VM's queued decisions (their order kept). In fleet mode the router names
every VM of the event; the first agent that answers takes the request (an availability set's event is
released through any of its VMs). When none answers after a few rounds, the Azure Resource Manager
path acknowledges the events instead (``--arm fallback``, only if no request reached any agent:
another path must not approve twice), or it is the only path (``--arm only``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace

from bridge.approver.arm import ArmAcknowledger
from bridge.approver.routing import FleetRouter, LocalRouter, RelayClient, RelayUnavailable
from bridge.decisions import Decision
from bridge.eligibility import check_event
from bridge.relay_api import EventResult, Outcome, RelayAnswer
from bridge.schemas import JsonObject
from bridge.support.retry import Backoff

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Unreached:
    """No agent of the event answered: why, and whether provably no request reached one (then
    nothing can have been posted, and another path may approve without approving twice)."""

    why: str
    never_sent: bool

    def __str__(self) -> str:
        return self.why


class Relayer:
    def __init__(
        self,
        router: LocalRouter | FleetRouter,
        client: RelayClient,
        *,
        attempts: int,
        stop_event: threading.Event,
        arm: ArmAcknowledger | None = None,
        arm_mode: str = "off",
    ) -> None:
        self.router = router
        self.client = client
        self.attempts = attempts
        self.stop_event = stop_event
        self.arm = arm  # Azure Resource Manager: a fallback (or the only path) when no agent answers
        self.arm_mode = arm_mode if arm is not None else "off"

    def relay(
        self, decisions: list[Decision], bodies: list[JsonObject], *, fallback: bool = True
    ) -> list[tuple[RelayAnswer | None, Unreached | None]]:
        """Relay decisions for one VM in one request (their order kept), to each candidate agent in
        turn (fleet failover), ``attempts`` rounds; ``(None, Unreached)`` for each when none answered
        (the approver parks them and tries again later). ``fallback``: the ARM path may be taken now
        if it is configured and no request can have reached an agent."""
        if self.arm_mode == "only":
            return self._through_arm(decisions)
        errors: list[str] = []
        never_sent = True  # no request reached any agent: another path cannot approve twice
        backoff = Backoff(base=0.5, cap=5.0)
        for attempt in range(self.attempts):
            candidates = list(dict.fromkeys(u for d in decisions for u in self.router.candidates(d)))
            if not candidates:
                errors.append("no agent known for the event's VMs")
            for index, url in enumerate(candidates):
                try:
                    answers = self.client.start_requests_many(url, bodies)
                except RelayUnavailable as exc:
                    errors.append(str(exc))
                    never_sent = never_sent and exc.never_sent
                    more = "trying the next VM of the event" if index + 1 < len(candidates) else "no other"
                    log.warning(
                        f"agent did not answer ({more})",
                        extra={"relay": url, "error": str(exc), "attempt": attempt + 1},
                    )
                    continue
                return [(replace(answer, relay=url, path="relay"), None) for answer in answers]
            if attempt + 1 < self.attempts and not self.stop_event.is_set():
                self.stop_event.wait(backoff.next_delay())
        why = "; ".join(errors[-3:])
        if fallback and self.arm_mode == "fallback" and never_sent:
            log.warning("no agent of the event could be reached: approving through ARM", extra={"error": why})
            return self._through_arm(decisions)
        return [(None, Unreached(why, never_sent))] * len(bodies)

    def _through_arm(self, decisions: list[Decision]) -> list[tuple[RelayAnswer | None, Unreached | None]]:
        """Acknowledge each decision's event through Azure Resource Manager (bridge.approver.arm), on
        the target VM's resource, or another VM's of the event when the target's is not known; only
        once the rule every approving path applies (bridge.eligibility) let it: the agents' relays
        check the same against IMDS, here against what the agents reported."""
        assert self.arm is not None
        return [self._acknowledge(decision) for decision in decisions]

    def _acknowledge(self, decision: Decision) -> tuple[RelayAnswer | None, Unreached | None]:
        assert self.arm is not None
        event_id = decision.event_id
        scope = self.router.scope_vm(decision)
        if scope is None:
            return None, Unreached("ARM: no resource id known for the event's VMs", never_sent=True)
        refusal = check_event(
            self.router.event_facts(event_id),
            approver_names={scope.name.lower()},
            target=decision.target,
            expires_at=decision.expires,
            now=time.time(),
        )
        if refusal is not None:
            detail = f"not acknowledged through ARM: {refusal.detail}"
            refused = EventResult(event_id, refusal.result, refusal.detail)
            return _answer(decision, "refused", refusal.result, detail, refused, None), None
        answer = self.arm.acknowledge(scope.resource_id, event_id, self.router.azure_parent(event_id))
        result = EventResult(
            event_id, "approved" if answer.outcome == "approved" else "armError", answer.detail
        )
        return _answer(
            decision, answer.outcome, answer.reason, answer.detail, result, answer.correlation_id
        ), None


def _answer(
    decision: Decision,
    outcome: Outcome,
    reason: str | None,
    detail: str | None,
    result: EventResult,
    correlation_id: str | None,
) -> RelayAnswer:
    """The ARM path's answer, typed like an agent's (the approver audits both alike)."""
    return RelayAnswer(
        decision.decision_id,
        outcome,
        reason,
        (result,),
        detail=detail,
        relay="arm",
        path="arm",
        arm_correlation_id=correlation_id,
    )
