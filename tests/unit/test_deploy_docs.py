"""The deploy docs agree with each other and with the templates (issue 34: the deployment was named
``-n se-bridge`` in one page and ``-n main`` in another, the agent's file ``config.toml`` in one and
``agent.toml`` in another, ``jq`` used but not a prerequisite, and nothing said whether the package is
on PyPI, which several install paths assumed)."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = sorted(DOCS.glob("*.md"))


def test_every_page_names_the_main_deployment_alike() -> None:
    names = {
        (page.name, m.group(1))
        for page in PAGES
        for m in re.finditer(r"az deployment group (?:create|show)[^\n]*?-n (\S+)[^\n]*", page.read_text())
        if "vm-extension" not in m.group(0)
    }
    assert names and {name for _, name in names} == {"se-bridge"}, names
    creates = [
        line
        for page in PAGES
        for line in page.read_text().splitlines()
        if "az deployment group create" in line and "infra/main.bicep" in line
    ]
    assert creates and all(" -n se-bridge " in line for line in creates), creates


def test_the_agents_file_has_one_name() -> None:
    for page in PAGES:
        assert "agent.toml" not in page.read_text(), page.name  # the installers render config.toml


def test_the_prerequisites_cover_what_the_path_uses() -> None:
    deploy = (DOCS / "deploy.md").read_text()
    prerequisites = deploy.split("## 0. Prerequisites", 1)[1].split("\n## ", 1)[0]
    if re.search(r"\bjq\b", deploy.split("## 0. Prerequisites", 1)[1]):
        assert "`jq`" in prerequisites
    assert "not published on PyPI" in prerequisites
    assert "[eventhubs]" in prerequisites and "se-bridge decide" in prerequisites


def test_the_modify_policys_alias_form_is_said_and_how_to_verify_it() -> None:
    """Issue 34: the `modify` policy adds with the `[*]` alias and `conflictEffect: audit`, which is a
    silent no-op where the alias is not Modifiable; Microsoft's sample uses the alias without `[*]`.
    The docs say which form the template uses, why, and how to check it before relying on it."""
    root = Path(__file__).resolve().parents[2]
    policy = (root / "deploy" / "policy" / "se-bridge-vmapp-policy.bicep").read_text()
    assert "field: '${kind.fields}applicationProfile.galleryApplications[*]'" in policy
    assert "conflictEffect: 'audit'" in policy and "Get-AzPolicyAlias" in policy
    deploy = (root / "docs" / "deploy.md").read_text()
    section = deploy[deploy.index("**The alias form, and how to verify it**") :][:2500]
    for needed in ("galleryApplications[*]", "Modifiable", "Get-AzPolicyAlias", "silent no-op",
                   "az provider show --namespace Microsoft.Compute", "conflictEffect"):  # fmt: skip
        assert needed in section, needed


def test_the_central_services_step_names_only_parameters_and_outputs_main_has() -> None:
    """Issue 34: docs/deploy.md walks one path through the central services (step 6c); every
    parameter its command passes is one infra/main.bicep declares, every output it names one it has."""
    root = Path(__file__).resolve().parents[2]
    deploy = (root / "docs" / "deploy.md").read_text()
    step = deploy[deploy.index("## 6c.") : deploy.index("## 7.")]
    main = (root / "infra" / "main.bicep").read_text()
    params = set(re.findall(r"^param (\w+) ", main, re.M))
    outputs = set(re.findall(r"^output (\w+) ", main, re.M))
    command = step[step.index("az deployment group create") : step.index("az deployment group show")]
    given = set(re.findall(r"(\w+)=", command.replace("\\\n", " "))) - {"n", "g", "f"}
    assert given and given <= params, given - params
    for name in (
        "centralScaleSetId",
        "fleetApproverDecisionsSpec",
        "fleetApproverEventsSpec",
        "azureChannelSourceSpec",
    ):
        assert f"`{name}`" in step and name in outputs, name
