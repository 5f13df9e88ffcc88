"""The fleet coordinator's memory over a month of waves (issue 33): it kept 1.15 KB per event for
good (77.6 -> 121.3 MB over 20 waves at 10 000 VMs), every preparation that came after its event
started, and every forged one (any agent credential writes the events stream) without limit."""

from __future__ import annotations

import time
import uuid

from records import change, event, preparation, scheduled_events, typed, vm_block

from bridge.approver import coordinator as module
from bridge.approver.coordinator import FORGET_AFTER, FleetCoordinator
from bridge.coordination import CoordinationPolicy

NOT_BEFORE = "2026-11-20T10:15:00Z"  # long past: the deadline rule approves at once


def coordinator(acts: list[str]) -> FleetCoordinator:
    return FleetCoordinator(
        CoordinationPolicy(deadline=60.0), runs_agent=lambda _: True, leader=lambda: True,
        act=lambda event_id, *_: bool(acts.append(event_id) or True),
    )  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def time(self) -> float:
        return self.now


def test_twenty_waves_leave_nothing_behind_once_their_events_are_over(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Each wave's events are approved, then vanish from the documents (an ended event is simply
    gone from IMDS: no record says Completed); an hour later none of them is held."""
    clock = Clock()
    monkeypatch.setattr(module, "time", clock)  # what the coordinator stamps as "seen"
    acts: list[str] = []
    coord = coordinator(acts)
    for wave in range(20):
        ids = [str(uuid.uuid4()) for _ in range(200)]
        for n, event_id in enumerate(ids):
            vm = vm_block(f"vm-{n:03d}")
            coord.observe(typed(scheduled_events(vm, [event(event_id, vm["name"], not_before=NOT_BEFORE)])))
            coord.observe(typed(preparation(vm, event_id, resources=(vm["name"],))))
        coord.tick(clock.now)
        for n in range(200):  # the events are over: gone from every document
            coord.observe(typed(scheduled_events(vm_block(f"vm-{n:03d}"), [])))
        clock.now += FORGET_AFTER + 60  # the next wave comes an hour later
        coord.tick(clock.now)
        assert len(coord) == 0, f"wave {wave}: {len(coord)} events still held"
    assert len(acts) == 20 * 200 and len(set(acts)) == len(acts)  # each approved once


def test_a_preparation_after_its_event_started_is_not_kept() -> None:
    acts: list[str] = []
    coord = coordinator(acts)
    vm = vm_block("vm-a")
    coord.observe(typed(scheduled_events(vm, [event("E1", "vm-a", status="Started")])))
    for _ in range(3):
        coord.observe(typed(preparation(vm, "E1", resources=("vm-a",))))
    assert len(coord) == 0


def test_forged_preparations_are_bounded_and_forgotten(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Any agent credential can write preparations for event ids nobody announced, and for VMs an
    event does not name: neither may grow the coordinator without limit."""
    monkeypatch.setattr(module, "MAX_EARLY_EVENTS", 100)
    acts: list[str] = []
    coord = coordinator(acts)
    forger = vm_block("vm-evil")
    for _ in range(1_000):
        coord.observe(typed(preparation(forger, str(uuid.uuid4()), resources=("vm-evil",))))
    assert len(coord) == 100  # the oldest dropped first
    # Reports for a known event from a VM it does not name count for nothing.
    vm = vm_block("vm-a")
    coord.observe(typed(scheduled_events(vm, [event("E2", "vm-a", not_before=NOT_BEFORE)])))
    coord.observe(typed(preparation(forger, "E2", resources=("vm-a",))))
    assert coord._events["E2"].reports == {}
    coord.tick(1e12)  # far later: every early report forgotten, the event too
    assert len(coord) == 0


def test_an_event_that_left_the_documents_is_forgotten_at_once() -> None:
    """The agents say so in their records' changes (completed, canceled, removed, started): no need
    to hold it for the hour after its NotBefore."""
    acts: list[str] = []
    coord = coordinator(acts)
    vm = vm_block("vm-a")
    coord.observe(typed(scheduled_events(vm, [event("E3", "vm-a", not_before=NOT_BEFORE)])))
    coord.observe(typed(preparation(vm, "E3", resources=("vm-a",))))
    coord.tick(time.time())
    assert acts == ["E3"] and len(coord) == 1
    coord.observe(typed(scheduled_events(vm, [], [change("E3", "completed")])))
    assert len(coord) == 0
    coord.observe(typed(preparation(vm, "E3", resources=("vm-a",))))  # late: not kept
    coord.observe(typed(scheduled_events(vm, [event("E3", "vm-a", not_before=NOT_BEFORE)])))  # a stale copy
    coord.tick(time.time())
    assert acts == ["E3"]  # approved once
