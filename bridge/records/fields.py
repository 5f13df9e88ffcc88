"""What every record reader shares: the refusal, the envelope, the VM block, and the few
conversions a schema leaves to code (text bounds, timestamps to Unix time).

Why a reader refuses rather than repairs: a record is evidence (what a VM saw, what an approver
did). A record that breaks its type's schema was written by something that is not this product, or
by a version that means something else by it; reading half of it would show a person, or tell an
approver, something nobody said. Every refusal is a :class:`Refused` with a short reason word (a
bounded metric label) and a detail for the log that quotes no value.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

from bridge.schemas import validate_document
from bridge.support.timeutil import epoch_of

#: Names (VMs, scale sets, groups) longer than this are not Azure's (VM names are at most 64
#: characters, a scale-set instance adds ``_<n>``): a record carrying one is refused, so no map a
#: reader fills is keyed by an attacker's megabyte.
MAX_NAME = 128
#: ARM resource ids are at most a few hundred characters; a longer one is refused, never cut.
MAX_RESOURCE_ID = 1024
#: An event names at most this many resources (a scale set holds at most 1 000 VMs); more is refused.
MAX_RESOURCES = 1000

RefusalReason = Literal["notObject", "unknownType", "schema", "tooLarge"]
REFUSAL_REASONS: tuple[RefusalReason, ...] = ("notObject", "unknownType", "schema", "tooLarge")


@dataclass(frozen=True, slots=True)
class Refused:
    """A record a reader would not read: its type (``unknown`` when it had none it knew), why (a
    metric label) and a detail for the log (schema paths and messages, never a value)."""

    record_type: str
    reason: RefusalReason
    detail: str = ""


class RecordInvalid(ValueError):
    """Raised inside a reader; the reader's caller gets it back as a :class:`Refused`."""

    def __init__(self, reason: RefusalReason, detail: str) -> None:
        super().__init__(detail)
        self.reason: RefusalReason = reason


def check(raw: Mapping[str, object], schema_file: str, part: str | None = None) -> Fields:
    """``raw`` against the schema in ``schema_file`` (or its property ``part``'s), as typed
    :class:`Fields`; a violation is :class:`RecordInvalid` naming the paths, not the values (a record
    may carry a secret by mistake)."""
    errors = validate_document(raw, schema_file, part)
    if errors:
        paths = sorted({e.split(":", 1)[0] for e in errors})
        raise RecordInvalid("schema", f"{len(errors)} violation(s) at {', '.join(paths[:5])}")
    return Fields(raw)


class Fields:
    """A schema-checked JSON object, read field by field with its type: the schema said what each
    is, and each getter checks it again (a schema and a reader that drift apart refuse the record,
    they never hand a wrong type on)."""

    __slots__ = ("raw",)

    def __init__(self, raw: Mapping[str, object]) -> None:
        self.raw = raw

    def _get(self, key: str, kind: type | tuple[type, ...]) -> object:
        value = self.raw.get(key)
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _kinds(kind)):
            raise RecordInvalid("schema", f"{key}: not a {_kind_name(kind)}")
        return value

    def string(self, key: str) -> str:
        return cast(str, self._get(key, str))

    def opt_string(self, key: str) -> str | None:
        return None if self.raw.get(key) is None else self.string(key)

    def integer(self, key: str) -> int:
        return cast(int, self._get(key, int))

    def opt_integer(self, key: str) -> int | None:
        return None if self.raw.get(key) is None else self.integer(key)

    def number(self, key: str) -> float:
        return float(cast(float, self._get(key, (int, float))))

    def boolean(self, key: str) -> bool:
        return cast(bool, self._get(key, bool))

    def obj(self, key: str) -> Fields:
        return Fields(cast("Mapping[str, object]", self._get(key, Mapping)))

    def opt_obj(self, key: str) -> Fields | None:
        return None if self.raw.get(key) is None else self.obj(key)

    def objs(self, key: str) -> list[Fields]:
        return [Fields(cast("Mapping[str, object]", item)) for item in self._list(key, Mapping)]

    def strings(self, key: str) -> list[str]:
        return [cast(str, item) for item in self._list(key, str)]

    def _list(self, key: str, kind: type) -> list[object]:
        value = self.raw.get(key)
        items = value if isinstance(value, list) else [] if value is None else None
        if items is None or not all(isinstance(item, kind) for item in items):
            raise RecordInvalid("schema", f"{key}: not a list of {kind.__name__}")
        return items


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    return "/".join(k.__name__ for k in _kinds(kind))


def text(value: object, limit: int = 4096) -> str:
    """A schema-checked text field: None as "", cut at ``limit`` (what a page or a log may show)."""
    return value[:limit] if isinstance(value, str) else ""


def name(value: object) -> str:
    """A name a map is keyed by: interned (a fleet's names repeat in every record), bounded."""
    if not isinstance(value, str):
        return ""
    if len(value) > MAX_NAME:
        raise RecordInvalid("tooLarge", f"a name of {len(value)} characters (at most {MAX_NAME})")
    return sys.intern(value)


def bounded(value: object, limit: int, field: str) -> str:
    """An identifier a decision is taken on (a vmId, a resource id): refused when longer than any
    real one, never cut (a cut id could stand for another)."""
    if not isinstance(value, str):
        return ""
    if len(value) > limit:
        raise RecordInvalid("tooLarge", f"{field} of {len(value)} characters (at most {limit})")
    return value


def names(values: object) -> tuple[str, ...]:
    """A list of names (an event's resources), each interned, at most MAX_RESOURCES, duplicates dropped."""
    if not isinstance(values, list):
        return ()
    if len(values) > MAX_RESOURCES:
        raise RecordInvalid("tooLarge", f"{len(values)} resources (at most {MAX_RESOURCES})")
    return tuple(dict.fromkeys(name(v) for v in values if isinstance(v, str) and v))


def optional_int(value: object) -> int | None:
    return value if type(value) is int else None


def optional_text(value: object, limit: int = 4096) -> str | None:
    return value[:limit] if isinstance(value, str) else None


def stamp(value: object) -> float:
    """A schema-checked RFC 3339 timestamp as Unix time (0.0 when the schema allowed null)."""
    return epoch_of(value) or 0.0


@dataclass(frozen=True, slots=True)
class VmRef:
    """The VM a record is about or from, as its agent (or Azure's channel) named it. Absent fields are
    "" (the agent writes null while IMDS instance metadata is unavailable)."""

    name: str
    vm_id: str = ""
    resource_id: str = ""
    subscription_id: str = ""
    resource_group: str = ""
    location: str = ""
    zone: str = ""
    scale_set: str = ""
    private_ip: str = ""

    @property
    def key(self) -> str:
        """How maps key a VM: its name, case-folded (Azure names are case-insensitive)."""
        return self.name.lower()


def vm_of(block: object, *, schema: bool = True) -> VmRef:
    """The ``vm`` block of an agent's record (record.v1's shape, checked here when the record's own
    schema leaves it open: heartbeat, preparation, approval, impact)."""
    if not isinstance(block, Mapping):
        raise RecordInvalid("schema", "vm: not an object")
    if schema:
        check(block, "record.v1.schema.json", "vm")
    return VmRef(
        name=name(block.get("name")),
        vm_id=sys.intern(bounded(block.get("vmId"), MAX_NAME, "vm.vmId").lower()),
        resource_id=bounded(block.get("resourceId"), MAX_RESOURCE_ID, "vm.resourceId"),
        subscription_id=text(block.get("subscriptionId"), MAX_NAME),
        resource_group=name(block.get("resourceGroup")),
        location=name(block.get("location")),
        zone=text(block.get("zone"), 16),
        scale_set=name(block.get("vmScaleSetName")),
        private_ip=text(block.get("privateIp"), 64),
    )


def azure_vm_of(block: Mapping[str, object]) -> VmRef:
    """A VM as Azure's channel names it (name, resourceId, subscriptionId, resourceGroup)."""
    return VmRef(
        name=name(block.get("name")),
        resource_id=bounded(block.get("resourceId"), MAX_RESOURCE_ID, "vm.resourceId"),
        subscription_id=text(block.get("subscriptionId"), MAX_NAME),
        resource_group=name(block.get("resourceGroup")),
    )


@dataclass(frozen=True, slots=True)
class Envelope:
    """What every record shares: its id, when it was observed (Unix time) and the VM (None for an
    approver's audit of a decision that never reached an agent, and for Azure's channel)."""

    record_id: str
    observed_at: float
    vm: VmRef | None
