"""Secrets in Azure Key Vault, read with the VM's managed identity (issue 13).

Why: a fleet's HMAC keys and connection strings must reach each VM without travelling through a
command line (process-creation auditing records it), custom data (Microsoft: never for secrets) or
an installer's arguments. With Key Vault, the VM extension's settings carry only *where* a secret is,
and the service reads it at start with the VM's identity (a role such as *Key Vault Secrets User* on
the vault or the secret). Rotation is a new secret version; the services read the current one when
they (re)start.

Wherever a secret **file** is named (``--key KEYID=PATH``, ``--relay-key``, ``*_file=`` options of
sinks and sources), a Key Vault secret identifier may stand instead::

    https://<vault>.vault.azure.net/secrets/<name>[/<version>][?client_id=<uuid>]

(any ``https`` host with that path: sovereign clouds and private endpoints keep the vault's name).
``client_id`` picks a user-assigned managed identity; without it, the system-assigned one (or what
``AZURE_CLIENT_ID`` names). azure-keyvault-secrets and azure-identity are imported only when such a
reference is read (the ``keyvault`` extra): an agent that reads files never loads them.

Errors name the secret's URL (which holds no secret) and never the value.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

_SECRET_PATH = re.compile(r"^/secrets/([0-9A-Za-z-]{1,127})(?:/([0-9A-Za-z]{1,64}))?/?$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
TIMEOUT = 30.0


class KeyVaultError(Exception):
    """A secret that could not be read from Key Vault (the message names the URL, never a value)."""


def is_secret_url(text: str) -> bool:
    """Whether ``text`` names a Key Vault secret rather than a file."""
    return text.startswith("https://") and _SECRET_PATH.match(urlsplit(text).path) is not None


def read_secret(url: str) -> str:
    """The secret's current (or named) version, read now with the managed identity."""
    vault, name, version, client_id = _parse(url)
    try:
        from azure.core.exceptions import AzureError, HttpResponseError
        from azure.identity import ManagedIdentityCredential
        from azure.keyvault.secrets import SecretClient
    except ImportError:
        raise KeyVaultError(
            f"{_shown(url)}: reading secrets from Key Vault needs the keyvault extra "
            "(pip install 'scheduled-events-bridge[keyvault]')"
        ) from None
    credential = ManagedIdentityCredential(client_id=client_id) if client_id else ManagedIdentityCredential()
    client = SecretClient(vault, credential, connection_timeout=TIMEOUT, read_timeout=TIMEOUT)
    try:
        value = client.get_secret(name, version).value
    except HttpResponseError as exc:
        status = f"HTTP {exc.status_code} ({exc.reason})"
        raise KeyVaultError(f"{_shown(url)}: Key Vault answered {status}") from None
    except AzureError as exc:  # no token (no identity, no role), the vault unreachable
        raise KeyVaultError(f"{_shown(url)}: {type(exc).__name__}: {exc.message}"[:500]) from None
    finally:
        client.close()
        credential.close()
    if not value or not value.strip():
        raise KeyVaultError(f"{_shown(url)}: the secret is empty")
    return value


def _parse(url: str) -> tuple[str, str, str | None, str | None]:
    parts = urlsplit(url)
    match = _SECRET_PATH.match(parts.path)
    if parts.scheme != "https" or not parts.hostname or match is None:
        raise KeyVaultError(f"{_shown(url)}: expected https://<vault>/secrets/<name>[/<version>]")
    query = parse_qs(parts.query)
    unknown = set(query) - {"client_id"}
    if unknown:
        raise KeyVaultError(f"{_shown(url)}: unknown option {sorted(unknown)[0]} (only client_id)")
    client_id = query.get("client_id", [None])[0]
    if client_id is not None and not _UUID.match(client_id):
        raise KeyVaultError(f"{_shown(url)}: client_id must be a UUID")
    return f"https://{parts.netloc}", match.group(1), match.group(2), client_id


def _shown(url: str) -> str:
    """The URL as messages show it (without its query: nothing there is secret, but keep it short)."""
    return url.split("?", 1)[0]
