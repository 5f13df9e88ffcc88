"""Render and validate ``config.toml`` for the installers (deploy/linux/install.sh, install.ps1).

Both installers run ``<venv>/bin/python -m bridge.commands.install_config`` after installing the
package, so the package's own loaders (:func:`bridge.agent.config.load_agent_config`,
:func:`bridge.approver.config.load_approver_config`, the very functions the services start with) decide
what a valid configuration is: unknown keys, bad
values and missing required settings are refused here, before any service is restarted, and an
existing ``config.toml`` is kept unless ``SEB_FORCE=1``. Inputs come as ``SEB_*`` environment variables
(set by the installers, documented in docs/deploy.md); secrets arrive as a JSON document or base64
variable, never on a command line, and are written with mode 0600 from the start. It runs on Linux and
Windows, hence the guards around POSIX-only calls.

When the approver is enabled without its own audit sinks (``--approver-sink``, ``sink`` in the
approver's settings), it publishes its audit records to the agent's sinks: the events stream, where
the agent's own relay audit records already go (docs/approvals.md).

``SEB_ROLE=central`` (``install.sh --role central``, issue 34) installs the central services of a fleet
on a VM of their own (infra/modules/central.bicep): no agent, a fleet approver (``[approver]``, its own
sinks) and Azure's channel (``[azure_channel]``) when the settings hold them, each validated by its own
loader.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import sys
import tempfile
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

from bridge.agent.config import load_agent_config
from bridge.approver.config import load_approver_config
from bridge.azure.config import load_azure_channel_config
from bridge.settings import ConfigError

#: uid and gid of the service account that must read the secrets, or None (Windows, tests as non-root).
OwnerIds = tuple[int, int] | None
#: ``write(path, data)``: a file only the service account (and root) can read.
PrivateWriter = Callable[[Path, bytes], None]

HEADER = (
    "# Scheduled Events bridge configuration, rendered by deploy/linux/install.sh.\n"
    "# Keys are the command-line flags with '_' (se-bridge agent --help, se-bridge approver --help).\n"
    "# Re-running the installer keeps this file unless --force-config is given.\n\n"
)


def main() -> None:
    env = os.environ
    etc = Path(env["SEB_ETC"])
    ids = service_account_ids(env.get("SEB_OWNER", ""))

    def write(path: Path, data: bytes) -> None:
        write_private(path, data, ids)

    secret_doc = read_secrets(Path(env["SEB_SECRETS"]))
    write_secret_files(etc, secret_doc, write)
    approver_keys = write_approver_keys(etc, secret_doc, write)
    write_environment_file(etc, secret_doc)

    agent, approver, channel = read_settings(env)
    if env.get("SEB_ROLE", "agent") == "central":
        text = central_config(agent, approver, channel, env, approver_keys)
    else:
        if channel:
            fail("azure_channel settings need --role central (Azure's channel is a central service)")
        apply_agent_inputs(agent, env)
        apply_approver_inputs(approver, env, approver_keys)
        complete_approver(approver, agent, env)
        give_local_approver_a_relay_key(approver, agent, etc, write)
        give_agent_the_public_decision_keys(agent, secret_doc, approver_keys)
        text = render_toml(agent, approver)

    target = etc / "config.toml"
    result = install_config_file(target, text, force=env["SEB_FORCE"] == "1", write=write)
    warn_about_kept_unsigned_approver(target, result)
    on = enabled(tomllib.loads(target.read_text()))
    flags = "".join(f"{name}={int(name in on)}\n" for name in ("approver", "agent", "azure_channel"))
    Path(env["SEB_RESULT"]).write_text(f"config={result}\n{flags}")


def runs_agent(tables: Mapping[str, object]) -> bool:
    """Whether a config.toml runs the agent: always, but on a central VM's (``--role central``),
    whose file holds only ``[approver]`` and ``[azure_channel]``."""
    return "agent" in tables or not any(k in tables for k in ("approver", "azure_channel"))


def enabled(tables: Mapping[str, object]) -> set[str]:
    """The services a config.toml's tables enable (what the installer starts and waits for): the
    agent (:func:`runs_agent`), the approver and Azure's channel when their table names a source."""

    def sourced(name: str) -> bool:
        table = tables.get(name)
        return isinstance(table, dict) and bool(table.get("source"))

    agent = {"agent"} if runs_agent(tables) else set()
    return agent | {name for name in ("approver", "azure_channel") if sourced(name)}


def central_config(
    agent: Mapping[str, object],
    approver: dict[str, object],
    channel: dict[str, object],
    env: Mapping[str, str],
    approver_keys: list[str],
) -> str:
    """A central VM's file: the fleet approver and Azure's channel, no agent (the agents run on the
    fleet's VMs). Each service publishes to its own sinks: there is no agent's to borrow."""
    if agent:
        fail("a central install (--role central) runs no agent: remove the agent settings")
    apply_approver_inputs(approver, env, approver_keys)
    if approver:
        if not approver.get("source") or approver.get("mode", "fleet") != "fleet":
            fail("a central approver is a fleet approver: a source and mode 'fleet'")
        approver["mode"] = "fleet"
        approver.setdefault("state_dir", env["SEB_APPROVER_STATE"])
        if not approver.get("sink"):
            fail("a central approver needs its own audit sink (approver.sink)")
    if "sources" in channel:
        channel["source"] = channel.pop("sources")
    if channel:
        channel.setdefault("state_dir", env["SEB_AZURE_STATE"])
    if not approver and not channel:
        fail("a central install needs approver or azure_channel settings")
    text = HEADER + "\n".join(
        toml_table(name, values)
        for name, values in (("approver", approver), ("azure_channel", channel))
        if values
    )
    tomllib.loads(text)
    return text


def fail(msg: str) -> NoReturn:
    print(f"se-bridge-install: error: {msg}", file=sys.stderr)
    sys.exit(1)


# -- files with secrets ------------------------------------------------------------------------------


def service_account_ids(owner: str) -> OwnerIds:
    """The service account's uid and gid (``SEB_OWNER``), or None when no account is named."""
    if not owner:
        return None
    import pwd  # POSIX only: Windows installs name no owner

    entry = pwd.getpwnam(owner)
    return entry.pw_uid, entry.pw_gid


def write_private(path: Path, data: bytes, ids: OwnerIds) -> None:
    """Atomic replace with mode 0600 from the start (no window where the secret is world-readable),
    owned by the service account when ``ids`` names one. On Windows the directory's ACL (set by
    install.ps1) protects the file instead."""
    if not path.parent.exists():
        path.parent.mkdir(mode=0o750, parents=True)
        if ids:  # root-owned, group of the service account: it may traverse, not write
            os.chown(path.parent, 0, ids[1])
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.write(fd, data)
        if hasattr(os, "fchmod"):
            os.fchmod(fd, 0o600)
        if ids:
            os.fchown(fd, *ids)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _table(doc: Mapping[str, object], key: str) -> dict[str, object]:
    """A table of the secrets document or a settings table (absent: empty; another type: refused)."""
    value = doc.get(key) or {}
    if not isinstance(value, dict):
        fail(f"{key} must be an object")
    return {str(k): v for k, v in value.items()}


def _strings(doc: Mapping[str, object], key: str) -> list[str]:
    """A list setting (absent: empty)."""
    value = doc.get(key) or []
    return [str(v) for v in value] if isinstance(value, list | tuple) else [str(value)]


def read_secrets(file: Path) -> dict[str, object]:
    """The secrets document (``files``, ``approverKeys``, ``env``); an empty file means none."""
    doc = json.loads(file.read_text() or "{}")
    if not isinstance(doc, dict):
        fail("the secrets JSON must be an object")
    return doc


def write_secret_files(etc: Path, secret_doc: Mapping[str, object], write: PrivateWriter) -> None:
    """``files``: secret files relative to /etc/se-bridge, readable by the service account only."""
    for name, value in sorted(_table(secret_doc, "files").items()):
        rel = Path(name)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            fail(f"secret file name {name!r} must be relative to {etc} without '..'")
        write(etc / rel, str(value).encode())


def write_approver_keys(etc: Path, secret_doc: Mapping[str, object], write: PrivateWriter) -> list[str]:
    """``approverKeys``: one key file per id under keys/; returns the approver's ``KEYID=PATH`` specs."""
    specs = []
    for key_id, value in sorted(_table(secret_doc, "approverKeys").items()):
        if not key_id.replace("-", "").replace("_", "").replace(".", "").isalnum():
            fail(f"approver key id {key_id!r} may only hold letters, digits, '.', '_' and '-'")
        if len(str(value).encode().strip()) < 32:
            fail(f"approver key {key_id!r} is shorter than 32 bytes")
        path = etc / "keys" / f"{key_id}.key"
        write(path, str(value).encode())
        specs.append(f"{key_id}={path}")
    return specs


def write_environment_file(etc: Path, secret_doc: Mapping[str, object]) -> None:
    """``env``: the environment of both services, read by systemd as root before dropping privileges
    (hence owned by root, not by the service account)."""
    env_vars = _table(secret_doc, "env")
    if not env_vars:
        return
    out = []
    for name, value in sorted(env_vars.items()):
        if not name.replace("_", "").isalnum() or name[0].isdigit():
            fail(f"environment variable name {name!r} is not valid")
        quoted = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        out.append(f'{name}="{quoted}"\n')
    write_private(etc / "environment", "".join(out).encode(), None)


def local_relay_key(etc: Path, write_private: PrivateWriter) -> Path:
    """The key the local approver signs its relay requests with, made once per VM.

    The agent refuses unsigned relay requests, loopback included (any local user and any web page
    can reach 127.0.0.1), so the local approver proves itself with a key only the service account
    can read. Kept across re-runs so a running approver and agent keep agreeing."""
    path = etc / "keys" / "relay-local.key"
    if not path.exists():
        write_private(path, secrets.token_urlsafe(36).encode())
    return path


# -- settings ----------------------------------------------------------------------------------------


def lines(env: Mapping[str, str], name: str) -> list[str]:
    """A multi-valued installer input: one value per line, blank lines ignored."""
    return [x for x in env.get(name, "").split("\n") if x.strip()]


def read_settings(env: Mapping[str, str]) -> tuple[dict[str, object], dict[str, object], dict[str, object]]:
    """The ``[agent]``, ``[approver]`` and ``[azure_channel]`` tables from the settings JSON (a file or
    base64)."""
    settings: Any = {}
    if env.get("SEB_SETTINGS_FILE"):
        settings = json.loads(Path(env["SEB_SETTINGS_FILE"]).read_text())
    elif env.get("SEB_SETTINGS_B64"):
        settings = json.loads(base64.b64decode(env["SEB_SETTINGS_B64"]))
    if not isinstance(settings, dict) or not set(settings) <= {"agent", "approver", "azure_channel"}:
        fail('settings must be a JSON object {"agent": {...}, "approver": {...}, "azure_channel": {...}}')
    return (
        dict(settings.get("agent") or {}),
        dict(settings.get("approver") or {}),
        dict(settings.get("azure_channel") or {}),
    )


def apply_agent_inputs(agent: dict[str, object], env: Mapping[str, str]) -> None:
    """The installer's own flags (``--sink``, ``--poll-interval``) over the JSON, then its defaults."""
    if "sinks" in agent:
        agent["sink"] = agent.pop("sinks")
    if lines(env, "SEB_SINKS"):
        agent["sink"] = lines(env, "SEB_SINKS")
    if env.get("SEB_POLL_INTERVAL"):
        agent["poll_interval"] = float(env["SEB_POLL_INTERVAL"])
    agent.setdefault("sink", [(Path(env["SEB_LOGS"]) / "records.jsonl").as_uri()])
    agent.setdefault("state_dir", env["SEB_STATE"])


def apply_approver_inputs(
    approver: dict[str, object], env: Mapping[str, str], approver_keys: list[str]
) -> None:
    """The installer's ``--approver-*`` flags over the JSON, and the keys written from the secrets."""
    for flag, key in (
        ("SEB_APPROVER_SOURCE", "source"),
        ("SEB_APPROVER_RELAY", "relay"),
        ("SEB_APPROVER_MODE", "mode"),
    ):
        if env.get(flag):
            approver[key] = env[flag]
    if lines(env, "SEB_APPROVER_KEYS"):
        approver["key"] = lines(env, "SEB_APPROVER_KEYS")
    if "sinks" in approver:
        approver["sink"] = approver.pop("sinks")
    if lines(env, "SEB_APPROVER_SINKS"):
        approver["sink"] = lines(env, "SEB_APPROVER_SINKS")
    # Keys from the secrets configure an approver the settings enable; without one (a scale set whose
    # approvals go through a fleet approver) they are only written, not an approver setting.
    if approver_keys and approver:
        approver["key"] = sorted(set(_strings(approver, "key")) | set(approver_keys))


def complete_approver(
    approver: dict[str, object], agent: Mapping[str, object], env: Mapping[str, str]
) -> None:
    """Defaults of an enabled approver; approver settings without a source are a mistake.

    Audit records default to the agent's sinks, so an approver installed without ``--approver-sink``
    (the VM extension installs it so) starts instead of being refused for want of a sink."""
    if not approver.get("source"):
        if approver:
            fail("approver settings given without an approver source (--approver-source)")
        return
    approver.setdefault("mode", "local")
    if approver["mode"] == "local":
        approver.setdefault("relay", "http://127.0.0.1:8710")
    approver.setdefault("state_dir", env["SEB_APPROVER_STATE"])
    approver.setdefault("sink", _strings(agent, "sink"))


def give_local_approver_a_relay_key(
    approver: dict[str, object], agent: dict[str, object], etc: Path, write: PrivateWriter
) -> None:
    """A local approver without a relay key gets the VM's local one, and the agent accepts it."""
    if approver.get("mode") == "local" and not approver.get("relay_key"):
        key_file = local_relay_key(etc, write)
        approver["relay_key"] = [f"local={key_file}"]
        agent["relay_key"] = sorted({*_strings(agent, "relay_key"), f"local={key_file}"})


def give_agent_the_public_decision_keys(
    agent: dict[str, object], secret_doc: Mapping[str, object], specs: list[str]
) -> None:
    """The approver's Ed25519 public keys prove decisions to the agent too (issue 31: the agent
    verifies every relayed decision itself). A shared (HMAC) approver key is never given to the
    agent, which could then sign; with only such keys the agent acts on no relayed decision, and the
    installer says so."""
    public = [
        spec
        for spec in specs
        if str(_table(secret_doc, "approverKeys").get(spec.split("=", 1)[0], ""))
        .strip()
        .startswith("-----BEGIN PUBLIC KEY-----")
    ]
    if public:
        agent["decision_key"] = sorted({*_strings(agent, "decision_key"), *public})
    elif specs and not agent.get("decision_key") and not agent.get("relay_legacy_until"):
        print(
            "se-bridge-install: warning: the approver keys are shared (HMAC) keys; the agent acts only "
            "on decisions signed with Ed25519 (se-bridge keygen; docs/security.md, migration)",
            file=sys.stderr,
        )


# -- config.toml ---------------------------------------------------------------------------------------


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + " }"
    return json.dumps(str(v))  # a JSON string is a valid TOML basic string


def toml_table(name: str, values: Mapping[str, object]) -> str:
    return f"[{name}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in values.items())


def render_toml(agent: Mapping[str, object], approver: Mapping[str, object]) -> str:
    """The file's text; it must read back as TOML (a rendering bug stops here, not in a service)."""
    text = HEADER + toml_table("agent", agent) + ("\n" + toml_table("approver", approver) if approver else "")
    tomllib.loads(text)
    return text


def validate(path: Path) -> None:
    """Load ``path`` with the loaders the services start with: exactly what they will accept."""
    args = argparse.Namespace(config=str(path))
    tables = tomllib.loads(path.read_text())
    try:
        if runs_agent(tables):
            load_agent_config(args, environ={})
        if "approver" in tables:
            load_approver_config(args, environ={})
        if "azure_channel" in tables:
            load_azure_channel_config(args, environ={})
    except ConfigError as exc:
        fail(f"{path}: {exc}")


def install_config_file(target: Path, text: str, *, force: bool, write: PrivateWriter) -> str:
    """``written`` (validated first, the previous file kept as config.toml.previous) or ``kept`` (an
    existing file without ``force``); either way the file in place is validated."""
    if target.exists() and not force:
        result = "kept"
    else:
        candidate = target.with_name(f".{target.name}.new")
        write(candidate, text.encode())
        try:
            validate(candidate)
        except SystemExit:
            candidate.unlink()
            raise
        if target.exists():
            write(target.with_name(f"{target.name}.previous"), target.read_bytes())
        os.replace(candidate, target)
        result = "written"
    validate(target)
    return result


def warn_about_kept_unsigned_approver(target: Path, result: str) -> None:
    """Warns when a kept file runs a local approver the agent will refuse (no relay key, and agents
    refuse unsigned relay requests)."""
    approver = tomllib.loads(target.read_text()).get("approver") or {}
    approver_on = bool(approver.get("source"))
    unsigned_local = approver.get("mode", "local") == "local" and not approver.get("relay_key")
    if result == "kept" and approver_on and unsigned_local:
        print(
            "se-bridge-install: warning: the kept config.toml runs a local approver without a relay "
            "key; agents now refuse unsigned relay requests (loopback included): re-run with "
            "--force-config to add one",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
