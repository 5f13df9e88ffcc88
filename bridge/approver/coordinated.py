"""The fleet approver's coordinated approvals: acting on the fleet coordinator's verdicts.

The coordinator (:mod:`bridge.approver.coordinator`) decides, per event, whether every VM it names
is prepared (or the deadline before ``NotBefore`` came); this module acts on that verdict like on a
decision: a decision id derived from the event (:func:`bridge.coordination.decision_id`, so it is
approved once whatever instance or restart acts), relayed through an agent of the event, audited
with the coordinator's account of whom it waited for; or an audit that the platform decides.
"""

from __future__ import annotations

import logging
from typing import Any

from bridge import coordination
from bridge.approver.auditing import AuditWriter, Ending
from bridge.approver.lifecycle import DecisionLife
from bridge.approver.metrics import ApproverMetrics
from bridge.approver.store import DecisionStore
from bridge.coordination import Verdict
from bridge.decisions import Decision, SigningKey, new_decision, sign
from bridge.relay_api import RelayDecision
from bridge.streams import Message, Position

log = logging.getLogger("bridge.approver.service")

#: Seconds a coordinator's signed approval lives: it is relayed at once (and signed anew if retried).
COORDINATED_TTL = 300.0


class CoordinatedApprovals:
    def __init__(
        self,
        life: DecisionLife,
        audit: AuditWriter,
        store: DecisionStore,
        metrics: ApproverMetrics,
        *,
        instance: str,
        on_deadline: str,
        signer: tuple[str, SigningKey] | None = None,
    ) -> None:
        self.signer = signer  # signs each approval, which the agent proves like any decision
        self.life = life
        self.audit = audit
        self.store = store
        self.metrics = metrics
        self.instance = instance
        self.on_deadline = on_deadline

    def act(self, event_id: str, members: list[str], verdict: Verdict) -> bool:
        """Act on the fleet coordinator's verdict for one event: approve it through an agent of the
        event (the decision store makes it once per event id), or audit that the platform decides.
        A full or failing disk is waited out: a verdict is never dropped (until the approver stops).
        False when no agent of the event answered: nothing is recorded or audited, and the
        coordinator tries again later (a relay request that never arrived approved nothing)."""
        decision_id = coordination.decision_id(event_id)
        coordinator = f"fleet-approver:{self.instance}"
        decision = Decision(
            decision_id,
            event_id,
            # The first prepared VM: its agent is live and its ledger sees any repeat of this id.
            target=(verdict.prepared or verdict.waited_for or tuple(members) or ("",))[0],
            issued_by=f"coordinator:{coordinator}",
        )
        account = verdict.to_json(coordinator, self.on_deadline)
        message = Message(b"", Position(f"coordinator/{event_id}", 0, partitioned=False))
        done = self.audit.until_stored(
            lambda: self._act_on_verdict(decision, message, verdict, account), message
        )
        if done is None:
            return True  # stopping: the next coordinator assesses the event again
        if done:
            self.metrics.coordinated.labels(verdict.action, verdict.why).inc()
        return done

    def _signed(self, decision: Decision) -> dict[str, Any] | None:
        """The coordinator's approval as a signed decision (a short life: it is signed again at each
        attempt; the agent's ledger keys on the decision id, which is the event's)."""
        if self.signer is None:
            return None  # the agent refuses it (unproven); build_approver requires a key with --coordinate
        draft = new_decision(decision.event_id, decision.target, decision.issued_by, COORDINATED_TTL)
        draft["decisionId"] = decision.decision_id
        return sign(draft, *self.signer)

    def _act_on_verdict(
        self, decision: Decision, message: Message, verdict: Verdict, account: dict[str, Any]
    ) -> bool:
        earlier = self.store.get(decision.decision_id)
        if earlier is not None and earlier.state == "final":
            return True  # acted on already (the stream was read again after a restart)
        if verdict.action == "leave":
            detail = verdict.left_detail()
            ending = Ending("refused", "leftToPlatform", detail)
            self.audit.finish(decision, message, ending, coordination=account)
            return True
        self.store.started(decision.decision_id, message.position)
        body = RelayDecision(
            decision.decision_id,
            (decision.event_id,),
            target=decision.target,
            issued_by=decision.issued_by,
            coordination=account,
            proof=self._signed(decision),
        ).to_json()
        answer, unreached = self.life.relay(decision, body)
        if answer is None:
            log.warning(
                "coordinated approval reached no agent of the event; trying again later",
                extra={"eventId": decision.event_id, "error": str(unreached)},
            )
            return False
        self.life.finish_relayed(decision, message, answer, coordination=account)
        return True
