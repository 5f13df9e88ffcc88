"""Azure resource ids: the grammar a VM's id must follow before any of it reaches a URL, and the
scopes an operator allows (``--arm-scope``).

Why a module of its own: resource ids arrive in records anyone on the events stream may publish, and
the same rules serve the configuration (an allowed scope is checked when it is read), the ARM path
(the scope of an acknowledgement) and Azure's own channel (an event's VM). One grammar, one place.
"""

from __future__ import annotations

import re
from urllib.parse import quote

GUID_TEXT = r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"
#: Azure's naming rules (learn.microsoft.com, "Naming rules and restrictions for Azure resources"):
#: a resource group 1-90 of letters, digits, ``_ - . ( )``, not ending with ``.``; a VM or scale set
#: 1-64 of letters, digits, ``_ - .``; a scale-set instance id, digits. Nothing else reaches a URL:
#: no ``..`` path walk, no ``?``/``#`` cut, no ``%2F``.
RG_TEXT = r"[-\w().]{0,89}[-\w()]"
NAME_TEXT = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}"
_VM = re.compile(
    rf"^/subscriptions/(?P<sub>{GUID_TEXT})/resourceGroups/(?P<rg>{RG_TEXT})/providers/Microsoft\.Compute/"
    rf"(?:virtualMachineScaleSets/(?P<set>{NAME_TEXT})/virtualMachines/\d{{1,10}}|virtualMachines/(?P<vm>{NAME_TEXT}))$",
    re.IGNORECASE | re.ASCII,
)
_SCOPE = re.compile(
    rf"^/subscriptions/(?P<sub>{GUID_TEXT})(?:/resourceGroups/(?P<rg>{RG_TEXT}))?$", re.IGNORECASE | re.ASCII
)


#: A VM, scale set or availability set: the parent Azure files a scheduled event under (groups
#: ``sub``, ``rg``, ``kind``, ``name``), unanchored, for the ids built on it (bridge.azure.events).
PARENT_TEXT = (
    rf"/subscriptions/(?P<sub>{GUID_TEXT})/resourceGroups/(?P<rg>{RG_TEXT})/providers/Microsoft\.Compute/"
    rf"(?P<kind>virtualMachines|virtualMachineScaleSets|availabilitySets)/(?P<name>{NAME_TEXT})"
)
_PARENT = re.compile(rf"^{PARENT_TEXT}$", re.IGNORECASE | re.ASCII)
#: A parent's kind as the id may spell it (any case) -> as ARM spells it.
PARENT_KINDS = {k.lower(): k for k in ("virtualMachines", "virtualMachineScaleSets", "availabilitySets")}


class ScopeRefused(ValueError):
    """A resource id that is no VM's, or a VM outside the configured ``--arm-scope`` s."""


def parse_allowed_scope(text: str) -> tuple[str, str | None]:
    """``/subscriptions/<id>[/resourceGroups/<name>]`` as (subscription, group) in lower case."""
    match = _SCOPE.match(text.strip().rstrip("/"))
    if match is None:
        raise ValueError("expected /subscriptions/<guid> or /subscriptions/<guid>/resourceGroups/<name>")
    return match["sub"].lower(), match["rg"].lower() if match["rg"] else None


def event_scope(resource_id: str, allowed: tuple[tuple[str, str | None], ...] = ()) -> str:
    """The ARM scope whose scheduled events a VM's are: the VM itself, or the scale set of a scale-set
    instance, with every segment checked against Azure's naming rules and quoted, inside one of the
    ``allowed`` scopes (subscription, optional group) when any is given. :class:`ScopeRefused`
    otherwise: a resource id comes from records anyone on the events stream may publish."""
    match = _VM.match(resource_id.strip())
    if match is None:  # RG_TEXT: a group never ends with "."
        raise ScopeRefused(f"not a virtual machine's resource id: {resource_id[:200]!r}")
    base = _compute(_inside(match, allowed), match["rg"])
    if match["set"]:
        return f"{base}/virtualMachineScaleSets/{quote(match['set'], safe='')}"
    return f"{base}/virtualMachines/{quote(match['vm'], safe='')}"


def parent_scope(parent_id: str, allowed: tuple[tuple[str, str | None], ...] = ()) -> str:
    """The ARM scope of a scheduled event as Azure's own channel names its parent (a VM, a scale set or
    an availability set: a Flexible scale set's or an availability set's VMs have their events under
    the parent, which a VM's own id does not tell), checked and quoted as :func:`event_scope` does."""
    match = _PARENT.match(parent_id.strip())
    if match is None:  # RG_TEXT: a group never ends with "."
        raise ScopeRefused(f"not a VM, scale set or availability set id: {parent_id[:200]!r}")
    base = _compute(_inside(match, allowed), match["rg"])
    return f"{base}/{PARENT_KINDS[match['kind'].lower()]}/{quote(match['name'], safe='')}"


def _compute(sub: str, group: str) -> str:
    """The Microsoft.Compute provider of a subscription's resource group, every segment quoted."""
    return f"/subscriptions/{quote(sub)}/resourcegroups/{quote(group, safe='')}/providers/Microsoft.Compute"


def _inside(match: re.Match[str], allowed: tuple[tuple[str, str | None], ...]) -> str:
    """The id's subscription (lower case), once its group is inside one of the ``allowed`` scopes."""
    sub, rg = match["sub"].lower(), match["rg"].lower()
    if allowed and not any(sub == a_sub and a_rg in (None, rg) for a_sub, a_rg in allowed):
        raise ScopeRefused(f"resource group {match['rg']} of subscription {sub} is outside --arm-scope")
    return sub
