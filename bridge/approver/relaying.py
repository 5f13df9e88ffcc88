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
from typing import Any

from bridge.approver.arm import ArmAcknowledger
from bridge.approver.routing import FleetRouter, LocalRouter, RelayClient, RelayUnavailable
from bridge.retry import Backoff

log = logging.getLogger(__name__)


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
        self, decisions: list[dict[str, Any]], bodies: list[dict[str, Any]]
    ) -> list[tuple[dict[str, Any] | None, str]]:
        """Relay decisions for one VM in one request (their order kept), trying each candidate agent
        (fleet failover) a few times; ``(None, why)`` for each when none answered."""
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
                return [({**answer, "relay": url, "path": "relay"}, "") for answer in answers]
            if attempt + 1 < self.attempts and not self.stop_event.is_set():
                self.stop_event.wait(backoff.next_delay())
        why = "; ".join(errors[-3:])
        if self.arm_mode == "fallback" and never_sent:
            log.warning("no agent of the event could be reached: approving through ARM", extra={"error": why})
            return self._through_arm(decisions)
        return [(None, why)] * len(bodies)

    def _through_arm(self, decisions: list[dict[str, Any]]) -> list[tuple[dict[str, Any] | None, str]]:
        """Acknowledge each decision's event through Azure Resource Manager (bridge.approver.arm), on
        the target VM's resource, or another VM's of the event when the target's is not known."""
        assert self.arm is not None
        out: list[tuple[dict[str, Any] | None, str]] = []
        for decision in decisions:
            event_id, resource_id = decision["eventId"], self.router.resource_id(decision)
            if resource_id is None:
                out.append((None, "ARM: no resource id known for the event's VMs"))
                continue
            answer = self.arm.acknowledge(resource_id, event_id)
            result = {
                "eventId": event_id,
                "result": "approved" if answer.outcome == "approved" else "armError",
                "detail": answer.detail,
            }
            finished = {
                "decisionId": decision["decisionId"],
                "outcome": answer.outcome,
                "reason": answer.reason,
                "detail": answer.detail,
                "results": [result],
                "relay": "arm",
                "path": "arm",
                "armCorrelationId": answer.correlation_id,
            }
            out.append((finished, ""))
        return out
