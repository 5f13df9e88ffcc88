"""``preparation`` records (``schemas/preparation.v1.schema.json``): one VM's readiness for one
event, after its prepare hook (:mod:`bridge.coordination`). Derivable like a change: the id comes
from the VM, the event and the result, so a hook run again after a restart republishes the same id."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bridge.records.fields import Envelope, check, names, optional_int, optional_text, stamp, text, vm_of
from bridge.records.ids import PREPARATION, derived_id, envelope

if TYPE_CHECKING:  # the writer's types; readers (sinks, services) never load the IMDS layer
    from bridge.imds.instance import VmIdentity


SCHEMA = "preparation.v1.schema.json"


def build(
    vm: VmIdentity,
    event: dict[str, Any],
    result: str,
    hook: dict[str, Any] | None,
    observed_at: float,
) -> dict[str, Any]:
    """``event`` as :meth:`ScheduledEvent.to_json` gives it; ``hook`` its run (``result``,
    ``exitCode``, ``seconds``) or None without a hook."""
    event_id = str(event["eventId"])
    return {
        **envelope(PREPARATION, derived_id(vm.key, "preparation", event_id, result), observed_at, vm),
        "eventId": event_id,
        "eventType": event.get("eventType") or "",
        "notBefore": event.get("notBefore"),
        "resources": list(event.get("resources") or []),
        "result": result,
        "hook": hook,
    }


@dataclass(frozen=True, slots=True)
class HookRun:
    result: str  # ok, failed, timeout, error
    exit_code: int | None
    seconds: float

    def to_json(self) -> dict[str, object]:
        return {"result": self.result, "exitCode": self.exit_code, "seconds": self.seconds}


@dataclass(frozen=True, slots=True)
class Preparation(Envelope):
    event_id: str
    event_type: str
    not_before: str | None
    resources: tuple[str, ...]
    result: str  # prepared, prepareFailed
    hook: HookRun | None


def read(raw: Mapping[str, Any]) -> Preparation:
    check(raw, SCHEMA)
    hook = raw["hook"]
    return Preparation(
        record_id=raw["recordId"],
        observed_at=stamp(raw["observedAt"]),
        vm=vm_of(raw["vm"]),
        event_id=sys.intern(raw["eventId"]),
        event_type=text(raw["eventType"], 64),
        not_before=optional_text(raw["notBefore"], 64),
        resources=names(raw["resources"]),
        result=raw["result"],
        hook=None
        if hook is None
        else HookRun(hook["result"], optional_int(hook["exitCode"]), float(hook["seconds"])),
    )
