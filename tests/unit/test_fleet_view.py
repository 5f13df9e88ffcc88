"""The fleet view (bridge/approver/fleet.py): what a fleet approver believes of records anyone on the
events stream may publish (issue 23 items 2 and 7; issue 19 item 3's event status)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from records import event as make_event
from records import scheduled_events, vm_block

import bridge.approver.fleet as fleet_module
from bridge.approver.fleet import FleetView, Vm
from bridge.records.ids import SCHEDULED_EVENTS
from bridge.records.reader import Reader
from bridge.records.scheduled_events import ScheduledEvents

SUB = "/subscriptions/8d10da13-8125-4ba9-a717-bf7490507b3d/resourceGroups/rg/providers/Microsoft.Compute"


READER = Reader(types=(SCHEDULED_EVENTS,))


def record(name: str, *events: dict[str, Any], ip: str = "10.0.0.4", vm_id: str = "", rid: str = "") -> dict:
    vm = vm_block(
        name, vm_id=vm_id or f"id-{name}", private_ip=ip, resource_id=rid or f"{SUB}/virtualMachines/{name}"
    )
    return scheduled_events(vm, events)


def event(event_id: str, *resources: str, status: str = "Scheduled", not_before: str | None = None) -> dict:
    return make_event(event_id, *resources, status=status, not_before=not_before)


def learn(view: FleetView, raw: dict[str, Any], now: float | None = None) -> Vm | None:
    """``raw`` as the fleet router hands it over: read first (a record the reader refuses never
    reaches the view)."""
    typed = READER.read(raw)
    if not isinstance(typed, ScheduledEvents):
        return None
    return view.learn(typed, now=now)


def test_an_identity_is_pinned_on_first_sight_and_a_changed_claim_refused(tmp_path: Path) -> None:
    refused: list[str] = []
    view = FleetView(tmp_path, on_refused=refused.append)
    assert learn(view, record("vm1", ip="10.0.0.4")) is not None
    assert learn(view, record("vm1", ip="10.9.9.9")) is None  # a poisoned address is not followed
    assert learn(view, record("vm1", rid=f"{SUB.replace('8d10', 'ffff')}/virtualMachines/vm1")) is None
    assert learn(view, record("vm2", vm_id="id-vm1")) is None  # vm1's vmId claimed for another name
    vm = view.vm("VM1")
    assert vm is not None and vm.private_ip == "10.0.0.4" and vm.resource_id.endswith("/vm1")
    assert refused == ["changedClaim"] * 3 and view.vm("vm2") is None
    # Pins outlive a restart: a restart is not the moment an address may change.
    again = FleetView(tmp_path)
    assert learn(again, record("vm1", ip="10.9.9.9")) is None
    assert again.vm("id-vm1") is not None and again.vm("id-vm1").private_ip == "10.0.0.4"  # type: ignore[union-attr]


def test_what_one_publisher_can_claim_is_bounded(tmp_path: Path) -> None:
    refused: list[str] = []
    view = FleetView(tmp_path, max_vms=3, on_refused=refused.append)
    many = [event(f"E{i}", "vm1") for i in range(fleet_module.MAX_EVENTS_PER_RECORD + 1)]
    assert learn(view, record("vm1", *many)) is None
    assert learn(view, record("vm1", event("E1", *[f"v{i}" for i in range(1001)]))) is None
    assert learn(view, record("vm1", ip="evil.example/x#")) is None  # formatted into the relay URL
    assert learn(view, record("x" * 200)) is None
    for name in ("vm1", "vm2", "vm3"):
        assert learn(view, record(name)) is not None
    assert learn(view, record("vm4")) is None  # the fleet holds at most max_vms
    # An event of 1001 VMs and a 200-character name never reach the view: the reader refuses them.
    assert refused == ["tooManyEvents", "malformed", "fleetFull"]
    assert READER.refused[("scheduledEvents", "tooLarge")] >= 2
    assert view.counts() == (3, 0)


def test_an_event_is_forgotten_once_no_vm_shows_it(tmp_path: Path) -> None:
    view = FleetView(tmp_path)
    learn(view, record("vm1", event("E1", "vm1", "vm2")))
    learn(view, record("vm2", event("E1", "vm1", "vm2")))
    facts = view.event("e1")
    assert facts is not None and facts.facts().status == "Scheduled"
    learn(view, record("vm1", event("E1", "vm1", "vm2", status="Started")))
    assert view.event("E1").status == "Started"  # type: ignore[union-attr]
    learn(view, record("vm1"))  # gone from vm1's document; vm2 still shows it
    assert view.event("E1") is not None
    learn(view, record("vm2"))
    assert view.event("E1") is None and view.counts() == (2, 0)


def test_an_event_a_silent_vm_still_shows_is_forgotten_a_day_past_its_not_before(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setattr(fleet_module, "SWEEP_EVERY", 0.0)
    view = FleetView(tmp_path)
    learn(view, record("vm1", event("E1", "vm1", not_before="2026-01-01T00:00:00Z")), now=1_767_225_600)
    assert view.event("E1") is not None
    learn(view, record("vm2"), now=1_767_225_600 + fleet_module.FORGET_AFTER + 1)
    assert view.event("E1") is None and view.vm("vm1").events == ()  # type: ignore[union-attr]


# -- issue 31, finding 7 --------------------------------------------------------------------------


def test_made_up_names_never_lock_real_vms_out_restart_included(tmp_path: Path, caplog: Any) -> None:
    """200 000 made-up names filled the fleet for good (fleetFull, fleet-pins.jsonl kept them). Now a
    pin idle for IDLE_PIN with no open event makes room, before and after a restart; nearly full is
    logged as an error."""
    refused: list[str] = []
    view = FleetView(tmp_path, max_vms=100, on_refused=refused.append)
    for n in range(100):
        assert learn(view, record(f"fake-{n}", ip=f"10.1.0.{n + 1}"), now=1000.0) is not None
    assert any("nearly full" in r.getMessage() for r in caplog.records)
    assert learn(view, record("real-vm", ip="10.0.0.7"), now=1100.0) is None  # every pin is live
    assert refused == ["fleetFull"]
    later = 1000.0 + fleet_module.IDLE_PIN + 1
    assert learn(view, record("real-vm", ip="10.0.0.7"), now=later) is not None  # an idle pin made room
    assert view.vm("fake-0") is None and view.vm("real-vm") is not None
    restarted = FleetView(tmp_path, max_vms=100)  # the file kept 100 pins; loaded ones idle from now
    assert learn(restarted, record("real-vm-2", ip="10.0.0.8")) is None
    import time as _time

    assert learn(restarted, record("real-vm-2", ip="10.0.0.8"), now=_time.time() + fleet_module.IDLE_PIN + 1)


def test_a_vm_speaks_only_for_itself_and_the_events_that_name_it(tmp_path: Path, monkeypatch: Any) -> None:
    """A first-sight resourceId whose last segment is not the VM's name is refused; an event that does
    not name the reporter is refused; all events together name at most RESOURCE_BUDGET VMs."""
    refused: list[str] = []
    view = FleetView(tmp_path, on_refused=refused.append)
    assert learn(view, record("vm1", rid=f"{SUB}/virtualMachines/vm-other")) is None
    assert learn(view, record("ss_3", rid=f"{SUB}/virtualMachineScaleSets/ss/virtualMachines/3")) is not None
    assert learn(view, record("vm2", event("E1", "vm9", "vm8"))) is None
    monkeypatch.setattr(fleet_module, "RESOURCE_BUDGET", 1000)
    made_up = [f"fake-{i}" for i in range(499)]
    for n in range(2):  # two events of 500 names from one pinned VM: the budget's worth
        assert learn(view, record("vm3", *(event(f"E{10 + k}", "vm3", *made_up) for k in range(n + 1))))
    assert learn(view, record("vm3", *(event(f"E{10 + k}", "vm3", *made_up) for k in range(3)))) is None
    assert refused == ["nameMismatch", "notNamed", "overBudget"]
    assert view.counts() == (3, 2)


def test_the_pins_file_is_never_whole_in_memory(tmp_path: Path) -> None:
    """Issue 33 (restart peak at 100 000 VMs): the 25 MB pins file was read whole and split, then
    joined whole again to be compacted: +56 MB over the pins themselves at a restart. Read line by
    line and written in 256 KiB chunks, the peak over what is kept is a few chunks' worth."""
    import tracemalloc

    from bridge.approver.fleet import PinFile

    path = tmp_path / fleet_module.PINS_FILE
    sub = "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg/providers"
    pins = PinFile(path)
    pins.rewrite(
        Vm(
            f"vm-{i:06d}",
            f"{i:08d}-0000-4000-8000-000000000000",
            f"{sub}/Microsoft.Compute/virtualMachines/vm-{i:06d}",
            "10.0.0.1",
        )
        for i in range(20_000)
    )
    size = path.stat().st_size
    assert size > 4_000_000
    tracemalloc.start()
    try:
        vms = pins.load()
        held, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        pins.rewrite(vms)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(vms) == 20_000 and path.stat().st_size == size
    assert peak - held < 2_000_000, f"rewriting {size} bytes of pins cost {peak - held} bytes more"
