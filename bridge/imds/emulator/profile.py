"""The emulated VM's identity, served by ``/metadata/instance`` and named in event ``Resources``.

The agent learns who it is from the instance endpoint and then filters scheduled events by ``Resources``.
Both answers therefore come from this one profile, so a test can change the VM and the events follow.
"""

import re
import uuid
from dataclasses import dataclass, field
from typing import Any

# Fixed defaults so repeated runs (tests, benchmark, demo) see byte-identical instance documents.
DEFAULT_SUBSCRIPTION_ID = "0d2d7c4e-6a1b-4f3e-8a52-9c3b1e7f4a21"
DEFAULT_RESOURCE_GROUP = "rg-scheduled-events-bridge"
DEFAULT_LOCATION = "westeurope"
DEFAULT_VMSS_NAME = "webvmss"
DEFAULT_VMSS_INSTANCE = 3
_PROFILE_NAMESPACE = uuid.UUID("6f0c2d4a-93f1-4c59-b7a8-2e61d0c4f9ab")
_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"


def base36(number: int, width: int = 6) -> str:
    """Lower-case base-36, zero-padded: Azure builds scale-set computer names this way.

    Example from a real AKS node: instance 18 of ``aks-default-36328368-vmss`` is the resource
    ``aks-default-36328368-vmss_18`` but the guest computer name ``aks-default-36328368-vmss00000i``.
    """
    if number < 0:
        raise ValueError("instance index must be >= 0")
    digits = ""
    while True:
        number, rem = divmod(number, 36)
        digits = _BASE36[rem] + digits
        if number == 0:
            break
    return digits.rjust(width, "0")


@dataclass(frozen=True, slots=True)
class VmProfile:
    """Identity of the emulated VM: a standalone VM (default) or one scale-set instance.

    ``vmss_name`` switches to a scale-set instance: ``compute.name`` becomes ``<vmss>_<instance_id>``, the
    guest computer name ``<vmss>`` + 6-char base-36 index and the resource id the scale-set VM id.
    Empty ``vm_id``/``computer_name`` mean "derive" (deterministically, so runs repeat exactly).
    """

    name: str = "vm-bridge-0"
    vm_id: str = ""
    subscription_id: str = DEFAULT_SUBSCRIPTION_ID
    resource_group: str = DEFAULT_RESOURCE_GROUP
    location: str = DEFAULT_LOCATION
    zone: str = "1"
    vmss_name: str = ""
    instance_id: int = 0
    platform_fault_domain: int = 0
    platform_update_domain: int = 0
    os_type: str = "Linux"
    vm_size: str = "Standard_D2s_v5"
    private_ip: str = "10.0.0.4"
    computer_name: str = ""
    tags: tuple[tuple[str, str], ...] = field(default=(("env", "test"), ("app", "scheduled-events-bridge")))

    def __post_init__(self) -> None:
        # Frozen dataclass: fill the derived values once so every reader sees the same strings.
        if not self.computer_name:
            derived = self.vmss_name + base36(self.instance_id) if self.vmss_name else self.name
            object.__setattr__(self, "computer_name", derived)
        if not self.vm_id:
            object.__setattr__(self, "vm_id", str(uuid.uuid5(_PROFILE_NAMESPACE, self.resource_id)))

    @classmethod
    def scale_set(
        cls, vmss_name: str = DEFAULT_VMSS_NAME, instance_id: int = DEFAULT_VMSS_INSTANCE, **kwargs: Any
    ) -> "VmProfile":
        """A scale-set instance profile (default ``webvmss_3`` / ``webvmss000003``)."""
        return cls(vmss_name=vmss_name, instance_id=instance_id, **kwargs)

    @property
    def compute_name(self) -> str:
        """``compute.name`` and the name scheduled events put in ``Resources`` for this VM."""
        return f"{self.vmss_name}_{self.instance_id}" if self.vmss_name else self.name

    @property
    def resource_id(self) -> str:
        base = (
            f"/subscriptions/{self.subscription_id}/resourceGroups/{self.resource_group}"
            "/providers/Microsoft.Compute"
        )
        if self.vmss_name:
            return f"{base}/virtualMachineScaleSets/{self.vmss_name}/virtualMachines/{self.instance_id}"
        return f"{base}/virtualMachines/{self.name}"

    def sibling_names(self, count: int) -> list[str]:
        """Names of ``count`` other VMs of the same availability set / placement group.

        Events for a whole availability set list every affected VM (the documentation's sample lists
        ``WestNO_0`` and ``WestNO_1``); siblings continue this VM's trailing number so they look real.
        """
        name = self.compute_name
        match = re.fullmatch(r"(.*?)(\d+)", name)
        if match:
            prefix, number = match.group(1), int(match.group(2))
            return [f"{prefix}{number + i}" for i in range(1, count + 1)]
        return [f"{name}-{i}" for i in range(1, count + 1)]

    def instance_document(self) -> dict[str, Any]:
        """The ``/metadata/instance`` JSON (the subset the agent and common tools read).

        Real IMDS serves fault/update domains as strings and tags both as ``k:v;k:v`` and as a list; the
        same shape is served for every instance api-version (older versions lacked some fields).
        """
        tags = ";".join(f"{k}:{v}" for k, v in self.tags)
        return {
            "compute": {
                "azEnvironment": "AzurePublicCloud",
                "location": self.location,
                "name": self.compute_name,
                "offer": "0001-com-ubuntu-server-jammy",
                "osProfile": {
                    "adminUsername": "azureuser",
                    "computerName": self.computer_name,
                    "disablePasswordAuthentication": "true",
                },
                "osType": self.os_type,
                "platformFaultDomain": str(self.platform_fault_domain),
                "platformUpdateDomain": str(self.platform_update_domain),
                "priority": "Regular",
                "provider": "Microsoft.Compute",
                "publisher": "canonical",
                "resourceGroupName": self.resource_group,
                "resourceId": self.resource_id,
                "sku": "22_04-lts-gen2",
                "subscriptionId": self.subscription_id,
                "tags": tags,
                "tagsList": [{"name": k, "value": v} for k, v in self.tags],
                "version": "22.04.202404080",
                "vmId": self.vm_id,
                "vmScaleSetName": self.vmss_name,
                "vmSize": self.vm_size,
                "zone": self.zone,
            },
            "network": {
                "interface": [
                    {
                        "ipv4": {
                            "ipAddress": [{"privateIpAddress": self.private_ip, "publicIpAddress": ""}],
                            "subnet": [{"address": "10.0.0.0", "prefix": "24"}],
                        },
                        "ipv6": {"ipAddress": []},
                        "macAddress": "000D3A4B5C6D",
                    }
                ]
            },
        }
