"""Azure's own Scheduled Events channel: one event as Event Grid or Resource Graph carries it, parsed
once into an :class:`AzureEvent`.

Since Compute 2024-03-01 a VM, scale set or availability set can have Azure publish its Scheduled
Events itself (``scheduledEventsPolicy.scheduledEventsAdditionalPublishingTargets
.eventGridAndResourceGraph``, preview): to an Event Grid system topic of type
``Microsoft.ResourceNotifications.MaintenanceResources`` and to Resource Graph's
``maintenanceresources`` table, including the two outcomes IMDS never shows (``Completed``,
``Canceled``). What arrives differs between Microsoft's page and real captures, so parsing is lenient
where they differ and strict where a wrong value would mislead:

* an Event Grid delivery is one event object, or an array of them (Event Grid hands subscribers an
  array holding one event); ``dataVersion`` is "3.0" on Microsoft's page, "1" in captures;
  ``data.apiVersion`` varies ("2024-07-01", "2020-03-01"); ``subject`` is the event's id or the VM's;
* ``data.resourceInfo.id`` is the event's own ARM id, under the VM or the scale set:
  ``/subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Compute/{virtualMachines|
  virtualMachineScaleSets|availabilitySets}/{name}/providers/microsoft.maintenance/scheduledevents/{EventId}``
  (case varies); ``properties`` are IMDS's event fields (EventId, EventType, EventStatus, EventSource,
  NotBefore, Description, DurationInSeconds, Resources, ResourceType);
* Microsoft's table names the event type ``microsoft.maintenance/scheduledevents/write`` in one place:
  the resource type (``data.resourceInfo.type`` or a Resource Graph row's ``type``) decides, not the
  envelope's ``eventType``; older AKS material shows ``ResourceType: ManagedCluster`` under the same
  type: only ``VirtualMachine`` is an event of this product (others are refused with their reason).

A refused event (:class:`AzureEventRefused`) carries a short reason for the metric and the dead letter;
nothing here raises anything else, whatever a delivery holds.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from bridge.azure_ids import GUID_TEXT, NAME_TEXT, PARENT_KINDS, PARENT_TEXT
from bridge.imds.document import STATUS_RANK

Channel = Literal["eventGrid", "resourceGraph"]
Status = Literal["Scheduled", "Started", "Completed", "Canceled"]
#: The statuses that end an event (an agent only sees it vanish; Azure says which).
FINAL: frozenset[str] = frozenset({"Completed", "Canceled"})

RESOURCE_TYPE = "microsoft.maintenance/scheduledevents"
#: Refusal reasons (a closed set: a metric label).
REASONS = ("notJson", "notAnEvent", "otherResourceType", "malformed", "tooLarge")
#: VMs one event may name (the fleet approver's bound too): 5 000 made a 1.29 MB record (issue 31).
MAX_RESOURCES = 1000
#: An event's Description, at most (Azure's are a sentence; a record must stay far below 1 MB).
MAX_DESCRIPTION = 4096
#: An Event Grid event is at most 1 MB; a Scheduled Event is a few hundred bytes.
MAX_EVENT_BYTES = 64 * 1024

_EVENT_ID = re.compile(
    rf"^{PARENT_TEXT}/providers/microsoft\.maintenance/scheduledevents/(?P<event>{GUID_TEXT})$",
    re.IGNORECASE | re.ASCII,
)
_NAME = re.compile(NAME_TEXT, re.ASCII)
_DIGITS = re.compile(r"[0-9]{1,10}", re.ASCII)
_SIGNED_DIGITS = re.compile(r"-?[0-9]{1,12}", re.ASCII)


class AzureEventRefused(ValueError):
    """Not an event this product can use; ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in REASONS:  # a metric label: a closed set
            raise ValueError(f"unknown refusal reason {reason!r}")
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class VmRef:
    """A VM an event names, as an agent's record names it: the join key is subscription, resource
    group and the VM's name (a scale-set instance's ``myvmss_3``, as IMDS's ``compute.name``)."""

    subscription_id: str
    resource_group: str
    name: str
    #: The resource id when it is not the VM's own (:meth:`standard_id`): a Uniform scale set's
    #: instance, or an agent's spelling. "" for most: a wave's thousands of VMs are held for an hour,
    #: and the id spelled out was a fifth of what the reconciliation kept per event (issue 33).
    given_id: str = ""
    #: The other id the name may stand for (issue 34): a scale set's ``web_12345678`` is a Uniform
    #: instance or a Flexible VM (``{scale-set}_{8-char-guid}``, whose 8 characters may all be
    #: digits, or any name a Flexible VM was given); the event does not say which. "" when unambiguous.
    other_id: str = ""

    @classmethod
    def of(
        cls, subscription_id: str, resource_group: str, name: str, resource_id: str, other_id: str = ""
    ) -> VmRef:
        ref = cls(subscription_id, resource_group, name, "", other_id)
        return (
            ref
            if resource_id == ref.standard_id
            else cls(subscription_id, resource_group, name, resource_id, other_id)
        )

    @property
    def standard_id(self) -> str:
        """``/subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{name}``."""
        return (
            f"/subscriptions/{self.subscription_id}/resourceGroups/{self.resource_group}"
            f"/providers/Microsoft.Compute/virtualMachines/{self.name}"
        )

    @property
    def resource_id(self) -> str:
        return self.given_id or self.standard_id

    @property
    def key(self) -> str:
        return vm_key(self.subscription_id, self.resource_group, self.name)

    def named_by(self, resource_id: str) -> bool:
        """Whether ``resource_id`` (an agent's) is this VM's, in either form it may have (ARM ids are
        case-insensitive)."""
        wanted = resource_id.lower()
        return bool(wanted) and wanted in (self.resource_id.lower(), self.other_id.lower())


def vm_key(subscription_id: str | None, resource_group: str | None, name: str | None) -> str:
    """The join key of a VM (lower case): ``<subscription>/<group>/<name>``."""
    return f"{subscription_id or ''}/{resource_group or ''}/{name or ''}".lower()


@dataclass(frozen=True, slots=True)
class AzureEvent:
    """One observation of an event by Azure's channel (module docstring)."""

    channel: Channel
    delivery_id: str | None  # Event Grid's envelope id (a redelivery repeats it); None from Graph
    event_id: str
    event_type: str
    event_status: Status
    event_source: str | None
    not_before: str | None
    description: str | None
    duration_in_seconds: int | None
    resources: tuple[str, ...]
    resource_id: str  # the event's own ARM id
    subscription_id: str
    resource_group: str
    parent_kind: str  # virtualMachines | virtualMachineScaleSets | availabilitySets
    parent_name: str
    location: str | None = None
    event_time: str | None = None  # when Azure says the state changed
    api_version: str | None = None
    unknown: dict[str, Any] = field(default_factory=dict)  # properties not understood, kept

    @property
    def key(self) -> str:
        """The event's key: its id in lower case (the reconciliation keeps one string per event it
        holds; the tracker keeps its keys on disk)."""
        return self.event_id.lower()

    @property
    def parent_id(self) -> str:
        """The ARM id of the resource whose event this is: the scope an approval acknowledges on."""
        return f"{self._compute}/{self.parent_kind}/{self.parent_name}"

    @property
    def _compute(self) -> str:
        """The Microsoft.Compute provider of the event's group (segments already checked by the grammar)."""
        group = f"/subscriptions/{self.subscription_id}/resourceGroups/{self.resource_group}"
        return f"{group}/providers/Microsoft.Compute"

    def vms(self) -> tuple[VmRef, ...]:
        """The VMs the event names (``Resources``), with the resource id each has: a VM's own, a
        Uniform scale set's instance (``myvmss_3`` -> ``…/virtualMachineScaleSets/myvmss/virtualMachines/3``)
        or a Flexible one's VM (``…/virtualMachines/<name>``)."""
        base = self._compute
        scale_set = self.parent_kind == "virtualMachineScaleSets"
        out: list[VmRef] = []
        for name in self.resources or ((self.parent_name,) if self.parent_kind == "virtualMachines" else ()):
            flexible = f"{base}/virtualMachines/{name}"
            instance = _uniform_instance(self.parent_name, name) if scale_set else None
            if instance is None:
                out.append(VmRef.of(self.subscription_id, self.resource_group, name, flexible))
                continue
            uniform = f"{base}/virtualMachineScaleSets/{self.parent_name}/virtualMachines/{instance}"
            # Eight characters: Flexible's generated name first (a Uniform instance id that long is
            # far-fetched); either way, an agent naming the other form is this VM too.
            first, other = (flexible, uniform) if len(instance) == FLEXIBLE_SUFFIX else (uniform, flexible)
            out.append(VmRef.of(self.subscription_id, self.resource_group, name, first, other))
        return tuple(out)

    @property
    def content(self) -> tuple[str, str, str | None, tuple[str, ...]]:
        """What makes two observations the same: status, NotBefore (a moved NotBefore is news) and
        the VMs named. Redeliveries and Resource Graph's unchanged rows repeat it."""
        return (self.event_id.lower(), self.event_status, self.not_before, self.resources)


#: Characters after ``{scale-set}_`` in a Flexible scale set's generated VM names (an 8-char guid).
FLEXIBLE_SUFFIX = 8


def _uniform_instance(scale_set: str, name: str) -> str | None:
    prefix, sep, number = name.rpartition("_")
    return number if sep and prefix.lower() == scale_set.lower() and _DIGITS.fullmatch(number) else None


def deliveries(payload: bytes) -> Iterator[dict[str, Any] | AzureEventRefused]:
    """The event objects of one Event Hubs message Event Grid wrote: one object or an array."""
    import orjson

    if len(payload) > MAX_EVENT_BYTES * 16:
        yield AzureEventRefused("tooLarge", f"message of {len(payload)} bytes")
        return
    try:
        value = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        yield AzureEventRefused("notJson", f"not JSON: {str(exc)[:120]}")
        return
    for item in value if isinstance(value, list) else [value]:
        yield item if isinstance(item, dict) else AzureEventRefused("notAnEvent", "not a JSON object")


def from_event_grid(envelope: dict[str, Any]) -> AzureEvent:
    """An Event Grid event (Event Grid schema) of the MaintenanceResources system topic."""
    data = envelope.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("resourceInfo"), dict):
        raise AzureEventRefused(
            "notAnEvent", f"no data.resourceInfo (eventType {_short(envelope.get('eventType'))})"
        )
    info = data["resourceInfo"]
    operational = data.get("operationalInfo")
    if not isinstance(operational, dict):
        operational = {}
    return _event(
        "eventGrid",
        info,
        delivery_id=_text(envelope.get("id")),
        event_time=_text(operational.get("resourceEventTime")) or _text(envelope.get("eventTime")),
        api_version=_text(data.get("apiVersion")),
    )


def from_graph_row(row: dict[str, Any]) -> AzureEvent:
    """A Resource Graph ``maintenanceresources`` row (updated in place at each state change)."""
    return _event("resourceGraph", row, delivery_id=None, event_time=None, api_version=None)


def _event(
    channel: Channel,
    info: dict[str, Any],
    *,
    delivery_id: str | None,
    event_time: str | None,
    api_version: str | None,
) -> AzureEvent:
    if str(info.get("type", "")).lower() != RESOURCE_TYPE:
        raise AzureEventRefused("notAnEvent", f"resource type {_short(info.get('type'))}")
    props = info.get("properties")
    if not isinstance(props, dict):
        raise AzureEventRefused("malformed", "no properties")
    resource_type = props.get("ResourceType")
    if resource_type not in (None, "VirtualMachine"):
        raise AzureEventRefused("otherResourceType", f"ResourceType {_short(resource_type)}")
    match = _EVENT_ID.match(str(info.get("id", "")))
    if match is None:
        raise AzureEventRefused("malformed", f"not a scheduled event's resource id: {_short(info.get('id'))}")
    event_id, status = props.get("EventId"), props.get("EventStatus")
    if not isinstance(event_id, str) or event_id.lower() != match["event"].lower():
        raise AzureEventRefused("malformed", "EventId missing or not the one in the resource id")
    if status not in STATUS_RANK:
        raise AzureEventRefused("malformed", f"EventStatus {_short(status)}")
    resources = props.get("Resources") or []
    # Names become resource ids (VmRef) and the ARM path's scopes: Azure's naming grammar, nothing else
    # (IMDS's 2017-03-01 leading underscore removed first).
    if not isinstance(resources, list) or not all(
        isinstance(r, str) and _NAME.fullmatch(r.removeprefix("_")) for r in resources
    ):
        raise AzureEventRefused("malformed", "Resources is not an array of VM names")
    if len(resources) > MAX_RESOURCES:  # one record must fit an Event Hubs message (1 MB)
        raise AzureEventRefused("tooLarge", f"Resources names {len(resources)} VMs (at most {MAX_RESOURCES})")
    duration = props.get("DurationInSeconds")
    if duration not in (None, "") and _duration(duration) is None:
        raise AzureEventRefused("malformed", f"DurationInSeconds {_short(duration)} is not an integer")
    description = _text(props.get("Description"))
    if description is not None and len(description) > MAX_DESCRIPTION:
        raise AzureEventRefused("tooLarge", f"Description of {len(description)} characters")
    known = {"EventId", "EventType", "EventStatus", "EventSource", "NotBefore", "Description",
             "DurationInSeconds", "Resources", "ResourceType"}  # fmt: skip
    return AzureEvent(
        channel=channel,
        delivery_id=delivery_id,
        event_id=event_id,
        event_type=str(props.get("EventType") or ""),
        event_status=cast(Status, sys.intern(status)),  # one string per status, not one per event held
        event_source=_text(props.get("EventSource")),
        not_before=_text(props.get("NotBefore")) or None,  # empty once Started
        description=description,
        duration_in_seconds=_duration(duration),
        resources=tuple(r.removeprefix("_") for r in resources),
        resource_id=match.group(0),
        # interned: a wave's thousands of events (and the VMs the reconciler keeps of them) share a
        # few subscriptions and groups
        subscription_id=sys.intern(match["sub"].lower()),
        resource_group=sys.intern(match["rg"]),
        parent_kind=PARENT_KINDS[match["kind"].lower()],
        parent_name=match["name"],
        location=_text(info.get("location")),
        event_time=event_time,
        api_version=api_version,
        unknown={k: v for k, v in props.items() if k not in known},
    )


def _duration(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    # str.isdigit() takes "²" and other Unicode digits that int() refuses (issue 31: one such
    # delivery stopped the channel): ASCII digits only, and a bounded length.
    if isinstance(value, str) and _SIGNED_DIGITS.fullmatch(value):
        return int(value)
    return None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _short(value: object) -> str:
    return repr(value)[:80]
