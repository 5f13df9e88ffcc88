"""``impact`` records (``schemas/impact.v1.schema.json``): what one event did to the VM, measured
by :mod:`bridge.agent.impact`; one per event, its id from the VM and the event."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bridge.records.fields import Envelope, check, optional_int, stamp, text, vm_of
from bridge.records.ids import IMPACT, derived_id, envelope

if TYPE_CHECKING:  # the writer's types; readers (sinks, services) never load the IMDS layer
    from bridge.imds.instance import VmIdentity


SCHEMA = "impact.v1.schema.json"


def build(vm: VmIdentity, event_id: str, measured: dict[str, Any], now: float) -> dict[str, Any]:
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


def read(raw: Mapping[str, Any]) -> Impact:
    check(raw, SCHEMA)
    pause, down = raw["pauseSeconds"], raw["downSeconds"]
    return Impact(
        record_id=raw["recordId"],
        observed_at=stamp(raw["observedAt"]),
        vm=vm_of(raw["vm"]),
        event_id=raw["eventId"],
        event_type=text(raw["eventType"], 64),
        ending=raw["ending"],
        advertised_duration=optional_int(raw["advertisedDurationSeconds"]),
        pause_seconds=None if pause is None else float(pause),
        rebooted=raw["rebooted"],
        down_seconds=None if down is None else float(down),
    )
