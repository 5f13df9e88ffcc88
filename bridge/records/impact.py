"""``impact`` records (``schemas/impact.v1.schema.json``): what one event did to the VM, measured
by :mod:`bridge.agent.impact`; one per event, its id from the VM and the event."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bridge.records.fields import Envelope, check, optional_int, stamp, text, vm_of
from bridge.records.ids import IMPACT, derived_id, envelope

if TYPE_CHECKING:  # the writer's types; readers (sinks, services) never load the IMDS layer
    from bridge.imds.instance import VmIdentity


SCHEMA = "impact.v1.schema.json"


def build(vm: VmIdentity, event_id: str, measured: Mapping[str, object], now: float) -> dict[str, object]:
    """``measured`` as :mod:`bridge.agent.impact` measured it."""
    return {
        **envelope(IMPACT, derived_id(vm.key, "impact", event_id.upper()), now, vm),
        "eventId": event_id,
        **measured,
    }


@dataclass(frozen=True, slots=True)
class Impact(Envelope):
    event_id: str
    event_type: str
    ending: str
    advertised_duration: int | None
    pause_seconds: float | None
    rebooted: bool
    down_seconds: float | None


def read(raw: Mapping[str, object]) -> Impact:
    f = check(raw, SCHEMA)
    pause, down = raw["pauseSeconds"], raw["downSeconds"]
    return Impact(
        record_id=f.string("recordId"),
        observed_at=stamp(raw["observedAt"]),
        vm=vm_of(raw["vm"]),
        event_id=f.string("eventId"),
        event_type=text(raw["eventType"], 64),
        ending=f.string("ending"),
        advertised_duration=optional_int(raw["advertisedDurationSeconds"]),
        pause_seconds=None if pause is None else f.number("pauseSeconds"),
        rebooted=f.boolean("rebooted"),
        down_seconds=None if down is None else f.number("downSeconds"),
    )
