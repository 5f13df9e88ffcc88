"""Azure's channel, in-process: parsing both shapes of an Event Grid event, mapping an event to its VMs,
deduplication without moving an event back, the records' schemas, and the reconciliation's findings
with an injected clock (no waiting)."""

from __future__ import annotations

import tracemalloc
import uuid
from pathlib import Path

import orjson
import pytest
from azure_events import RG, SUB, grid_event
from records import event, heartbeat, scheduled_events, typed, vm_block

from bridge.azure import tracker as tracker_module
from bridge.azure.events import AzureEvent, AzureEventRefused, deliveries, from_event_grid, from_graph_row
from bridge.azure.reconcile import Reconciler
from bridge.azure.records import azure_event_record
from bridge.azure.tracker import EventTracker, News
from bridge.records.reader import Record
from bridge.schemas import validate_record

E1, E2 = str(uuid.uuid4()).upper(), str(uuid.uuid4()).upper()


@pytest.mark.parametrize("shape", ["microsoft", "capture"])
def test_both_shapes_parse_to_the_same_event(shape: str) -> None:
    event = from_event_grid(grid_event(E1, "Scheduled", ["vm-a"], shape=shape, delivery_id="d1"))
    assert (event.event_id, event.event_status, event.event_type) == (E1, "Scheduled", "Reboot")
    assert (event.subscription_id, event.resource_group, event.parent_kind) == (SUB, RG, "virtualMachines")
    assert event.delivery_id == "d1" and event.resources == ("vm-a",)
    assert event.parent_id.endswith("/providers/Microsoft.Compute/virtualMachines/vm-a")
    assert event.api_version == ("2024-07-01" if shape == "microsoft" else "2020-03-01")
    assert event.event_time is not None
    (vm,) = event.vms()
    assert vm.key == f"{SUB}/{RG}/vm-a".lower()


def test_scale_set_instances_map_to_uniform_and_flexible_ids() -> None:
    event = from_event_grid(
        grid_event(E1, "Scheduled", ["web_3", "web_a1b2c3d4"], parent="web", kind="virtualMachineScaleSets")
    )
    uniform, flexible = event.vms()
    assert uniform.resource_id.endswith("/virtualMachineScaleSets/web/virtualMachines/3")
    assert flexible.resource_id.endswith("/virtualMachines/web_a1b2c3d4")
    assert event.parent_id.endswith("/virtualMachineScaleSets/web")


def test_a_scale_set_vm_name_that_may_be_either_form_is_watched_by_its_agent_in_either() -> None:
    """Issue 34: a Flexible scale set's VM is ``{set}_{8-char-guid}``, whose eight characters can all be
    digits, and a Flexible VM may be given any name, ``web_7`` too; a Uniform instance is
    ``{set}_{instance id}``. The event does not say which: a name that may be either is this VM for an
    agent naming either id (it was taken for a Uniform instance, and its agent found "unwatched")."""
    compute = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute"
    tracker = EventTracker()
    reconciler = Reconciler(grace=60, ended=tracker.ended)
    names = ["web_12345678", "web_7", "web_3", "web_a1b2c3d4"]
    observe(reconciler, tracker, grid_event(E1, "Scheduled", names, parent="web",
                                            kind="virtualMachineScaleSets"), now=0)  # fmt: skip
    reconciler.agent(agent_record("web_12345678", E1), now=1)  # Flexible: .../virtualMachines/<name>
    reconciler.agent(agent_record("web_7", E1), now=2)  # a Flexible VM named like an instance
    uniform = f"{compute}/virtualMachineScaleSets/web/virtualMachines/3"
    reconciler.agent(agent_record("web_3", E1, resource_id=uniform), now=3)  # a Uniform instance
    reconciler.agent(agent_record("web_a1b2c3d4", E1), now=4)
    assert [f for f in reconciler.due(61) if f["finding"] == "unwatched"] == []
    eight, seven, three, _ = from_event_grid(
        grid_event(E1, "Scheduled", names, parent="web", kind="virtualMachineScaleSets")
    ).vms()
    assert eight.resource_id == f"{compute}/virtualMachines/web_12345678"  # the generated form first
    assert three.resource_id == uniform and three.named_by(f"{compute}/virtualMachines/web_3")
    assert not seven.named_by(f"{compute}/virtualMachines/web_8") and not seven.named_by("")


def test_unknown_properties_are_kept_and_a_graph_row_parses_too() -> None:
    grid = grid_event(E1, "Started", ["vm-a"], NewField="x")
    event = from_event_grid(grid)
    assert event.unknown == {"NewField": "x"} and event.not_before is None  # empty once Started
    row = {**grid["data"]["resourceInfo"], "resourceGroup": RG, "subscriptionId": SUB}
    assert from_graph_row(row).content == event.content


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (
            lambda e: e["data"]["resourceInfo"]["properties"].update(ResourceType="ManagedCluster"),
            "otherResourceType",
        ),
        (lambda e: e["data"]["resourceInfo"].update(type="microsoft.compute/virtualmachines"), "notAnEvent"),
        (lambda e: e["data"].pop("resourceInfo"), "notAnEvent"),
        (lambda e: e["data"]["resourceInfo"].update(id="/subscriptions/x/../../etc"), "malformed"),
        (  # a group name Azure's rules refuse (it ends with "."): the grammar of the ARM path
            lambda e: e["data"]["resourceInfo"].update(
                id=e["data"]["resourceInfo"]["id"].replace(RG, RG + ".")
            ),
            "malformed",
        ),
        (lambda e: e["data"]["resourceInfo"]["properties"].update(EventStatus="Paused"), "malformed"),
        (lambda e: e["data"]["resourceInfo"]["properties"].update(EventId=E2), "malformed"),
        (lambda e: e["data"]["resourceInfo"]["properties"].update(Resources="vm-a"), "malformed"),
        (lambda e: e["data"]["resourceInfo"].pop("properties"), "malformed"),
        # issue 31: "²" passed str.isdigit() and int() raised, wedging the source
        (lambda e: e["data"]["resourceInfo"]["properties"].update(DurationInSeconds="²"), "malformed"),
        (lambda e: e["data"]["resourceInfo"]["properties"].update(DurationInSeconds="1e3"), "malformed"),
        # issue 31 (low): one delivery naming 5 000 VMs made a 1.29 MB record and 5 005 findings
        (
            lambda e: e["data"]["resourceInfo"]["properties"].update(
                Resources=[f"vm-{n}" for n in range(5000)]
            ),
            "tooLarge",
        ),
        (lambda e: e["data"]["resourceInfo"]["properties"].update(Description="x" * 900_000), "tooLarge"),
    ],
)
def test_what_is_not_a_usable_event_is_refused_with_its_reason(mutate, reason: str) -> None:  # type: ignore[no-untyped-def]
    event = grid_event(E1, "Scheduled", ["vm-a"])
    mutate(event)
    with pytest.raises(AzureEventRefused) as refused:
        from_event_grid(event)
    assert refused.value.reason == reason


def test_a_delivery_is_an_object_or_an_array_and_junk_is_a_refusal_not_a_crash() -> None:
    one, two = grid_event(E1, "Scheduled", ["vm-a"]), grid_event(E2, "Scheduled", ["vm-b"])
    assert list(deliveries(orjson.dumps(one))) == [one]
    assert list(deliveries(orjson.dumps([one, two]))) == [one, two]
    (junk,) = deliveries(b"\xff{not json")
    assert isinstance(junk, AzureEventRefused) and junk.reason == "notJson"
    assert [getattr(x, "reason", None) for x in deliveries(b"[1, {}]")] == ["notAnEvent", None]


def test_duplicates_are_dropped_and_a_late_status_never_moves_the_event_back() -> None:
    tracker = EventTracker()
    scheduled = from_event_grid(grid_event(E1, "Scheduled", ["vm-a"], delivery_id="d1"))
    completed = from_event_grid(grid_event(E1, "Completed", ["vm-a"], delivery_id="d3"))
    started = from_event_grid(grid_event(E1, "Started", ["vm-a"], delivery_id="d2"))
    assert tracker.observe(scheduled) == News("Scheduled", late=False)
    assert tracker.observe(scheduled) is None  # a redelivery: same id, same content
    assert tracker.observe(completed) == News("Completed", late=False)  # out of order: before Started
    assert tracker.observe(started) == News("Completed", late=True)  # published, state kept
    redelivered = from_event_grid(grid_event(E1, "Started", ["vm-a"], delivery_id="d9"))
    assert tracker.observe(redelivered) is None  # another id, same content
    moved = from_event_grid(grid_event(E1, "Scheduled", ["vm-a"], not_before="Tue, 01 Dec 2026 10:00:00 GMT"))
    assert tracker.observe(moved) == News("Completed", late=True)  # a moved NotBefore is news


def seen_and_stored(tracker: EventTracker, *events: AzureEvent) -> list[News | None]:
    """What the service does per batch: observe each, then (records stored) persist them."""
    answers = [tracker.observe(e) for e in events]
    tracker.persist(events)
    return answers


def test_the_events_kept_are_bounded_the_least_recently_changed_forgotten(tmp_path: Path) -> None:
    tracker = EventTracker(max_events=10, state_path=tmp_path / "events.sqlite")
    ids = [str(uuid.uuid4()) for _ in range(100)]
    for eid in ids:
        seen_and_stored(tracker, from_event_grid(grid_event(eid, "Scheduled", ["vm-a"])))
    assert len(tracker) == 10
    assert tracker.observe(from_event_grid(grid_event(ids[-1], "Scheduled", ["vm-a"]))) is None
    assert tracker.observe(from_event_grid(grid_event(ids[0], "Scheduled", ["vm-a"]))) is not None
    tracker.close()
    smaller = EventTracker(max_events=5, state_path=tmp_path / "events.sqlite")  # a lower cap at a restart
    assert len(smaller) == 5
    assert smaller.observe(from_event_grid(grid_event(ids[-1], "Scheduled", ["vm-a"]))) is None


def test_a_month_of_events_is_held_on_disk_not_in_memory(tmp_path: Path) -> None:
    """Issue 33: the tracker held 0.5 KB of heap per event until its 200 000-event bound (20 waves at
    10 000 VMs: 105 MB). Kept in a file, the heap it holds does not grow with the events."""
    tracker = EventTracker(state_path=tmp_path / "events.sqlite")
    batches = [
        [from_event_grid(grid_event(str(uuid.UUID(int=w * 1000 + i)), s, [f"vm-{i}"])) for i in range(500)]
        for w in range(20)
        for s in ("Scheduled", "Completed")
    ]
    tracemalloc.start()
    try:
        for batch in batches:
            seen_and_stored(tracker, *batch)
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(True, tracker_module.__file__)]
        )
    finally:
        tracemalloc.stop()
    held = sum(stat.size for stat in snapshot.statistics("filename"))
    assert len(tracker) == 10_000
    assert held < 500_000, f"{held} bytes held by the tracker for 10 000 events"  # was 5.2 MB


def test_what_was_seen_survives_a_restart_and_an_unreadable_file_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "events.sqlite"
    completed = from_event_grid(grid_event(E1, "Completed", ["vm-a"]))
    started = from_event_grid(grid_event(E1, "Started", ["vm-a"]))
    assert seen_and_stored(EventTracker(state_path=path), completed) == [News("Completed", late=False)]
    again = EventTracker(state_path=path)
    assert again.observe(completed) is None  # a redelivery after the restart: still a duplicate
    assert again.observe(started) == News("Completed", late=True)  # the state never moves back
    again.close()
    path.write_bytes(b"not a database" * 100)
    for leftover in (tmp_path / "events.sqlite-wal", tmp_path / "events.sqlite-shm"):
        leftover.unlink(missing_ok=True)
    fresh = EventTracker(state_path=path)
    assert fresh.errors["corrupt"] == 1 and len(fresh) == 0
    assert [p.name for p in tmp_path.glob("events.sqlite.corrupt-*")]
    assert seen_and_stored(fresh, completed) == [News("Completed", late=False)]  # works on


def test_the_previous_versions_states_are_taken_over_once(tmp_path: Path) -> None:
    """An upgrade must not move a state back: azure-states.jsonl (key -> state) is read, then removed."""
    legacy = tmp_path / "azure-states.jsonl"
    legacy.write_bytes(orjson.dumps({"k": E1.lower(), "v": "Completed"}) + b"\n" + b'{"k": "torn')
    tracker = EventTracker(state_path=tmp_path / "events.sqlite", legacy_path=legacy)
    assert not legacy.exists()
    assert tracker.observe(from_event_grid(grid_event(E1, "Started", ["vm-a"]))) == News(
        "Completed", late=True
    )


def test_records_are_valid_and_their_ids_do_not_depend_on_the_channel_or_the_delivery() -> None:
    grid = grid_event(E1, "Scheduled", ["vm-a"], delivery_id="d1")
    first = azure_event_record(from_event_grid(grid), News("Scheduled", False), 1.0)
    again = azure_event_record(from_event_grid({**grid, "id": "d2"}), News("Scheduled", False), 2.0)
    row = from_graph_row(grid["data"]["resourceInfo"])
    graph = azure_event_record(row, News("Scheduled", False), 3.0)
    assert validate_record(first) == [] and validate_record(graph) == []
    assert first["recordId"] == again["recordId"] == graph["recordId"]
    assert first["source"] == {**first["source"], "kind": "azure", "channel": "eventGrid", "deliveryId": "d1"}


# -- reconciliation ------------------------------------------------------------------------------------


def agent_record(
    name: str,
    *event_ids: str,
    sub: str | None = SUB,
    rg: str | None = RG,
    vm_id: str = "",
    kind: str = "scheduledEvents",
    resource_id: str | None = None,
) -> Record:
    """An agent's record as IMDS fills its identity (compute.resourceId with the subscription and
    group), read as the channel reads it off the stream."""
    resource_id = resource_id or (
        f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{name}"
    )
    vm = vm_block(name, subscription_id=sub, resource_group=rg, vm_id=vm_id or f"id-{name}",
                  resource_id=resource_id if sub and rg else None)  # fmt: skip
    if kind == "heartbeat":
        return typed(heartbeat(vm))
    return typed(scheduled_events(vm, [event(e, name) for e in event_ids]))


def observe(reconciler: Reconciler, tracker: EventTracker, grid: dict, now: float) -> list[dict]:
    event = from_event_grid(grid)
    news = tracker.observe(event)
    assert news is not None
    findings = reconciler.azure(event, news, now)
    tracker.persist([event])  # as the service does once the batch's records are stored
    return findings


def test_a_vm_whose_agent_never_reported_is_unwatched_after_the_grace_and_only_then() -> None:
    tracker = EventTracker()
    reconciler = Reconciler(grace=60, ended=tracker.ended)
    observe(reconciler, tracker, grid_event(E1, "Scheduled", ["vm-a", "vm-b", "vm-c"], parent="avset",
                                            kind="availabilitySets"), now=0)  # fmt: skip
    reconciler.agent(agent_record("vm-a", E1), now=5)
    reconciler.agent(agent_record("vm-b", E1), now=6)
    assert reconciler.due(59) == []
    (finding,) = reconciler.due(61)
    assert (finding["finding"], finding["vm"]["name"]) == ("unwatched", "vm-c")
    assert validate_record(finding) == []
    assert [u["vm"] for u in reconciler.unwatched()] == ["vm-c"]
    assert reconciler.due(1000) == []  # once
    reconciler.agent(agent_record("vm-c", E1), now=70)  # late, but watched now
    assert reconciler.unwatched() == []


def test_every_event_gets_its_outcome_once_with_the_agents_that_saw_it() -> None:
    tracker = EventTracker()
    reconciler = Reconciler(grace=60, ended=tracker.ended)
    observe(reconciler, tracker, grid_event(E1, "Scheduled", ["vm-a"]), now=0)
    reconciler.agent(agent_record("vm-a", E1), now=1)
    assert observe(reconciler, tracker, grid_event(E1, "Completed", ["vm-a"]), now=30) == []
    (outcome,) = reconciler.due(91)  # settled after the grace (issue 33), not at first sight
    assert (outcome["finding"], outcome["azureState"], outcome["agentVms"]) == (
        "outcome", "Completed", [f"{SUB}/{RG}/vm-a".lower()],
    )  # fmt: skip
    assert validate_record(outcome) == []
    assert observe(reconciler, tracker, grid_event(E1, "Canceled", ["vm-a"]), now=31) == []
    assert reconciler.due(200) == []  # once; vm-a reported: not unwatched


def test_an_outcome_read_before_the_agents_records_still_names_them() -> None:
    """Issue 33: Azure's Completed read before the agents' records said "0 agent(s) reported it"."""
    tracker = EventTracker()
    reconciler = Reconciler(grace=60, ended=tracker.ended)
    observe(reconciler, tracker, grid_event(E1, "Scheduled", ["vm-a"]), now=0)
    observe(reconciler, tracker, grid_event(E1, "Completed", ["vm-a"]), now=1)
    reconciler.agent(agent_record("vm-a", E1), now=2)  # the agent's record, read after Azure's word
    (outcome,) = [f for f in reconciler.due(70) if f["finding"] == "outcome"]
    assert "1 agent(s) reported it" in outcome["detail"] and len(outcome["agentVms"]) == 1


def test_an_event_only_an_agent_saw_is_agent_only_after_the_grace() -> None:
    tracker = EventTracker()
    reconciler = Reconciler(grace=60, ended=tracker.ended)
    reconciler.agent(agent_record("vm-a", E1), now=0)
    reconciler.agent(agent_record("vm-b", E2), now=0)
    observe(reconciler, tracker, grid_event(E2, "Scheduled", ["vm-b"]), now=30)
    (finding,) = reconciler.due(61)
    assert (finding["finding"], finding["eventId"], finding["vm"]["name"]) == ("agentOnly", E1, "vm-a")
    assert "scheduledEventsPolicy" in finding["detail"] and validate_record(finding) == []


def test_an_event_first_seen_ended_is_an_outcome_not_an_unwatched_vm() -> None:
    tracker = EventTracker()
    reconciler = Reconciler(grace=60, ended=tracker.ended)
    assert observe(reconciler, tracker, grid_event(E1, "Completed", ["vm-a"]), now=0) == []
    (outcome,) = reconciler.due(100)
    assert outcome["finding"] == "outcome" and outcome["agentVms"] == []
    assert reconciler.due(200) == []


def test_a_settled_event_is_forgotten_at_once_and_a_late_word_starts_nothing(tmp_path: Path) -> None:
    """Issue 33: an ended event was held whole (~1 KB) for an hour after its outcome, then its key
    (~200 B) for another: a 120 000-delivery backlog held 40 000 keys. Settled (its findings out),
    it is forgotten at once; the tracker's committed state says it ended, so a late agent record is
    no agentOnly finding and a late Azure word no new finding, after a restart too."""
    tracker = EventTracker(state_path=tmp_path / "azure-events.sqlite")
    reconciler = Reconciler(grace=60, ended=tracker.ended)
    observe(reconciler, tracker, grid_event(E1, "Scheduled", ["vm-a"]), now=0)
    reconciler.agent(agent_record("vm-a", E1), now=1)
    observe(reconciler, tracker, grid_event(E1, "Completed", ["vm-a"]), now=10)
    assert reconciler.in_grace() == 1
    assert [f["finding"] for f in reconciler.due(71)] == ["outcome"]
    assert reconciler.in_grace() == 0 and reconciler.counts()[0] == 0  # settled: nothing held
    reconciler.agent(agent_record("vm-z", E1), now=80)  # another VM's late record of it
    assert observe(reconciler, tracker, grid_event(E1, "Started", ["vm-a"]), now=81) == []
    assert reconciler.due(500) == [] and reconciler.in_grace() == 0 and reconciler.counts()[0] == 0
    tracker.close()
    tracker = EventTracker(state_path=tmp_path / "azure-events.sqlite")  # a restart
    reconciler = Reconciler(grace=60, ended=tracker.ended)
    reconciler.agent(agent_record("vm-a", E1), now=600)
    assert reconciler.due(700) == [] and reconciler.counts()[0] == 0
    # Without the tracker's word (the old behaviour), the same late record was an agentOnly finding.
    forgetful = Reconciler(grace=60, ended=lambda key: False)
    forgetful.agent(agent_record("vm-a", E1), now=600)
    assert [f["finding"] for f in forgetful.due(700)] == ["agentOnly"]
    tracker.close()


def test_an_event_ended_in_the_batch_being_stored_still_takes_its_agents() -> None:
    """The tracker answers ``ended`` from what is committed: an agent record read while Azure's
    ``Completed`` of a new event is being stored (observed, records not out yet) is the event's, not
    a late word: the outcome names its VM."""
    tracker = EventTracker()
    reconciler = Reconciler(grace=60, ended=tracker.ended)
    event = from_event_grid(grid_event(E1, "Completed", ["vm-a"]))
    news = tracker.observe(event)
    assert news is not None and not tracker.ended(event.key)  # pending, not committed
    reconciler.azure(event, news, now=0)
    reconciler.agent(agent_record("vm-a", E1), now=1)
    tracker.persist([event])
    assert tracker.ended(event.key)
    (outcome,) = reconciler.due(61)
    assert outcome["finding"] == "outcome" and len(outcome["agentVms"]) == 1


def test_a_check_of_a_forgotten_event_is_not_counted_against_the_same_event_named_again() -> None:
    """Past ``max_events`` an event in its grace is forgotten; named again before its old check is
    due, the old check found the new event by its key: a finding before the new one's grace, and the
    in-grace count (which paces the Azure readers) went negative or stuck."""
    reconciler = Reconciler(grace=60, ended=lambda key: False, max_events=1)
    reconciler.agent(agent_record("vm-a", E1), now=0)  # E1: an agentOnly check due at 60
    reconciler.agent(agent_record("vm-b", E2), now=1)  # E1 forgotten (the cap)
    reconciler.agent(agent_record("vm-a", E1), now=30)  # E1 named again: its check due at 90
    assert reconciler.in_grace() == 1
    assert reconciler.due(61) == [] and reconciler.in_grace() == 1  # neither old check counts
    (only,) = reconciler.due(91)
    assert (only["finding"], only["eventId"]) == ("agentOnly", E1) and reconciler.in_grace() == 0


def test_events_that_never_end_here_are_forgotten_after_azures_longest_notice() -> None:
    """An agent's event Azure never published (the agentOnly case: a VM whose policy does not publish)
    never ends in Azure's words, so it was kept until the 100 000-event cap: a month of waves on such
    VMs grew the map without end. Forgotten 8 days after anything last named it; an open event named
    again is kept, and an ended one goes once its findings are out."""
    tracker = EventTracker()
    reconciler = Reconciler(grace=60, ended=tracker.ended)
    day = 86400.0
    reconciler.agent(agent_record("vm-a", E1), now=0)  # Azure never publishes E1
    observe(reconciler, tracker, grid_event(E2, "Scheduled", ["vm-b"]), now=0)  # 7 days of notice
    (only,) = [f for f in reconciler.due(61) if f["finding"] == "agentOnly"]
    assert only["eventId"] == E1
    observe(reconciler, tracker, grid_event(E2, "Started", ["vm-b"]), now=7 * day)
    reconciler.due(8 * day + 1)
    assert reconciler.counts()[0] == 1  # E1 forgotten, E2 (named a day ago) kept
    observe(reconciler, tracker, grid_event(E2, "Completed", ["vm-b"]), now=8 * day + 2)
    reconciler.due(8 * day + 2 + 3601)
    assert reconciler.counts()[0] == 0


@pytest.mark.parametrize("kind", ["virtualMachines", "virtualMachineScaleSets", "availabilitySets"])
def test_a_parent_named_by_azures_channel_is_a_checked_quoted_scope(kind: str) -> None:
    from bridge.azure_ids import parent_scope

    parent = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/{kind.lower()}/web"
    assert parent_scope(parent).endswith(f"/providers/Microsoft.Compute/{kind}/web")
    assert parent_scope(parent, ((SUB, RG.lower()),)) == parent_scope(parent)


@pytest.mark.parametrize(
    "parent",
    [
        f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachineScaleSets/web/../x",
        f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/availabilitySets/a?b",
        f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/availabilitySets/a%2Fb",
        f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Storage/storageAccounts/a",
        f"/subscriptions/{SUB}/resourceGroups/other/providers/Microsoft.Compute/availabilitySets/a",
    ],
)
def test_a_parent_outside_the_grammar_or_the_allowed_scopes_is_refused(parent: str) -> None:
    from bridge.azure_ids import ScopeRefused, parent_scope

    with pytest.raises(ScopeRefused):
        parent_scope(parent, ((SUB, RG.lower()),))


def test_an_observation_whose_records_were_not_stored_is_news_again() -> None:
    """The service forgets what it could not store (a failure, a stop): read again from the source
    (not committed) or polled again, the same delivery is news, not a duplicate."""
    tracker = EventTracker()
    event = from_event_grid(grid_event(E1, "Scheduled", ["vm-a"], delivery_id="d1"))
    assert tracker.observe(event) is not None and tracker.observe(event) is None
    tracker.forget(event)
    assert tracker.observe(event) == News("Scheduled", late=False)


def test_only_a_vms_own_identity_counts_as_watching_it() -> None:
    """Issue 31, finding 5: a record in the dead VM's name, from any agent credential, made Azure's
    channel report no unwatched finding for it. vm-c's agent spoke once (a heartbeat pinned its vmId),
    then died; the event comes; the forgeries are refused and vm-c is found unwatched."""
    tracker = EventTracker()
    reconciler = Reconciler(grace=60, ended=tracker.ended)
    reconciler.agent(agent_record("vm-c", kind="heartbeat", vm_id="id-of-the-real-vm-c"), now=0)
    observe(reconciler, tracker, grid_event(E1, "Scheduled", ["vm-c", "vm-d"], parent="avset",
                                            kind="availabilitySets"), now=1)  # fmt: skip
    reconciler.agent(agent_record("vm-c", E1, vm_id="id-of-mallory"), now=2)  # another identity
    reconciler.agent(agent_record("vm-c", E1, sub=None, rg=None), now=3)  # no resource id: name only
    reconciler.agent(agent_record("vm-d", E1, rg="another-group"), now=4)  # not the VM Azure names
    findings = reconciler.due(61)
    assert sorted(f["vm"]["name"] for f in findings if f["finding"] == "unwatched") == ["vm-c", "vm-d"]
    assert reconciler.refused == {"noResourceId": 1, "changedClaim": 1}
    reconciler.agent(agent_record("vm-c", E1, vm_id="id-of-the-real-vm-c"), now=70)  # its own agent, back
    assert [u["vm"] for u in reconciler.unwatched()] == ["vm-d"]


def test_the_pins_outlive_a_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The agents' stream is read on from where it stopped after a restart: a pin kept only in memory
    would let another identity claim a VM right after it. Saved, read back, a torn line survived."""
    path = tmp_path / "agent-pins.jsonl"
    reconciler = Reconciler(grace=60, ended=lambda key: False, pins_path=path)
    reconciler.agent(agent_record("vm-c", kind="heartbeat", vm_id="id-of-the-real-vm-c"), now=0)
    reconciler.save_pins()
    with path.open("ab") as out:
        out.write(b'{"vm": "torn')  # a kill -9 in the middle of a write
    tracker = EventTracker()
    again = Reconciler(grace=60, ended=tracker.ended, pins_path=path)
    observe(again, tracker, grid_event(E1, "Scheduled", ["vm-c"]), now=1)
    again.agent(agent_record("vm-c", E1, vm_id="id-of-mallory"), now=2)
    assert again.refused["changedClaim"] == 1
    assert [f["vm"]["name"] for f in again.due(70) if f["finding"] == "unwatched"] == ["vm-c"]
