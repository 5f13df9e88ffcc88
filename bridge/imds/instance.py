"""The VM's identity, from ``GET /metadata/instance`` (read once at start-up).

Records name the VM they come from (so a dashboard reading one Event Hub for a whole fleet can group
them) and every event says whether it affects *this* VM. Scheduled Events are broadcast to every VM of
an availability set or scale-set placement group, so ``Resources`` must be matched against this VM's
names, which IMDS spells differently depending on the kind of VM:

* a standalone VM: ``Resources`` holds the VM name (``compute.name``);
* a uniform scale-set instance: ``Resources`` holds ``<scaleSetName>_<instanceId>`` (``webvmss_3``),
  which is ``compute.name`` for such an instance, while the guest's computer name is different
  (``webvmss000003``, base-36 index) and never appears in ``Resources``;
* api-version 2017-03-01 prefixes names with ``_`` (normalized away by the document parser).
"""

from __future__ import annotations

import re
import socket
from dataclasses import asdict, dataclass, field
from typing import Any

INSTANCE_API_VERSION = "2021-02-01"
_VMSS_VM = re.compile(r"/virtualMachineScaleSets/([^/]+)/virtualMachines/(\d+)$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class VmIdentity:
    vm_id: str | None
    name: str
    resource_id: str | None = None
    subscription_id: str | None = None
    resource_group: str | None = None
    location: str | None = None
    zone: str | None = None
    vm_scale_set_name: str | None = None
    private_ip: str | None = None
    hostname: str | None = None
    # Where the identity came from: "imds", "cache" (state dir) or "hostname" (IMDS unreachable).
    source: str = "imds"
    aliases: frozenset[str] = field(default_factory=frozenset, compare=False)

    @property
    def key(self) -> str:
        """The stable key of this VM: message key, record-id input. vmId when known."""
        return self.vm_id or self.name

    def names(self) -> frozenset[str]:
        """Every spelling under which ``Resources`` may name this VM (lower-cased: Azure names are
        case-insensitive)."""
        names = {self.name.lower()} | {a.lower() for a in self.aliases}
        if self.resource_id:
            m = _VMSS_VM.search(self.resource_id)
            if m:
                names.add(f"{m.group(1)}_{m.group(2)}".lower())
        return frozenset(n for n in names if n)

    def affects(self, resources: tuple[str, ...] | list[str], _names: frozenset[str] | None = None) -> bool:
        names = _names if _names is not None else self.names()
        return any(r.lower() in names for r in resources)

    def to_record(self) -> dict[str, Any]:
        return {
            "vmId": self.vm_id,
            "name": self.name,
            "resourceId": self.resource_id,
            "subscriptionId": self.subscription_id,
            "resourceGroup": self.resource_group,
            "location": self.location,
            "zone": self.zone,
            "vmScaleSetName": self.vm_scale_set_name,
            "privateIp": self.private_ip,
            "hostname": self.hostname,
        }

    def to_state(self) -> dict[str, Any]:
        d = asdict(self)
        d["aliases"] = sorted(self.aliases)
        return d

    @classmethod
    def from_state(cls, data: dict[str, Any]) -> VmIdentity:
        data = dict(data)
        data["aliases"] = frozenset(data.get("aliases") or ())
        data["source"] = "cache"
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def identity_from_instance(doc: Any) -> VmIdentity:
    """Build the identity from an instance metadata document; ``ValueError`` when it is unusable."""
    if not isinstance(doc, dict) or not isinstance(doc.get("compute"), dict):
        raise ValueError("instance metadata has no compute object")
    c = doc["compute"]
    name = c.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("instance metadata has no compute.name")

    def s(key: str) -> str | None:
        v = c.get(key)
        return v if isinstance(v, str) and v else None

    os_profile = c.get("osProfile") if isinstance(c.get("osProfile"), dict) else {}
    return VmIdentity(
        vm_id=s("vmId"),
        name=name,
        resource_id=s("resourceId"),
        subscription_id=s("subscriptionId"),
        resource_group=s("resourceGroupName"),
        location=s("location"),
        zone=s("zone"),
        vm_scale_set_name=s("vmScaleSetName"),
        private_ip=_private_ip(doc.get("network")),
        hostname=(os_profile.get("computerName") or None) if isinstance(os_profile, dict) else None,
        source="imds",
    )


def fallback_identity(name: str | None = None) -> VmIdentity:
    """Identity used while IMDS instance metadata is unavailable and nothing is cached."""
    host = socket.gethostname()
    return VmIdentity(vm_id=None, name=name or host, hostname=host, source="hostname")


def _private_ip(network: Any) -> str | None:
    try:
        return network["interface"][0]["ipv4"]["ipAddress"][0]["privateIpAddress"] or None
    except (KeyError, IndexError, TypeError):
        return None
