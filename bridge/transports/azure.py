"""The Entra ID credential a spec asks for: a managed identity (system- or user-assigned) or
azure-identity's default chain.

Why here, and why lazy: Kafka's OAUTHBEARER on an Event Hubs namespace (``azure_identity=``), the
Event Hubs sink and source (``credential=``) and the approver's checkpoint store all need the same
credential, built the same way. azure-identity is an optional extra and heavy to import, so it is
imported inside :func:`make_credential`, the first time a spec that uses Entra ID is opened: an agent
that writes to a file, or authenticates with a connection string, never loads it. Building a
credential contacts nothing; the first token request does.
"""

from __future__ import annotations

import uuid
from typing import Any

from bridge.transports.base import Owner

#: The kinds of credential a spec can name.
IDENTITIES = ("managed", "default")
EXTRA_HINT = "pip install 'scheduled-events-bridge[eventhubs]'"


def check_client_id(owner: Owner, option: str, client_id: str | None) -> str | None:
    """A user-assigned identity's client id, which must be a UUID (a name or a resource id is refused)."""
    if client_id is not None:
        try:
            uuid.UUID(client_id)
        except ValueError:
            raise owner.refuse(f"{option} must be a UUID (the identity's client id)") from None
    return client_id


def make_credential(owner: Owner, option: str, kind: str, client_id: str | None = None) -> Any:
    """``ManagedIdentityCredential`` (``kind="managed"``) or ``DefaultAzureCredential`` (``"default"``),
    for the user-assigned identity ``client_id`` when one is given. ``option`` names the spec option
    that asked for it, for the message when azure-identity is missing."""
    try:
        from azure.identity import DefaultAzureCredential, ManagedIdentityCredential
    except ImportError as exc:
        raise owner.refuse(f"{option}={kind} needs azure-identity ({exc}); {EXTRA_HINT}") from None
    if kind == "managed":
        return ManagedIdentityCredential(client_id=client_id) if client_id else ManagedIdentityCredential()
    if kind == "default":
        if client_id:
            return DefaultAzureCredential(managed_identity_client_id=client_id)
        return DefaultAzureCredential()
    raise owner.refuse(f"{option} must be one of {', '.join(IDENTITIES)}")
