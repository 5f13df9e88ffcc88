"""Secrets from Azure Key Vault with the managed identity (issue 13): nothing on a command line.

The real azure-keyvault-secrets and azure-identity clients talk to two local fakes (Azure cannot be
reached from here, so these stand in for it; everything else is real):

* an identity endpoint speaking azure-identity's App Service managed-identity protocol
  (``IDENTITY_ENDPOINT`` / ``IDENTITY_HEADER``; on a VM the same credential asks IMDS);
* a Key Vault over HTTPS (a self-signed certificate the clients trust through
  ``REQUESTS_CA_BUNDLE``) that answers the first request with Key Vault's 401 challenge, as the
  service does, and serves secrets only for the token the identity endpoint issued. The challenge's
  resource is ``https://0.0.1:<port>``: the client checks that the vault's host ends with the
  resource's domain (``127.0.0.1:<port>`` does), the check that keeps a token from leaving Azure.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
from brokers import self_signed_certificate
from peers.azure_identity import IdentityEndpoint, QuietHandler, serve
from procs import PY, Agent, Emulator

from bridge.signing import KeyRing, sign_request

TOKEN = "fake-entra-token-for-the-vault"
IDENTITY_HEADER = "identity-header-of-the-test"
RELAY_KV_KEY = "relay-key-held-in-key-vault-" + "v" * 20


class FakeAzure:
    """The identity endpoint (HTTP) and the vault (HTTPS); what each was asked is in ``seen``."""

    def __init__(self, workdir: Path) -> None:
        self.secrets: dict[str, str] = {}
        self.cert, key = self_signed_certificate(workdir)
        self.vault = serve(self._vault_handler(), tls=(self.cert, key))
        self.identity = IdentityEndpoint(IDENTITY_HEADER, lambda resource: TOKEN)
        self.seen = self.identity.seen  # the vault's requests are added to the identity's
        self.vault_url = f"https://127.0.0.1:{self.vault.server_address[1]}"
        self.resource = f"https://0.0.1:{self.vault.server_address[1]}"

    def env(self) -> dict[str, str]:
        return {**self.identity.env(), "REQUESTS_CA_BUNDLE": str(self.cert)}

    def url(self, name: str, query: str = "") -> str:
        return f"{self.vault_url}/secrets/{name}" + (f"?{query}" if query else "")

    def _vault_handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Vault(QuietHandler):
            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                auth = self.headers.get("Authorization")
                fake.seen.append({"at": "vault", "path": parts.path, "auth": auth, "query": parts.query})
                if auth != f"Bearer {TOKEN}":
                    challenge = (
                        'Bearer authorization="https://login.microsoftonline.com/'
                        f'00000000-0000-0000-0000-000000000000", resource="{fake.resource}"'
                    )
                    return self.answer(
                        401, {"error": {"code": "Unauthorized"}}, {"WWW-Authenticate": challenge}
                    )
                name = parts.path.split("/")[2]
                if name not in fake.secrets:
                    return self.answer(
                        404, {"error": {"code": "SecretNotFound", "message": f"{name} not found"}}
                    )
                secret_id = f"{fake.vault_url}/secrets/{name}/0123456789abcdef"
                self.answer(
                    200, {"value": fake.secrets[name], "id": secret_id, "attributes": {"enabled": True}}
                )

        return Vault

    def stop(self) -> None:
        self.vault.shutdown()
        self.vault.server_close()
        self.identity.stop()


@pytest.fixture
def azure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAzure]:
    fake = FakeAzure(tmp_path)
    for name, value in fake.env().items():
        monkeypatch.setenv(name, value)
    yield fake
    fake.stop()


def test_keys_and_connection_strings_come_from_key_vault_with_the_managed_identity(azure: FakeAzure) -> None:
    azure.secrets["ops-key"] = "ops-decision-key-" + "o" * 30 + "\n"
    azure.secrets["eh-conn"] = (
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=abc="
    )
    ring = KeyRing.from_specs([f"ops={azure.url('ops-key')}"])
    assert ring.get("ops") == b"ops-decision-key-" + b"o" * 30  # the trailing newline dropped, as for files
    # The vault was asked without a token first (the challenge), then with the identity's token, for
    # the resource the challenge named.
    vault = [s for s in azure.seen if s["at"] == "vault"]
    assert [s["auth"] for s in vault] == [None, f"Bearer {TOKEN}"]
    (token,) = [s for s in azure.seen if s["at"] == "identity"]
    assert token["resource"] == azure.resource and token["header"] == IDENTITY_HEADER
    # A user-assigned identity is picked with client_id; a secret version may be named.
    client = "11111111-2222-3333-4444-555555555555"
    assert KeyRing.from_specs([f"ops={azure.url('ops-key/0123abcd', f'client_id={client}')}"]).get("ops")
    assert [s for s in azure.seen if s["at"] == "identity"][-1].get("client_id") == client
    # A sink's *_file option takes a secret URL too (read when the client is built).
    from bridge.sinks import create_sink

    sink = create_sink(
        "kafka://ns.servicebus.windows.net:9093/hub?security_protocol=SASL_SSL&sasl_mechanism=PLAIN"
        f"&sasl_username=$ConnectionString&sasl_password_file={azure.url('eh-conn')}"
    )
    assert sink.producer_config()["sasl.password"] == azure.secrets["eh-conn"]  # type: ignore[attr-defined]


def test_a_missing_or_short_secret_is_refused_naming_the_url_never_a_value(azure: FakeAzure) -> None:
    with pytest.raises(ValueError, match=r"secrets/absent: Key Vault answered HTTP 404"):
        KeyRing.from_specs([f"ops={azure.url('absent')}"])
    azure.secrets["short"] = "tiny-secret-value"
    with pytest.raises(ValueError) as caught:
        KeyRing.from_specs([f"ops={azure.url('short')}"])
    assert "at least 32" in str(caught.value) and "tiny-secret-value" not in str(caught.value)
    with pytest.raises(ValueError, match="client_id must be a UUID"):
        KeyRing.from_specs([f"ops={azure.url('short', 'client_id=me')}"])


def test_the_agent_signs_with_a_relay_key_from_key_vault(azure: FakeAzure, tmp_path: Path) -> None:
    """The installed shape: the config names the secret, the agent reads it at start with its
    identity; a relay request signed with that key is accepted, any other is refused."""
    azure.secrets["relay-key"] = RELAY_KV_KEY
    emulator = Emulator()
    agent = Agent(emulator.url, tmp_path / "agent", env=azure.env())
    (tmp_path / "agent").mkdir()
    try:
        agent.start("--relay-key", f"kv={azure.url('relay-key')}")
        body = json.dumps({"decisionId": "kv-decision-1", "eventIds": ["E-1"], "target": "x"}).encode()
        url = f"{agent.api}/v1/start-requests"

        def post(key_id: str, key: bytes) -> int:
            headers = {
                "Content-Type": "application/json",
                **sign_request(key_id, key, "POST", "/v1/start-requests", body),
            }
            return requests.post(url, data=body, headers=headers, timeout=10).status_code

        assert post("kv", RELAY_KV_KEY.encode()) == 200
        assert post("kv", b"w" * 40) == 401
        assert RELAY_KV_KEY not in (tmp_path / "agent" / "agent.log").read_text()
    finally:
        agent.stop()
        emulator.stop()


def test_an_agent_whose_secret_cannot_be_read_refuses_to_start(azure: FakeAzure, tmp_path: Path) -> None:
    done = subprocess.run(
        [PY, "-m", "bridge", "agent", "--imds-url", "http://127.0.0.1:9", "--state-dir", str(tmp_path / "s"),
         "--sink", f"file://{tmp_path}/r.jsonl", "--relay-key", f"kv={azure.url('nowhere')}"],
        capture_output=True, text=True, timeout=60, env={**os.environ, **azure.env()}, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "secrets/nowhere: Key Vault answered HTTP 404" in done.stderr
