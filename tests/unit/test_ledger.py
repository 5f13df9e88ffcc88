"""The relay's ledger (bridge.agent.ledger): a POST is noted before it is sent, and what an agent
killed mid-POST left behind is found again on restart (issue 21 item 2, issue 23 item 5)."""

from __future__ import annotations

from pathlib import Path

import orjson

from bridge.agent.ledger import LEDGER_SIZE, DecisionLedger, IntendedDecision, PostIntent


def _intent(post: str, *events: str, decision: str = "d-00000001") -> PostIntent:
    return PostIntent(post, list(events), [IntendedDecision(decision, list(events), {}, {}, "", "agent")])


def test_a_post_noted_and_never_answered_survives_a_restart(tmp_path: Path) -> None:
    ledger = DecisionLedger(tmp_path)
    assert not ledger.approved("E1")
    ledger.intend(_intent("p1", "E1"))
    assert ledger.approved("e1")  # event ids compare case-insensitively, as IMDS takes them
    again = DecisionLedger(tmp_path)  # the agent was killed before IMDS answered
    interrupted = again.interrupted()
    assert interrupted is not None and interrupted.post_id == "p1" and again.approved("E1")
    again.resolved()
    assert DecisionLedger(tmp_path).interrupted() is None


def test_an_answered_post_needs_no_resolution_and_its_approval_is_remembered(tmp_path: Path) -> None:
    ledger = DecisionLedger(tmp_path)
    ledger.intend(_intent("p1", "E1"))
    answer = {"outcome": "approved", "results": [{"eventId": "E1", "result": "approved", "detail": None}]}
    ledger.put_many({"d-00000001": answer})
    assert ledger.interrupted() is None
    again = DecisionLedger(tmp_path)
    assert again.interrupted() is None and again.approved("E1") and not again.approved("E2")
    assert again.get("d-00000001") == {"decisionId": "d-00000001", **answer}


def test_a_refused_event_is_not_approved_and_the_ledger_stays_bounded(tmp_path: Path) -> None:
    ledger = DecisionLedger(tmp_path)
    refused = {"outcome": "refused", "results": [{"eventId": "E1", "result": "notThisVm", "detail": None}]}
    ledger.put_many({f"d-{i:08d}": refused for i in range(LEDGER_SIZE + 5)})
    assert not ledger.approved("E1")
    assert len(orjson.loads((tmp_path / "relayed.json").read_bytes())) == LEDGER_SIZE
    assert ledger.get("d-00000000") is None and ledger.get(f"d-{LEDGER_SIZE + 4:08d}") is not None


def test_damaged_files_start_empty_instead_of_stopping_the_agent(tmp_path: Path) -> None:
    (tmp_path / "relayed.json").write_bytes(b'[{"decisionId": "d-1", "results": [')
    (tmp_path / "posting.json").write_bytes(b"\x00\x00")
    ledger = DecisionLedger(tmp_path)
    assert ledger.get("d-1") is None and ledger.interrupted() is None
