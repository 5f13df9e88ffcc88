"""Infrastructure as code, checked without Azure: Bicep, checkov, the ADX mapping, the Logic App signer.

Nothing here can deploy, so every check that can run offline does: each ``.bicep`` file parses with
pycep-parser and references only what it declares (infra/tools/bicep_lint.py, which also follows
secrets and module interfaces), checkov finds no failed check and every skip is inline with a reason,
the ADX ingestion mapping reads only paths that exist in the record schema with matching types, the
dashboard queries read only fields the schemas define, and the Logic App's JavaScript signer produces
decisions the approver's canonical form and HMAC accept.

checkov and pycep-parser live in their own virtual environment (``make test`` creates
``.venv-infra`` and sets ``SE_BRIDGE_INFRA_VENV``); run outside ``make test`` without it, these tests
skip and say how to get it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
INFRA_VENV = Path(os.environ.get("SE_BRIDGE_INFRA_VENV", ROOT / ".venv-infra"))
TOOLS_PYTHON = INFRA_VENV / "bin" / "python"
BICEP_FILES = sorted(
    p.relative_to(ROOT).as_posix() for p in [*ROOT.glob("infra/**/*.bicep"), *ROOT.glob("deploy/**/*.bicep")]
)
RECORD_SCHEMA = json.loads((ROOT / "schemas" / "record.v1.schema.json").read_text())

# The API versions the templates are written against (known to exist; bump deliberately).
API_VERSIONS = {
    "Microsoft.EventHub/namespaces": "2024-01-01",
    "Microsoft.ContainerRegistry/registries": "2025-11-01",
    "Microsoft.EventHub/namespaces/eventhubs": "2024-01-01",
    "Microsoft.EventHub/namespaces/eventhubs/consumergroups": "2024-01-01",
    "Microsoft.Storage/storageAccounts": "2023-05-01",
    "Microsoft.Storage/storageAccounts/blobServices": "2023-05-01",
    "Microsoft.Storage/storageAccounts/blobServices/containers": "2023-05-01",
    "Microsoft.ManagedIdentity/userAssignedIdentities": "2023-01-31",
    "Microsoft.Authorization/roleAssignments": "2022-04-01",
    "Microsoft.Compute/virtualMachines": "2024-07-01",
    "Microsoft.Compute/virtualMachines/extensions": "2024-07-01",
    "Microsoft.Compute/virtualMachines/runCommands": "2024-07-01",
    "Microsoft.Authorization/policyDefinitions": "2023-04-01",
    "Microsoft.Authorization/policyAssignments": "2024-04-01",
    "Microsoft.Compute/virtualMachineScaleSets": "2024-07-01",
    "Microsoft.Compute/virtualMachineScaleSets/extensions": "2024-07-01",
    "Microsoft.Logic/workflows": "2019-05-01",
    "Microsoft.KeyVault/vaults": "2023-07-01",
    "Microsoft.KeyVault/vaults/secrets": "2023-07-01",
    "Microsoft.Web/serverfarms": "2023-12-01",
    "Microsoft.Web/sites": "2023-12-01",
    "Microsoft.Web/connections": "2016-06-01",
    "Microsoft.Kusto/clusters": "2023-08-15",
    "Microsoft.Kusto/clusters/databases": "2023-08-15",
    "Microsoft.Kusto/clusters/databases/scripts": "2023-08-15",
    "Microsoft.Kusto/clusters/databases/dataConnections": "2023-08-15",
    "Microsoft.EventHub/namespaces/networkRuleSets": "2024-01-01",
    "Microsoft.Network/privateEndpoints": "2023-11-01",
    "Microsoft.Network/privateEndpoints/privateDnsZoneGroups": "2023-11-01",
    "Microsoft.Insights/diagnosticSettings": "2021-05-01-preview",
    "Microsoft.Kusto/clusters/databases/principalAssignments": "2023-08-15",
    # A gallery's user-assigned identity (publishing from private blobs without a SAS): the version
    # Microsoft's "Publish VM applications using managed identity" uses.
    "Microsoft.Compute/galleries": "2025-03-03",
    "Microsoft.Compute/galleries/applications": "2025-03-03",
    "Microsoft.Compute/galleries/applications/versions": "2025-03-03",
    "Microsoft.Resources/templateSpecs": "2022-02-01",
    # The ops console: the Microsoft.App stable version whose authConfigs, Key Vault secret
    # references (keyVaultUrl + identity) and Secret volumes the module uses.
    "Microsoft.App/managedEnvironments": "2024-03-01",
    "Microsoft.App/containerApps": "2024-03-01",
    # the token store with a managed identity (no SAS, shared keys stay off): preview only (issue 31)
    "Microsoft.App/containerApps/authConfigs": "2024-10-02-preview",
    # Azure's own channel: the newest GA Event Grid version (azure-rest-api-specs, stable/2025-02-15).
    "Microsoft.EventGrid/systemTopics": "2025-02-15",
    "Microsoft.EventGrid/systemTopics/eventSubscriptions": "2025-02-15",
    # Azure Monitor (issue 26): the versions in Microsoft's Logs Ingestion and workbook references,
    # each a stable folder of azure-rest-api-specs.
    "Microsoft.OperationalInsights/workspaces": "2025-07-01",
    "Microsoft.OperationalInsights/workspaces/tables": "2025-07-01",
    "Microsoft.Insights/dataCollectionRules": "2024-03-11",
    "Microsoft.Insights/workbooks": "2023-06-01",
    "Microsoft.Insights/actionGroups": "2022-06-01",
    "Microsoft.Insights/scheduledQueryRules": "2023-12-01",
}

# Versions the resource providers publish (Azure/azure-rest-api-specs, each provider's stable folder;
# learn.microsoft.com/azure/templates), for the types whose namespace holds several providers with
# different version sets: Microsoft.Compute's galleries are GalleryRP's (2025-03-03), not ComputeRP's
# (2025-04-01, which a gallery refuses). Checked against the pins above (issue 25).
GALLERY_RP = {"2022-03-03", "2022-08-03", "2023-07-03", "2024-03-03", "2025-03-03"}
PUBLISHED = {
    "Microsoft.Compute/galleries": GALLERY_RP,
    "Microsoft.Compute/galleries/applications": GALLERY_RP,
    "Microsoft.Compute/galleries/applications/versions": GALLERY_RP,
    "Microsoft.App/managedEnvironments": {"2023-05-01", "2024-03-01", "2025-01-01"},
    "Microsoft.App/containerApps": {"2023-05-01", "2024-03-01", "2025-01-01"},
    "Microsoft.App/containerApps/authConfigs": {
        "2023-05-01", "2024-03-01", "2024-10-02-preview", "2025-01-01"
    },
    "Microsoft.Resources/templateSpecs": {"2021-05-01", "2022-02-01"},
    "Microsoft.EventGrid/systemTopics": {"2025-02-15"},  # the stable versions checked so far
    "Microsoft.EventGrid/systemTopics/eventSubscriptions": {"2025-02-15"},
    "Microsoft.OperationalInsights/workspaces/tables": {"2025-07-01"},  # the stable versions checked so far
    "Microsoft.Insights/scheduledQueryRules": {"2023-12-01"},
    "Microsoft.Insights/workbooks": {"2023-06-01"},
    # GA versions listed by Microsoft's template reference (2026-11): 2019-05-01 ... 2025-11-01
    "Microsoft.ContainerRegistry/registries": {"2019-05-01", "2021-09-01", "2022-12-01", "2023-07-01",
                                               "2025-04-01", "2025-11-01"},
}  # fmt: skip


def test_the_pinned_versions_are_ones_their_provider_publishes() -> None:
    for rtype, published in PUBLISHED.items():
        assert API_VERSIONS[rtype] in published, f"{rtype}@{API_VERSIONS[rtype]} is not a version it has"


# Every checkov skip, per scanned directory: a new skip must be justified inline and listed here.
EXPECTED_SKIPS = {
    "infra": {
        "CKV_AZURE_35",
        "CKV_AZURE_43",
        "CKV_AZURE_59",
        "CKV_AZURE_206",
        "CKV_AZURE_109",
        "CKV_AZURE_189",
        "CKV_AZURE_41",
        "CKV_AZURE_225",
        "CKV_AZURE_222",
        "CKV_AZURE_17",
        "CKV_AZURE_212",
        "CKV_AZURE_213",
        "CKV_AZURE_233",  # the container registry (modules/registry.bicep): Basic SKU
        "CKV_AZURE_166",  # the container registry (modules/registry.bicep): Basic SKU
        "CKV_AZURE_139",  # the container registry (modules/registry.bicep): Basic SKU
        "CKV_AZURE_163",  # the container registry (modules/registry.bicep): Basic SKU
        "CKV_AZURE_95",  # the central scale set (modules/central.bicep): a reimage would lose its state
        "CKV_AZURE_97",  # the central scale set: encryption at host is a subscription feature
    },
    "deploy": set(),
}


def tools_python() -> Path:
    if not TOOLS_PYTHON.exists():
        if "SE_BRIDGE_INFRA_VENV" in os.environ:
            pytest.fail(
                f"{TOOLS_PYTHON} is missing although SE_BRIDGE_INFRA_VENV is set (make test creates it)"
            )
        pytest.skip(
            f"the infrastructure tools environment {INFRA_VENV} is missing: `make test` "
            "(or `make infra-tools`) creates it with checkov and pycep-parser"
        )
    return TOOLS_PYTHON


def run_lint(*paths: str | Path, cwd: Path = ROOT) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run(
        [str(tools_python()), str(ROOT / "infra" / "tools" / "bicep_lint.py"), *map(str, paths)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.fixture(scope="module")
def lint_report() -> dict[str, Any]:
    code, report = run_lint("infra", "deploy")
    errors = {f: d["errors"] for f, d in report["files"].items() if d["errors"]}
    assert code == (1 if errors else 0)
    return report


# -- Bicep -------------------------------------------------------------------------------------------


def test_there_are_bicep_files_to_check() -> None:
    assert "infra/main.bicep" in BICEP_FILES
    assert "deploy/vm-extension.bicep" in BICEP_FILES
    assert len(BICEP_FILES) >= 8


@pytest.mark.parametrize("path", BICEP_FILES)
def test_bicep_parses_and_references_only_declared_symbols(path: str, lint_report: dict[str, Any]) -> None:
    entry = lint_report["files"][path]
    assert entry["errors"] == []


def test_api_versions_are_the_pinned_ones(lint_report: dict[str, Any]) -> None:
    seen = {r["type"] for f in lint_report["files"].values() for r in f["resources"]}
    assert seen
    for pair in sorted(seen):
        rtype, _, version = pair.partition("@")
        assert API_VERSIONS.get(rtype) == version, f"{pair}: not a pinned API version"


def test_role_assignments_are_scoped_to_a_hub_or_container(lint_report: dict[str, Any]) -> None:
    """Least privilege: data-plane roles on one hub, container or Key Vault secret, never on the
    namespace, account or vault."""
    scoped_types = {
        "Microsoft.EventHub/namespaces/eventhubs@2024-01-01",
        "Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01",
        "Microsoft.KeyVault/vaults/secrets@2023-07-01",
        "Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31",  # attach one identity, no other
        "Microsoft.Resources/templateSpecs@2022-02-01",  # read the one spec a policy deploys from
        "Microsoft.Insights/dataCollectionRules@2024-03-11",  # send through the one rule (Azure Monitor)
        "Microsoft.ContainerRegistry/registries@2025-11-01",  # pull from the one registry (AcrPull)
        "Microsoft.OperationalInsights/workspaces@2025-07-01",  # an alert rule reads the one workspace
    }
    assignments = 0
    for path, entry in lint_report["files"].items():
        by_symbol = {r["symbol"]: r for r in entry["resources"]}
        for resource in entry["resources"]:
            if not resource["type"].startswith("Microsoft.Authorization/roleAssignments@"):
                continue
            assignments += 1
            # The resource-group grants: the narrowest role there is (ARM acknowledge), and the policy
            # remediation's Virtual Machine Contributor on the one group it is assigned to.
            if path in (ARM_ACKNOWLEDGE, POLICY_ASSIGNMENT):
                assert not resource["scope"], resource
                continue
            assert resource["scope"], f"{resource['symbol']} has no scope"
            assert by_symbol[resource["scope"][0]]["type"] in scoped_types, resource
    assert assignments >= 10


ARM_ACKNOWLEDGE = "infra/modules/arm-acknowledge.bicep"
POLICY_ASSIGNMENT = "deploy/policy/policy-assignment.bicep"  # every se-bridge policy's assignment
SCHEDULED_EVENTS_CONTRIBUTOR = "b67fe603-310e-4889-b9ee-8257d09d353d"  # acknowledge + VM/VMSS/AvSet read


def test_the_arm_path_grants_only_the_scheduled_events_role_per_resource_group() -> None:
    """Issue 12: the fleet approver's ARM fallback may acknowledge scheduled events, nothing else, in
    the resource groups main.bicep lists (a module per group, never the subscription)."""
    text = (ROOT / ARM_ACKNOWLEDGE).read_text()
    role_ids = set(re.findall(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", text))
    assert role_ids == {SCHEDULED_EVENTS_CONTRIBUTOR}
    assert "targetScope = 'resourceGroup'" in text
    main = (ROOT / "infra" / "main.bicep").read_text()
    assert "[for rg in armAcknowledgeResourceGroups:" in main and "scope: resourceGroup(rg)" in main
    assert "param armAcknowledgeResourceGroups array = []" in main  # off unless asked for


def test_scheduled_events_policy_is_one_block_for_templates_and_existing_vms(tmp_path: Path) -> None:
    """Issues 12 and 25: the Bicep module (resources a template defines) and the script (resources
    that exist; `az vm update` / `az vmss update` / `az vm availability-set update`, which read,
    change and write back the whole model) set the same scheduledEventsPolicy block. The script runs
    here against a stand-in `az` that records its arguments and answers the two questions the script
    asks (the preview feature's state, a VM's parent): the Azure CLI cannot reach Azure from here."""
    module = (ROOT / "infra" / "modules" / "scheduled-events-policy.bicep").read_text()
    script = ROOT / "deploy" / "enable-scheduled-events-policy.sh"
    # During the preview the schema version's only value, 2020-07-01, is set by default (issue 34).
    preview = {"enable": True, "scheduledEventsApiVersion": "2020-07-01"}
    policy = {
        "scheduledEventsAdditionalPublishingTargets": {"eventGridAndResourceGraph": preview},
        "userInitiatedReboot": {"automaticallyApprove": False},
        "userInitiatedRedeploy": {"automaticallyApprove": False},
    }
    keys = ["scheduledEventsAdditionalPublishingTargets", "eventGridAndResourceGraph", "enable:"]
    keys += ["userInitiatedReboot", "userInitiatedRedeploy", "automaticallyApprove:", "output policy object"]
    keys += ["scheduledEventsApiVersion:", "allInstancesDown:", "ScheduledEventsActivity"]
    assert all(key in module for key in keys)
    rg = "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg/providers/Microsoft.Compute"
    vm, vmss, aset = (
        f"{rg}/virtualMachines/vm-1",
        f"{rg}/virtualMachineScaleSets/set-1",
        f"{rg}/availabilitySets/as-1",
    )
    member = f"{rg}/virtualMachines/vm-in-set"
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "az"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$*" >> {calls}\n'
        'case "$*" in\n'
        f'  "feature show --namespace Microsoft.Maintenance"*) echo "${{ACTIVITY_STATE:-Registered}}" ;;\n'
        f'  "feature show"*) echo "${{FEATURE_STATE:-Registered}}" ;;\n'
        f'  "vm show --ids {member} "*) echo "{aset}" ;;\n'
        '  "vm show"*) echo "" ;;\n'
        "esac\n"
    )
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}

    def run(*args: str, **more: str) -> subprocess.CompletedProcess[str]:
        if calls.exists():
            calls.unlink()
        return subprocess.run(
            [str(script), *args], env={**env, **more}, capture_output=True, text=True, check=False
        )

    done = run(vm, vmss, aset)
    assert done.returncode == 0, done.stderr
    updates = [line for line in calls.read_text().splitlines() if " update " in line]
    assert [line.split(" --ids ")[0] for line in updates] == [
        "vm update",
        "vmss update",
        "vm availability-set update",
    ]
    sent = [line.split("scheduledEventsPolicy=", 1)[1].split(" --output")[0] for line in updates]
    assert [json.loads(s) for s in sent] == [policy] * 3
    # Compute 2025-04-01's two settings, when asked for.
    done = run("--events-api-version", "2020-07-01", "--all-instances-down-approve", "false", vm)
    sent_one = calls.read_text().split("scheduledEventsPolicy=", 1)[1].split(" --output")[0]
    assert json.loads(sent_one) == {**policy, "allInstancesDown": {"automaticallyApprove": False}}
    # Another schema version is refused (the preview delivers only 2020-07-01); it can be left out.
    refused = run("--events-api-version", "2024-07-01", vm)
    assert refused.returncode == 2 and "only value is 2020-07-01" in refused.stderr and not calls.exists()
    done = run("--no-events-api-version", vm)
    sent_one = calls.read_text().split("scheduledEventsPolicy=", 1)[1].split(" --output")[0]
    assert json.loads(sent_one)["scheduledEventsAdditionalPublishingTargets"] == {
        "eventGridAndResourceGraph": {"enable": True}
    }
    # Microsoft's second preview feature (Microsoft.Maintenance/ScheduledEventsActivity) is checked:
    # a warning that names the command, and the policy is still set.
    warned = run(vm, ACTIVITY_STATE="NotRegistered")
    assert warned.returncode == 0 and "Microsoft.Maintenance/ScheduledEventsActivity" in warned.stderr
    assert (
        "az feature register --namespace Microsoft.Maintenance --name ScheduledEventsActivity"
        in warned.stderr
    )
    assert " update " in calls.read_text()
    assert re.search(
        r"@allowed\(\[\s*'2020-07-01'\s*''\s*\]\)\nparam scheduledEventsApiVersion string = '2020-07-01'",
        module,
    )
    # Nothing changes without the preview feature, or for a VM whose availability set holds the policy.
    refused = run(vm, FEATURE_STATE="NotRegistered")
    assert refused.returncode == 3 and "SendScheduledEventsPolicy" in refused.stderr
    assert " update " not in calls.read_text()
    refused = run(vm, member)
    assert refused.returncode == 2 and f"give {aset} instead" in refused.stderr
    assert " update " not in calls.read_text()
    # A wrong id anywhere stops everything before the first change (or question).
    for bad in (f"{rg}/disks/d-1", f"{rg}/virtualMachineScaleSets/set-1/virtualMachines/3"):
        refused = run(vm, bad)
        assert refused.returncode == 2 and not calls.exists(), refused.stderr
    assert "give that instead: " + vmss in run(f"{vmss}/virtualMachines/3").stderr


FAKE_AZ = """#!{python}
import json, sys
args = sys.argv[1:]
with open({calls!r}, "a") as f:
    f.write(json.dumps(args) + "\\n")
state = json.load(open({state!r}))
if args[1] == "update" and args[3] in state.get("failUpdate", []):
    sys.exit("ERROR: (AuthorizationFailed) the client does not have authorization")
if args[1] == "show":
    profile = state.get(args[args.index("--ids") + 1])
    print("" if profile is None else json.dumps(profile))
"""


def test_vm_application_is_added_to_existing_vms_keeping_their_other_applications(tmp_path: Path) -> None:
    """Issue 13: deploy/enable_vm_application.py adds the application version to VMs and scale sets
    deployed from elsewhere: their other applications stay, an older version of ours is replaced, a
    model without an applicationProfile gets the whole block, and one wrong id stops everything before
    the first change. Run against a stand-in `az` that answers `show` from a file and records every
    call (the Azure CLI cannot reach Azure from this machine)."""
    script = ROOT / "deploy" / "enable_vm_application.py"
    sub = "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg/providers/Microsoft.Compute"
    app = f"{sub}/galleries/g1/applications/se-bridge"
    other = {"packageReferenceId": f"{sub}/galleries/g1/applications/monitoring/versions/2.0.0", "order": 1}
    vm, vm_bare, vmss = (
        f"{sub}/virtualMachines/vm-1",
        f"{sub}/virtualMachines/vm-2",
        f"{sub}/virtualMachineScaleSets/s-1",
    )
    state = tmp_path / "state.json"
    state.write_text(json.dumps({
        vm: {"galleryApplications": [other, {"packageReferenceId": f"{app}/versions/0.9.0"}]},
        vm_bare: None,
        vmss: {"galleryApplications": []},
    }))  # fmt: skip
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "az"
    fake.parent.mkdir()
    fake.write_text(FAKE_AZ.format(python=sys.executable, calls=str(calls), state=str(state)))
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    version = f"{app}/versions/1.0.0"
    identity = (
        f"{sub.replace('Microsoft.Compute', 'Microsoft.ManagedIdentity')}/userAssignedIdentities/se-agent"
    )
    run = [sys.executable, str(script), "--version-id", version, "--update-instances", "--identity", identity]
    done = subprocess.run([*run, vm, vm_bare, vmss], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    updates = [json.loads(line) for line in calls.read_text().splitlines()]
    updates = [c for c in updates if c[1] != "show"]
    ours = {"packageReferenceId": version, "treatFailureAsDeploymentFailure": True}
    sets = {c[3]: c[c.index("--set") + 1] for c in updates if c[1] == "update"}
    assert sets[vm] == "applicationProfile.galleryApplications=" + json.dumps([other, ours])
    assert sets[vm_bare] == "applicationProfile=" + json.dumps({"galleryApplications": [ours]})
    assert sets[vmss] == "virtualMachineProfile.applicationProfile.galleryApplications=" + json.dumps([ours])
    assert ["vmss", "update-instances", "--ids", vmss, "--instance-ids", "*", "--output", "none"] in updates
    # The agents' identity first, on each (assign adds to the identities a VM has, never replaces).
    for group, resource in (("vm", vm), ("vm", vm_bare), ("vmss", vmss)):
        assign = [
            group,
            "identity",
            "assign",
            "--ids",
            resource,
            "--identities",
            identity,
            "--output",
            "none",
        ]
        update = next(c for c in updates if c[1] == "update" and c[3] == resource)
        assert updates.index(assign) < updates.index(update)
    # Already there: nothing is written.
    state.write_text(json.dumps({vm: {"galleryApplications": [other, ours]}}))
    calls.unlink()
    done = subprocess.run([*run, vm], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "already set" in done.stdout
    # (az vm update reads the model itself when it writes: the identity assigned meanwhile stays)
    called = [json.loads(line)[1:3] for line in calls.read_text().splitlines()]
    assert called == [["show", "--ids"], ["identity", "assign"]]
    # Azure refuses one resource midway (no rights on it): the run stops there with exit 1 and says
    # which command failed; what was done before is listed (the output names each resource).
    state.write_text(json.dumps({vm: None, vm_bare: None, "failUpdate": [vm_bare]}))
    calls.unlink()
    failed = subprocess.run([*run, vm, vm_bare, vmss], env=env, capture_output=True, text=True, check=False)
    assert failed.returncode == 1 and f"application set: {vm}" in failed.stdout, failed
    assert "az vm update failed" in failed.stderr and "AuthorizationFailed" in failed.stderr
    assert not [c for c in map(json.loads, calls.read_text().splitlines()) if vmss in c]  # stopped there
    # A wrong id anywhere, or a version that is not one, stops everything before the first call.
    calls.unlink()
    for bad in ([vm, f"{sub}/virtualMachineScaleSets/s-1/virtualMachines/3"], [vm, f"{sub}/disks/d-1"]):
        refused = subprocess.run([*run, *bad], env=env, capture_output=True, text=True, check=False)
        assert refused.returncode == 2 and not calls.exists(), refused.stderr
    for wrong in (["--version-id", f"{app}/versions/latest"], ["--version-id", version, "--identity", vm]):
        refused = subprocess.run(
            [sys.executable, str(script), *wrong, vm], env=env, capture_output=True, text=True
        )
        assert refused.returncode == 2 and not calls.exists(), refused.stderr


def test_the_fleet_policy_deploys_the_extension_template_it_checks_for(lint_report: dict[str, Any]) -> None:
    """Issue 13: the DeployIfNotExists policy deploys deploy/vm-extension.bicep (as a template spec)
    with parameters that template declares, checks for the Run Command that template creates, and
    carries no secret (policy parameters are readable)."""
    policy = (ROOT / "deploy" / "policy" / "se-bridge-policy.bicep").read_text()
    nested = policy[policy.index("templateLink: {") :]
    given = set(re.findall(r"^ {24}(\w+): \{$", nested, re.M))
    extension = lint_report["files"]["deploy/vm-extension.bicep"]
    assert given == {"osType", "vmName", "location", "eventHubsNamespaceFqdn", "agentIdentityClientId",
                     "wheelUri", "agentSettings", "installWith"}  # fmt: skip
    assert given <= set(extension["params"])
    assert {"eventHubsNamespaceFqdn", "agentIdentityClientId"} <= given  # its required ones
    run_command = re.search(
        r"resource vmRunCommand .*?name: '([^']+)'",
        (ROOT / "deploy" / "vm-extension.bicep").read_text(),
        re.S,
    )
    assert run_command and f"name: '{run_command.group(1)}'" in policy
    assert "type: 'Microsoft.Compute/virtualMachines/runCommands'" in policy
    for path in ("deploy/policy/se-bridge-policy.bicep", POLICY_ASSIGNMENT):
        assert (
            lint_report["files"][path]["secure_params"] == [] and lint_report["files"][path]["errors"] == []
        )


def test_the_install_policy_can_read_the_template_spec_it_deploys(lint_report: dict[str, Any]) -> None:
    """Issue 25: the remediation deploys from a template spec with the assignment's identity, which
    held Virtual Machine Contributor on the VMs' group only: the deployment failed reading a spec kept
    elsewhere. It now gets Template Spec Reader on that one spec, found from the version id the
    policy is given (the Bicep's split of the id is replayed here)."""
    policy = (ROOT / "deploy" / "policy" / "se-bridge-policy.bicep").read_text()
    version_id = (
        "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg-se-bridge/providers/"
        "Microsoft.Resources/templateSpecs/se-bridge-vm-extension/versions/1.0"
    )
    parts = version_id.split("/")
    scope = re.search(r"scope: resourceGroup\(specParts\[(\d+)\], specParts\[(\d+)\]\)", policy)
    name = re.search(r"templateSpecName: specParts\[(\d+)\]", policy)
    assert scope and name
    assert (parts[int(scope.group(1))], parts[int(scope.group(2))]) == (parts[2], "rg-se-bridge")
    assert parts[int(name.group(1))] == "se-bridge-vm-extension"
    assert "principalId: assignment.outputs.principalId" in policy
    reader = lint_report["files"]["deploy/policy/template-spec-reader.bicep"]
    assert reader["errors"] == []
    module = (ROOT / "deploy" / "policy" / "template-spec-reader.bicep").read_text()
    assert "'392ae280-861d-42bd-9ea5-08ee6d83b80e'" in module  # Template Spec Reader, built in


def test_the_vm_application_policy_adds_the_version_it_is_given(lint_report: dict[str, Any]) -> None:
    """Issue 13: the `modify` policies (VMs, scale sets; Microsoft's "Govern and enforce compliance
    for VM Applications with Azure Policy") rebuild the version id they are assigned from its parts
    and count a VM that has any version of the application as compliant; what they add is the
    entry deploy/enable_vm_application.py writes. The Bicep's split of the id is replayed here."""
    policy = (ROOT / "deploy" / "policy" / "se-bridge-vmapp-policy.bicep").read_text()
    version_id = (
        "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg-platform/providers/"
        "Microsoft.Compute/galleries/sebridgegallery1/applications/se-bridge/versions/1.2.3"
    )
    parts = version_id.split("/")
    given = {name: parts[int(i)] for name, i in re.findall(r"(\w+): \{\n\s+value: idParts\[(\d+)\]", policy)}
    assert set(given) == {
        "subscriptionId",
        "resourceGroup",
        "galleryName",
        "applicationName",
        "applicationVersion",
    }
    concat = re.search(r"packageReferenceId: '\[concat\((.*)\)\]'", policy).group(1)  # type: ignore[union-attr]
    rebuilt = "".join(
        given[re.match(r"parameters\(\\'(\w+)\\'\)", piece).group(1)]
        if piece.startswith("parameters")  # type: ignore[union-attr]
        else piece.strip("\\'")
        for piece in (p.strip() for p in concat.split(", "))
    )
    assert rebuilt == version_id
    assert "treatFailureAsDeploymentFailure: true" in policy and "operation: 'add'" in policy
    # Issue 25: an element appended through the [*] alias (the array alias replaces the other
    # applications), and a conflict audited, not denied (modify's default).
    appended = r"operation: 'add'\n\s+field: '\$\{kind.fields\}applicationProfile\.galleryApplications\[\*\]'"
    assert re.search(appended, policy)
    assert "conflictEffect: 'audit'" in policy
    where = "contains: '[concat(\\'/galleries/\\', parameters(\\'galleryName\\'), \\'/applications/\\', "
    assert where + "parameters(\\'applicationName\\'), \\'/\\')]'" in policy  # any version: compliant
    for path in ("deploy/policy/se-bridge-vmapp-policy.bicep", POLICY_ASSIGNMENT):
        assert (
            lint_report["files"][path]["secure_params"] == [] and lint_report["files"][path]["errors"] == []
        )


def test_the_identity_policy_attaches_only_the_agents_identity_to_tagged_resources(
    lint_report: dict[str, Any],
) -> None:
    """Issue 13: the agents' identity reaches tagged VMs and scale sets by policy. Unlike Microsoft's
    built-in (no filter, Contributor on the subscription), only resources tagged se-bridge=enabled,
    with Virtual Machine Contributor on the group and Managed Identity Operator on that one identity;
    the identities a resource has are kept (read 'Full', written back with this one added), and a
    resource with exactly one user-assigned identity is left alone (its software may rely on IMDS's
    default identity)."""
    policy = (ROOT / "deploy" / "policy" / "se-bridge-identity-policy.bicep").read_text()
    assert "field: 'tags[se-bridge]'\n            equals: 'enabled'" in policy
    role_ids = set(re.findall(r"var \w+ = '([0-9a-f-]{36})'", policy))
    assert role_ids == {"9980e02c-c2be-4d73-94e8-173b1dc7cf3c", "f1a07417-d97a-45cb-824c-7a7467783830"}
    assert "b24988ac-6180-42a0-ab88-20f7382dd24c" not in policy  # no Contributor anywhere
    assert "containsKey: '[parameters(\\'agentIdentityResourceId\\')]'" in policy
    single = "value: '[string(length(field(\\'identity.userAssignedIdentities\\')))]'"
    assert single + "\n                    equals: '1'" in policy
    assert "\\'Full\\')]'" in policy and "union(parameters(\\'userAssignedIdentities\\')" in policy
    assert "\\'SystemAssigned,UserAssigned\\'" in policy  # a system-assigned identity stays
    operator = (ROOT / "deploy" / "policy" / "identity-operator.bicep").read_text()
    assert "scope: identity" in operator
    for path in ("deploy/policy/se-bridge-identity-policy.bicep", "deploy/policy/identity-operator.bicep"):
        assert (
            lint_report["files"][path]["secure_params"] == [] and lint_report["files"][path]["errors"] == []
        )


def test_secrets_reach_only_protected_settings(lint_report: dict[str, Any]) -> None:
    entry = lint_report["files"]["deploy/vm-extension.bicep"]
    assert set(entry["secure_params"]) == {"decisionKeys", "secretEnvironment", "secretFiles", "pipIndexUrl"}
    flows = entry["secret_flows"]
    assert {f["parameter"] for f in flows} == set(entry["secure_params"])
    for flow in flows:
        assert ".protectedSettings." in flow["to"] or ".protectedParameters." in flow["to"], flow
    targets = {f["to"].split(" ")[1] for f in flows}
    assert targets == {"vmExtension", "vmssExtension", "vmRunCommand"}
    # Issue 13: never into a command line (Windows' commandToExecute is one: process-creation
    # auditing records it); Windows installs read their secrets from Key Vault (windowsSecretsUri).
    protected = ("protectedSettings.script", "protectedParameters.[].value")
    assert all(f["to"].endswith(protected) for f in flows), flows
    text = (ROOT / "deploy" / "vm-extension.bicep").read_text()
    command = re.search(r"^var windowsCommand = (.*)$", text, re.M)
    assert command and "-SecretsB64" not in command.group(1) and "secretsB64" not in command.group(1)


def test_bicep_lint_catches_mistakes(tmp_path: Path) -> None:
    """The checker itself: each kind of mistake in a small template is reported."""
    (tmp_path / "child.bicep").write_text(
        "param required string\n@secure()\nparam token string = ''\noutput real string = required\n"
        "output tokenLength int = length(token)\n"
    )
    (tmp_path / "main.bicep").write_text(
        """param vmName string
param unused string = 'x'
@secure()
param key string
var wrapped = base64('k=${key}')

resource vm 'Microsoft.Compute/virtualMachines@2024-07-01' existing = {
  name: vmName
}

resource ext 'Microsoft.Compute/virtualMachines/extensions@2024-07-01' = {
  parent: vm
  name: 'se-${undeclared}'
  location: locaton
  properties: {
    settings: {
      commandToExecute: wrapped
    }
    protectedSettings: {
      script: loadTextContent('missing.sh')
    }
  }
}

module child './child.bicep' = {
  name: 'child'
  params: {
    bogus: key
  }
}

output leaked string = '${child.outputs.nothere}${wrapped}'
"""
    )
    code, report = run_lint(tmp_path / "main.bicep", tmp_path / "child.bicep")
    assert code == 1
    errors = "\n".join(report["files"][str(tmp_path / "main.bicep")]["errors"])
    for expected in (
        "'undeclared' is not a declared",
        "'locaton' is not a declared",
        "parameter 'unused' is declared but never used",
        "load_text_content of a missing file",
        "module child has no output 'nothere'",
        "child.bicep has no parameter 'bogus'",
        "required parameter 'required' of child.bicep is not given",
        "secure parameter 'key' flows into Microsoft.Compute/virtualMachines/extensions ext at "
        "properties.settings.commandToExecute",
        "secure parameter 'key' flows into module child at params.bogus",
        "secure parameter 'key' flows into output 'leaked'",
    ):
        assert expected in errors
    assert "protectedSettings" not in errors.replace("secrets belong in protectedSettings", "")


def test_event_hubs_retention_and_partitions_respect_each_tier() -> None:
    """Issue 13: Standard keeps messages at most 7 days, Premium 90; the template takes one value per
    tier, each bounded by its tier's limit, so a Standard namespace cannot be asked for 90 days and
    fail halfway. Partition counts are fixed after creation on Standard: the description says so."""
    main = (ROOT / "infra" / "main.bicep").read_text()

    def bounds(name: str) -> tuple[int, int]:
        found = re.search(r"@minValue\((\d+)\)\n@maxValue\((\d+)\)\nparam " + name + r" int", main)
        assert found, name
        return int(found.group(1)), int(found.group(2))

    assert bounds("standardRetentionDays") == (1, 7) and bounds("premiumRetentionDays") == (1, 90)
    selection = "eventHubsSku == 'Standard' ? standardRetentionDays : premiumRetentionDays"
    assert f"var retentionDays = {selection}" in main
    assert "param retentionDays" not in main
    assert "cannot change after the hub is created" in main


def test_the_decisions_hub_has_the_consumer_groups_the_fleet_approvers_read_with() -> None:
    """Issue 19: the owners share ``se-bridge-approver`` (the fleet approver's --source spec), and each
    instance's standby reads every partition in the group the source derives from it; a group the hub
    lacks would fail every standby read. Standard allows 20 consumer groups per hub."""
    from bridge.streams.eventhubs import standby_group

    main = (ROOT / "infra" / "main.bicep").read_text()
    block = re.search(r"decisionsConsumerGroups: \[(.*?)\]", main, re.S)
    assert block, "decisionsConsumerGroups"
    groups = re.findall(r"'([^']+)'", block.group(1))
    source = re.search(r"var fleetDecisionsSpec = '[^']*consumer_group=([^&']+)", main)
    assert source and source.group(1) in groups
    assert standby_group(source.group(1)) in groups and len(groups) <= 20


def test_azures_channel_reaches_the_hub_the_azure_channel_service_reads(lint_report: dict[str, Any]) -> None:
    """Issue 25: the system topic is the subscription's MaintenanceResources (location global), its
    event subscription delivers only ScheduledEventEmitted to the module's hub with the topic's own
    identity (Event Hubs Data Sender on that hub alone, granted before the subscription is created);
    the service's --source spec names that hub and a consumer group the module creates, and parses
    as a source spec without a secret; the reconciliation's events reader has its group on the records
    hub (bridge.streams.topology: <group>-fleet)."""
    from bridge.streams import topology
    from bridge.streams.eventhubs import parse_source_spec

    module = (ROOT / "infra" / "modules" / "azure-channel.bicep").read_text()
    assert lint_report["files"]["infra/modules/azure-channel.bicep"]["errors"] == []
    assert "topicType: topicType" in module and "location: 'global'" in module
    assert "var topicType = 'Microsoft.ResourceNotifications.MaintenanceResources'" in module
    assert "source: subscription().id" in module
    assert re.search(r"includedEventTypes: \[\s*eventType\s*\]", module)
    assert "'Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted'" in module
    assert re.search(r"deliveryWithResourceIdentity: \{\s*identity: \{\s*type: 'SystemAssigned'", module)
    assert re.search(r"dependsOn: \[[^\]]*\btopicSends\b", module)
    sender = re.search(r"resource topicSends [^{]*\{(.*?)\n\}", module, re.S)
    assert sender and "scope: hub" in sender.group(1) and "roles.eventHubsDataSender" in sender.group(1)
    main = (ROOT / "infra" / "main.bicep").read_text()
    spec = re.search(r"var azureChannelSpec = '([^']+)'", main)
    assert spec, "azureChannelSourceSpec"
    filled = re.sub(r"\$\{[^}]+\}", "x", spec.group(1)).replace(
        "eventhubs://x/", "eventhubs://ns.servicebus.windows.net/"
    )
    filled = filled.replace(
        "checkpoint_url=xx", "checkpoint_url=https://acct.blob.core.windows.net/checkpoints"
    )
    filled = filled.replace("client_id=x", "client_id=0f8fad5b-d9cb-469f-a165-70867728950e")
    hub, source = parse_source_spec(filled)
    default_hub = re.search(r"param hubName string = '([^']+)'", module)
    default_group = re.search(r"param consumerGroup string = '([^']+)'", module)
    assert default_hub and default_group
    assert (hub.hub, source.consumer_group) == (default_hub.group(1), default_group.group(1))
    assert source.has_store and hub.credential == "managed"
    reader_group = topology.events_group("eventhubs://ns/se-records", "se-bridge-azure-channel", Path("/x"))
    assert f"'{reader_group}'" in main and "deployAzureChannel ? [" in main


def test_azure_monitor_tables_rule_and_sink_share_one_layout(lint_report: dict[str, Any]) -> None:
    """Issue 26: the tables, the rule's stream declarations and data flows, and the sink's streams all
    come from schemas/logs-ingestion.v1.json; column names are Log Analytics-legal (no reserved name,
    at most 45 characters; a table name too); the rule is Direct, the role is Monitoring Metrics
    Publisher on the rule; the agents' sink spec main.bicep outputs parses as a sink."""
    from bridge.sinks import create_sink
    from bridge.sinks.logsingestion import COLUMNS, DEFAULT_STREAMS, LogsIngestionSink, rows_of

    layout = json.loads((ROOT / "schemas" / "logs-ingestion.v1.json").read_text())
    reserved = {"_resourceid", "id", "_subscriptionid", "tenantid", "type", "uniqueid", "title"}
    assert all(c["name"].lower() not in reserved and len(c["name"]) <= 45 for c in layout["columns"])
    assert all(s["table"].endswith("_CL") and len(s["table"]) <= 45 for s in layout["streams"].values())
    assert {s for s in DEFAULT_STREAMS.values()} == set(layout["streams"])
    row = rows_of({"recordId": "r", "observedAt": "2026-11-25T10:00:00Z", "recordType": "scheduledEvents"})[0]
    assert set(row) <= set(COLUMNS)
    module = (ROOT / "infra" / "modules" / "monitor.bicep").read_text()
    assert lint_report["files"]["infra/modules/monitor.bicep"]["errors"] == []
    assert "loadJsonContent('../../schemas/logs-ingestion.v1.json')" in module and "kind: 'Direct'" in module
    for stream in layout["streams"]:
        assert f"'{stream}': {{" in module
    assert module.count("outputStream: 'Custom-${layout.streams[stream].table}'") == 2
    assert "'3913510d-42f4-4e42-8a64-420c390055eb'" in module and "scope: rule" in module
    main = (ROOT / "infra" / "main.bicep").read_text()
    spec = re.search(r"output agentMonitorSinkSpec string = deployAzureMonitor \? '(.+)' : ''$", main, re.M)
    assert spec
    filled = spec.group(1).replace("${replace(azureMonitor.outputs.logsIngestionEndpoint, 'https://', '')}",
                                   "se-dcr-abcd.westeurope-1.ingest.monitor.azure.com")  # fmt: skip
    filled = filled.replace("${azureMonitor.outputs.immutableId}", "dcr-0123456789abcdef0123456789abcdef")
    filled = filled.replace("${identities.outputs.agent.clientId}", "0f8fad5b-d9cb-469f-a165-70867728950e")
    sink = create_sink(filled)
    assert isinstance(sink, LogsIngestionSink) and sink.credential_kind == "managed"


def test_azures_channel_reuses_an_existing_system_topic_and_keeps_its_dead_letters(
    lint_report: dict[str, Any],
) -> None:
    """Issue 34: Azure allows one system topic per source, so a second deployment in a subscription
    failed (the module always created one): an existing topic is named instead, and nothing creates
    another. Completed and Canceled exist only on this channel: a delivery Event Grid gives up on (30
    attempts, 24 h) is dead-lettered to a blob container the topic's identity alone may write."""
    module = (ROOT / "infra" / "modules" / "azure-channel.bicep").read_text()
    assert lint_report["files"]["infra/modules/azure-channel.bicep"]["errors"] == []
    topics = re.findall(
        r"resource (\w+) 'Microsoft\.EventGrid/systemTopics@[^']+'( existing)? = (if \([^)]*\) )?", module
    )
    created = [t for t in topics if not t[1]]
    assert len(created) == 1 and created[0][2] == "if (createTopic) ", topics
    assert "var createTopic = empty(existingSystemTopicName)" in module
    assert re.search(r"param existingSystemTopicName string = ''", module)
    main = (ROOT / "infra" / "main.bicep").read_text()
    assert "existingSystemTopicName: existingMaintenanceSystemTopicName" in main
    assert "param existingMaintenanceSystemTopicName string = ''" in main
    subscription = re.search(r"resource toHub [^{]*\{(.*?)\n\}", module, re.S)
    assert subscription
    body = subscription.group(1)
    assert re.search(r"deadLetterWithResourceIdentity: \{\s*identity: \{\s*type: 'SystemAssigned'", body)
    assert "endpointType: 'StorageBlob'" in body and "blobContainerName: deadLetters.name" in body
    assert re.search(r"dependsOn: \[[^\]]*\btopicDeadLetters\b", body)
    writer = re.search(r"resource topicDeadLetters [^{]*\{(.*?)\n\}", module, re.S)
    assert writer and "scope: deadLetters" in writer.group(1)
    assert "roles.storageBlobDataContributor" in writer.group(1) and "topicPrincipalId" in writer.group(1)
    assert "deadLetterAccountName: storage.outputs.accountName" in main


def test_event_grid_can_deliver_to_a_namespace_whose_public_access_is_off() -> None:
    """Issue 34: the Event Hubs network rule set (with trustedServiceAccessEnabled, how Event Grid's
    deliveries of Azure's channel are let in) existed only when subnet ids were given: with public
    access Disabled and private endpoints alone, Event Grid could not deliver."""
    module = (ROOT / "infra" / "modules" / "eventhubs.bicep").read_text()
    rules = re.search(r"resource networkRules '[^']+' = if \((.*?)\) \{(.*?)\n\}", module, re.S)
    assert rules, "the network rule set"
    condition, body = rules.groups()
    assert "publicNetworkAccess == 'Disabled'" in condition and "!empty(allowedSubnetIds)" in condition
    assert "trustedServiceAccessEnabled: true" in body and "defaultAction: 'Deny'" in body


CONSOLE_DEPLOYMENT = {
    "namespaceFqdn": "sebridge-ehns-abc.servicebus.windows.net", "eventsHubName": "se-records",
    "decisionsHubName": "se-decisions", "consumerGroup": "se-bridge-console",
    "credential": "credential=managed&client_id=00000000-0000-0000-0000-000000000001",
    "decisionKeyId": "console", "keyRefName": "console-key", "port": "8720",
    "approverRole": "Maintenance.Approve",
    "oidcIssuer": "https://login.microsoftonline.com/00000000-0000-0000-0000-0000000000aa/v2.0",
    "entraClientId": "11111111-2222-3333-4444-555555555555",
    "publicHost": "se-console.calmwave-1a2b3c.westeurope.azurecontainerapps.io",
}  # fmt: skip


def console_template_argv(**deployment: str) -> list[str]:
    """The console container's command line in infra/modules/console.bicep, its interpolations filled
    in as a deployment would (``deployment`` overrides CONSOLE_DEPLOYMENT's values)."""
    values = {**CONSOLE_DEPLOYMENT, **deployment}
    module = (ROOT / "infra" / "modules" / "console.bicep").read_text()
    block = re.search(r"\n          args: \[\n(.*?)\n          \]", module, re.S)
    assert block, "the container's args"
    argv = []
    for line in (raw.strip() for raw in block.group(1).splitlines()):
        if line.startswith("'"):
            argv.append(re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], line.strip("'")))
        else:
            argv.append(values[line])  # a bare parameter
    return argv


def test_the_console_container_starts_with_flags_the_console_accepts(tmp_path: Path) -> None:
    """Issue 20: the container's command line in infra/modules/console.bicep, with its interpolations
    filled in as a deployment would, goes through the console's own parser and configuration: every
    flag exists, entra mode has its approver role, both specs are valid Event Hubs specs (managed
    identity, no secret), the events reader has its consumer group and no checkpoint store (every
    replica reads everything), the key is a file (the Key Vault secret volume), and main.bicep creates
    that consumer group on the records hub."""
    from bridge.cli import build_parser
    from bridge.console.config import load_console_config
    from bridge.sinks.eventhubs import parse_eventhubs_spec
    from bridge.streams import topology
    from bridge.streams.eventhubs import parse_source_spec

    module = (ROOT / "infra" / "modules" / "console.bicep").read_text()
    deployment = CONSOLE_DEPLOYMENT
    argv = console_template_argv()
    assert argv[0] == "console"
    args = build_parser("console").parse_args(argv)
    config = load_console_config(args, environ={})
    assert config.auth == "entra" and config.approver_role == ("Maintenance.Approve",)
    # issue 31: the person is proven from the ID token, and only the app's own name is served
    assert config.oidc_issuer == deployment["oidcIssuer"]
    assert config.oidc_audience == deployment["entraClientId"]
    assert config.public_host == (deployment["publicHost"],)
    (events,) = config.events_source
    hub, _own = parse_source_spec(events)
    assert hub.credential == "managed" and hub.hub == "se-records"
    topology.check_events_reader(events)  # no checkpoint store
    assert "consumer_group=se-bridge-console" in events
    sink = parse_eventhubs_spec(config.sink)
    assert sink.credential == "managed" and sink.hub == "se-decisions"
    assert config.key == "console=/mnt/se-bridge-keys/console-key"
    mount = re.search(r"mountPath: '([^']+)'", module)
    assert mount and config.key.partition("=")[2].startswith(mount.group(1) + "/")
    main = (ROOT / "infra" / "main.bicep").read_text()
    assert re.search(r"deployConsole \? \[\n\s+'se-bridge-console'", main), "the console's consumer group"
    assert "consumerGroup: 'se-bridge-console'" in main


def test_the_console_starts_from_its_container_command_line(tmp_path: Path) -> None:
    """Issue 34: every central service starts from the configuration its template gives it. The
    console's container command line (infra/modules/console.bicep) runs here as the container would,
    only its listener, its state directory and its key file (Azure mounts the Key Vault secret) put
    under the test's directory; Event Hubs and Entra ID cannot be reached from here: it starts, is
    healthy, refuses an unsigned person, and keeps running."""
    import requests
    from brokers import free_port
    from procs import PY, stop_all, wait_until

    keys = tmp_path / "keys"
    keys.mkdir()
    subprocess.run([PY, "-m", "bridge", "keygen", "console"], cwd=keys, check=True, capture_output=True)
    port = free_port()
    argv = console_template_argv(port=str(port), keyRefName="console-key")
    argv = [a.replace("/mnt/se-bridge-keys/console-key", str(keys / "console.key")) for a in argv]
    argv = [a.replace("/tmp/se-bridge-console", str(tmp_path / "state")) for a in argv]
    argv = [f"127.0.0.1:{port}" if a == f"0.0.0.0:{port}" else a for a in argv]
    log = open(tmp_path / "console.log", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([PY, "-m", "bridge", *argv], stdout=subprocess.DEVNULL, stderr=log)
    base = f"http://127.0.0.1:{port}"
    host = {"Host": CONSOLE_DEPLOYMENT["publicHost"]}

    def healthy() -> bool:
        try:
            return (
                requests.get(base + "/healthz", headers=host, timeout=2, proxies={"http": ""}).status_code
                == 200
            )
        except requests.RequestException:
            return False

    try:
        wait_until(healthy, 60, what="the console's /healthz from its container command line")
        fleet = requests.get(base + "/api/fleet", headers=host, timeout=5, proxies={"http": ""})
        assert fleet.status_code == 401  # no proven person (entra: an ID token from the front door)
        # It cannot reach its events stream: it says so (not ready) and keeps running.
        ready = requests.get(base + "/readyz", headers=host, timeout=5, proxies={"http": ""})
        assert ready.status_code == 503 and "events stream" in ready.text
        assert proc.poll() is None, (tmp_path / "console.log").read_text()[-2000:]
    finally:
        stop_all([proc])
        log.close()


def test_bicep_lint_knows_the_documented_limits(tmp_path: Path) -> None:
    """Issue 13: inline code of a Consumption workflow over 1,024 characters, two Custom Script
    extensions for one VM, and a Standard hub keeping messages longer than 7 days fail in Azure; the
    lint says so before anything is deployed."""
    (tmp_path / "big.js").write_text("// " + "x" * 1100 + "\n")
    (tmp_path / "small.js").write_text("return 1;\n")
    (tmp_path / "main.bicep").write_text(
        """param location string = 'westeurope'

var cse = {
  publisher: 'Microsoft.Azure.Extensions'
  type: 'CustomScript'
  typeHandlerVersion: '2.1'
}

resource vm 'Microsoft.Compute/virtualMachines@2024-07-01' existing = {
  name: 'vm1'
}

resource bootstrap 'Microsoft.Compute/virtualMachines/extensions@2024-07-01' = {
  parent: vm
  name: 'bootstrap'
  location: location
  properties: cse
}

resource agent 'Microsoft.Compute/virtualMachines/extensions@2024-07-01' = {
  parent: vm
  name: 'se-bridge'
  location: location
  properties: {
    publisher: 'Microsoft.Azure.Extensions'
    type: 'CustomScript'
    typeHandlerVersion: '2.1'
  }
}

resource monitor 'Microsoft.Compute/virtualMachines/extensions@2024-07-01' = {
  parent: vm
  name: 'monitor'
  location: location
  properties: {
    publisher: 'Microsoft.Azure.Monitor'
    type: 'AzureMonitorLinuxAgent'
    typeHandlerVersion: '1.0'
  }
}

var actions = {
  Big: {
    type: 'JavaScriptCode'
    inputs: {
      code: loadTextContent('big.js')
    }
  }
  Small: {
    type: 'JavaScriptCode'
    inputs: {
      code: loadTextContent('small.js')
    }
  }
  ViaVariable: {
    type: 'JavaScriptCode'
    inputs: {
      code: longCode
    }
  }
}

var longCode = '@LONG@'


resource workflow 'Microsoft.Logic/workflows@2019-05-01' = {
  name: 'wf'
  location: location
  properties: {
    definition: {
      actions: actions
    }
  }
}

@maxValue(90)
param loose int = 7

@maxValue(7)
param tight int = 7

resource ns 'Microsoft.EventHub/namespaces@2024-01-01' = {
  name: 'ns'
  location: location
  sku: {
    name: 'Standard'
  }
}

resource literal 'Microsoft.EventHub/namespaces/eventhubs@2024-01-01' = {
  parent: ns
  name: 'literal'
  properties: {
    messageRetentionInDays: 30
  }
}

resource viaLoose 'Microsoft.EventHub/namespaces/eventhubs@2024-01-01' = {
  parent: ns
  name: 'loose'
  properties: {
    messageRetentionInDays: loose
  }
}

resource viaTight 'Microsoft.EventHub/namespaces/eventhubs@2024-01-01' = {
  parent: ns
  name: 'tight'
  properties: {
    messageRetentionInDays: tight
  }
}
"""
    )
    main = tmp_path / "main.bicep"
    main.write_text(main.read_text().replace("@LONG@", "x" * 1030))  # a variable's literal code
    code, report = run_lint(tmp_path / "main.bicep")
    assert code == 1
    errors = report["files"][str(tmp_path / "main.bicep")]["errors"]
    inline, via_variable = [e for e in errors if "inline code" in e]  # small.js fits
    assert via_variable.endswith("inline code of 1030 characters in workflow workflow: a Consumption "
                                 "Logic App takes at most 1024 (Standard 100,000)")  # fmt: skip
    assert inline.endswith(
        "inline code of 1104 characters in workflow workflow: a Consumption Logic App takes at most 1024 "
        "(Standard 100,000)"
    )
    assert [e for e in errors if "Custom Script" in e] == [
        "2 Custom Script extensions for vm (bootstrap, agent): a VM or scale set takes one"
    ]
    retention = [e for e in errors if "messageRetentionInDays" in e]
    assert [e.split(":")[0] for e in retention] == ["hub literal", "hub viaLoose"]  # viaTight is bounded
    assert "may be 30, but its namespace's tier keeps messages at most 7 days" in retention[0]


def test_bicep_lint_knows_the_vm_application_limits(tmp_path: Path) -> None:
    """A gallery application version's commands are at most 4,096 characters and its name is
    Major.Minor.Patch (Azure Compute Gallery "VM Applications overview"); a command built from
    variables is measured as the platform gets it. infra/modules/vm-application.bicep passes."""
    module = (ROOT / "infra" / "modules" / "vm-application.bicep").read_text()
    bad = module.replace("param version string\n", "var version = '1.0'\n").replace(
        "var removeCommand = 'tar", "var removeCommand = '" + "x" * 4100 + " tar"
    )
    (tmp_path / "vm-application.bicep").write_text(bad)
    code, report = run_lint(tmp_path / "vm-application.bicep")
    errors = report["files"][str(tmp_path / "vm-application.bicep")]["errors"]
    assert code == 1 and len(errors) == 2, errors
    assert errors[0] == "version applicationVersion: name 1.0 is not Major.Minor.Patch"
    assert errors[1].endswith("remove command of 4159 characters in applicationVersion: a VM Application "
                              "takes at most 4096")  # fmt: skip
    code, report = run_lint(ROOT / "infra" / "modules" / "vm-application.bicep")
    assert report["files"][str(ROOT / "infra" / "modules" / "vm-application.bicep")]["errors"] == []


# -- checkov -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("directory", sorted(EXPECTED_SKIPS))
def test_checkov_finds_no_failed_check(directory: str) -> None:
    checkov = tools_python().parent / "checkov"
    proc = subprocess.run(
        [str(checkov), "-d", directory, "--skip-download", "--output", "json", "--compact"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE", "LOG_LEVEL": "WARNING"},
    )
    reports = json.loads(proc.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    bicep = [r for r in reports if r["check_type"] == "bicep"]
    assert bicep, f"checkov scanned no Bicep in {directory}: {proc.stdout[:500]} {proc.stderr[-2000:]}"
    failed = [
        (c["check_id"], c["file_path"], c["resource"]) for r in reports for c in r["results"]["failed_checks"]
    ]
    assert failed == []
    assert all(r["summary"]["parsing_errors"] == 0 for r in reports), [
        r["results"]["parsing_errors"] for r in reports
    ]
    assert sum(r["summary"]["passed"] for r in bicep) > 0
    skipped = [c for r in reports for c in r["results"]["skipped_checks"]]
    for check in skipped:
        reason = check["check_result"].get("suppress_comment", "")
        assert check["file_path"].endswith(".bicep"), check["file_path"]
        assert reason != "No comment provided" and len(reason) > 40, (check["check_id"], reason)
    assert {c["check_id"] for c in skipped} == EXPECTED_SKIPS[directory]
    assert proc.returncode == 0, proc.stderr[-2000:]


# -- Azure Data Explorer -----------------------------------------------------------------------------

ADX_TYPES = {  # ADX column type -> the JSON Schema types it can hold
    "string": {"string", "null"},
    "int": {"integer", "null"},
    "long": {"integer", "null"},
    "datetime": {"string"},
    "dynamic": {"object", "array", "null", "string", "integer", "boolean"},
}


def schema_node(schema: dict[str, Any], path: str) -> dict[str, Any]:
    """The JSON Schema that describes ``$.a.b`` (following $refs)."""
    assert path == "$" or path.startswith("$."), path
    node = schema
    for part in [p for p in path[2:].split(".") if p] if path != "$" else []:
        while "$ref" in node:
            node = schema["$defs"][node["$ref"].rsplit("/", 1)[-1]]
        properties = node.get("properties", {})
        assert part in properties, f"{path}: {part!r} is not in the record schema"
        node = properties[part]
    while "$ref" in node:
        node = schema["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def schema_types(node: dict[str, Any]) -> set[str]:
    if "const" in node:
        return {"integer" if isinstance(node["const"], int) else "string"}
    types = node.get("type", [])
    return set(types if isinstance(types, list) else [types])


def test_adx_mapping_matches_the_record_schema() -> None:
    script = (ROOT / "infra" / "adx" / "setup.kql").read_text()
    table = re.search(r"^\.create-merge table SeBridgeRecords \((.*)\)$", script, re.M)
    assert table, "no .create-merge table command"
    columns = dict(tuple(part.strip().split(": ")) for part in table.group(1).split(","))
    mapping_match = re.search(
        r"^\.create-or-alter table SeBridgeRecords ingestion json mapping"
        r' "SeBridgeRecordsMapping" ```(.*)```$',
        script,
        re.M,
    )
    assert mapping_match, "no JSON ingestion mapping"
    mapping = json.loads(mapping_match.group(1))
    assert [m["column"] for m in mapping] == list(columns), "every column mapped once, in table order"
    for entry in mapping:
        node = schema_node(RECORD_SCHEMA, entry["path"])
        assert entry["datatype"] == columns[entry["column"]], entry
        if entry["path"] == "$":
            continue
        types = schema_types(node)
        assert types and types <= ADX_TYPES[entry["datatype"]], (entry, types)
        if entry["datatype"] == "datetime":
            assert node.get("format") == "date-time", entry
    # Every scalar the record has at the top level or in `source`/`vm` is a column of its own.
    mapped = {m["path"] for m in mapping}
    for prop, node in RECORD_SCHEMA["properties"].items():
        if prop == "raw":
            continue
        if "properties" in node:
            assert {f"$.{prop}.{sub}" for sub in node["properties"]} - {"$.vm.hostname"} <= mapped, prop
        else:
            assert f"$.{prop}" in mapped, prop
    # The Bicep data connection uses exactly this table and mapping.
    bicep = (ROOT / "infra" / "modules" / "dataexplorer.bicep").read_text()
    assert "tableName: 'SeBridgeRecords'" in bicep
    assert "mappingRuleName: 'SeBridgeRecordsMapping'" in bicep
    assert "loadTextContent('../adx/setup.kql')" in bicep


def test_mapping_check_rejects_a_path_the_schema_lacks() -> None:
    with pytest.raises(AssertionError, match="not in the record schema"):
        schema_node(RECORD_SCHEMA, "$.vm.vmid")


def test_dashboard_queries_read_fields_the_schemas_define() -> None:
    queries = (ROOT / "infra" / "adx" / "dashboard.kql").read_text()
    code = "\n".join(line for line in queries.splitlines() if not line.lstrip().startswith("//"))
    defs = RECORD_SCHEMA["$defs"]
    event_fields = set(re.findall(r"\bevent\.(\w+)", code))
    change_fields = set(re.findall(r"\bchange\.(\w+)", code))
    assert event_fields and change_fields
    assert event_fields <= set(defs["event"]["properties"]), event_fields - set(defs["event"]["properties"])
    assert change_fields <= set(defs["change"]["properties"]), change_fields - set(
        defs["change"]["properties"]
    )
    script = (ROOT / "infra" / "adx" / "setup.kql").read_text()
    columns = set(re.findall(r"(\w+): (?:string|int|long|datetime|dynamic)", script))
    used_columns = set(
        re.findall(
            r"\b(ObservedAt|RecordType|Vm\w*|Events|Changes|Payload|AgentVersion|ResourceGroup|Location|Zone)\b",
            code,
        )
    )
    assert used_columns - {"Vm"} <= columns
    approval = ROOT / "schemas" / "approval.v1.schema.json"
    payload_fields = set(re.findall(r"\bPayload\.(\w+)", code))
    assert payload_fields
    if approval.exists():
        assert payload_fields <= set(json.loads(approval.read_text())["properties"])


# -- cloud-init --------------------------------------------------------------------------------------


def test_cloud_init_is_valid_yaml_with_the_current_installer() -> None:
    python = tools_python()  # PyYAML comes with checkov
    proc = subprocess.run(
        [
            str(python),
            "-c",
            "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))",
            str(ROOT / "deploy" / "linux" / "cloud-init.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    config = json.loads(proc.stdout)
    assert (ROOT / "deploy" / "linux" / "cloud-init.yaml").read_text().startswith("#cloud-config\n")
    files = {f["path"]: f for f in config["write_files"]}
    installer = files["/usr/local/sbin/se-bridge-install"]
    assert installer["content"] == (ROOT / "deploy" / "linux" / "install.sh").read_text()
    assert installer["permissions"] == "0755"
    assert files["/etc/se-bridge/install/settings.json"]["permissions"] == "0600"
    settings = json.loads(files["/etc/se-bridge/install/settings.json"]["content"])
    assert set(settings) == {"agent", "approver"}
    # Issue 13: custom data carries no secret (Microsoft: it is not for secrets); the approver's key
    # is a Key Vault reference the service reads with the VM's identity.
    assert not any("secrets" in path for path in files)
    (key,) = settings["approver"]["key"]
    assert "=https://<vault>.vault.azure.net/secrets/" in key
    assert "--secrets" not in config["runcmd"][0]
    command = config["runcmd"][0]
    assert command[0] == "/usr/local/sbin/se-bridge-install"
    usage = subprocess.run(
        ["sh", str(ROOT / "deploy" / "linux" / "install.sh"), "--help"], capture_output=True, text=True
    )
    for flag in (a for a in command if a.startswith("--")):
        assert f"  {flag} " in usage.stdout, f"cloud-init passes {flag}, which the installer does not know"


# -- Logic App signer --------------------------------------------------------------------------------


def _signer_module() -> Any:
    import importlib
    import sys

    sys.path.insert(0, str(ROOT / "infra" / "signer"))
    try:
        return importlib.import_module("signer"), importlib.import_module("function_app")
    finally:
        sys.path.pop(0)


def test_the_signer_function_signs_decisions_the_approver_accepts() -> None:
    """Issue 13: the example Logic App's decisions are signed by a Function running the approvers' own
    signing code (its key from Key Vault through an app setting), called through the real
    azure-functions request and response types; what it returns passes the approver's validation."""
    import azure.functions as func

    from bridge.decisions import Decision, DecisionRefused, ValidationPolicy, validate
    from bridge.signing import KeyRing

    signer, function_app = _signer_module()
    key = "k" * 20 + "é-secret-" + "0123456789abcdef" * 4  # longer than a SHA-256 block, non-ASCII
    env = {
        "SE_DECISION_KEY": key + "\n",
        "SE_DECISION_KEY_ID": "logicapp",
        "SE_DECISION_MAX_TTL_SECONDS": "900",
    }
    fields = {
        "decisionId": "la-28957A56-C52D-5E12-BC58-57EBD6129DEF-vm-app-0",
        "eventId": "28957A56-C52D-5E12-BC58-57EBD6129DEF",
        "target": "vm-app-0",
        "issuedBy": "logicapp:sebridge-approve-user-events",
        "ttlSeconds": 900,
        "reason": "user-initiated Reboot ✓",
    }
    (user_function,) = [f.get_user_function() for f in function_app.app.get_functions()]
    old = dict(os.environ)
    os.environ.update(env)
    try:
        answer = user_function(func.HttpRequest("POST", "/api/sign", body=json.dumps(fields).encode()))
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert answer.status_code == 200 and answer.mimetype == "application/json"
    decision = json.loads(answer.get_body())
    policy = ValidationPolicy(KeyRing({"logicapp": key.encode()}), issuers=frozenset({fields["issuedBy"]}))
    assert validate(decision, policy, time.time()) == Decision.of(decision)
    assert decision["decisionId"] == fields["decisionId"] and decision["reason"] == fields["reason"]
    with pytest.raises(DecisionRefused) as refused:
        validate(decision, ValidationPolicy(KeyRing({"logicapp": b"w" * 40})), time.time())
    assert refused.value.reason == "badSignature"
    # Bad requests are refused with 400 and say which field; a Function without a key says so (500)
    # and never echoes what it has.
    bad_ones = [{**fields, "ttlSeconds": 86400}, {**fields, "target": ""}, {**fields, "eventId": 7}, [1]]
    bad_ones += [{**fields, "decisionId": "has a space"}, {**fields, "reason": "r" * 3000}]  # the schema's
    for bad in bad_ones:
        status, body = signer.handle(json.dumps(bad).encode(), env)
        assert status == 400 and "error" in body, bad
    assert signer.handle(b"not json", env)[0] == 400
    status, body = signer.handle(
        json.dumps(fields).encode(), {"SE_DECISION_KEY": "short", "SE_DECISION_KEY_ID": "x"}
    )
    assert status == 500 and "short" not in json.dumps(body)


def test_the_signer_package_carries_the_function_and_the_approvers_code(tmp_path: Path) -> None:
    """What WEBSITE_RUN_FROM_PACKAGE runs: the function, its host.json, and this project under
    .python_packages (the dependencies come from PyPI in a real build; --no-deps here)."""
    import zipfile

    out = tmp_path / "signer.zip"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "infra" / "signer" / "build_package.py"), str(out), "--no-deps"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    names = set(zipfile.ZipFile(out).namelist())
    assert {"function_app.py", "signer.py", "host.json", "requirements.txt"} <= names
    assert ".python_packages/lib/site-packages/bridge/decisions.py" in names
    assert ".python_packages/lib/site-packages/bridge/schemas/decision.v1.schema.json" in names  # checked
    assert json.loads(zipfile.ZipFile(out).read("host.json"))["version"] == "2.0"


def test_the_logic_app_calls_the_signer_and_holds_no_signing_key() -> None:
    """The workflow signs through the Function (function key as a secure workflow parameter) and has
    no inline code and no copy of the HMAC key; the key goes to Key Vault only."""
    workflow = (ROOT / "infra" / "modules" / "logicapp.bicep").read_text()
    assert "JavaScriptCode" not in workflow and "decisionKey" not in workflow
    assert "uri: signUrl" in workflow and "'x-functions-key': '@parameters(\\'signerKey\\')'" in workflow
    signer_bicep = (ROOT / "infra" / "modules" / "signer.bicep").read_text()
    assert "@Microsoft.KeyVault(SecretUri=${signingKey.properties.secretUri})" in signer_bicep
    assert "enablePurgeProtection: true" in signer_bicep and "enableRbacAuthorization: true" in signer_bicep


def test_the_console_gets_id_tokens_from_a_token_store_its_identity_alone_reaches() -> None:
    """Issue 31: the console proves a person from the ID token Container Apps authentication passes,
    which needs the token store; a store reached by SAS would need shared keys on the account."""
    module = (ROOT / "infra" / "modules" / "console.bicep").read_text()
    auth = module[module.index("resource signIn ") :]
    assert re.search(r"tokenStore: \{\n\s+enabled: true\n\s+azureBlobStorage: \{\n\s+blobContainerUri:", auth)
    assert "managedIdentityResourceId: identity.id" in auth and "sasUrlSettingName" not in auth
    role = module[module.index("resource keepsTokens") : module.index("resource signIn ")]
    assert "scope: tokenContainer" in role and "ba92f5b4-2d11-453d-a403-e96b0029c9fe" in module
    main = (ROOT / "infra" / "main.bicep").read_text()
    assert "tokenStoreAccountName: storage.outputs.accountName" in main


def _block(text: str, kind: str, name: str) -> str:
    found = re.search(
        rf"resource {name} '{re.escape(kind)}@[^']+' = (?:\[for [^\n]*|\{{)(.*?)\n\}}\]?\n", text, re.S
    )
    assert found, f"no {kind} {name}"
    return found.group(1)


def test_agents_may_send_only_their_records_stream() -> None:
    """Issue 34: one data collection rule for every sender, Monitoring Metrics Publisher for the
    agents' shared identity: a compromised VM could post to the approvals and findings streams,
    silence the "unapproved" alert fleet-wide or fabricate findings. Now the agents' rule has the
    records stream alone; approvals and findings go through a second rule whose senders are the
    central services."""
    module = (ROOT / "infra" / "modules" / "monitor.bicep").read_text()
    rules = "Microsoft.Insights/dataCollectionRules"
    agents, central = _block(module, rules, "rule"), _block(module, rules, "centralRule")
    assert "agentStreams" in agents and "centralStreams" not in agents
    declared = re.search(r"streamDeclarations: \{(.*?)\n    \}", agents, re.S)
    assert declared and re.findall(r"'(Custom-\w+)'", declared.group(1)) == ["Custom-SeBridgeRecords"]
    assert re.search(r"var agentStreams = \[\s*'Custom-SeBridgeRecords'\s*\]", module)
    assert "centralStreams" in central and "location: workspace.location" in central
    roles = "Microsoft.Authorization/roleAssignments"
    assert "for principalId in agentPrincipalIds" in module and "scope: rule\n" in _block(
        module, roles, "publishers"
    )
    assert "scope: centralRule" in _block(module, roles, "centralPublishers")
    main = (ROOT / "infra" / "main.bicep").read_text()
    wiring = main[main.index("module azureMonitor ") :]
    agents_given = re.search(r"agentPrincipalIds: \[(.*?)\]", wiring, re.S)
    central_given = re.search(r"centralPrincipalIds: (.*?)\n    alertEmails", wiring, re.S)
    assert agents_given and central_given
    assert "agent" in agents_given.group(1) and "approver" not in agents_given.group(1)
    assert "approver" in central_given.group(1) and "agent." not in central_given.group(1)
    assert "azureChannel.principalId" in central_given.group(1)  # Azure's channel writes findings
    assert "output centralMonitorSinkSpec string" in main


def test_alert_rules_look_back_two_days_as_themselves() -> None:
    """Issue 34: both rules looked back only their windowSize (no overrideQueryTimeRange), so a
    silence or an event announced days ahead left nothing to find; they ran as whoever last edited
    them. Now: 2 days (the maximum), a system-assigned identity with Log Analytics Reader on the
    workspace, one alert dimension (Subject: a VM, or a wave past 250); a dead agent's alert is not
    auto-resolved when the VM leaves the 2-day inventory. The queries themselves are evaluated in
    tests/integration/test_kql.py."""
    module = (ROOT / "infra" / "modules" / "monitor.bicep").read_text()
    assert "var queryTimeRange = 'P2D'" in module
    kind = "Microsoft.Insights/scheduledQueryRules"
    for name in ("unapproved", "silent"):
        body = _block(module, kind, name)
        assert "overrideQueryTimeRange: queryTimeRange" in body, name
        assert re.search(r"identity: \{\s*type: 'SystemAssigned'\s*\}", body), name
        assert re.findall(r"name: '(\w+)'\s*operator: 'Include'", body) == ["Subject"], name
        reads = _block(module, "Microsoft.Authorization/roleAssignments", f"{name}Reads")
        assert f"principalId: {name}.identity.principalId" in reads and "scope: workspace" in reads
    assert "autoMitigate: false" in _block(module, kind, "silent")
    assert "'73c42c96-874c-492b-b04d-ab87d138a893'" in module  # Log Analytics Reader
    main = (ROOT / "infra" / "main.bicep").read_text()
    # An empty workspace id failed with an index error; the stand-in names the parameter.
    assert "scope: resourceGroup(workspaceParts[2], workspaceParts[4])" in main
    assert "set-logAnalyticsWorkspaceId" in main and "split(logAnalyticsWorkspaceId, '/')[" not in main


def test_alert_rules_depend_on_the_tables_they_query() -> None:
    """Issue 34: the scheduledQueryRules raced the custom tables (no dependency; Azure validates a
    rule's query at creation), so a first deployment could fail with "Failed to resolve table"."""
    module = (ROOT / "infra" / "modules" / "monitor.bicep").read_text()
    rules = re.findall(
        r"resource (\w+) 'Microsoft\.Insights/scheduledQueryRules@[^']+' = \{(.*?)\n\}", module, re.S
    )
    assert len(rules) == 2
    for name, body in rules:
        assert re.search(r"dependsOn: \[\s*tables\s*\]", body), f"{name} does not depend on the tables"


def test_azure_monitor_resources_keep_the_documented_limits_and_regions() -> None:
    """Issue 34 (lows): the data collection rule must be in the workspace's region (it sends to
    workspaces of its own region only), an action group takes at most 10 receivers of a kind (1 000
    emails), and two deployments in one resource group must not give two workbooks one display name."""
    module = (ROOT / "infra" / "modules" / "monitor.bicep").read_text()
    rule = re.search(
        r"resource rule 'Microsoft\.Insights/dataCollectionRules@[^']+' = \{(.*?)\n\}", module, re.S
    )
    assert rule and re.search(r"\n  location: workspace\.location\n", rule.group(1))
    limits = {"alertEmails": 1000, "alertSms": 10, "alertPush": 10, "alertWebhooks": 10, "alertLogicApps": 10}
    for name, most in limits.items():
        assert re.search(rf"@maxLength\({most}\)\nparam {name} array", module), name
    workbook = re.search(r"resource workbook '[^']+' = \{(.*?)\n\}", module, re.S)
    assert workbook and re.search(r"displayName: '[^']*\$\{ruleName\}[^']*'", workbook.group(1))


def test_the_deploy_scripts_without_the_azure_cli_say_so_in_one_line(tmp_path: Path) -> None:
    """Issue 33: deploy/enable_vm_application.py ended in a traceback and the policy script told
    the user to register an Azure feature when `az` was simply not installed."""
    sub = "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg/providers/Microsoft.Compute"
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}  # no az anywhere
    sh = shutil.which("sh")
    assert sh is not None
    policy = subprocess.run(
        [sh, str(ROOT / "deploy" / "enable-scheduled-events-policy.sh"), f"{sub}/virtualMachines/vm-1"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    app = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "enable_vm_application.py"), "--version-id",
         f"{sub}/galleries/g/applications/se-bridge/versions/1.0.0", f"{sub}/virtualMachines/vm-1"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    for done in (policy, app):
        assert done.returncode != 0
        assert "Traceback" not in done.stderr and "feature" not in done.stderr
        assert "the Azure CLI (az) is not installed or not on PATH" in done.stderr, done.stderr


TYPES_INDEX = ROOT / "infra" / "tools" / "bicep-types-index.json"


def test_every_template_resource_is_checked_against_microsofts_types(
    tmp_path: Path, lint_report: dict[str, Any]
) -> None:
    """Issue 34: the lint checked references, secrets and some limits, not property names, enums or
    read-only properties, and the api-version list was hand-typed. infra/tools/bicep-types-index.json,
    derived from Azure/bicep-types-az (its commit named in the file, regenerated by
    infra/tools/bicep_types_index.py), holds every type@apiVersion the templates use; a property the
    type lacks, a read-only one set, a literal outside an enum or discriminator, an api-version
    Microsoft does not define: each is an error. Found by it on the templates: the registry's
    anonymousPullEnabled does not exist in 2023-07-01 (now 2025-11-01), and the Logic App
    connection's parameterValueSet, Microsoft's documented managed-identity form, is absent from the
    2016-06-01 definition (accepted with Bicep's own `#disable-next-line BCP037`)."""
    index = json.loads(TYPES_INDEX.read_text())
    assert index["source"]["repository"] == "Azure/bicep-types-az"
    assert re.fullmatch(r"[0-9a-f]{40}", index["source"]["commit"])
    used = {r["type"] for f in lint_report["files"].values() for r in f["resources"]}
    assert used <= {k for k, v in index["resources"].items() if v is not None}
    bad = tmp_path / "bad.bicep"
    bad.write_text(
        "param loc string\n"
        "resource rule 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {\n"
        "  name: 'r'\n  location: loc\n  kind: 'LogAlert'\n"
        "  identity: {\n    type: 'Magic'\n  }\n"  # not in the (closed) enum
        "  properties: {\n"
        "    overrideQueryTimeRanges: 'P2D'\n"  # misspelt
        "    isLegacyLogAnalyticsRule: false\n"  # read-only
        "    criteria: {\n      allOf: [\n        {\n          query: 'T'\n"
        "        }\n      ]\n    }\n"
        "  }\n}\n"
        "resource sub 'Microsoft.EventGrid/systemTopics/eventSubscriptions@2025-02-15' = {\n"
        "  name: 's'\n  properties: {\n    destination: {\n"
        "      endpointType: 'EventHubs'\n"  # no such case
        "    }\n"
        "    #disable-next-line BCP037\n"
        "    notInTheSpecButDocumented: true\n"
        "  }\n}\n"
        "resource old 'Microsoft.Insights/scheduledQueryRules@2099-01-01' = {\n"
        "  name: 'o'\n  location: loc\n}\n"
    )
    code, report = run_lint(bad)
    errors = "\n".join(report["files"][str(bad)]["errors"])
    assert code == 1
    assert "properties.overrideQueryTimeRanges: no such property" in errors
    assert "properties.isLegacyLogAnalyticsRule: read-only" in errors
    assert "identity.type: 'Magic' is none of ['None', 'SystemAssigned', 'UserAssigned']" in errors
    assert "properties.destination.endpointType: 'EventHubs' is none of" in errors
    assert "notInTheSpecButDocumented" not in errors
    assert "scheduledQueryRules@2099-01-01 is not in bicep-types-index.json" in errors


def test_the_type_index_is_what_its_generator_makes(tmp_path: Path) -> None:
    """The index is generated, never hand-edited: regenerate it from a two-file stand-in of
    bicep-types-az and check the shape the lint reads (and that it names the commit it came from)."""
    repo = tmp_path / "bicep-types-az"
    folder = repo / "generated" / "monitor" / "microsoft.insights" / "2023-12-01"
    folder.mkdir(parents=True)
    (folder / "types.json").write_text(json.dumps([
        {"$type": "StringType"},
        {"$type": "StringLiteralType", "value": "A"},
        {"$type": "StringLiteralType", "value": "B"},
        {"$type": "UnionType", "elements": [{"$ref": "#/1"}, {"$ref": "#/2"}]},
        {"$type": "ObjectType", "name": "body", "properties": {
            "name": {"type": {"$ref": "#/0"}, "flags": 9},
            "kind": {"type": {"$ref": "#/3"}, "flags": 0},
            "etag": {"type": {"$ref": "#/0"}, "flags": 2}}},
        {"$type": "ResourceType", "name": "Microsoft.Insights/scheduledQueryRules@2023-12-01",
         "body": {"$ref": "#/4"}},
    ]))  # fmt: skip
    template = tmp_path / "t.bicep"
    template.write_text(
        "resource r 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {\n  name: 'x'\n}\n"
    )
    for args in (
        ["init", "-q"],
        ["add", "."],
        ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "t"],
    ):
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    generator = ROOT / "infra" / "tools" / "bicep_types_index.py"
    code = (
        "import runpy, sys, pathlib\n"
        f"module = runpy.run_path({str(generator)!r})\n"
        f"built = module['build'](pathlib.Path({str(repo)!r}), [pathlib.Path({str(template)!r})])\n"
        "print(__import__('json').dumps(built))"
    )
    built = json.loads(
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    )
    body = built["types"][built["resources"]["Microsoft.Insights/scheduledQueryRules@2023-12-01"]]
    assert body["k"] == "o" and body["p"]["etag"]["f"] == 2
    assert built["types"][body["p"]["kind"]["t"]] == {"k": "e", "v": ["A", "B"]}
    assert re.fullmatch(r"[0-9a-f]{40}", built["source"]["commit"])
    shipped = json.loads(TYPES_INDEX.read_text())
    assert set(shipped) == set(built)
