"""Render and validate ``config.toml`` for the installers (deploy/linux/install.sh, install.ps1).

Both installers run ``<venv>/bin/python -m bridge.install_config`` after installing the package, so the
package's own settings tables decide what a valid configuration is: unknown keys and bad values are
refused here, before any service is restarted, and an existing ``config.toml`` is kept unless
``SEB_FORCE=1``. Inputs come as ``SEB_*`` environment variables (set by the installers, documented in
docs/deploy.md); secrets arrive as a JSON document or base64 variable, never on a command line, and are
written with mode 0600 from the start. It runs on Linux and Windows, hence the guards around
POSIX-only calls.
"""

import base64
import json
import os
import sys
import tempfile
import tomllib
from pathlib import Path


def main() -> None:
    env = os.environ
    etc, owner = Path(env["SEB_ETC"]), env.get("SEB_OWNER", "")
    ids = None
    if owner:
        import pwd

        ids = (pwd.getpwnam(owner).pw_uid, pwd.getpwnam(owner).pw_gid)

    def write_private(path: Path, data: bytes, uid_gid=ids) -> None:
        """Atomic replace with mode 0600 from the start (no window where the secret is world-readable).
        On Windows the directory's ACL (set by install.ps1) protects the file instead."""
        if not path.parent.exists():
            path.parent.mkdir(mode=0o750, parents=True)
            if uid_gid:  # root-owned, group of the service account: it may traverse, not write
                os.chown(path.parent, 0, uid_gid[1])
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            os.write(fd, data)
            if hasattr(os, "fchmod"):
                os.fchmod(fd, 0o600)
            if uid_gid:
                os.fchown(fd, *uid_gid)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)

    def lines(name: str) -> list[str]:
        return [x for x in env.get(name, "").split("\n") if x.strip()]

    def fail(msg: str) -> None:
        print(f"se-bridge-install: error: {msg}", file=sys.stderr)
        sys.exit(1)

    secrets = json.loads(Path(env["SEB_SECRETS"]).read_text() or "{}")
    if not isinstance(secrets, dict):
        fail("the secrets JSON must be an object")

    # Secret files, relative to /etc/se-bridge, readable by the service account only.
    for name, value in sorted((secrets.get("files") or {}).items()):
        rel = Path(name)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            fail(f"secret file name {name!r} must be relative to {etc} without '..'")
        write_private(etc / rel, str(value).encode())
    approver_keys = []
    for key_id, value in sorted((secrets.get("approverKeys") or {}).items()):
        if not key_id.replace("-", "").replace("_", "").replace(".", "").isalnum():
            fail(f"approver key id {key_id!r} may only hold letters, digits, '.', '_' and '-'")
        if len(str(value).encode().strip()) < 32:
            fail(f"approver key {key_id!r} is shorter than 32 bytes")
        path = etc / "keys" / f"{key_id}.key"
        write_private(path, str(value).encode())
        approver_keys.append(f"{key_id}={path}")
    # Environment for both services (read by systemd as root before dropping privileges).
    env_vars = secrets.get("env") or {}
    if env_vars:
        out = []
        for name, value in sorted(env_vars.items()):
            if not name.replace("_", "").isalnum() or name[0].isdigit():
                fail(f"environment variable name {name!r} is not valid")
            quoted = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
            out.append(f'{name}="{quoted}"\n')
        write_private(etc / "environment", "".join(out).encode(), uid_gid=None)

    # Settings: JSON (file or base64), then the flags on top.
    settings: dict = {}
    if env.get("SEB_SETTINGS_FILE"):
        settings = json.loads(Path(env["SEB_SETTINGS_FILE"]).read_text())
    elif env.get("SEB_SETTINGS_B64"):
        settings = json.loads(base64.b64decode(env["SEB_SETTINGS_B64"]))
    if not isinstance(settings, dict) or not set(settings) <= {"agent", "approver"}:
        fail('settings must be a JSON object {"agent": {...}, "approver": {...}}')
    agent = dict(settings.get("agent") or {})
    approver = dict(settings.get("approver") or {})
    if "sinks" in agent:
        agent["sink"] = agent.pop("sinks")
    if lines("SEB_SINKS"):
        agent["sink"] = lines("SEB_SINKS")
    if env.get("SEB_POLL_INTERVAL"):
        agent["poll_interval"] = float(env["SEB_POLL_INTERVAL"])
    agent.setdefault("sink", [(Path(env["SEB_LOGS"]) / "records.jsonl").as_uri()])
    agent.setdefault("state_dir", env["SEB_STATE"])
    for flag, key in (
        ("SEB_APPROVER_SOURCE", "source"),
        ("SEB_APPROVER_RELAY", "relay"),
        ("SEB_APPROVER_MODE", "mode"),
    ):
        if env.get(flag):
            approver[key] = env[flag]
    if lines("SEB_APPROVER_KEYS"):
        approver["key"] = lines("SEB_APPROVER_KEYS")
    if lines("SEB_APPROVER_SINKS"):
        approver["sink"] = lines("SEB_APPROVER_SINKS")
    if approver_keys:
        approver["key"] = sorted(set(approver.get("key", [])) | set(approver_keys))
    if approver.get("source"):
        approver.setdefault("mode", "local")
        if approver["mode"] == "local":
            approver.setdefault("relay", "http://127.0.0.1:8710")
        approver.setdefault("state_dir", env["SEB_APPROVER_STATE"])
    elif approver:
        fail("approver settings given without an approver source (--approver-source)")
    if approver.get("mode") == "local" and not approver.get("relay_key"):
        key_file = local_relay_key(etc, write_private)
        approver["relay_key"] = [f"local={key_file}"]
        agent["relay_key"] = sorted({*agent.get("relay_key", []), f"local={key_file}"})

    def toml_value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(toml_value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + " }"
        return json.dumps(str(v))  # a JSON string is a valid TOML basic string

    def table(name: str, values: dict) -> str:
        return f"[{name}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in values.items())

    text = (
        "# Scheduled Events bridge configuration, rendered by deploy/linux/install.sh.\n"
        "# Keys are the command-line flags with '_' (se-bridge agent --help, se-bridge approver --help).\n"
        "# Re-running the installer keeps this file unless --force-config is given.\n\n"
        + table("agent", agent)
        + ("\n" + table("approver", approver) if approver else "")
    )
    tomllib.loads(text)  # what we wrote must read back

    def validate(path: Path) -> None:
        """Load the file with the package's own settings tables: exactly what the services will do."""
        import argparse

        from bridge import config

        args = argparse.Namespace(config=str(path))
        try:
            values = config.load(config.AGENT_SETTINGS, args, environ={}, section="agent")
            if not values["sink"]:
                raise config.ConfigError("sink: at least one sink is required")
            approver_settings = getattr(config, "APPROVER_SETTINGS", None)
            if approver_settings is not None and "approver" in tomllib.loads(path.read_text()):
                config.load(approver_settings, args, environ={}, section="approver")
        except config.ConfigError as exc:
            fail(f"{path}: {exc}")

    target = etc / "config.toml"
    if target.exists() and env["SEB_FORCE"] != "1":
        result = "kept"
    else:
        candidate = etc / ".config.toml.new"
        write_private(candidate, text.encode())
        try:
            validate(candidate)
        except SystemExit:
            candidate.unlink()
            raise
        if target.exists():
            write_private(etc / "config.toml.previous", target.read_bytes())
        os.replace(candidate, target)
        result = "written"
    validate(target)
    final = tomllib.loads(target.read_text())
    approver_on = bool((final.get("approver") or {}).get("source"))
    kept_approver = final.get("approver") or {}
    unsigned_local = kept_approver.get("mode", "local") == "local" and not kept_approver.get("relay_key")
    if result == "kept" and approver_on and unsigned_local:
        print(
            "se-bridge-install: warning: the kept config.toml runs a local approver without a relay "
            "key; agents now refuse unsigned relay requests (loopback included): re-run with "
            "--force-config to add one",
            file=sys.stderr,
        )
    Path(env["SEB_RESULT"]).write_text(f"config={result}\napprover={int(approver_on)}\n")


def local_relay_key(etc: Path, write_private) -> Path:
    """The key the local approver signs its relay requests with, made once per VM.

    The agent refuses unsigned relay requests, loopback included (any local user and any web page
    can reach 127.0.0.1), so the local approver proves itself with a key only the service account
    can read. Kept across re-runs so a running approver and agent keep agreeing."""
    import secrets

    path = etc / "keys" / "relay-local.key"
    if not path.exists():
        write_private(path, secrets.token_urlsafe(36).encode())
    return path


if __name__ == "__main__":
    main()
