"""The central services' image is built from the repository (issue 34: console.bicep needed an image
"with se-bridge[console,eventhubs] installed" that nothing in the repository built).

No Docker here: the test does what the Dockerfile's first stage does, with exactly the files it
copies (and only those .dockerignore lets into the build context), and checks the wheel: the
``se-bridge`` command, the console's pages, the record schemas, and every extra the second stage
installs. ``az acr build`` runs the same file in Azure (docs/deploy.md)."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "container" / "Dockerfile"


def _context_allows(path: str) -> bool:
    """.dockerignore's verdict on a path of the build context (its last matching rule wins)."""
    allowed = True
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        rule = line.strip()
        if not rule or rule.startswith("#"):
            continue
        negate, pattern = rule.startswith("!"), rule.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
            allowed = negate
    return allowed


def test_the_image_is_built_from_the_sources_with_the_extras_the_services_run(tmp_path: Path) -> None:
    text = DOCKERFILE.read_text()
    first_stage = text.split("\nFROM ", 2)[1]
    copies = [line.split()[1:-1] for line in first_stage.splitlines() if line.startswith("COPY ")]
    context = tmp_path / "context"
    context.mkdir()
    for sources in copies:
        for source in sources:
            assert _context_allows(source), f"{source} is copied but .dockerignore keeps it out"
            target = context / source
            if (ROOT / source).is_dir():
                shutil.copytree(ROOT / source, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(ROOT / source, target)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(wheels), str(context)],
        check=True,
        timeout=600,
    )
    (wheel,) = wheels.glob("scheduled_events_bridge-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = next(archive.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
        entry_points = next(
            archive.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt")
        )
    assert "se-bridge = bridge.cli:main" in entry_points
    assert {"bridge/console/static/console.js", "bridge/console/static/index.html"} <= names
    assert any(n.startswith("bridge/schemas/") and n.endswith(".schema.json") for n in names)
    wanted = re.search(r"scheduled_events_bridge-\*\.whl\)\[([a-z,]+)\]", text)
    assert wanted, "the second stage installs the wheel with its extras"
    provided = set(re.findall(r"^Provides-Extra: (\S+)$", metadata, re.M))
    assert set(wanted.group(1).split(",")) <= provided
    # What the templates run from it: the console needs its web server and Event Hubs.
    assert {"console", "eventhubs"} <= set(wanted.group(1).split(","))
    assert re.search(r'^ENTRYPOINT \["se-bridge"\]$', text, re.M)
    assert re.search(r"^USER 10001$", text, re.M)  # not root
    console = (ROOT / "infra" / "modules" / "console.bicep").read_text()
    assert "deploy/container/Dockerfile" in console


def test_the_console_pulls_the_image_from_the_deployments_registry_with_its_own_identity() -> None:
    """Issue 34: console.bicep named an image but no registry and no pull identity. main.bicep creates
    the registry (deployRegistry), the console pulls with its user-assigned identity (AcrPull on that
    registry alone), and the registry's admin user is off."""
    console = (ROOT / "infra" / "modules" / "console.bicep").read_text()
    assert re.search(
        r"registries: empty\(registryName\) \? \[\] : \[\s*\{"
        r"\s*server: registry\.properties\.loginServer\s*identity: identity\.id",
        console,
    )
    pull = re.search(r"resource pullsImage [^{]*\{(.*?)\n\}", console, re.S)
    assert pull and "scope: registry" in pull.group(1) and "roleDefinitionId: acrPull" in pull.group(1)
    assert "'7f951dda-4ed3-4680-a7ca-43fe172d538d'" in console  # AcrPull
    assert re.search(r"dependsOn: \[\s*pullsImage", console)
    registry = (ROOT / "infra" / "modules" / "registry.bicep").read_text()
    assert "adminUserEnabled: false" in registry and "anonymousPullEnabled: false" in registry
    main = (ROOT / "infra" / "main.bicep").read_text()
    assert "registryName: deployRegistry ? registry.outputs.name : ''" in main
    assert "output registryLoginServer string" in main
