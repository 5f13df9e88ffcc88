"""The console's board, record by record (issue 20): what the pages show when the stream's
partitions are read unevenly, as a console reading many partitions always does.

Found by bench/console_bench.py: with 10 000 VMs the history counted 16 404 closed events for
6 000 (an event closed once per VM of its set: VM A's partition read to its end, the event had no
reporter left and closed; VM B's records, behind, showed it again and it closed again).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from records import approval, preparation, scheduled_events, typed, vm_block
from records import change as make_change
from records import event as make_event

from bridge.console import fleet_pages
from bridge.console.board import Board, Sent
from bridge.signing import KeyRing, sign_record

SET = ["vm-a", "vm-b", "vm-c"]
EVENT = "8D10DA13-8125-4BA9-A717-BF7490507B3D"


@pytest.fixture(autouse=True)
def _no_view_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests read the board right after each record; a page sees VM views up to 1 s old."""
    monkeypatch.setattr(fleet_pages, "VIEW_SECONDS", 0.0)


def take_raw(board: Board, raw: object, now: float | None = None) -> None:
    """A record as parsed JSON, through the board's own reader (as the stream would hand it)."""
    board.take(board.reader.read(raw), now)


def listed(fleet: dict[str, Any]) -> list[dict[str, Any]]:
    """The VMs the fleet page's first answer lists (those of the groups shown open)."""
    return [vm for group in fleet["groups"] for vm in group.get("listed", [])]


def events_of(fleet: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["eventId"]: e for e in fleet["events"]}


def record(vm: str, status: str | None, at: str, change: str = "") -> dict[str, Any]:
    events = (
        []
        if status is None
        else [
            make_event(
                EVENT,
                *SET,
                status=status,
                not_before="2026-11-20T10:15:00Z" if status == "Scheduled" else None,
            )
        ]
    )
    changes = [make_change(EVENT, change)] if change else []
    return scheduled_events(vm_block(vm), events, changes, at=at)


def lifetime(vm: str) -> list[dict[str, Any]]:
    return [
        record(vm, "Scheduled", "2026-11-20T10:00:00Z"),
        record(vm, "Started", "2026-11-20T10:15:00Z"),
        record(vm, None, "2026-11-20T10:16:00Z", change="completed"),
    ]


def test_an_event_closes_once_when_its_vms_are_read_one_partition_after_another() -> None:
    board = Board(history_days=366)
    for vm in SET:  # every record of vm-a, then vm-b's, then vm-c's
        for rec in lifetime(vm):
            take_raw(board, rec, now=1795000000.0)
    history = board.history(now=1795000000.0)
    assert history["days"] == [("2026-11-20", {"Freeze": 1})]
    assert [h["eventId"] for h in history["events"]] == [EVENT]
    closed = board.event(EVENT)
    assert closed is not None and closed["open"] is False and closed["outcome"] == "completed"
    assert [t["vm"] for t in closed["timeline"] if t["change"] == "completed"] == SET  # one row, every VM
    assert board.fleet(now=1795000000.0)["counts"]["openEvents"] == 0


def test_a_late_vm_reopens_the_event_without_undoing_its_status() -> None:
    board = Board(history_days=366)
    for rec in lifetime("vm-a")[:2]:
        take_raw(board, rec, now=1795000000.0)
    take_raw(board, record("vm-b", "Scheduled", "2026-11-20T10:00:01Z"), now=1795000000.0)  # vm-b is behind
    event = board.event(EVENT)
    assert event is not None and event["eventStatus"] == "Started" and event["open"]


APPROVER_KEY = b"approvers-sign-key-of-the-tests-0123456789"


def approver_audit(**more: Any) -> dict[str, Any]:
    audit = approval(decision_id="d-1", event_ids=[EVENT], at="2026-11-20T10:14:00Z",
                     issuedBy="alice@contoso.example", **more)  # fmt: skip
    return sign_record("approvers", APPROVER_KEY, audit)


def test_an_audit_that_comes_after_the_event_closed_is_kept_with_it() -> None:
    board = Board(history_days=366, approver_keys=KeyRing({"approvers": APPROVER_KEY}))
    for vm in SET:
        for rec in lifetime(vm):
            take_raw(board, rec, now=1795000000.0)
    take_raw(board, approver_audit(), now=1795000000.0)
    closed = board.event(EVENT)
    assert closed is not None
    assert [a["outcome"] for a in closed["audits"]] == ["approved"]
    assert closed["approvedBy"] == "alice@contoso.example"


def test_azures_channel_shows_the_vms_nobody_watches_and_how_events_ended() -> None:
    """Issue 25: the azure-channel service's records on the same stream. vm-c runs no agent: Azure's
    event and the reconciliation's unwatched finding put it on the fleet page, flagged, with the event;
    vm-c's agent coming back takes the flag off; Azure's Completed is the event's outcome."""
    import time

    from azure_events import RG, SUB, grid_event

    from bridge.azure.events import from_event_grid
    from bridge.azure.reconcile import Reconciler
    from bridge.azure.records import azure_event_record
    from bridge.azure.tracker import EventTracker
    from bridge.signing import KeyRing, sign_record

    key = b"z" * 40
    board, tracker = Board(azure_keys=KeyRing({"azure": key})), EventTracker()
    reconciler = Reconciler(grace=10, ended=tracker.ended)

    def azure(status: str, now: float) -> None:
        event = from_event_grid(grid_event(EVENT, status, SET, parent="avset", kind="availabilitySets"))
        news = tracker.observe(event)
        assert news is not None
        for rec in [azure_event_record(event, news, now), *reconciler.azure(event, news, now)]:
            take_raw(board, rec, now)  # unsigned (what any agent could write): not shown
            take_raw(board, sign_record("azure", key, rec), now)

    now = time.time()
    for vm in ("vm-a", "vm-b"):
        agents = record(vm, "Scheduled", "2026-11-20T10:00:00Z")
        agents["vm"].update(subscriptionId=SUB, resourceGroup=RG)
        take_raw(board, agents, now)
        reconciler.agent(typed(agents), now)
    azure("Scheduled", now)
    findings = reconciler.due(now + 11)
    for finding in findings:
        take_raw(board, finding, now + 11)
    assert all(not vm["unwatched"] for vm in listed(board.fleet(now + 11)))  # unsigned findings: not shown
    for finding in findings:
        take_raw(board, sign_record("azure", key, finding), now + 11)
    fleet = board.fleet(now + 11)
    by_name = {vm["name"]: vm for vm in listed(fleet)}
    assert by_name["vm-c"]["unwatched"] == [EVENT] and by_name["vm-c"]["events"] == [EVENT]
    assert by_name["vm-a"]["unwatched"] == [] and events_of(fleet)[EVENT]["eventStatus"] == "Scheduled"
    take_raw(board, record("vm-c", "Scheduled", "2026-11-20T10:01:00Z"), now + 12)  # its agent is back
    assert {vm["name"]: vm for vm in listed(board.fleet(now + 12))}["vm-c"]["unwatched"] == []
    for vm in SET:
        take_raw(board, record(vm, None, "2026-11-20T10:16:00Z", change="completed"), now + 13)
    azure("Completed", now + 14)
    event = board.event(EVENT)
    assert event is not None and event["open"] is False and event["azureOutcome"] == "Completed"


# -- issue 31, finding 4: whoever can publish on the events stream must not steer what a person sees --


def scheduled(vm: str, resources: list[str], vm_id: str = "", **fields: Any) -> dict[str, Any]:
    event = make_event(EVENT, *resources, event_type="Redeploy", not_before="2026-11-20T10:15:00Z",
                       description="Host maintenance")  # fmt: skip
    event.update(fields)
    return scheduled_events(vm_block(vm, vm_id=vm_id or None), [event])


def test_a_vm_the_event_does_not_name_cannot_rewrite_it() -> None:
    """vm-x rewrote E7's Resources from three VMs to one and its description to "routine, one VM";
    moved NotBefore 30 days; forced it Started. None of it is believed now."""
    board = Board()
    take_raw(board, scheduled("vm-a", SET, "id-a"))
    for lie in (
        scheduled("vm-x", ["vm-x", "vm-a"], description="routine, one VM"),
        scheduled("vm-x", ["vm-x"], eventStatus="Started"),
        scheduled("vm-x", ["vm-x"], notBefore="2026-12-20T10:15:00Z"),
    ):
        take_raw(board, lie)
    event = board.event(EVENT)
    assert event is not None
    assert (event["resources"], event["eventStatus"]) == (SET, "Scheduled")
    assert (event["description"], event["notBefore"]) == ("Host maintenance", "2026-11-20T10:15:00Z")
    assert board.refused["notNamed"] == 3
    assert board.scheduled(EVENT) is not None  # still approvable


def test_another_vm_in_a_pinned_vms_name_changes_nothing() -> None:
    """Records in vm-b's name from another identity closed the event or forced it Started."""
    board = Board()
    take_raw(board, scheduled("vm-a", SET, "id-a"))
    take_raw(board, scheduled("vm-b", SET, "id-b"))
    impostor = scheduled("vm-b", SET, "id-mallory", eventStatus="Started")
    take_raw(board, impostor)
    take_raw(board, {**impostor, "events": [], "changes": [make_change(EVENT, "completed")]})
    event = board.event(EVENT)
    assert event is not None and event["open"] and event["eventStatus"] == "Scheduled"
    assert board.refused["changedClaim"] == 2


def test_the_dialog_releases_what_the_targets_own_agent_reported() -> None:
    """A record rewrote Resources so that confirm ["vm-a"] signed a decision that releases three: the
    target's own report decides what the dialog lists and what confirm must name."""
    board = Board()
    take_raw(board, scheduled("vm-a", SET, "id-a"))
    take_raw(board, scheduled("vm-b", ["vm-b", "vm-a"], "id-b"))  # a named VM's own (narrower) report
    row = board.scheduled(EVENT)
    assert row is not None
    summary = row.summary()
    assert summary["target"] == "vm-a" and summary["releases"] == SET
    assert row.released("vm-a") == tuple(SET) and row.released("vm-b") == ("vm-b", "vm-a")


def test_approvals_and_preparations_only_from_proven_origins() -> None:
    """Unsigned records made the console show "approved by alice@corp" and "3/3 prepared"."""
    board = Board(approver_keys=KeyRing({"approvers": APPROVER_KEY}))
    take_raw(board, scheduled("vm-a", SET, "id-a"))
    unsigned = approval(
        decision_id="d-2", event_ids=[EVENT], issuedBy="alice@corp", at="2026-11-20T10:01:00Z"
    )
    forged = {**approver_audit(), "issuedBy": "mallory@corp"}  # a real signature over other words
    other_key = sign_record("approvers", b"m" * 40, unsigned)
    agent_x = {**unsigned, "component": "agent", "vm": vm_block("vm-x")}  # an agent the event does not name
    for lie in (unsigned, forged, other_key, agent_x):
        take_raw(board, lie)
    for _ in SET:  # vm-x reports a preparation for an event that does not name it
        take_raw(board, preparation(vm_block("vm-x"), EVENT, at="2026-11-20T10:02:00Z"))
    event = board.event(EVENT)
    assert event is not None and event["approved"] is False and event["audits"] == []
    assert event["preparations"] == {}
    assert board.refused["unprovenApproval"] == 4
    take_raw(board, preparation(vm_block("vm-a", vm_id="id-a"), EVENT, at="2026-11-20T10:03:00Z"))
    take_raw(board, approver_audit())
    event = board.event(EVENT)
    assert event is not None and event["preparations"] == {"vm-a": "prepared"}
    assert event["approved"] and event["approvedBy"] == "alice@contoso.example"


def test_the_approvers_verdict_on_this_consoles_decision_is_shown_even_unproven() -> None:
    """Issue 33: when the approvers do not hold the console's key they refuse its decision before
    proving it (``unknownKey``): the audit names the decision only under ``unverified``, and the page
    kept saying "waiting". The console links the verdict to the decision it published."""
    board = Board(approver_keys=KeyRing({"approvers": APPROVER_KEY}))
    take_raw(board, scheduled("vm-a", SET, "id-a"))
    board.published("console-d-1", Sent.now(EVENT, "approve", 0.0, "alice"))
    seen: list[dict[str, Any]] = []
    board.announced.listeners.append(seen.append)
    refused = sign_record("approvers", APPROVER_KEY, approval(
        decision_id=None, outcome="refused", reason="unknownKey", at="2026-11-20T10:01:00Z",
        unverified={"decisionId": "console-d-1", "eventId": EVENT},
    ))  # fmt: skip
    take_raw(board, refused)
    (audit,) = [m for m in seen if m["type"] == "audit"]
    assert audit["eventIds"] == [EVENT] and audit["audit"]["decisionId"] == "console-d-1"
    assert audit["audit"]["reason"] == "unknownKey"
    stranger = {**refused, "unverified": {"decisionId": "someone-elses", "eventId": EVENT}}
    take_raw(
        board, sign_record("approvers", APPROVER_KEY, {k: v for k, v in stranger.items() if k != "signature"})
    )
    assert len([m for m in seen if m["type"] == "audit"]) == 1  # not this console's: not shown


def test_closed_events_are_compacted_and_the_history_keeps_only_its_days() -> None:
    """Issue 33: each closed event kept its whole timeline (~8.7 KB) for up to 50 000 events, and
    ``--history-days`` only filtered the page: the console grew with the month, not the fleet."""
    from bridge.console import board as board_module

    board = Board(history_days=2)
    day = 86400.0

    def close(event_id: str, at: float) -> None:
        vms = [f"vm-{event_id[:4]}-{n}" for n in range(40)]
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
        item = make_event(event_id, *vms)
        for vm in vms:  # 40 VMs, each with its own timeline rows
            take_raw(
                board,
                scheduled_events(vm_block(vm), [item], [make_change(event_id, "scheduled")], at=stamp),
                now=at,
            )
        for vm in vms:
            take_raw(
                board,
                scheduled_events(vm_block(vm), [], [make_change(event_id, "completed")], at=stamp),
                now=at,
            )

    first, second, third = (str(uuid.uuid4()).upper() for _ in range(3))
    close(first, 1_800_000_000.0)
    closed = board.event(first)
    assert closed is not None and not closed["open"]
    assert len(closed["timeline"]) <= board_module.CLOSED_TIMELINE
    close(second, 1_800_000_000.0 + day)
    close(third, 1_800_000_000.0 + 3 * day)  # the first is now older than history_days
    assert board.event(first) is None and board.event(second) is not None and board.event(third) is not None


def test_a_decision_for_an_event_whose_agents_are_all_silent_says_what_it_waits_for() -> None:
    """Issue 33: an approval nobody could carry out (the only VM's agent dead, approvers without
    --arm) looked like "waiting for the approver" for 45 s and "not approved" after a reload. The
    board tells the page, at once and after a reload, that no agent of the event is reporting, and
    when the approvers' verdict has come."""
    now = 1_795_168_800.0  # 2026-11-20T10:00:00Z, when the records say they were observed
    board = Board(silent_after=60, approver_keys=KeyRing({"approvers": APPROVER_KEY}))
    for vm in SET:
        take_raw(board, record(vm, "Scheduled", "2026-11-20T10:00:00Z"), now=now)
    later = now + 600  # every agent silent since (silent_after 60 s)
    sent = board.published("d-1", Sent(EVENT, "approve", later, later + 900, "alice"))
    assert sent["anyAgentReporting"] is False and sent["agentsSilent"] == SET and sent["answered"] is False
    page = board.event(EVENT, now=later)
    assert page is not None and [s["decisionId"] for s in page["sent"]] == ["d-1"]  # after a reload too
    take_raw(board, record("vm-b", "Scheduled", "2026-11-20T10:10:00Z"), now=later)  # vm-b's agent is back
    page = board.event(EVENT, now=later)
    assert page is not None
    (mine,) = page["sent"]
    assert mine["anyAgentReporting"] is True and mine["agentsSilent"] == ["vm-a", "vm-c"]
    take_raw(board, approver_audit(), now=later)  # the approvers' verdict
    page = board.event(EVENT, now=later)
    assert page is not None and page["sent"][0]["answered"] is True


def test_a_stream_of_invented_vms_cannot_grow_the_board_past_its_bound(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Issue 33: 200 000 invented VMs took the console to 684 MB. Past the bound, the VM heard from
    least recently with no open event makes room; a VM showing an open event is kept."""
    from records import heartbeat

    from bridge.console import board as module

    monkeypatch.setattr(module, "MAX_VMS", 100)
    board = Board()
    for vm in SET:  # the real fleet: an open event on each
        take_raw(board, record(vm, "Scheduled", "2026-11-20T10:00:00Z"))
    for n in range(1000):
        take_raw(board, heartbeat(vm_block(f"invented-{n:04d}")))
    fleet = board.fleet()
    assert fleet["counts"]["vms"] == 100 and set(SET) <= {v["name"] for v in listed(fleet)}  # type: ignore[index]
    assert board.refused["overBudget"] == 1000 + len(SET) - 100
