"""The peer coordinator: coordinated approval without a fleet approver (``coordinate = "peers"``).

The documentation advises choosing one VM of an event to coordinate it. Here every agent of the
event runs the same loop and the same rule picks the coordinator: **the first live VM** in the
event's ``Resources`` (lower-cased, sorted; :func:`bridge.coordination.members`). Each round
(``interval`` seconds) an agent asks the VMs before it ``GET /v1/preparations`` (signed with the
relay key; Azure DNS resolves VM names inside a VNet, ``--peer`` names others) until one answers,
and the coordinator asks every VM of the event, so it knows:

* what each VM of the event reported; every VM of the event is expected to run the agent: one that
  never answered (down, partitioned, starting) is waited for until the deadline like an unprepared
  one, and named ``silent`` in the audit, never dropped from the vote;
* that an answer is real: it is signed with the relay key for the request's own nonce
  (:func:`bridge.signing.verify_peer_answer`: signed with that peer's own key, pinned at its first
  answer, :mod:`bridge.agent.peerkeys`); anything else is no answer;
* who is live: answered within the last ``takeover`` seconds. Every peer counts as live when the
  wait starts, so an agent that is still starting is not skipped: a VM takes over only after the
  VMs before it stayed silent for ``takeover`` seconds.

The coordinator applies :func:`bridge.coordination.assess` and, when it says approve, approves
through **its own relay** with the event's one coordinated ``decisionId`` (checked against its
document, posted once, audited with the ``coordination`` account); when it says leave, it audits
that it approved nothing. The others only wait; when the event starts or leaves the document, every
loop ends. A coordinator killed mid-wait is replaced by the next live VM, which still knows what the
dead one last reported.

The residual risk (docs/approvals.md, failure table): a coordinator killed within ``takeover``
seconds *after* posting, while the next VM's document still shows the event Scheduled, lets the
next VM post a second StartRequests for the same event.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson

from bridge import coordination
from bridge.agent.peerkeys import PeerPins
from bridge.coordination import CoordinationPolicy, Verdict
from bridge.imds.document import SCHEDULED, ScheduledEvent
from bridge.relay_api import PREPARATIONS_PATH
from bridge.signing import H_NONCE, KeyRing, sign_request, verify_peer_answer
from bridge.support.observability import RateLimitedLog

log = logging.getLogger(__name__)

MAX_ANSWER = 256 * 1024


class PeerCoordinator:
    def __init__(
        self,
        policy: CoordinationPolicy,
        *,
        this_vm: Callable[[], str],
        event: Callable[[str], ScheduledEvent | None],
        own_report: Callable[[str], str | None],
        approve: Callable[[dict[str, Any], str], Any],
        leave: Callable[[str, Verdict, str], None],
        keys: KeyRing,
        peers: dict[str, str],
        template: str,
        stop: threading.Event,
        interval: float = 2.0,
        takeover: float = 10.0,
        timeout: float = 2.0,
        asked: Callable[[str], None] = lambda result: None,
        pins: PeerPins | None = None,
    ) -> None:
        import requests

        self.policy = policy
        self._this_vm = this_vm  # -> this VM's name
        self._event = event  # event id -> the event in the agent's current document
        self._own_report = own_report  # event id -> this VM's report (prepared, prepareFailed)
        self._approve = approve  # relay.handle(body, requester, component="coordinator")
        self._leave = leave  # (event id, verdict, coordinator): audit "left to the platform"
        self._keys = keys
        self._pins = pins or PeerPins(None)  # each peer's own answer key, pinned (bridge.agent.peerkeys)
        self._peers = peers
        self._template = template
        self._stop = stop
        self.interval = interval
        self.takeover = takeover
        self._timeout = timeout
        self._asked = asked  # -> the result of each question to a peer (a metric)
        self._session = requests.Session()
        self._session.trust_env = False  # peers are in the VNet: never through a proxy
        self._forged = RateLimitedLog(log, every=60.0, level=logging.WARNING)

    def coordinate(self, event_id: str) -> None:
        """Wait for the event's verdict, acting on it when this VM coordinates; returns when the
        event left the Scheduled state, a verdict was acted on, or the agent stops. It runs on a
        hook thread, whose pool would swallow an exception: one is logged (the platform then starts
        the event at NotBefore)."""
        try:
            self._coordinate(event_id)
        except Exception:
            log.exception("coordination failed", extra={"eventId": event_id})

    def _coordinate(self, event_id: str) -> None:
        me = self._this_vm().lower()
        started = time.monotonic()
        last_seen: dict[str, float] = {}  # peer -> when it last answered (monotonic)
        reports: dict[str, str | None] = {}  # members that run the agent -> their last report
        waiting_for: str | None = None
        while True:
            event = self._event(event_id)
            if event is None or event.event_status != SCHEDULED:
                log.info("coordination ended: the event is no longer Scheduled", extra={"eventId": event_id})
                return
            names = coordination.members(event.resources)
            reports[me] = self._own_report(event_id)
            coordinator = self._round(names, me, event_id, last_seen, reports, started)
            if coordinator == me:
                # Every VM of the event is expected: one that never answered is waited for until
                # the deadline like an unprepared one, never dropped from the vote (issue 23).
                silent = [n for n in names if n != me and n not in last_seen]
                expected = {**dict.fromkeys(names), **reports}
                verdict = coordination.assess(
                    event.resources, expected, event.not_before, time.time(), self.policy, silent=silent
                )
                if verdict.action != "wait":
                    self._act(event, verdict, me, takeover=names.index(me) > 0)
                    return
            elif coordinator != waiting_for:
                waiting_for = coordinator
                log.info(
                    "coordination: another VM coordinates",
                    extra={"eventId": event_id, "coordinator": coordinator},
                )
            if self._stop.wait(self.interval):
                return

    def _round(
        self,
        names: list[str],
        me: str,
        event_id: str,
        last_seen: dict[str, float],
        reports: dict[str, str | None],
        started: float,
    ) -> str:
        """Ask the peers in the members' order and return the coordinator: the first live member
        (this VM is always live; a peer that never answered counts as live until ``takeover`` seconds
        after the wait began). A VM stops asking at the first live peer before it, so only the
        coordinator asks everyone: one question per VM and round, not one per pair of VMs."""
        for position, name in enumerate(names):
            if name == me:
                for later in names[position + 1 :]:
                    self._ask(later, event_id, last_seen, reports)
                return me
            self._ask(name, event_id, last_seen, reports)
            if time.monotonic() - last_seen.get(name, started) < self.takeover:
                return name
        return me  # this VM is not named (its document said otherwise a moment ago): act alone

    def _act(self, event: ScheduledEvent, verdict: Verdict, me: str, *, takeover: bool) -> None:
        account = verdict.to_json(me, self.policy.on_deadline)
        log.info(
            "coordination verdict",
            extra={
                "eventId": event.event_id,
                "action": verdict.action,
                "why": verdict.why,
                "pending": list(verdict.pending),
                "takeover": takeover,
            },
        )
        if verdict.action == "leave":
            self._leave(event.event_id, verdict, me)
            return
        body = {
            "decisionId": coordination.decision_id(event.event_id),
            "eventIds": [event.event_id],
            "target": me,
            "issuedBy": f"coordinator:{me}",
            "coordination": account,
        }
        self._approve(body, f"coordinator:{me}")

    def _ask(
        self, name: str, event_id: str, last_seen: dict[str, float], reports: dict[str, str | None]
    ) -> None:
        """One peer's report for the event (``last_seen``/``reports`` updated when it answered)."""
        url = self._peers.get(name) or self._template.format(name=name)
        signer = self._keys.first()
        if signer is None:
            return  # nothing to sign with, nothing to believe (the agent refuses to start so)
        headers = sign_request(signer[0], signer[1], "GET", PREPARATIONS_PATH)
        try:
            # At most MAX_ANSWER bytes are read: a hostile or broken peer cannot make this agent
            # buffer an unbounded answer (an oversized one is not JSON, so not an answer).
            with self._session.get(
                url.rstrip("/") + PREPARATIONS_PATH, headers=headers, timeout=self._timeout, stream=True
            ) as resp:
                body = resp.raw.read(MAX_ANSWER + 1, decode_content=True) if resp.status_code == 200 else b""
            answer = orjson.loads(body) if body and len(body) <= MAX_ANSWER else None
        except Exception as exc:  # unreachable, refused, not JSON: not live this round
            log.debug("peer did not answer", extra={"peer": name, "error": type(exc).__name__})
            self._asked("unanswered")
            return
        try:  # signed by that peer's own key, for this very request (bridge.agent.peerkeys)
            answer = verify_peer_answer(headers[H_NONCE], answer)
            if str(answer.get("vm", "")).lower() != name.lower():
                raise PermissionError(f"an answer in the name of {str(answer.get('vm'))[:64]!r}")
        except PermissionError as exc:
            self._forged.log(
                "peer answer refused: not proven (no answer this round)", peer=name, error=str(exc)
            )
            self._asked("unproven")
            return
        if not self._pins.check(name, str(answer["answerKey"])):
            log.error(
                "peer answer refused: signed with another key than the one pinned for this peer "
                "(another VM in its name, or a reimaged VM: docs/security.md)",
                extra={"peer": name},
            )
            self._asked("unproven")
            return
        preparations = answer.get("preparations")
        if not isinstance(preparations, dict):
            self._asked("unanswered")
            return
        self._asked("answered")
        last_seen[name] = time.monotonic()
        entry = preparations.get(event_id)
        result = entry.get("result") if isinstance(entry, dict) else None
        reports[name] = result if result in (coordination.PREPARED, coordination.PREPARE_FAILED) else None

    def close(self) -> None:
        self._session.close()
