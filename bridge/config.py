"""Configuration: one table of settings drives the TOML file, the environment and the flags.

Precedence, lowest first: built-in default < TOML file (``--config`` or ``SE_BRIDGE_CONFIG``) <
environment (``SE_BRIDGE_<NAME>``) < command-line flag. Every setting is declared once in a
:class:`Setting` table, so the three sources, ``--help`` and the documentation cannot drift apart.

A wrong value is refused at start-up with a message naming the setting, the value and where it came
from (flag, variable or file), never with a traceback. Unknown keys in the TOML file are refused too:
a typo must not silently fall back to a default on a production VM.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge.imds.client import DEFAULT_IMDS_URL
from bridge.imds.document import API_VERSIONS, DEFAULT_API_VERSION
from bridge.netaddr import parse_listen

ENV_PREFIX = "SE_BRIDGE_"


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message says which and from where."""


@dataclass(frozen=True)
class Setting:
    name: str
    parse: Callable[[Any], Any]
    default: Any
    help: str
    multiple: bool = False
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


# -- value parsers (raise ValueError with a short explanation) ---------------------------------------


def number(low: float, high: float) -> Callable[[Any], float]:
    def parse(value: Any) -> float:
        if isinstance(value, bool):
            raise ValueError("expected a number")
        v = float(value)
        if not low <= v <= high:
            raise ValueError(f"expected a number from {low:g} to {high:g}")
        return v

    return parse


def integer(low: int, high: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError("expected a whole number")
        v = int(value)
        if not low <= v <= high:
            raise ValueError(f"expected a whole number from {low} to {high}")
        return v

    return parse


def size(value: Any) -> int:
    """Bytes, with an optional K/M/G (binary) suffix: ``64M``."""
    if isinstance(value, int) and not isinstance(value, bool):
        v = value
    else:
        text = str(value).strip().upper().removesuffix("B").removesuffix("I")
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        v = int(float(text[:-1] if mult > 1 else text) * mult)
    if v < 4096:
        raise ValueError("expected a size of at least 4096 bytes (suffixes K, M, G allowed)")
    return v


def api_version(value: Any) -> str:
    v = str(value).strip()
    if v not in API_VERSIONS:
        raise ValueError(f"expected one of {', '.join(API_VERSIONS)}")
    return v


def imds_url(value: Any) -> str:
    v = str(value).strip().rstrip("/")
    if not v.startswith("http://") or len(v) <= len("http://"):
        raise ValueError("expected http://host[:port] (IMDS is plain HTTP on a link-local address)")
    return v


def listen_address(value: Any) -> str:
    v = str(value).strip()
    if v in ("", "off", "none"):
        return ""
    if v.startswith("unix:"):
        if not v[len("unix:") :].startswith("/"):
            raise ValueError("expected unix:/absolute/path.sock")
        return v
    parse_listen(v)
    return v


def log_level(value: Any) -> str:
    v = str(value).strip().lower()
    if v not in ("debug", "info", "warning", "error"):
        raise ValueError("expected debug, info, warning or error")
    return v


def boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    v = str(value).strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def key_spec(value: Any) -> str:
    v = text(value)
    key_id, sep, file = v.partition("=")
    if not sep or not key_id or not file:
        raise ValueError("expected KEYID=PATH (a file holding the shared secret)")
    return v


def auto_approve_rule(value: Any) -> str:
    from bridge.agent.policy import ApprovalRule

    ApprovalRule.parse(text(value))
    return text(value)


def optional_text(value: Any) -> str | None:
    v = str(value).strip() if value is not None else ""
    return v or None


def text(value: Any) -> str:
    v = str(value).strip()
    if not v:
        raise ValueError("must not be empty")
    return v


def path(value: Any) -> Path:
    return Path(text(value)).expanduser()


AGENT_SETTINGS: tuple[Setting, ...] = (
    Setting(
        "imds_url", imds_url, DEFAULT_IMDS_URL, "IMDS base URL (the emulator's URL in tests).", metavar="URL"
    ),
    Setting(
        "api_version",
        api_version,
        DEFAULT_API_VERSION,
        f"Scheduled Events api-version to request ({API_VERSIONS[0]} .. {API_VERSIONS[-1]}).",
        metavar="V",
    ),
    Setting(
        "sink",
        text,
        (),
        "Where records go; repeat for several: file:///path.jsonl, stdout:, kafka://host:port/topic?..., "
        "eventhubs://<namespace>/<hub>?..., https://host/path#options (in the environment: several specs "
        "separated by spaces).",
        multiple=True,
        metavar="SPEC",
    ),
    Setting(
        "state_dir",
        path,
        Path("/var/lib/se-bridge"),
        "Directory for the outbox, the baseline document and cursors (must persist across reboots).",
        metavar="DIR",
    ),
    Setting(
        "poll_interval", number(0.1, 60), 1.0, "Seconds between polls (IMDS recommends 1).", metavar="SECONDS"
    ),
    Setting(
        "listen",
        listen_address,
        "127.0.0.1:8710",
        "HTTP listener for /healthz, /readyz, /metrics, /v1/document and the relay: HOST:PORT (loopback "
        "by default), unix:/path.sock (mode 0660, for a local approver), or 'off'.",
        metavar="HOST:PORT|unix:PATH",
    ),
    Setting(
        "outbox_max_records",
        integer(1, 10_000_000),
        10_000,
        "Records held for the slowest sink before new changes are coalesced.",
        metavar="N",
    ),
    Setting(
        "outbox_max_bytes", size, "64M", "Bytes held for the slowest sink (K/M/G suffix).", metavar="SIZE"
    ),
    Setting(
        "imds_timeout",
        number(0.1, 60),
        5.0,
        "Timeout of an IMDS request after the first answer.",
        metavar="SECONDS",
    ),
    Setting(
        "imds_first_timeout",
        number(1, 600),
        120.0,
        "Timeout of the first IMDS request (Scheduled Events may take 2 minutes to wake up).",
        metavar="SECONDS",
    ),
    Setting(
        "imds_max_rps",
        number(0.1, 5),
        5.0,
        "Most IMDS requests per second this agent sends (IMDS allows about 5 for the whole VM).",
        metavar="N",
    ),
    Setting(
        "ready_max_failure",
        number(1, 3600),
        30.0,
        "/readyz reports not ready once IMDS has failed for this many seconds in a row.",
        metavar="SECONDS",
    ),
    Setting(
        "shutdown_timeout",
        number(0, 300),
        10.0,
        "On SIGTERM, seconds to keep delivering queued records before exiting.",
        metavar="SECONDS",
    ),
    Setting("log_level", log_level, "info", "debug, info, warning or error.", metavar="LEVEL"),
    Setting(
        "relay_key",
        key_spec,
        (),
        "Key that relay requests must be signed with, loopback callers included (the local and fleet "
        "approvers hold it); repeat to rotate.",
        multiple=True,
        metavar="KEYID=PATH",
    ),
    Setting(
        "listen_tls_cert",
        optional_text,
        None,
        "PEM certificate (chain) to serve the listener over TLS (with --listen-tls-key), e.g. when fleet "
        "approvers reach the relay API over the network.",
        metavar="PATH",
    ),
    Setting("listen_tls_key", optional_text, None, "PEM private key of --listen-tls-cert.", metavar="PATH"),
    Setting(
        "listen_max_connections",
        integer(1, 10_000),
        64,
        "Connections the listener serves at once; a few more may still ask /healthz and /readyz, the "
        "rest are answered 503.",
        metavar="N",
    ),
    Setting(
        "listen_request_timeout",
        number(0.5, 300),
        10.0,
        "Seconds a caller has to deliver a whole request (TLS handshake, headers and body); slower "
        "connections are cut.",
        metavar="SECONDS",
    ),
    Setting(
        "relay_allow_unsigned_loopback",
        boolean,
        False,
        "Development only: accept unsigned relay requests from loopback when no relay key is set (any "
        "local user can then approve; a warning is logged at start).",
        metavar="BOOL",
    ),
    Setting(
        "read_token_file",
        optional_text,
        None,
        "File holding a token (at least 32 bytes) that non-loopback callers of /metrics and /v1/document "
        "send as 'Authorization: Bearer <token>' (Prometheus: authorization.credentials_file).",
        metavar="PATH",
    ),
    Setting(
        "relay_require_this_vm",
        boolean,
        True,
        "Refuse to approve events whose Resources do not name this VM.",
        metavar="BOOL",
    ),
    Setting(
        "auto_approve",
        auto_approve_rule,
        (),
        "Approve matching Scheduled events locally, e.g. 'source=User' or 'type=Freeze,max_duration=9'; "
        "repeat for several rules (conditions: type=, source=, max_duration=).",
        multiple=True,
        metavar="RULE",
    ),
    Setting(
        "prepare_hook",
        optional_text,
        None,
        "Command run for each Scheduled event affecting this VM (event in SE_* variables and SE_EVENT_FILE); "
        "a local approval waits for it to exit 0.",
        metavar="CMD",
    ),
    Setting(
        "recover_hook",
        optional_text,
        None,
        "Command run when an event that affected this VM is gone (completed or canceled).",
        metavar="CMD",
    ),
    Setting("hook_timeout", number(1, 86400), 600.0, "Longest a hook may run.", metavar="SECONDS"),
    Setting(
        "hook_margin",
        number(0, 3600),
        30.0,
        "A prepare hook's timeout ends this long before the event's NotBefore.",
        metavar="SECONDS",
    ),
    Setting(
        "approve_after_prepare",
        boolean,
        False,
        "Approve every Scheduled event affecting this VM once the prepare hook exited 0.",
        metavar="BOOL",
    ),
)


@dataclass(frozen=True)
class AgentConfig:
    imds_url: str = DEFAULT_IMDS_URL
    api_version: str = DEFAULT_API_VERSION
    sink: tuple[str, ...] = ()
    state_dir: Path = Path("/var/lib/se-bridge")
    poll_interval: float = 1.0
    listen: str = "127.0.0.1:8710"
    outbox_max_records: int = 10_000
    outbox_max_bytes: int = 64 << 20
    imds_timeout: float = 5.0
    imds_first_timeout: float = 120.0
    imds_max_rps: float = 5.0
    ready_max_failure: float = 30.0
    shutdown_timeout: float = 10.0
    log_level: str = "info"
    relay_key: tuple[str, ...] = ()
    listen_tls_cert: str | None = None
    listen_tls_key: str | None = None
    relay_require_this_vm: bool = True
    relay_allow_unsigned_loopback: bool = False
    listen_max_connections: int = 64
    listen_request_timeout: float = 10.0
    read_token_file: str | None = None
    auto_approve: tuple[str, ...] = ()
    prepare_hook: str | None = None
    recover_hook: str | None = None
    hook_timeout: float = 600.0
    hook_margin: float = 30.0
    approve_after_prepare: bool = False
    sources: dict[str, str] = field(default_factory=dict, compare=False)


def choice(*allowed: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        v = str(value).strip().lower()
        if v not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return v

    return parse


APPROVER_SETTINGS: tuple[Setting, ...] = (
    Setting(
        "source",
        text,
        None,
        "Where decisions come from: kafka://host:port/topic, "
        "eventhubs://<namespace>/<hub>?..., file:///path.jsonl or stdin:.",
        metavar="SPEC",
    ),
    Setting(
        "relay",
        text,
        "http://127.0.0.1:8710",
        "The local agent's listener (local mode): http(s)://host:port or unix:/path.sock.",
        metavar="URL",
    ),
    Setting(
        "state_dir",
        path,
        Path("/var/lib/se-bridge/approver"),
        "Directory for the decision store, the audit outbox and source positions.",
        metavar="DIR",
    ),
    Setting(
        "key",
        key_spec,
        (),
        "Key that signs decisions; repeat to rotate (file: at least 32 bytes).",
        multiple=True,
        metavar="KEYID=PATH",
    ),
    Setting(
        "sink",
        text,
        (),
        "Where audit records go (same specs as the agent's sinks); repeat for several.",
        multiple=True,
        metavar="SPEC",
    ),
    Setting(
        "mode",
        choice("local", "fleet"),
        "local",
        "local: the agent on this VM; fleet: agents learned from --events-source.",
        metavar="MODE",
    ),
    Setting(
        "events_source",
        text,
        (),
        "Fleet mode: the events stream the agents publish to (learns each "
        "agent's address and each event's VMs).",
        multiple=True,
        metavar="SPEC",
    ),
    Setting(
        "relay_url_template",
        text,
        "http://{privateIp}:8710",
        "Fleet mode: an agent's relay URL from its vm block ({privateIp}, {name}, {vmId}).",
        metavar="TEMPLATE",
    ),
    Setting(
        "relay_key",
        key_spec,
        (),
        "Key that signs relay requests (needed for non-loopback agents).",
        multiple=True,
        metavar="KEYID=PATH",
    ),
    Setting(
        "relay_ca_file",
        optional_text,
        None,
        "CA bundle that signs the agents' listener certificates (https:// relay URLs); default: system CAs.",
        metavar="PATH",
    ),
    Setting(
        "relay_timeout", number(1, 120), 15.0, "Seconds to wait for an agent's answer.", metavar="SECONDS"
    ),
    Setting(
        "group",
        text,
        "se-bridge-approver",
        "Consumer group (Kafka) / consumer group name (Event Hubs).",
        metavar="NAME",
    ),
    Setting(
        "allow_unsigned",
        boolean,
        False,
        "Accept unsigned decisions (labs only; refused by default).",
        metavar="BOOL",
    ),
    Setting(
        "issuer",
        text,
        (),
        "Allowed issuedBy values; repeat. Empty: any signed issuer.",
        multiple=True,
        metavar="NAME",
    ),
    Setting("max_skew", number(0, 3600), 300.0, "Tolerated clock skew for issuedAt.", metavar="SECONDS"),
    Setting(
        "max_ttl", number(1, 7 * 86400), 86400.0, "Longest allowed expiresAt - issuedAt.", metavar="SECONDS"
    ),
    Setting("log_level", log_level, "info", "debug, info, warning or error.", metavar="LEVEL"),
)


@dataclass(frozen=True)
class ApproverConfig:
    source: str = ""
    relay: str = "http://127.0.0.1:8710"
    state_dir: Path = Path("/var/lib/se-bridge/approver")
    key: tuple[str, ...] = ()
    sink: tuple[str, ...] = ()
    mode: str = "local"
    events_source: tuple[str, ...] = ()
    relay_url_template: str = "http://{privateIp}:8710"
    relay_key: tuple[str, ...] = ()
    relay_timeout: float = 15.0
    relay_ca_file: str | None = None
    group: str = "se-bridge-approver"
    allow_unsigned: bool = False
    issuer: tuple[str, ...] = ()
    max_skew: float = 300.0
    max_ttl: float = 86400.0
    log_level: str = "info"
    sources: dict[str, str] = field(default_factory=dict, compare=False)


def load_approver_config(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> ApproverConfig:
    environ = os.environ if environ is None else environ
    # The approver's variables are prefixed SE_BRIDGE_APPROVER_ so one environment can hold both.
    values = load(APPROVER_SETTINGS, args, environ, "approver", env_prefix=ENV_PREFIX + "APPROVER_")
    if not values["source"]:
        raise ConfigError(
            "source: a decisions source is required (--source kafka://host:9092/decisions, ...)"
        )
    if not values["sink"]:
        raise ConfigError("sink: at least one sink for audit records is required (--sink ...)")
    return ApproverConfig(**values)


def add_arguments(
    parser: argparse.ArgumentParser, settings: tuple[Setting, ...], env_prefix: str = ENV_PREFIX
) -> None:
    """One flag per setting; defaults stay None so the loader knows what was given."""
    parser.add_argument(
        "--config", metavar="FILE", help=f"TOML configuration file (env: {ENV_PREFIX}CONFIG)."
    )
    for s in settings:
        shown = ", ".join(map(str, s.default)) if s.multiple else s.default
        has_default = shown not in ((), "", None) and not isinstance(shown, bool)
        env = env_prefix + s.name.upper()
        help_text = f"{s.help} Env: {env}." + (f" Default: {shown}." if has_default else "")
        if isinstance(s.default, bool):
            help_text += f" Default: {str(s.default).lower()}."
        parser.add_argument(
            s.flag,
            dest=s.name,
            metavar=s.metavar,
            help=help_text,
            action="append" if s.multiple else "store",
            default=None,
        )


def load(
    settings: tuple[Setting, ...],
    args: argparse.Namespace | None = None,
    environ: Mapping[str, str] | None = None,
    section: str = "agent",
    env_prefix: str = ENV_PREFIX,
) -> dict[str, Any]:
    """Resolve every setting from defaults, file, environment and flags (in that order)."""
    environ = os.environ if environ is None else environ
    given = vars(args) if args is not None else {}
    values: dict[str, Any] = {s.name: s.default for s in settings}
    sources: dict[str, str] = dict.fromkeys(values, "default")

    config_file = given.get("config") or environ.get(ENV_PREFIX + "CONFIG")
    if config_file:
        for key, value in _read_toml(Path(config_file), section, settings).items():
            values[key], sources[key] = value, f"{config_file}"
    by_name = {s.name: s for s in settings}
    for s in settings:
        env = env_prefix + s.name.upper()
        if env in environ and environ[env].strip() != "":
            raw = environ[env]
            values[s.name] = raw.split() if s.multiple else raw
            sources[s.name] = f"environment variable {env}"
        if given.get(s.name) is not None:
            values[s.name] = given[s.name]
            sources[s.name] = f"flag {s.flag}"
    resolved: dict[str, Any] = {}
    for name, value in values.items():
        s = by_name[name]
        try:
            if s.multiple:
                items = [value] if isinstance(value, str) else list(value)
                resolved[name] = tuple(s.parse(v) for v in items)
            else:
                resolved[name] = value if value is None else s.parse(value)
        except (ValueError, TypeError) as exc:
            shown = "***" if "secret" in name or "password" in name else repr(value)
            raise ConfigError(f"{name}: {exc} (got {shown} from {sources[name]})") from None
    resolved["sources"] = sources
    return resolved


def load_agent_config(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> AgentConfig:
    values = load(AGENT_SETTINGS, args, environ, "agent")
    if not values["sink"]:
        raise ConfigError(
            "sink: at least one sink is required (--sink file:///var/log/se-bridge/records.jsonl, "
            f"{ENV_PREFIX}SINK or 'sink' in the config file)"
        )
    return AgentConfig(**values)


def _read_toml(file: Path, section: str, settings: tuple[Setting, ...]) -> dict[str, Any]:
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {file} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {file} cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {file} is not valid TOML: {exc}") from None
    # The agent's settings may sit at the top level or in an [agent] table; the approver's only in
    # an [approver] table, so one file can configure both without one reading the other's keys.
    table = data.get(section, {}) if isinstance(data.get(section), dict) else {}
    top = {k: v for k, v in data.items() if not isinstance(v, dict)} if section == "agent" else {}
    merged = top | table
    known = {s.name for s in settings}
    aliases = {"sinks": "sink"}
    out: dict[str, Any] = {}
    for key, value in merged.items():
        name = aliases.get(key.replace("-", "_"), key.replace("-", "_"))
        if name not in known:
            raise ConfigError(
                f"config file {file}: unknown setting {key!r} (known: {', '.join(sorted(known))})"
            )
        out[name] = value
    return out
