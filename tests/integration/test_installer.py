"""The Linux installer (deploy/linux/install.sh) run for real, under a temporary root.

``SE_BRIDGE_ROOT`` puts every path of the install under a prefix, so no root, no systemd and no real
/etc are needed: the test builds the project's wheel, installs it with the installer into a fresh
virtual environment (dependencies through the machine's pip configuration), checks the rendered
config, secrets and systemd units (``systemd-analyze verify`` where it exists), runs the installed
``se-bridge agent`` from that environment against the IMDS emulator until a scenario reaches the file
sink, and checks that a second run upgrades in place without touching the state or a hand-edited
config. The wheel build and the first install happen once per module (the pip install is the slow part).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from procs import Emulator, decision_public_pem, wait_until

ROOT = Path(__file__).resolve().parents[2]
INSTALLER = ROOT / "deploy" / "linux" / "install.sh"
WEBHOOK_KEY = "webhook-secret-9f8e7d6c5b4a39281706f5e4d3c2b1a0"
APPROVER_KEY = "approver-secret-0a1b2c3d4e5f60718293a4b5c6d7e8f9"
CONNECTION_SECRET = "SharedAccessKey=c2VjcmV0LXZhbHVlLW5ldmVyLWxvZ2dlZA=="


@dataclass
class Install:
    root: Path
    wheel: Path
    settings: Path
    secrets: Path
    first: subprocess.CompletedProcess[str]

    @property
    def etc(self) -> Path:
        return self.root / "etc" / "se-bridge"

    @property
    def venv(self) -> Path:
        return self.root / "opt" / "se-bridge" / "venv"

    @property
    def units(self) -> Path:
        return self.root / "etc" / "systemd" / "system"

    @property
    def sink(self) -> Path:
        return self.root / "var" / "log" / "se-bridge" / "records.jsonl"

    def run(self, *extra: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run_installer(self.root, self.wheel, self.settings, self.secrets, *extra, check=check)


def run_installer(
    root: Path, wheel: Path, settings: Path, secrets: Path | None, *extra: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    args = ["sh", str(INSTALLER), "--wheel", str(wheel), "--find-links", str(wheel.parent), "--extras", ""]
    args += ["--settings", str(settings)]
    if secrets is not None:
        args += ["--secrets", str(secrets)]
    proc = subprocess.run(
        [*args, *extra],
        env={**os.environ, "SE_BRIDGE_ROOT": str(root)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if check:
        assert proc.returncode == 0, f"installer failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    (built,) = out.glob("scheduled_events_bridge-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Install:
    root = tmp_path_factory.mktemp("root")
    inputs = tmp_path_factory.mktemp("inputs")
    settings = inputs / "settings.json"
    settings.write_text(
        json.dumps(
            {
                "agent": {
                    "sink": [f"file://{root}/var/log/se-bridge/records.jsonl"],
                    "poll_interval": 0.2,
                    "shutdown_timeout": 5,
                },
                "approver": {"source": f"file://{root}/var/lib/se-bridge-approver/decisions.jsonl"},
            }
        )
    )
    secrets = inputs / "secrets.json"
    secrets.write_text(
        json.dumps(
            {
                "files": {"webhook.key": WEBHOOK_KEY},
                "env": {
                    "EVENTHUBS_CONNECTION_STRING": f"Endpoint=sb://x.servicebus.windows.net/;{CONNECTION_SECRET}"
                },
                "approverKeys": {"ops-2026": APPROVER_KEY},
            }
        )
    )
    first = run_installer(root, wheel, settings, secrets)
    return Install(root, wheel, settings, secrets, first)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- static ------------------------------------------------------------------------------------------


def test_installer_is_posix_sh() -> None:
    """The Custom Script extension runs its protected script with /bin/sh (dash on Ubuntu)."""
    for shell in ("sh", "dash"):
        if shutil.which(shell):
            proc = subprocess.run([shell, "-n", str(INSTALLER)], capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr
    if shutil.which("shellcheck"):
        proc = subprocess.run(
            ["shellcheck", "-s", "sh", "-S", "warning", str(INSTALLER)], capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stdout


def test_both_installers_render_config_with_the_packaged_renderer() -> None:
    """One renderer, in the package (bridge/commands/install_config.py): no copy in either script."""
    linux = INSTALLER.read_text()
    windows = (ROOT / "deploy" / "windows" / "install.ps1").read_text()
    assert '"$VENV/bin/python" -m bridge.commands.install_config' in linux
    assert "@('-m', 'bridge.commands.install_config')" in windows
    assert "def write_private" not in linux and "def write_private" not in windows


def test_cloud_init_is_built_from_the_current_installer() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "linux" / "build_cloud_init.py")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (ROOT / "deploy" / "linux" / "cloud-init.yaml").read_text(), (
        "deploy/linux/cloud-init.yaml is stale: "
        "python3 deploy/linux/build_cloud_init.py > deploy/linux/cloud-init.yaml"
    )


# -- first install -----------------------------------------------------------------------------------


def test_install_lays_out_venv_config_secrets_and_state(installed: Install) -> None:
    version = subprocess.run(
        [str(installed.venv / "bin" / "se-bridge"), "--version"], capture_output=True, text=True
    )
    assert version.returncode == 0 and version.stdout.startswith("se-bridge ")
    assert installed.wheel.name.split("-")[1] in version.stdout
    config_path = installed.etc / "config.toml"
    assert mode(config_path) == 0o600
    config = tomllib.loads(config_path.read_text())
    assert config["agent"]["sink"] == [f"file://{installed.root}/var/log/se-bridge/records.jsonl"]
    assert config["agent"]["poll_interval"] == 0.2
    assert config["agent"]["state_dir"] == f"{installed.root}/var/lib/se-bridge"
    approver = config["approver"]
    assert approver["mode"] == "local" and approver["relay"] == "http://127.0.0.1:8710"
    assert approver["state_dir"] == f"{installed.root}/var/lib/se-bridge-approver"
    key_file = installed.etc / "keys" / "ops-2026.key"
    assert approver["key"] == [f"ops-2026={key_file}"]
    assert key_file.read_text() == APPROVER_KEY and mode(key_file) == 0o600
    assert mode(key_file.parent) == 0o750
    # The agent refuses unsigned relay requests (loopback included): the installer made a relay key for
    # the local approver, readable by the service account only, and gave it to both services.
    relay_key = installed.etc / "keys" / "relay-local.key"
    assert len(relay_key.read_bytes()) >= 32 and mode(relay_key) == 0o600
    assert approver["relay_key"] == [f"local={relay_key}"] and config["agent"]["relay_key"] == [
        f"local={relay_key}"
    ]
    assert (installed.etc / "webhook.key").read_text() == WEBHOOK_KEY
    assert mode(installed.etc / "webhook.key") == 0o600
    environment = (installed.etc / "environment").read_text()
    assert (
        environment
        == f'EVENTHUBS_CONNECTION_STRING="Endpoint=sb://x.servicebus.windows.net/;{CONNECTION_SECRET}"\n'
    )
    assert mode(installed.etc / "environment") == 0o600
    for state in ("se-bridge", "se-bridge-approver"):
        assert mode(installed.root / "var" / "lib" / state) == 0o700
    output = installed.first.stdout + installed.first.stderr
    for secret in (WEBHOOK_KEY, APPROVER_KEY, CONNECTION_SECRET):
        assert secret not in output
    assert "config " in output and ": written; approver: enabled" in output


def test_units_are_hardened_and_point_at_the_install(installed: Install) -> None:
    agent = (installed.units / "se-bridge-agent.service").read_text()
    approver = (installed.units / "se-bridge-approver.service").read_text()
    for unit, command, state in ((agent, "agent", "se-bridge"), (approver, "approver", "se-bridge-approver")):
        lines = set(unit.splitlines())
        exec_start = (
            f"ExecStart={installed.venv}/bin/se-bridge {command} --config {installed.etc}/config.toml"
        )
        assert exec_start in lines
        for directive in (
            "User=se-bridge",
            "Restart=always",
            "RestartSec=5",
            "LimitNOFILE=65536",  # systemd's soft default (1024) is too few under load (issue 8)
            "ProtectSystem=strict",
            "NoNewPrivileges=yes",
            f"StateDirectory={state}",
            "StateDirectoryMode=0700",
            "CapabilityBoundingSet=",
            f"EnvironmentFile=-{installed.etc}/environment",
            "WantedBy=multi-user.target",
        ):
            assert directive in lines, f"{command}: {directive}"
    assert "After=se-bridge-agent.service" in approver.splitlines()
    assert os.access(installed.venv / "bin" / "se-bridge", os.X_OK)


def test_units_pass_systemd_analyze_verify(installed: Install) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here")
    units = [
        str(installed.units / "se-bridge-agent.service"),
        str(installed.units / "se-bridge-approver.service"),
        str(installed.units / "se-bridge-azure-channel.service"),
    ]
    proc = subprocess.run(
        [analyze, "verify", *units],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SYSTEMD_UNIT_PATH": f"{installed.units}:"},
    )
    # verify exits 0 on unknown keys too, warning on stderr: any line about our units is a failure.
    complaints = [line for line in (proc.stdout + proc.stderr).splitlines() if "se-bridge" in line]
    assert proc.returncode == 0 and complaints == [], proc.stdout + proc.stderr


def test_installed_agent_forwards_a_scenario_to_the_file_sink(installed: Install, tmp_path: Path) -> None:
    emulator = Emulator("--rate-limit", "0")
    log_path = tmp_path / "agent.log"
    agent: subprocess.Popen[bytes] | None = None
    try:
        before = len(installed.sink.read_text().splitlines()) if installed.sink.exists() else 0
        with open(log_path, "wb") as log:
            agent = subprocess.Popen(
                [
                    str(installed.venv / "bin" / "se-bridge"),
                    "agent",
                    "--config",
                    str(installed.etc / "config.toml"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
                env={
                    **os.environ,
                    "SE_BRIDGE_IMDS_URL": emulator.url,
                    "SE_BRIDGE_LISTEN": "127.0.0.1:0",
                    "SE_BRIDGE_IMDS_FIRST_TIMEOUT": "10",
                },
            )

        def records() -> list[dict]:
            if not installed.sink.exists():
                return []
            return [json.loads(line) for line in installed.sink.read_text().splitlines()[before:] if line]

        def alive() -> None:
            assert agent is not None
            if agent.poll() is not None:
                raise AssertionError(f"agent exited with {agent.returncode}: {log_path.read_text()[-3000:]}")

        wait_until(lambda: alive() or len(records()) >= 1, 30, what="first record of the installed agent")
        emulator.control("POST", "scenario", {"name": "user-reboot", "speed": 300})
        expected = ["scheduled", "started", "completed"]

        def transitions() -> list[str]:
            alive()
            documents = [r for r in records() if r["recordType"] == "scheduledEvents"]
            return [c["change"] for r in documents for c in r["changes"] if c["change"] != "present"]

        wait_until(lambda: transitions() == expected, 60, what=f"transitions {expected}")
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(30) == 0, log_path.read_text()[-3000:]
        agent = None
        got = records()
        # the scenario's documents, and the impact record of its event once it ended (bridge.agent.impact)
        kinds = {r["recordType"] for r in got}
        assert got[0]["vm"]["name"] and {"scheduledEvents"} <= kinds <= {"scheduledEvents", "impact"}
        state = installed.root / "var" / "lib" / "se-bridge"
        assert (state / "baseline.json").exists(), "the agent used the state_dir of the rendered config"
        validated = subprocess.run(
            [str(installed.venv / "bin" / "se-bridge"), "validate", str(installed.sink)],
            capture_output=True,
            text=True,
        )
        assert validated.returncode == 0, validated.stdout + validated.stderr
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
            agent.wait(10)
        emulator.stop()


def test_the_installer_waits_for_every_enabled_service(installed: Install, tmp_path: Path) -> None:
    """Issue 11: only the agent's /healthz was awaited, so an approver exiting at start was restarted
    every 5 s behind a successful extension. Both services start from the installed config.toml (with
    only their ports, IMDS and the relay moved for the test) and ``bridge.commands.install_health``, what both
    installers run, waits for both; with the approver down it fails and names it."""
    from brokers import free_port

    emulator = Emulator("--rate-limit", "0")
    agent_port, approver_port = free_port(), free_port()
    env = {
        **os.environ,
        "SE_BRIDGE_IMDS_URL": emulator.url,
        "SE_BRIDGE_LISTEN": f"127.0.0.1:{agent_port}",
        "SE_BRIDGE_APPROVER_LISTEN": f"127.0.0.1:{approver_port}",
        "SE_BRIDGE_APPROVER_RELAY": f"http://127.0.0.1:{agent_port}",
    }
    config = str(installed.etc / "config.toml")
    se_bridge = str(installed.venv / "bin" / "se-bridge")
    python = str(installed.venv / "bin" / "python")

    def health(timeout: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [python, "-m", "bridge.commands.install_health", config, "--timeout", timeout],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    procs: list[subprocess.Popen[bytes]] = []
    try:
        with open(tmp_path / "services.log", "wb") as log:
            procs.append(subprocess.Popen([se_bridge, "agent", "--config", config], env=env, stderr=log))
            down = health("3")
            assert down.returncode == 1 and "the approver did not become healthy" in down.stderr, down
            procs.append(subprocess.Popen([se_bridge, "approver", "--config", config], env=env, stderr=log))
            up = health("60")
        assert up.returncode == 0, up.stdout + up.stderr + (tmp_path / "services.log").read_text()[-3000:]
        assert f"agent healthy on 127.0.0.1:{agent_port}" in up.stdout
        assert f"approver healthy on 127.0.0.1:{approver_port}" in up.stdout
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)
        emulator.stop()


# -- second run --------------------------------------------------------------------------------------


def test_second_run_upgrades_in_place_and_keeps_state_and_config(installed: Install) -> None:
    config = installed.etc / "config.toml"
    python = installed.venv / "bin" / "python"
    venv_inode = python.lstat().st_ino
    units_before = {p.name: p.read_text() for p in installed.units.glob("*.service")}
    state = installed.root / "var" / "lib" / "se-bridge"
    (state / "marker").write_text("kept")
    edited = config.read_text() + "# edited by hand\n"
    config.write_text(edited)

    second = installed.run()
    output = second.stderr
    assert "reusing" in output and ": kept;" in output
    assert config.read_text() == edited, "a second run must not clobber the config"
    assert (state / "marker").read_text() == "kept", "the state directory survives an upgrade"
    assert python.lstat().st_ino == venv_inode, "the virtual environment is upgraded in place"
    assert {p.name: p.read_text() for p in installed.units.glob("*.service")} == units_before

    forced = installed.run("--force-config")
    assert ": written;" in forced.stderr
    assert "# edited by hand" not in config.read_text()
    assert (installed.etc / "config.toml.previous").read_text() == edited
    assert mode(installed.etc / "config.toml.previous") == 0o600
    assert (state / "marker").exists()


def test_bad_settings_are_refused_and_change_nothing(installed: Install, tmp_path: Path) -> None:
    config = installed.etc / "config.toml"
    before = config.read_text()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"agent": {"sink": ["stdout:"], "pol_interval": 1}}))
    proc = run_installer(installed.root, installed.wheel, bad, None, "--force-config", check=False)
    assert proc.returncode != 0
    assert "pol_interval" in proc.stderr and "configuration refused" in proc.stderr
    assert config.read_text() == before
    assert not list(installed.etc.glob(".config.toml*")), "no half-written config is left behind"


def test_run_command_delivery_runs_the_installer(wheel: Path, tmp_path: Path) -> None:
    """Issue 13: the default delivery on a Linux VM, a managed Run Command (it coexists with a Custom
    Script extension). The Linux run-command handler (Azure/run-command-handler-linux,
    internal/exec/exec.go) sets every named parameter, protected ones included, as an environment
    variable and runs the script with /bin/bash -c: done here the same way with the script
    deploy/vm-extension.bicep builds (`set --` arguments, then install.sh)."""
    import base64

    root = tmp_path / "root"
    settings = {"agent": {"sink": [f"file://{root}/records.jsonl"], "poll_interval": 1.0}}
    secrets = {"approverKeys": {}, "env": {}, "files": {"webhook.key": WEBHOOK_KEY}, "pipIndexUrl": ""}
    bicep = (ROOT / "deploy" / "vm-extension.bicep").read_text()
    assert "'set -- --force-config --extras \\'${packageExtras}\\' ${runCommandPackageArgs}'" in bicep
    assert "name: 'SE_BRIDGE_INSTALL_SETTINGS_B64'" in bicep
    assert "protectedParameters: [\n      {\n        name: 'SE_BRIDGE_INSTALL_SECRETS_B64'" in bicep
    script = "\n".join(
        [
            "#!/bin/sh",
            "# se-bridge installer, delivered as a managed Run Command by deploy/vm-extension.bicep",
            f"set -- --force-config --extras '' --wheel '{wheel}' --find-links {wheel.parent}",
            INSTALLER.read_text(),
        ]
    )
    workdir = tmp_path / "download" / "se-bridge-install" / "0"
    workdir.mkdir(parents=True)
    (workdir / "script.sh").write_text(script)
    (workdir / "script.sh").chmod(0o500)
    env = {
        **os.environ,
        "SE_BRIDGE_ROOT": str(root),
        "SE_BRIDGE_INSTALL_SETTINGS_B64": base64.b64encode(json.dumps(settings).encode()).decode(),
        "SE_BRIDGE_INSTALL_SECRETS_B64": base64.b64encode(json.dumps(secrets).encode()).decode(),
        "SE_BRIDGE_INSTALL_RUN": "once",
    }
    proc = subprocess.run(
        ["/bin/bash", "-c", str(workdir / "script.sh")], cwd=workdir, env=env,
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    config = tomllib.loads((root / "etc" / "se-bridge" / "config.toml").read_text())
    assert config["agent"]["sink"] == [f"file://{root}/records.jsonl"]
    assert (root / "etc" / "se-bridge" / "webhook.key").read_text() == WEBHOOK_KEY
    assert WEBHOOK_KEY not in proc.stdout + proc.stderr


def test_extension_bootstrap_runs_the_installer(wheel: Path, tmp_path: Path) -> None:
    """What deploy/vm-extension.bicep hands to the Custom Script extension: settings and secrets in
    environment variables, the arguments set with `set --`, then install.sh itself, run by /bin/sh."""
    import base64

    root = tmp_path / "root"
    settings = {"agent": {"sink": [f"file://{root}/records.jsonl"], "poll_interval": 1.0}}
    secrets = {"approverKeys": {}, "env": {}, "files": {"webhook.key": WEBHOOK_KEY}, "pipIndexUrl": ""}
    script = "\n".join(
        [
            "#!/bin/sh",
            "# se-bridge VM extension bootstrap, generated by deploy/vm-extension.bicep",
            f"SE_BRIDGE_INSTALL_SETTINGS_B64='{base64.b64encode(json.dumps(settings).encode()).decode()}'",
            f"SE_BRIDGE_INSTALL_SECRETS_B64='{base64.b64encode(json.dumps(secrets).encode()).decode()}'",
            "export SE_BRIDGE_INSTALL_SETTINGS_B64 SE_BRIDGE_INSTALL_SECRETS_B64",
            f"set -- --force-config --extras '' --wheel \"$PWD/{wheel.name}\" --find-links {wheel.parent}",
            INSTALLER.read_text(),
        ]
    )
    bicep = (ROOT / "deploy" / "vm-extension.bicep").read_text()
    assert "'SE_BRIDGE_INSTALL_SETTINGS_B64=\\'${settingsB64}\\''" in bicep
    assert "'set -- --force-config --extras \\'${packageExtras}\\' ${linuxPackageArgs}'" in bicep
    assert "loadTextContent('linux/install.sh')" in bicep
    download = tmp_path / "download"  # the extension runs the script where it downloaded fileUris
    download.mkdir()
    shutil.copy(wheel, download / wheel.name)
    (download / "script.sh").write_text(script)
    proc = subprocess.run(
        ["sh", "script.sh"],
        cwd=download,
        env={**os.environ, "SE_BRIDGE_ROOT": str(root)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    config = tomllib.loads((root / "etc" / "se-bridge" / "config.toml").read_text())
    assert config["agent"]["sink"] == [f"file://{root}/records.jsonl"]
    assert "approver" not in config
    assert (root / "etc" / "se-bridge" / "webhook.key").read_text() == WEBHOOK_KEY
    assert WEBHOOK_KEY not in proc.stdout + proc.stderr


def _vm_app_commands() -> dict[str, str]:
    """The install, update and remove commands as infra/modules/vm-application.bicep publishes them
    (its variables resolved)."""
    import re

    bicep = (ROOT / "infra" / "modules" / "vm-application.bicep").read_text()
    names = dict(re.findall(r"^var (\w+) = '([^']*)'$", bicep, re.M))
    resolve = lambda text: re.sub(r"\$\{(\w+)\}", lambda m: names[m.group(1)], text)  # noqa: E731
    return {action: resolve(names[f"{action}Command"]) for action in ("install", "update", "remove")}


def test_vm_application_installs_offline_updates_and_removes(tmp_path: Path) -> None:
    """Issue 13: the VM Application delivery (scale sets, fleets). The package deploy/vmapp/build_package.py
    builds carries every wheel, so a VM without a package index installs it: here pip's only way out is
    a dead proxy. The VM Application manager downloads the package and the settings into the version's
    directory under the names the version's settings give, and runs the version's commands there with
    /bin/bash as root: done the same way with the commands the Bicep module publishes. Then the update
    command upgrades in place, and remove takes the services and the virtual environment away but
    keeps the configuration and the state (an outbox may hold records not yet delivered)."""
    package = tmp_path / "dist" / "se-bridge.tar.gz"
    builder = ROOT / "deploy" / "vmapp" / "build_package.py"
    built = subprocess.run(
        [sys.executable, str(builder), str(package), "--extras", "", "--here"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    commands = _vm_app_commands()
    assert all(len(command) <= 4096 for command in commands.values())
    root = tmp_path / "root"
    workdir = tmp_path / "waagent" / "Microsoft.CPlat.Core.VMApplicationManagerLinux" / "se-bridge" / "1.0.0"
    workdir.mkdir(parents=True)
    shutil.copy(package, workdir / "se-bridge.tar.gz")
    env = {**os.environ, "SE_BRIDGE_ROOT": str(root), "HTTPS_PROXY": "http://127.0.0.1:9",
           "HTTP_PROXY": "http://127.0.0.1:9", "PIP_INDEX_URL": "http://127.0.0.1:9/simple"}  # fmt: skip

    def run(action: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["/bin/bash", "-c", commands[action]], cwd=workdir, env=env,
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip

    missing = run("install")  # no settings: a clear refusal, not an agent with defaults
    assert missing.returncode != 0 and "defaultConfigurationLink" in missing.stderr
    settings = {"agent": {"sink": [f"file://{root}/records.jsonl"], "poll_interval": 1.0}}
    (workdir / "se-bridge-settings.json").write_text(json.dumps(settings))
    installed = run("install")
    assert installed.returncode == 0, installed.stderr
    config = tomllib.loads((root / "etc" / "se-bridge" / "config.toml").read_text())
    assert config["agent"]["sink"] == [f"file://{root}/records.jsonl"]
    venv = root / "opt" / "se-bridge" / "venv"
    version = subprocess.run([str(venv / "bin" / "se-bridge"), "--version"], capture_output=True, text=True)
    assert version.returncode == 0, version.stderr
    settings["agent"]["poll_interval"] = 2.0
    (workdir / "se-bridge-settings.json").write_text(json.dumps(settings))
    updated = run("update")
    assert updated.returncode == 0, updated.stderr
    assert (
        tomllib.loads((root / "etc" / "se-bridge" / "config.toml").read_text())["agent"]["poll_interval"]
        == 2.0
    )
    (root / "var" / "lib" / "se-bridge" / "outbox").mkdir(parents=True, exist_ok=True)
    removed = run("remove")
    assert removed.returncode == 0, removed.stderr
    assert not (root / "opt" / "se-bridge").exists()
    assert not list((root / "etc" / "systemd" / "system").glob("se-bridge-*.service"))
    assert (root / "etc" / "se-bridge" / "config.toml").exists()
    assert (root / "var" / "lib" / "se-bridge" / "outbox").is_dir()


def test_a_central_install_runs_the_fleet_approver_and_azures_channel_without_an_agent(
    wheel: Path, tmp_path: Path
) -> None:
    """Issue 34: `install.sh --role central` (what infra/modules/central.bicep's cloud-init runs)
    renders the fleet approver and Azure's channel, each with its own sinks and state directory, and
    no agent; the azure-channel unit is hardened like the others; agent settings are refused there,
    and Azure's channel is refused on an agent's VM."""
    root = tmp_path / "root"
    settings = tmp_path / "settings.json"
    logs = f"file://{root}/var/log/se-bridge"
    settings.write_text(json.dumps({
        "approver": {"mode": "fleet", "source": f"file://{root}/var/lib/decisions.jsonl",
                     "events_source": [f"{logs}/records.jsonl"], "key": ["ops=/etc/se-bridge/keys/ops.pub"],
                     "relay_key": ["fleet=/etc/se-bridge/relay-fleet.key"], "sink": [f"{logs}/audit.jsonl"]},
        "azure_channel": {"source": [f"file://{root}/var/lib/grid.jsonl"], "sink": [f"{logs}/azure.jsonl"]},
    }))  # fmt: skip
    secrets = tmp_path / "secrets.json"
    secrets.write_text(
        json.dumps({"files": {"relay-fleet.key": "f" * 40, "keys/ops.pub": decision_public_pem()}})
    )
    done = run_installer(root, wheel, settings, secrets, "--role", "central")
    assert "approver: enabled; agent: disabled; azure-channel: enabled" in done.stderr
    etc = root / "etc" / "se-bridge"
    config = tomllib.loads((etc / "config.toml").read_text())
    assert set(config) == {"approver", "azure_channel"}
    assert config["approver"]["state_dir"] == f"{root}/var/lib/se-bridge-approver"
    assert config["azure_channel"]["state_dir"] == f"{root}/var/lib/se-bridge-azure"
    unit = (root / "etc" / "systemd" / "system" / "se-bridge-azure-channel.service").read_text().splitlines()
    assert (
        f"ExecStart={root}/opt/se-bridge/venv/bin/se-bridge azure-channel --config {etc}/config.toml" in unit
    )
    assert {"StateDirectory=se-bridge-azure", "ProtectSystem=strict", "NoNewPrivileges=yes"} <= set(unit)
    approver = (root / "etc" / "systemd" / "system" / "se-bridge-approver.service").read_text()
    assert "After=se-bridge-agent.service" not in approver  # a central approver needs no local agent
    # Agent settings on a central VM, or Azure's channel on an agent's VM: refused, nothing changed.
    settings.write_text(json.dumps({"agent": {"sink": ["stdout:"]}, "approver": {}}))
    refused = run_installer(
        root, wheel, settings, secrets, "--role", "central", "--force-config", check=False
    )
    assert refused.returncode != 0 and "runs no agent" in refused.stderr
    settings.write_text(json.dumps({"azure_channel": {"source": ["file:///x.jsonl"], "sink": ["stdout:"]}}))
    refused = run_installer(root, wheel, settings, secrets, "--force-config", check=False)
    assert refused.returncode != 0 and "need --role central" in refused.stderr
