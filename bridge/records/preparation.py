"""``preparation`` records (``schemas/preparation.v1.schema.json``): one VM's readiness for one
event, after its prepare hook (:mod:`bridge.coordination`). Derivable like a change: the id comes
from the VM, the event and the result, so a hook run again after a restart republishes the same id."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bridge.records.fields import Envelope, check, names, optional_text, stamp, text, vm_of
from bridge.records.ids import PREPARATION, derived_id, envelope
from bridge.schemas import JsonObject, json_list

if TYPE_CHECKING:  # the writer's types; readers (sinks, services) never load the IMDS layer
    from bridge.imds.instance import VmIdentity


SCHEMA = "preparation.v1.schema.json"


def build(
    vm: VmIdentity,
    event: JsonObject,
    result: str,
    hook: JsonObject | None,
    observed_at: float,
) -> JsonObject:
    """``event`` as :meth:`ScheduledEvent.to_json` gives it; ``hook`` its run (``result``,
    ``exitCode``, ``seconds``) or None without a hook."""
    event_id = str(event["eventId"])
    return {
        **envelope(PREPARATION, derived_id(vm.key, "preparation", event_id, result), observed_at, vm),
        "eventId": event_id,
        "eventType": event.get("eventType") or "",
        "notBefore": event.get("notBefore"),
        "resources": json_list(resources if isinstance(resources := event.get("resources"), list) else []),
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


def read(raw: Mapping[str, object]) -> Preparation:
    f = check(raw, SCHEMA)
    hook = f.opt_obj("hook")
    return Preparation(
        record_id=f.string("recordId"),
        observed_at=stamp(raw["observedAt"]),
        vm=vm_of(raw["vm"]),
        event_id=sys.intern(f.string("eventId")),
        event_type=text(raw["eventType"], 64),
        not_before=optional_text(raw["notBefore"], 64),
        resources=names(raw["resources"]),
        result=f.string("result"),
        hook=None
        if hook is None
        else HookRun(hook.string("result"), hook.opt_integer("exitCode"), hook.number("seconds")),
    )
