"""The agent's relay in its parts (issue 32 item 4), with a scripted IMDS client and the real ledger
and outbox: what it posts (once), what it answers, what it audits, and what survives a restart.

Only IMDS is scripted (the emulator's HTTP is covered by the integration tests): a StartRequests
POST that succeeds or fails on cue, and the document the poller would hold."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
import pytest

from bridge.agent.answers import DecisionMeta, RelayAnswers
from bridge.agent.ledger import DecisionLedger, IntendedDecision, PostIntent
from bridge.agent.posting import StartRequestPoster
from bridge.agent.relay import Relay
from bridge.eligibility import EventFacts, check_event
from bridge.imds.client import ImdsError
from bridge.imds.document import EventsDocument, document_from_json
from bridge.imds.instance import VmIdentity
from bridge.pipeline import Outbox
from bridge.relay_api import EventResult, RelayAnswer, outcome_of
from bridge.schemas import validate_record

E1, E2, E3 = (f"8D10DA13-8125-4BA9-A717-BF7490507B3{n}" for n in range(3))
VM = VmIdentity(vm_id="0f8fad5b-d9cb-469f-a165-70867728950e", name="vm-a")


def document(*events: tuple[str, str, list[str]], incarnation: int = 3) -> EventsDocument:
    """(EventId, EventStatus, Resources) each."""
    return document_from_json({
        "DocumentIncarnation": incarnation,
        "Events": [
            {"EventId": e, "EventType": "Freeze", "ResourceType": "VirtualMachine", "Resources": r,
             "EventStatus": s, "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT" if s == "Scheduled" else "",
             "Description": "", "EventSource": "Platform", "DurationInSeconds": 5}
            for e, s, r in events
        ],
    }, api_version="2020-07-01")  # fmt: skip


class ScriptedImds:
    """``post_start_requests`` as IMDS would answer it: each call takes the next step (an
    ImdsError to raise, or None: accepted)."""

    def __init__(self, *steps: ImdsError | None) -> None:
        self.steps = list(steps)
        self.posts: list[list[str]] = []
        self.slots = 0

    def wait_for_slot(self) -> None:
        self.slots += 1

    def post_start_requests(self, event_ids: Iterable[str], *, reserved: bool = False) -> None:
        self.posts.append(list(event_ids))
        step = self.steps.pop(0) if self.steps else None
        if step is not None:
            raise step


class Documents:
    """The poller's side: the current document, and the one a refresh would bring."""

    def __init__(self, current: EventsDocument | None, fresh: EventsDocument | None = None) -> None:
        self.current, self.fresh, self.refreshes = current, fresh, 0

    def document(self) -> EventsDocument | None:
        return self.current

    def refresh(self, timeout: float) -> bool:
        self.refreshes += 1
        self.current = self.fresh or self.current
        return True


class Agent:
    """A relay with everything real but IMDS: the ledger and the outbox in ``state``."""

    def __init__(self, state: Path, docs: Documents, imds: ScriptedImds, **relay: Any) -> None:
        self.state, self.docs, self.imds = state, docs, imds
        self.outbox = Outbox(state / "outbox", ["test"])
        answers = RelayAnswers(self.outbox, lambda: VM, None, "2020-07-01")
        self.poster = StartRequestPoster(imds, DecisionLedger(state), answers)  # type: ignore[arg-type]
        self.relay = Relay(imds, docs, lambda: VM, self.poster, answers, **relay)  # type: ignore[arg-type]

    def ask(self, body: Any, component: str = "policy") -> tuple[int, dict[str, Any]]:
        return self.relay.handle(body, "test", component=component)

    def audits(self) -> list[dict[str, Any]]:
        records = [orjson.loads(e.payload) for e in self.outbox.read(0, limit=1000)]
        for record in records:
            assert validate_record(record) == [], record
        return records

    def close(self) -> None:
        self.outbox.close()


@pytest.fixture
def agent(tmp_path: Path) -> Any:
    made: list[Agent] = []

    def make(docs: Documents, imds: ScriptedImds | None = None, **relay: Any) -> Agent:
        made.append(Agent(tmp_path, docs, imds or ScriptedImds(), **relay))
        return made[-1]

    yield make
    for a in made:
        a.close()


def decision(decision_id: str, *events: str, **more: Any) -> dict[str, Any]:
    return {"decisionId": decision_id, "eventIds": list(events), **more}


# -- eligibility: the rule every approving path applies ---------------------------------------------


@pytest.mark.parametrize(
    ("facts", "more", "word"),
    [
        (None, {}, "notFound"),
        (EventFacts("Started", ("vm-a",)), {}, "alreadyStarted"),
        (EventFacts("Canceled", ("vm-a",)), {}, "notScheduled"),
        (EventFacts("Scheduled", ("vm-b",)), {}, "notThisVm"),
        (EventFacts("Scheduled", ("vm-a", "vm-b")), {"target": "vm-c"}, "targetMismatch"),
        (EventFacts("Scheduled", ("vm-a",)), {"expires_at": 99.0}, "expired"),
        (EventFacts("Scheduled", ("VM-A",)), {}, None),
        (EventFacts("Scheduled", ("vm-a", "vm-b")), {"target": "vm-b"}, None),
    ],
)
def test_eligibility_names_why_an_event_cannot_be_approved(
    facts: Any, more: dict[str, Any], word: Any
) -> None:
    args = {"target": None, "expires_at": None, **more}
    refusal = check_event(facts, approver_names={"vm-a"}, now=100.0, **args)
    assert (refusal.result if refusal else None) == word


def test_an_event_of_another_vm_is_approvable_only_when_configured_so() -> None:
    other = EventFacts("Scheduled", ("vm-b",))
    assert check_event(other, approver_names={"vm-a"}, target=None, expires_at=None, now=0.0,
                       require_this_vm=False) is None  # fmt: skip


def test_the_outcome_rule_is_one_place() -> None:
    def of(*words: str) -> tuple[str, str | None]:
        return outcome_of([EventResult(f"e{i}", w) for i, w in enumerate(words)])  # type: ignore[arg-type]

    assert of("approved", "alreadyStarted") == ("approved", None)
    assert of("approved", "notThisVm") == ("partial", "notThisVm")
    assert of("imdsError", "imdsError") == ("failed", "imdsError")
    assert of("notFound", "imdsError") == ("refused", "notFound")
    assert of("approved", "unknown") == ("unknown", "interruptedPost")


# -- the relay ------------------------------------------------------------------------------------


def test_a_decision_is_posted_once_answered_and_audited_and_a_repeat_is_answered_from_the_ledger(
    agent: Any,
) -> None:
    a = agent(Documents(document((E1, "Scheduled", ["vm-a"]))))
    status, answer = a.ask(decision("decision-1", E1, target="vm-a", issuedBy="alice"))
    assert status == 200 and answer["outcome"] == "approved" and a.imds.posts == [[E1]]
    assert answer["results"] == [{"eventId": E1, "result": "approved"}] and answer["startRequests"]
    status, again = a.ask(decision("decision-1", E1, target="vm-a", issuedBy="alice"))
    assert status == 200 and again["repeat"] is True and again["startRequests"] == answer["startRequests"]
    assert a.imds.posts == [[E1]]  # no second StartRequest
    first, repeat = a.audits()
    assert (first["outcome"], first["startRequestsPosted"], first["issuedBy"]) == ("approved", 1, "alice")
    assert (repeat["outcome"], repeat["startRequestsPosted"]) == ("approved", 0)
    assert "repeat" in repeat["detail"]


def test_what_is_not_approvable_is_refused_and_nothing_is_posted(agent: Any) -> None:
    a = agent(Documents(document((E1, "Scheduled", ["vm-b"]), (E2, "Started", ["vm-a"]))))
    _, answer = a.ask(decision("decision-1", E1, E2, E3))
    # alreadyStarted releases the event (nothing left to approve): the others make it partial
    assert answer["outcome"] == "partial" and answer["reason"] == "notThisVm"
    assert [r["result"] for r in answer["results"]] == ["notThisVm", "alreadyStarted", "notFound"]
    assert a.imds.posts == [] and "startRequests" not in answer
    assert a.audits()[0]["startRequestsPosted"] == 0


def test_an_imds_failure_is_a_failed_answer_kept_so_a_repeat_never_posts_again(agent: Any) -> None:
    a = agent(Documents(document((E1, "Scheduled", ["vm-a"]))), ScriptedImds(ImdsError("http_5xx", "boom")))
    _, answer = a.ask(decision("decision-1", E1))
    assert (answer["outcome"], answer["reason"]) == ("failed", "imdsError")
    _, again = a.ask(decision("decision-1", E1))
    assert again["outcome"] == "failed" and again["repeat"] and a.imds.posts == [[E1]]


def test_decisions_of_one_request_share_one_post_and_keep_their_own_answers(agent: Any) -> None:
    a = agent(Documents(document((E1, "Scheduled", ["vm-a"]), (E2, "Scheduled", ["vm-a"]))))
    status, body = a.ask(
        {"decisions": [decision("decision-1", E1), decision("decision-2", E2), decision("decision-3", E3)]}
    )
    assert status == 200 and [x["outcome"] for x in body["answers"]] == ["approved", "approved", "refused"]
    assert a.imds.posts == [[E1, E2]] and a.imds.slots == 1
    _, late = a.ask(decision("decision-4", E1))  # posted already in this run: approved, not posted again
    assert late["outcome"] == "approved" and "already posted" in late["results"][0]["detail"]
    assert a.imds.posts == [[E1, E2]]


def test_an_event_the_document_does_not_show_yet_is_looked_for_once(agent: Any) -> None:
    docs = Documents(document(), fresh=document((E1, "Scheduled", ["vm-a"]), incarnation=4))
    a = agent(docs)
    _, answer = a.ask(decision("decision-1", E1))
    assert answer["outcome"] == "approved" and answer["documentIncarnation"] == 4 and docs.refreshes == 1


def test_no_document_yet_is_503_and_nothing_is_kept(agent: Any) -> None:
    a = agent(Documents(None))
    status, answer = a.ask(decision("decision-1", E1))
    assert status == 503 and "no Scheduled Events document" in answer["error"]
    assert a.poster.answered("decision-1") is None and a.audits() == []


def test_an_unproven_decision_from_outside_is_refused_unkept_and_unaudited(agent: Any) -> None:
    a = agent(Documents(document((E1, "Scheduled", ["vm-a"]))))  # no prover: no decision key
    status, answer = a.ask(decision("decision-1", E1), component="agent")
    assert status == 200 and (answer["outcome"], answer["reason"]) == ("refused", "unproven")
    assert a.imds.posts == [] and a.poster.answered("decision-1") is None and a.audits() == []


def test_a_malformed_request_is_400_and_never_audited(agent: Any) -> None:
    a = agent(Documents(document()))
    for body in (None, [], {"decisionId": ""}, {"decisionId": "d", "eventIds": []}, {"decisions": "x"}):
        status, answer = a.ask(body)
        assert status == 400 and "error" in answer
    assert a.audits() == []


@pytest.mark.parametrize(
    ("status", "word", "kept"), [("Started", "approved", True), ("Scheduled", "unknown", False)]
)
def test_a_post_interrupted_by_a_restart_is_resolved_against_the_first_document(
    tmp_path: Path, agent: Any, status: str, word: str, kept: bool
) -> None:
    """The agent died between its POST and IMDS's answer: the next run says what became of it, once,
    and keeps an approval; an event still Scheduled is ``unknown`` and not kept (a retry posts)."""
    meta = DecisionMeta(target="vm-a", issued_by="alice")
    refused = EventResult(E2, "notFound", "no such event").to_json()
    intended = IntendedDecision.from_json(
        {"decisionId": "decision-1", "eventIds": [E1, E2], "results": {E2: refused}, "meta": meta.to_json(),
         "requester": "key:ops@10.0.0.9", "component": "agent"}
    )  # fmt: skip
    assert intended is not None
    DecisionLedger(tmp_path).intend(PostIntent("post-1", [E1], [intended]))
    a = agent(Documents(document((E1, status, ["vm-a"]))))
    assert a.poster.approved(E1)  # until resolved: IMDS may have taken it
    a.poster.resolve_interrupted(a.docs.current)
    (audit,) = a.audits()
    assert audit["outcome"] == ("partial" if kept else "unknown") and audit["startRequestsPosted"] == 1
    assert [r["result"] for r in audit["results"]] == [word, "notFound"] and audit["issuedBy"] == "alice"
    answer = a.poster.answered("decision-1")
    assert (answer is not None) is kept
    assert isinstance(answer, RelayAnswer | None)
    assert DecisionLedger(tmp_path).interrupted() is None  # resolved for good
    a.poster.resolve_interrupted(a.docs.current)
    assert len(a.audits()) == 1  # once
