"""Every deployment path's configuration, rendered as it is deployed, passes the loaders the services
start with (issue 11: the VM extension's approver crash-looped on a config only the agent's loader had
checked).

Paths: ``deploy/vm-extension.bicep`` (a VM, a scale set, the fleet agents of docs/deploy.md; the
Windows installer receives the same settings), ``deploy/linux/cloud-init.yaml``. Each one's settings
are taken from the artifact itself (the Bicep output evaluated by ``tests/tools/bicep_output.py``, the
cloud-init file's ``settings.json``), rendered by ``python -m bridge.commands.install_config`` (what both
installers run) and loaded by ``load_agent_config`` and ``load_approver_config`` plus the topology
checks the approver makes before contacting anything. Then the services are started from each rendered
config as the units start them (``--config``), against the emulator: only the IMDS address, the
listeners and the approver's relay address are pointed at the test's processes. The Event Hubs
namespace of the rendered specs cannot be reached from here (nor could Entra ID tokens be had): the
services must run anyway, keep what they cannot deliver and say so, never crash-loop. Delivery from an
installed config is tested in tests/integration/test_installer.py (file sinks).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import requests
from brokers import free_port
from procs import PY, Emulator, decision_public_pem, scrape, stop_all, wait_until
from test_infra import tools_python
from test_keyvault import FakeAzure

from bridge.agent.config import load_agent_config
from bridge.approver.config import load_approver_config
from bridge.streams import topology

ROOT = Path(__file__).resolve().parents[2]
CLIENT_ID = "00000000-0000-0000-0000-0000000000a1"
EXTENSION_PARAMS = {
    "eventHubsNamespaceFqdn": "contoso.servicebus.windows.net",
    "agentIdentityClientId": CLIENT_ID,
}
# The fleet agents of docs/deploy.md hold the decision key's public half (issue 31), as a file.
SECRETS = {
    "approverKeys": {"ops-2026": "o" * 40},
    "files": {"relay-fleet.key": "f" * 40, "ops-2026.pub": decision_public_pem()},
}
#: Where cloud-init's Key Vault reference points in the rendered config until a test's fake vault
#: (tests/integration/test_keyvault.py) stands in for it.
VAULT_PLACEHOLDER = "https://127.0.0.1:1"


def extension_settings(**params: Any) -> dict[str, Any]:
    proc = subprocess.run(
        [str(tools_python()), str(ROOT / "tests" / "tools" / "bicep_output.py"),
         str(ROOT / "deploy" / "vm-extension.bicep"), "settings", json.dumps({**EXTENSION_PARAMS, **params})],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def cloud_init_settings() -> dict[str, Any]:
    """The ``settings.json`` cloud-init writes (YAML read by the infrastructure venv's PyYAML)."""
    read = (
        "import sys, yaml; doc = yaml.safe_load(open(sys.argv[1]));"
        "print(next(f['content'] for f in doc['write_files'] if f['path'].endswith('/settings.json')))"
    )
    proc = subprocess.run(
        [str(tools_python()), "-c", read, str(ROOT / "deploy" / "linux" / "cloud-init.yaml")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout.replace("<namespace>", "contoso").replace("<agentIdentityClientId>", CLIENT_ID)
    text = text.replace("https://<vault>.vault.azure.net", VAULT_PLACEHOLDER).replace("<key id>", "ops-kv")
    text = text.replace("<secret name>", "ops-key")
    assert "<" not in text, "a placeholder the test does not know"
    return json.loads(text)


def docs_fleet_agent_settings() -> dict[str, Any]:
    text = (ROOT / "docs" / "deploy.md").read_text()
    block = re.search(r"fleet agents' `agentSettings`.*?```json\n(.*?)```", text, re.S)
    assert block, "docs/deploy.md lost the fleet agents' agentSettings example"
    return extension_settings(vmssName="ss1", enableApprover=False, agentSettings=json.loads(block.group(1)))


def render(settings: dict[str, Any], tmp_path: Path, role: str = "agent") -> Path:
    """``python -m bridge.commands.install_config`` as the installers run it (``--role``); the file
    system under tmp_path."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    etc = tmp_path / "etc"
    text = json.dumps(settings).replace("/etc/se-bridge/", f"{etc}/")
    secrets = tmp_path / "secrets.json"
    secrets.write_text(json.dumps(SECRETS))
    env = {
        **os.environ,
        "SEB_ETC": str(etc),
        "SEB_STATE": str(tmp_path / "state"),
        "SEB_APPROVER_STATE": str(tmp_path / "approver-state"),
        "SEB_AZURE_STATE": str(tmp_path / "azure-state"),
        "SEB_ROLE": role,
        "SEB_LOGS": str(tmp_path / "logs"),
        "SEB_SETTINGS_B64": base64.b64encode(text.encode()).decode(),
        "SEB_SECRETS": str(secrets),
        "SEB_FORCE": "1",
        "SEB_OWNER": "",
        "SEB_RESULT": str(tmp_path / "result"),
    }
    etc.mkdir(parents=True)
    proc = subprocess.run(
        [sys.executable, "-m", "bridge.commands.install_config"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return etc / "config.toml"


PATHS = {
    "vm-extension, one VM": lambda: extension_settings(vmName="vm1"),
    "vm-extension, Windows VM": lambda: extension_settings(vmName="vm1", osType="Windows"),
    "vm-extension, scale set": lambda: extension_settings(vmssName="ss1"),
    "vm-extension, fleet agents (docs/deploy.md)": docs_fleet_agent_settings,
    "cloud-init": cloud_init_settings,
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_each_deployment_path_renders_a_config_every_service_starts_with(path: str, tmp_path: Path) -> None:
    config = render(PATHS[path](), tmp_path)
    args = argparse.Namespace(config=str(config))
    agent = load_agent_config(args, environ={})
    assert agent.sink, path
    rendered = tomllib.loads(config.read_text())
    if "approver" not in rendered:
        assert path.startswith("vm-extension, scale set") or "fleet" in path, "where did the approver go?"
        return
    approver = load_approver_config(args, environ={})
    assert approver.sink == agent.sink  # audit records go to the agent's sinks (no crash loop)
    topology.check(approver.mode, approver.source)
    if approver.mode == "local":
        assert approver.relay_key, "the local approver signs its relay requests"
        assert {k.split("=")[0] for k in agent.relay_key} >= {"local"}


def test_the_scale_set_default_installs_no_local_approver_on_event_hubs() -> None:
    """Local approvers on Event Hubs are for at most 5 VMs (readers per partition and consumer group)."""
    assert "approver" not in extension_settings(vmssName="ss1")
    assert "approver" in extension_settings(vmName="vm1")


def _healthy(base: str) -> bool:
    try:
        answer = requests.get(base + "/healthz", timeout=2, proxies={"http": "", "https": ""})
    except requests.RequestException:
        return False
    return answer.status_code == 200 and answer.json().get("status") == "ok"


@pytest.mark.parametrize("path", sorted(PATHS))
def test_each_deployment_paths_services_start_from_its_rendered_config(path: str, tmp_path: Path) -> None:
    config = render(PATHS[path](), tmp_path)
    azure = FakeAzure(tmp_path)  # the Key Vault a config may name (cloud-init's approver key)
    azure.secrets["ops-key"] = "k" * 40
    config.write_text(config.read_text().replace(VAULT_PLACEHOLDER, azure.vault_url))
    env = {**os.environ, **azure.env()}
    rendered = tomllib.loads(config.read_text())
    emulator = Emulator()
    procs: list[subprocess.Popen[bytes]] = []
    log = open(tmp_path / "services.log", "ab")  # noqa: SIM115 - closed below
    try:
        agent_api = f"http://127.0.0.1:{free_port()}"
        procs.append(subprocess.Popen(
            [PY, "-m", "bridge", "agent", "--config", str(config), "--imds-url", emulator.url,
             "--listen", agent_api.removeprefix("http://"), "--shutdown-timeout", "1"],
            stdout=subprocess.DEVNULL, stderr=log, env=env,
        ))  # fmt: skip
        wait_until(lambda: _healthy(agent_api), 30, what=f"{path}: the agent's /healthz")
        wait_until(lambda: scrape(agent_api, "se_bridge_records_total") >= 1, 30, what=f"{path}: a record")
        assert emulator.state()["requests"]["get"] >= 1  # it polls the emulator, not 169.254.169.254
        if "approver" in rendered:
            approver_api = f"http://127.0.0.1:{free_port()}"
            procs.append(subprocess.Popen(
                [PY, "-m", "bridge", "approver", "--config", str(config), "--relay", agent_api,
                 "--listen", approver_api.removeprefix("http://")],
                stdout=subprocess.DEVNULL, stderr=log, env=env,
            ))  # fmt: skip
            wait_until(lambda: _healthy(approver_api), 30, what=f"{path}: the approver's /healthz")
            if azure.vault_url in config.read_text():  # its key came from Key Vault, with the identity
                assert any(s["at"] == "vault" and s["auth"] for s in azure.seen), azure.seen
        # Still running a while later: the unreachable namespace is retried, not fatal.
        wait_until(
            lambda: scrape(agent_api, "se_bridge_sink_failures_total") >= 1, 30, what="a failed delivery"
        )
        assert all(proc.poll() is None for proc in procs), (tmp_path / "services.log").read_text()[-2000:]
    finally:
        stop_all(procs)
        emulator.stop()
        azure.stop()
        log.close()


# -- the central services (infra/modules/central.bicep, issue 34) -------------------------------------

CENTRAL_ID = "00000000-0000-0000-0000-0000000000b2"
CHANNEL_ID = "00000000-0000-0000-0000-0000000000c3"
NS = "eventhubs://contoso.servicebus.windows.net"
BLOB = "https://acct.blob.core.windows.net"
CENTRAL_PARAMS = {
    "location": "westeurope", "scaleSetName": "sebridge-central", "keyVaultName": "sebridgecenabc",
    "subnetId": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/virtualNetworks/v/subnets/c",
    "adminPublicKey": "ssh-ed25519 AAAA", "wheelUrl": f"{BLOB}/artifacts/w.whl",
    "identity": {"id": "/identities/approver", "clientId": CENTRAL_ID, "principalId": "p"},
    "channelIdentity": {"id": "/identities/azure-channel", "clientId": CHANNEL_ID, "principalId": "c"},
    # The strings infra/main.bicep passes (its fleetDecisionsSpec, fleetEventsSpec, ... variables).
    "decisionsSpec": f"{NS}/se-decisions?credential=managed&client_id={CENTRAL_ID}"
                     f"&consumer_group=se-bridge-approver&checkpoint_url={BLOB}/checkpoints",
    "approverEventsSpec": f"{NS}/se-records?credential=managed&client_id={CENTRAL_ID}"
                          "&consumer_group=se-bridge-approver-fleet",
    "recordsSinkSpec": f"{NS}/se-records?credential=managed&client_id={CENTRAL_ID}",
    "azureChannelSourceSpec": f"{NS}/se-azure-events?credential=managed&client_id={CHANNEL_ID}"
                              f"&consumer_group=se-bridge-azure-channel&checkpoint_url={BLOB}/checkpoints",
    "azureChannelEventsSpec": f"{NS}/se-records?credential=managed&client_id={CHANNEL_ID}"
                              "&consumer_group=se-bridge-azure-channel-fleet",
    "azureChannelSinkSpec": f"{NS}/se-records?credential=managed&client_id={CHANNEL_ID}",
    "decisionKeys": [{"id": "console", "publicKey": "PEM"}, {"id": "logicapp", "publicKey": "PEM2"}],
    "relayKey": "r" * 32, "azureSignKey": "a" * 32,
    "tags": {},
}  # fmt: skip


def central_settings(vault_url: str, **params: Any) -> dict[str, Any]:
    """central.bicep's ``settings`` output (what each instance's cloud-init hands the installer), its
    vault's URI being the test's stand-in Key Vault."""
    given = {
        **CENTRAL_PARAMS,
        **params,
        "__resources__": {"vault": {"properties": {"vaultUri": vault_url + "/"}}},
    }
    proc = subprocess.run(
        [str(tools_python()), str(ROOT / "tests" / "tools" / "bicep_output.py"),
         str(ROOT / "infra" / "modules" / "central.bicep"), "settings", json.dumps(given)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_central_services_start_from_the_config_their_template_renders(tmp_path: Path) -> None:
    """Issue 34: nothing deployed the fleet approvers nor Azure's channel. infra/modules/central.bicep
    gives each instance of a small scale set the installer and these settings; `install.sh --role
    central` renders them (no agent; each service its own sinks), the services' loaders accept them,
    and both services start from the rendered file as the units start them, reading their keys from
    (a stand-in for) the template's Key Vault with their identity. Event Hubs cannot be reached from
    here: they stay up, healthy, and keep retrying."""
    from bridge.azure.config import load_azure_channel_config

    azure = FakeAzure(tmp_path)
    azure.secrets["relay-fleet"] = "r" * 40
    azure.secrets["azure-channel-sign"] = "a" * 40
    config = render(central_settings(azure.vault_url), tmp_path, role="central")
    (tmp_path / "etc" / "keys").mkdir(exist_ok=True)
    for key_id in ("console", "logicapp"):  # cloud-init writes the public halves
        (tmp_path / "etc" / "keys" / f"{key_id}.pub").write_text(decision_public_pem())
    rendered = tomllib.loads(config.read_text())
    assert set(rendered) == {"approver", "azure_channel"}, "a central VM runs no agent"
    assert (tmp_path / "result").read_text().split() == [
        "config=written",
        "approver=1",
        "agent=0",
        "azure_channel=1",
    ]
    args = argparse.Namespace(config=str(config))
    approver = load_approver_config(args, environ={})
    channel = load_azure_channel_config(args, environ={})
    topology.check(approver.mode, approver.source)
    for spec in approver.events_source:
        topology.check_events_reader(spec)
    assert approver.mode == "fleet" and approver.sink and channel.sink and channel.sign_key
    # Every decision key given to the template is one the approvers verify with (a file per key).
    assert {"console", "logicapp"} <= {k.partition("=")[0] for k in approver.key}
    # Each service with its own identity: the approvers' and Azure's channel's.
    assert all(CENTRAL_ID in spec for spec in (approver.source, *approver.events_source, *approver.sink))
    assert all(CHANNEL_ID in spec and CENTRAL_ID not in spec for spec in (*channel.source, *channel.sink))
    assert channel.sign_key and channel.sign_key.endswith(f"client_id={CHANNEL_ID}")
    # Without its source, no Azure's channel: only the approver is rendered.
    lone = render(
        central_settings(azure.vault_url, azureChannelSourceSpec=""), tmp_path / "lone", role="central"
    )
    assert set(tomllib.loads(lone.read_text())) == {"approver"}

    env = {**os.environ, **azure.env()}
    procs: list[subprocess.Popen[bytes]] = []
    log = open(tmp_path / "services.log", "ab")  # noqa: SIM115 - closed below
    try:
        apis = {}
        for service in ("approver", "azure-channel"):
            api = f"http://127.0.0.1:{free_port()}"
            procs.append(subprocess.Popen(
                [PY, "-m", "bridge", service, "--config", str(config), "--listen", api.removeprefix("http://")],
                stdout=subprocess.DEVNULL, stderr=log, env=env,
            ))  # fmt: skip
            apis[service] = api
        for service, api in apis.items():
            wait_until(
                lambda api=api: _healthy(api), 60, what=f"{service}'s /healthz from the central config"
            )
        # Both read their keys from the vault, with the identity the template gives them.
        read = {s["path"].strip("/").split("/")[1] for s in azure.seen if s["at"] == "vault" and s["auth"]}
        assert {"relay-fleet", "azure-channel-sign"} <= read, azure.seen
        # Event Hubs cannot be reached: each service counts the failure and retries, never exits.
        for service, metric in (("approver", "se_bridge_approver_source_errors_total"),
                                ("azure-channel", "se_bridge_azure_source_errors_total")):  # fmt: skip
            wait_until(
                lambda api=apis[service], m=metric: scrape(api, m) >= 1, 120, what=f"{service} retrying"
            )
        assert all(proc.poll() is None for proc in procs), (tmp_path / "services.log").read_text()[-3000:]
    finally:
        stop_all(procs)
        azure.stop()
        log.close()


def test_main_passes_the_central_module_the_specs_it_outputs() -> None:
    """The central instances read what the deployment's outputs tell an operator: the same variables."""
    main = (ROOT / "infra" / "main.bicep").read_text()
    module = main[main.index("module central ") :]
    module = module[: module.index("\n}\n")]
    for param, var in (("decisionsSpec", "fleetDecisionsSpec"), ("approverEventsSpec", "fleetEventsSpec"),
                       ("recordsSinkSpec", "centralRecordsSpec")):  # fmt: skip
        assert f"    {param}: {var}\n" in module
    assert "output fleetApproverDecisionsSpec string = fleetDecisionsSpec" in main
    assert "output fleetApproverEventsSpec string = fleetEventsSpec" in main
    assert "azureChannelSourceSpec: deployAzureChannel ? azureChannelSpec : ''" in module
    assert "azureChannelSinkSpec: deployAzureChannel ? azureChannelRecordsSpec : ''" in module
    assert "channelIdentity: deployAzureChannel ? identities.outputs.azureChannel : {}" in module
    for var in ("azureChannelSpec", "azureChannelEventsSpec", "azureChannelRecordsSpec"):
        line = next(line for line in main.splitlines() if line.startswith(f"var {var} = "))
        assert "identities.outputs.azureChannel.clientId" in line and "approver" not in line, var
    assert "output azureChannelSourceSpec string = deployAzureChannel ? azureChannelSpec : ''" in main
    central = (ROOT / "infra" / "modules" / "central.bicep").read_text()
    assert "loadTextContent('../../deploy/linux/install.sh')" in central
    assert "'  - [/usr/local/sbin/se-bridge-install, --role, central," in central
    assert "base64(string(settings))" in central and "output settings object = settings" in central
    # Custom data decodes to at most 65 535 bytes (Compute's osProfile.customData): the cloud-config
    # holds the installer, the settings (< 4 KB) and a public key (< 1 KB), each base64 (4/3), and
    # lines around them (< 2 KB).
    installer = (ROOT / "deploy" / "linux" / "install.sh").read_bytes()
    decoded = 4 * (len(installer) + 4096 + 1024) // 3 + 2048
    assert decoded < 65_535, "the central cloud-init outgrows custom data"


def test_the_central_config_approves_through_the_local_peers(
    emulator: Emulator, make_agent: Any, tmp_path: Path
) -> None:
    """Issue 34: the central services started from the configuration their template renders, against
    the local peers: the Event Hubs peer (the three hubs, each service's consumer groups) and Azurite
    (the checkpoint store) stand in for the namespace and the account, a stand-in Key Vault for the
    template's vault. Only the addresses and credentials of the rendered specs are swapped (managed
    identities cannot be had here) and the relay address set to the test agent's. A decision signed
    with the console's key reaches the agent through the fleet approver, the emulator gets one
    StartRequest, and the approver's audit record lands on the records hub."""
    import secrets

    from azurite import Azurite, require_azurite
    from peers.amqp_eventhubs import EventHubsPeer
    from procs import DECISION_KEY, RELAY_KEY, decide, pem_files, relay_key_file

    eh_key = secrets.token_urlsafe(32)
    azure = FakeAzure(tmp_path)
    azure.secrets["relay-fleet"] = RELAY_KEY.decode()
    azure.secrets["azure-channel-sign"] = "a" * 40
    hubs = {"se-decisions": "EH_DECISIONS", "se-records": "EH_RECORDS", "se-azure-events": "EH_AZURE"}
    procs: list[subprocess.Popen[bytes]] = []
    log = open(tmp_path / "services.log", "ab")  # noqa: SIM115 - closed below
    with (
        EventHubsPeer({"se-decisions": 2, "se-records": 2, "se-azure-events": 1}, keys={"K": eh_key}) as peer,
        Azurite(require_azurite()) as store,
    ):
        try:
            store.create_container("checkpoints")
            env = {**os.environ, **azure.env(), "CP_CONN": store.connection_string()}
            env |= {var: peer.connection_string(hub, "K", eh_key) for hub, var in hubs.items()}
            records_sink = f"eventhubs://127.0.0.1:{peer.port}/se-records?connection_string_env=EH_RECORDS"
            agent = make_agent(
                emulator.url,
                "--sink",
                records_sink,
                "--relay-key",
                f"fleet={relay_key_file(tmp_path)}",
                env=env,
            ).start()
            config = render(
                central_settings(
                    azure.vault_url, decisionKeys=[{"id": "ops", "publicKey": decision_public_pem()}]
                ),
                tmp_path / "central",
                "central",
            )
            text = config.read_text()
            for hub, var in hubs.items():
                for identity in (CENTRAL_ID, CHANNEL_ID):
                    text = text.replace(
                        f"contoso.servicebus.windows.net/{hub}?credential=managed&client_id={identity}",
                        f"127.0.0.1:{peer.port}/{hub}?connection_string_env={var}",
                    )
            text = text.replace(
                f"checkpoint_url={BLOB}/checkpoints",
                "checkpoint_connection_string_env=CP_CONN&checkpoint_container=checkpoints",
            )
            assert "contoso" not in text and "credential=managed" not in text
            text = text.replace("[approver]\n", f'[approver]\nrelay_url_template = "{agent.api}"\n', 1)
            config.write_text(text)
            pem_files(config.parent / "keys", "ops", DECISION_KEY)  # the public half cloud-init writes
            apis = {}
            for service in ("approver", "azure-channel"):
                api = f"http://127.0.0.1:{free_port()}"
                procs.append(subprocess.Popen(
                    [PY, "-m", "bridge", service, "--config", str(config), "--listen", api.removeprefix("http://")],
                    stdout=subprocess.DEVNULL, stderr=log, env=env,
                ))  # fmt: skip
                apis[service] = api
            for service, api in apis.items():
                wait_until(lambda api=api: _healthy(api), 60, what=f"{service}'s /healthz")
            event_id = emulator.add_event(eventType="Freeze")
            agent.wait_for_change(event_id, "scheduled")
            # The approver knows where the agent is once it read the agent's records from the hub.
            wait_until(
                lambda: scrape(apis["approver"], "se_bridge_approver_fleet_records_read_total") >= 2,
                60,
                what="the fleet approver reading the agents' records",
            )
            decisions = f"eventhubs://127.0.0.1:{peer.port}/se-decisions?connection_string_env=EH_DECISIONS"
            published = decide(decisions, event_id, config.parent / "keys" / "ops.key", env=env)
            wait_until(
                lambda: emulator.state()["startRequests"] == {event_id: 1}, 60, what="one StartRequest"
            )

            def audit() -> list[dict[str, Any]]:
                bodies = [json.loads(e.body) for e in peer.messages(hub="se-records")]
                return [
                    b for b in bodies
                    if b.get("recordType") == "approval" and b.get("component") == "approver"
                    and b.get("decisionId") == published["decisionId"]
                ]  # fmt: skip

            mine = wait_until(audit, 30, what="the approver's audit record on the records hub")
            assert [a["outcome"] for a in mine] == ["approved"]
            assert all(proc.poll() is None for proc in procs), (tmp_path / "services.log").read_text()[-3000:]
        finally:
            stop_all(procs)
            azure.stop()
            log.close()
    assert eh_key not in (tmp_path / "services.log").read_text()
