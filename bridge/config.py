"""Configuration: every setting is declared once, as a field of :class:`AgentConfig` or
:class:`ApproverConfig`, and everything else is derived from that field.

Why: the settings used to be declared twice (a table for the flags and the files, a dataclass for the
code) and the two drifted apart. Now a field carries its default (the value the code gets) and, in its
metadata (:func:`setting`), the parser, the help text and the metavar; the flag (``--poll-interval``),
the environment variable (``SE_BRIDGE_POLL_INTERVAL``, ``SE_BRIDGE_APPROVER_*`` for the approver), the
TOML key, ``--help`` and the refusal messages are all computed from it (:func:`settings_of`).

Precedence, lowest first: built-in default < TOML file (``--config`` or ``SE_BRIDGE_CONFIG``) <
environment < command-line flag.

A wrong value is refused at start-up with a message naming the setting, the value and where it came
from (flag, variable or file), never with a traceback. Unknown keys in the TOML file are refused too:
a typo must not silently fall back to a default on a production VM. The services and the installers
(:mod:`bridge.install_config`) go through the same loaders, so a file the installer accepts is a file
the service starts with.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from bridge.imds.client import DEFAULT_IMDS_URL
from bridge.imds.document import API_VERSIONS, DEFAULT_API_VERSION
from bridge.netaddr import parse_listen
from bridge.rules import ApprovalRule

ENV_PREFIX = "SE_BRIDGE_"
#: The environment variable naming the TOML file, for every command (``--config`` wins over it).
CONFIG_ENV = ENV_PREFIX + "CONFIG"
#: Key of a setting's :class:`SettingInfo` in its dataclass field's metadata.
_METADATA_KEY = "se_bridge_setting"


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message says which and from where."""


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


def format_size(value: int) -> str:
    """``64M`` for 64 MiB: how :func:`size` values are shown in ``--help``, the form operators type."""
    for suffix, unit in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)


def known_api_version(value: Any) -> str:
    v = str(value).strip()
    if v not in API_VERSIONS:
        raise ValueError(f"expected one of {', '.join(API_VERSIONS)}")
    return v


def imds_base_url(value: Any) -> str:
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


def level_name(value: Any) -> str:
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


def choice(*allowed: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        v = str(value).strip().lower()
        if v not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return v

    return parse


def key_spec(value: Any) -> str:
    v = text(value)
    key_id, sep, file = v.partition("=")
    if not sep or not key_id or not file:
        raise ValueError("expected KEYID=PATH (a file holding the shared secret)")
    return v


def auto_approve_rule(value: Any) -> str:
    """The rule's text, once :class:`bridge.rules.ApprovalRule` could parse it (the agent parses it
    again when it builds its policy; refusing here names the setting and the source)."""
    ApprovalRule.parse(text(value))
    return text(value)


def peer_spec(value: Any) -> str:
    name, sep, url = text(value).partition("=")
    if not sep or not name.strip() or not url.startswith(("http://", "https://")):
        raise ValueError("expected NAME=URL with an http:// or https:// URL")
    return f"{name.strip().lower()}={url.strip()}"


def https_url(value: Any) -> str:
    v = str(value).strip().rstrip("/")
    if not v.startswith("https://") or len(v) <= len("https://"):
        raise ValueError("expected https://host[:port] (ARM is only spoken over TLS)")
    return v


def arm_scope_spec(value: Any) -> str:
    from bridge.azure_ids import parse_allowed_scope

    parse_allowed_scope(text(value))
    return text(value).rstrip("/")


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


# -- the declaration ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SettingInfo:
    """What a config field declares besides its default (kept in the field's metadata)."""

    parse: Callable[[Any], Any]
    help: str
    metavar: str
    multiple: bool = False
    #: Other TOML keys accepted for it (``sinks`` for ``sink``).
    toml_aliases: tuple[str, ...] = ()
    #: When set, an empty value is refused with ``"<name>: <required>"``.
    required: str | None = None
    #: How ``--help`` shows the default (``64M`` rather than 67108864).
    show: Callable[[Any], str] = str


def setting(
    default: Any,
    parse: Callable[[Any], Any],
    help: str,
    *,
    metavar: str,
    multiple: bool = False,
    toml_aliases: tuple[str, ...] = (),
    required: str | None = None,
    show: Callable[[Any], str] = str,
) -> Any:
    """A config dataclass field: its default is what the code gets when nothing sets it (so it must
    already be the parsed value, ``64 << 20`` and not ``"64M"``); the rest feeds the flag, the
    environment variable, the TOML key, ``--help`` and the refusal messages."""
    info = SettingInfo(parse, help, metavar, multiple, toml_aliases, required, show)
    return field(default=default, metadata={_METADATA_KEY: info})


@dataclass(frozen=True)
class Setting:
    """One setting as the loaders and the command line see it, derived from a config field."""

    name: str
    default: Any
    info: SettingInfo
    flag: str
    env: str
    toml_key: str

    @property
    def parse(self) -> Callable[[Any], Any]:
        return self.info.parse

    @property
    def multiple(self) -> bool:
        return self.info.multiple

    @property
    def help(self) -> str:
        return self.info.help

    @property
    def metavar(self) -> str:
        return self.info.metavar


def coordinate_deadline_setting() -> Any:
    """The agent's and the fleet approver's (both coordinate: bridge.coordination)."""
    return setting(
        120.0,
        number(0, 86400),
        "Seconds before the event's NotBefore when a coordinator stops waiting for unprepared VMs "
        "(then --coordinate-on-deadline applies).",
        metavar="SECONDS",
    )


def coordinate_on_deadline_setting() -> Any:
    return setting(
        "platform",
        choice("platform", "approve"),
        "At the deadline with VMs not prepared: 'platform' approves nothing (the platform starts the "
        "event at NotBefore, every VM gets its full notice); 'approve' approves anyway.",
        metavar="POLICY",
    )


@dataclass(frozen=True)
class ConfigBase:
    """What the agent's and the approver's configurations share: where their settings come from."""

    #: Prefix of the environment variables (``SE_BRIDGE_`` + the setting's name in capitals).
    env_prefix: ClassVar[str] = ENV_PREFIX
    #: The TOML table holding the settings.
    toml_section: ClassVar[str] = ""
    #: Whether settings may also sit at the top level of the TOML file, outside any table.
    toml_top_level: ClassVar[bool] = False

    #: Where each value came from: ``default``, the file's path, ``environment variable X``, ``flag --x``.
    sources: dict[str, str] = field(default_factory=dict, compare=False, kw_only=True)


Config = TypeVar("Config", bound=ConfigBase)


_SETTINGS: dict[type[ConfigBase], tuple[Setting, ...]] = {}


def settings_of(config_class: type[ConfigBase]) -> tuple[Setting, ...]:
    """Every setting of ``config_class``, in declaration order (the order of ``--help``)."""
    found = _SETTINGS.get(config_class)
    if found is None:
        found = _SETTINGS[config_class] = _declared(config_class)
    return found


def _declared(config_class: type[ConfigBase]) -> tuple[Setting, ...]:
    shared = {f.name for f in fields(ConfigBase)}  # ``sources``: bookkeeping, not a setting
    out = []
    for f in fields(config_class):
        if f.name in shared:
            continue
        info = f.metadata.get(_METADATA_KEY)
        if not isinstance(info, SettingInfo):
            raise TypeError(f"{config_class.__name__}.{f.name} is not declared with setting(...)")
        out.append(
            Setting(
                name=f.name,
                default=f.default,
                info=info,
                flag="--" + f.name.replace("_", "-"),
                env=config_class.env_prefix + f.name.upper(),
                toml_key=f.name,
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class AgentConfig(ConfigBase):
    """``se-bridge agent``: flags, ``SE_BRIDGE_<NAME>``, the ``[agent]`` table or the file's top level."""

    toml_section: ClassVar[str] = "agent"
    toml_top_level: ClassVar[bool] = True

    imds_url: str = setting(
        DEFAULT_IMDS_URL, imds_base_url, "IMDS base URL (the emulator's URL in tests).", metavar="URL"
    )
    api_version: str = setting(
        DEFAULT_API_VERSION,
        known_api_version,
        f"Scheduled Events api-version to request ({API_VERSIONS[0]} .. {API_VERSIONS[-1]}).",
        metavar="V",
    )
    sink: tuple[str, ...] = setting(
        (),
        text,
        "Where records go; repeat for several: file:///path.jsonl, stdout:, kafka://host:port/topic?..., "
        "eventhubs://<namespace>/<hub>?..., https://host/path#options (in the environment: several specs "
        "separated by spaces).",
        metavar="SPEC",
        multiple=True,
        toml_aliases=("sinks",),
        required="at least one sink is required (--sink file:///var/log/se-bridge/records.jsonl, "
        f"{ENV_PREFIX}SINK or 'sink' in the config file)",
    )
    state_dir: Path = setting(  # noqa: RUF009 - setting() returns a dataclasses.field
        Path("/var/lib/se-bridge"),
        path,
        "Directory for the outbox, the baseline document and cursors (must persist across reboots).",
        metavar="DIR",
    )
    poll_interval: float = setting(
        1.0, number(0.1, 60), "Seconds between polls (IMDS recommends 1).", metavar="SECONDS"
    )
    listen: str = setting(
        "127.0.0.1:8710",
        listen_address,
        "HTTP listener for /healthz, /readyz, /metrics, /v1/document and the relay: HOST:PORT (loopback "
        "by default), unix:/path.sock (mode 0660, for a local approver), or 'off'.",
        metavar="HOST:PORT|unix:PATH",
    )
    outbox_max_records: int = setting(
        10_000,
        integer(1, 10_000_000),
        "Records held for the slowest sink before new changes are coalesced.",
        metavar="N",
    )
    outbox_max_bytes: int = setting(
        64 << 20, size, "Bytes held for the slowest sink (K/M/G suffix).", metavar="SIZE", show=format_size
    )
    imds_timeout: float = setting(
        5.0, number(0.1, 60), "Timeout of an IMDS request after the first answer.", metavar="SECONDS"
    )
    imds_first_timeout: float = setting(
        120.0,
        number(1, 600),
        "Timeout of the first IMDS request (Scheduled Events may take 2 minutes to wake up).",
        metavar="SECONDS",
    )
    imds_max_rps: float = setting(
        4.0,
        number(0.1, 5),
        "Most IMDS requests per second this agent sends, StartRequests first (IMDS allows about 5 for "
        "the whole VM; the default keeps a margin for jitter and other IMDS users).",
        metavar="N",
    )
    ready_max_failure: float = setting(
        30.0,
        number(1, 3600),
        "/readyz reports not ready once IMDS has failed for this many seconds in a row.",
        metavar="SECONDS",
    )
    shutdown_timeout: float = setting(
        10.0,
        number(0, 300),
        "On SIGTERM, seconds to keep delivering queued records before exiting.",
        metavar="SECONDS",
    )
    log_level: str = setting("info", level_name, "debug, info, warning or error.", metavar="LEVEL")
    heartbeat_interval: float = setting(
        300.0,
        number(0, 86400),
        "Seconds between heartbeat records (the agent is alive and watching; records otherwise come "
        "only with changes): what tells a console or an alert a quiet VM from a dead agent. 0: none.",
        metavar="SECONDS",
    )
    relay_key: tuple[str, ...] = setting(
        (),
        key_spec,
        "Key that relay requests must be signed with, loopback callers included (the local and fleet "
        "approvers hold it); repeat to rotate.",
        metavar="KEYID=PATH",
        multiple=True,
    )
    listen_tls_cert: str | None = setting(
        None,
        optional_text,
        "PEM certificate (chain) to serve the listener over TLS (with --listen-tls-key), e.g. when fleet "
        "approvers reach the relay API over the network.",
        metavar="PATH",
    )
    listen_tls_key: str | None = setting(
        None, optional_text, "PEM private key of --listen-tls-cert.", metavar="PATH"
    )
    listen_max_connections: int = setting(
        64,
        integer(1, 10_000),
        "Connections the listener serves at once; a few more may still ask /healthz and /readyz, the "
        "rest are answered 503.",
        metavar="N",
    )
    listen_request_timeout: float = setting(
        10.0,
        number(0.5, 300),
        "Seconds a caller has to deliver a whole request (TLS handshake, headers and body); slower "
        "connections are cut.",
        metavar="SECONDS",
    )
    relay_allow_unsigned_loopback: bool = setting(
        False,
        boolean,
        "Development only: accept unsigned relay requests from loopback when no relay key is set (any "
        "local user can then approve; a warning is logged at start).",
        metavar="BOOL",
    )
    read_token_file: str | None = setting(
        None,
        optional_text,
        "File holding a token (at least 32 bytes) that non-loopback callers of /metrics and /v1/document "
        "send as 'Authorization: Bearer <token>' (Prometheus: authorization.credentials_file).",
        metavar="PATH",
    )
    relay_require_this_vm: bool = setting(
        True, boolean, "Refuse to approve events whose Resources do not name this VM.", metavar="BOOL"
    )
    auto_approve: tuple[str, ...] = setting(
        (),
        auto_approve_rule,
        "Approve matching Scheduled events locally, e.g. 'source=User' or 'type=Freeze,max_duration=9'; "
        "repeat for several rules (conditions: type=, source=, max_duration=).",
        metavar="RULE",
        multiple=True,
    )
    prepare_hook: str | None = setting(
        None,
        optional_text,
        "Command run for each Scheduled event affecting this VM (event in SE_* variables and SE_EVENT_FILE); "
        "a local approval waits for it to exit 0.",
        metavar="CMD",
    )
    recover_hook: str | None = setting(
        None,
        optional_text,
        "Command run when an event that affected this VM is gone (completed or canceled).",
        metavar="CMD",
    )
    hook_timeout: float = setting(600.0, number(1, 86400), "Longest a hook may run.", metavar="SECONDS")
    hook_margin: float = setting(
        30.0,
        number(0, 3600),
        "A prepare hook's timeout ends this long before the event's NotBefore.",
        metavar="SECONDS",
    )
    approve_after_prepare: bool = setting(
        False,
        boolean,
        "Approve every Scheduled event affecting this VM once the prepare hook exited 0.",
        metavar="BOOL",
    )
    coordinate: str = setting(
        "off",
        choice("off", "peers", "fleet"),
        "Coordinated approval across the VMs an event names (docs/approvals.md): 'off' approves locally "
        "as soon as this VM is prepared; 'fleet' only reports (preparation records) and leaves the "
        "approval to a fleet approver run with --coordinate; 'peers' lets the first live VM of the "
        "event approve once every VM that runs the agent reported prepared.",
        metavar="MODE",
    )
    peer: tuple[str, ...] = setting(
        (),
        peer_spec,
        "Where another VM's agent API is (coordinate=peers), as NAME=URL; repeat for each. VMs not "
        "listed are reached through --peer-url-template.",
        metavar="NAME=URL",
        multiple=True,
    )
    peer_url_template: str = setting(
        "http://{name}:8710",
        text,
        "The agent API of a VM of the event not listed with --peer ({name}: the VM name as the event's "
        "Resources give it; Azure DNS resolves VM names inside a VNet).",
        metavar="URL",
    )
    coordinate_deadline: float = coordinate_deadline_setting()
    coordinate_on_deadline: str = coordinate_on_deadline_setting()
    coordinate_takeover: float = setting(
        10.0,
        number(1, 600),
        "Seconds the coordinating VM's agent must stay unreachable before the next VM of the event "
        "takes over (coordinate=peers).",
        metavar="SECONDS",
    )


@dataclass(frozen=True)
class ApproverConfig(ConfigBase):
    """``se-bridge approver``: flags, ``SE_BRIDGE_APPROVER_<NAME>`` (so one environment can hold both
    services' variables) or the ``[approver]`` table (never the file's top level, which is the agent's)."""

    env_prefix: ClassVar[str] = ENV_PREFIX + "APPROVER_"
    toml_section: ClassVar[str] = "approver"

    source: str = setting(
        "",
        text,
        "Where decisions come from: kafka://host:port/topic, "
        "eventhubs://<namespace>/<hub>?..., file:///path.jsonl or stdin:.",
        metavar="SPEC",
        required="a decisions source is required (--source kafka://host:9092/decisions, ...)",
    )
    relay: str = setting(
        "http://127.0.0.1:8710",
        text,
        "The local agent's listener (local mode): http(s)://host:port or unix:/path.sock.",
        metavar="URL",
    )
    state_dir: Path = setting(  # noqa: RUF009 - setting() returns a dataclasses.field
        Path("/var/lib/se-bridge/approver"),
        path,
        "Directory for the decision store, the audit outbox and source positions.",
        metavar="DIR",
    )
    key: tuple[str, ...] = setting(
        (),
        key_spec,
        "Key that signs decisions; repeat to rotate (file: at least 32 bytes).",
        metavar="KEYID=PATH",
        multiple=True,
    )
    sink: tuple[str, ...] = setting(
        (),
        text,
        "Where audit records go (same specs as the agent's sinks); repeat for several.",
        metavar="SPEC",
        multiple=True,
        toml_aliases=("sinks",),
        required="at least one sink for audit records is required (--sink ...)",
    )
    mode: str = setting(
        "local",
        choice("local", "fleet"),
        "local: the agent on this VM; fleet: agents learned from --events-source.",
        metavar="MODE",
    )
    events_source: tuple[str, ...] = setting(
        (),
        text,
        "Fleet mode: the events stream the agents publish to (learns each "
        "agent's address and each event's VMs).",
        metavar="SPEC",
        multiple=True,
    )
    standby_after: float = setting(
        1.0,
        number(0, 60),
        "Fleet mode: seconds a decision may wait for the instance that owns its partition before this "
        "instance acts on it too (the standby: no takeover window when an instance dies; "
        "docs/approvals.md); 0 turns the standby off.",
        metavar="SECONDS",
    )
    relay_url_template: str = setting(
        "http://{privateIp}:8710",
        text,
        "Fleet mode: an agent's relay URL from its vm block ({privateIp}, {name}, {vmId}).",
        metavar="TEMPLATE",
    )
    relay_key: tuple[str, ...] = setting(
        (),
        key_spec,
        "Key that signs relay requests (needed for non-loopback agents).",
        metavar="KEYID=PATH",
        multiple=True,
    )
    relay_unsigned: bool = setting(
        False,
        boolean,
        "Development only: relay unsigned requests to a local agent started with "
        "--relay-allow-unsigned-loopback (without it, an approver with no --relay-key refuses to start: "
        "every agent would answer 401 and the decision would be spent).",
        metavar="BOOL",
    )
    relay_ca_file: str | None = setting(
        None,
        optional_text,
        "CA bundle that signs the agents' listener certificates (https:// relay URLs); default: system CAs.",
        metavar="PATH",
    )
    relay_timeout: float = setting(
        15.0, number(1, 120), "Seconds to wait for an agent's answer.", metavar="SECONDS"
    )
    group: str = setting(
        "se-bridge-approver",
        text,
        "Consumer group (Kafka) / consumer group name (Event Hubs).",
        metavar="NAME",
    )
    allow_unsigned: bool = setting(
        False, boolean, "Accept unsigned decisions (labs only; refused by default).", metavar="BOOL"
    )
    issuer: tuple[str, ...] = setting(
        (),
        text,
        "Allowed issuedBy values; repeat. Empty: any signed issuer.",
        metavar="NAME",
        multiple=True,
    )
    max_skew: float = setting(300.0, number(0, 3600), "Tolerated clock skew for issuedAt.", metavar="SECONDS")
    max_ttl: float = setting(
        86400.0, number(1, 7 * 86400), "Longest allowed expiresAt - issuedAt.", metavar="SECONDS"
    )
    listen: str = setting(
        "127.0.0.1:8711",
        listen_address,
        "HTTP listener for /healthz, /readyz and /metrics: HOST:PORT (loopback by default), "
        "unix:/path.sock, or 'off'.",
        metavar="HOST:PORT|unix:PATH",
    )
    read_token_file: str | None = setting(
        None,
        optional_text,
        "File holding a token (at least 32 bytes) that non-loopback scrapers of /metrics send as "
        "'Authorization: Bearer <token>'.",
        metavar="PATH",
    )
    arm: str = setting(
        "off",
        choice("off", "fallback", "only"),
        "Approve through Azure Resource Manager (docs/approvals.md): off; fallback, when no agent of the "
        "event could be reached; only, for VMs without the agent.",
        metavar="MODE",
    )
    arm_endpoint: str = setting(
        "https://management.azure.com",
        https_url,
        "ARM endpoint (sovereign clouds: https://management.usgovcloudapi.net, ...).",
        metavar="URL",
    )
    arm_api_version: str = setting(
        "2025-11-01", text, "api-version of ScheduledEvents_Acknowledge.", metavar="V"
    )
    arm_audience: str | None = setting(
        None, optional_text, "Token audience (default: the endpoint).", metavar="URL"
    )
    arm_credential: str = setting(
        "managed",
        choice("managed", "default"),
        "Entra ID credential: managed identity or azure-identity's default chain.",
        metavar="KIND",
    )
    arm_client_id: str | None = setting(
        None, optional_text, "Client id of a user-assigned managed identity for ARM.", metavar="UUID"
    )
    arm_scope: tuple[str, ...] = setting(
        (),
        arm_scope_spec,
        "With --arm: where acknowledgements may go, /subscriptions/<id> or "
        "/subscriptions/<id>/resourceGroups/<name>; repeat for several. A VM outside every scope is "
        "refused (its resource id comes from records anyone on the events stream may publish).",
        metavar="SCOPE",
        multiple=True,
    )
    arm_ca_file: str | None = setting(
        None,
        optional_text,
        "CA bundle for the ARM endpoint (a private endpoint's proxy); default: system CAs.",
        metavar="PATH",
    )
    coordinate: bool = setting(
        False,
        boolean,
        "Fleet mode: approve each Scheduled event once every VM it names that runs the agent reported "
        "prepared (agents run with coordinate=fleet), or at the deadline (docs/approvals.md).",
        metavar="BOOL",
    )
    coordinate_deadline: float = coordinate_deadline_setting()
    coordinate_on_deadline: str = coordinate_on_deadline_setting()
    log_level: str = setting("info", level_name, "debug, info, warning or error.", metavar="LEVEL")


@dataclass(frozen=True)
class ConsoleConfig(ConfigBase):
    """``se-bridge console``: flags, ``SE_BRIDGE_CONSOLE_<NAME>`` or the ``[console]`` table."""

    env_prefix: ClassVar[str] = ENV_PREFIX + "CONSOLE_"
    toml_section: ClassVar[str] = "console"

    events_source: tuple[str, ...] = setting(
        (),
        text,
        "The events stream the agents and approvers publish to (kafka://..., eventhubs://... without a "
        "checkpoint store, file:///path.jsonl); repeat for several. Every console instance reads all of it.",
        metavar="SPEC",
        multiple=True,
        required="an events stream is required (--events-source kafka://host:9092/events, ...)",
    )
    sink: str = setting(
        "",
        text,
        "The decisions topic approvals are published to (the specs of se-bridge decide --sink).",
        metavar="SPEC",
        required="a decisions topic is required (--sink kafka://host:9092/decisions, ...)",
    )
    key: str = setting(
        "",
        key_spec,
        "The key that signs the console's decisions, KEYID=PATH or KEYID=https://<vault>/secrets/<name> "
        "(the approvers' --key names the same).",
        metavar="KEYID=PATH",
        required="a signing key is required (--key console=/etc/se-bridge/keys/console.key)",
    )
    auth: str = setting(
        "",
        choice("entra", "oauth2-proxy", "lab"),
        "Who the person is: 'entra' (Container Apps / App Service authentication), 'oauth2-proxy', or "
        "'lab' (a random token printed at start; anyone holding it may approve). Required.",
        metavar="MODE",
        required="auth is required: entra or oauth2-proxy behind Entra ID, or lab for a test bench",
    )
    approver_role: tuple[str, ...] = setting(
        (), text, "An Entra app role whose holders may approve; repeat.", metavar="ROLE", multiple=True
    )
    approver_group: tuple[str, ...] = setting(
        (), text, "A group (object id, or oauth2-proxy group) whose members may approve; repeat.",
        metavar="GROUP", multiple=True,
    )  # fmt: skip
    listen: str = setting(
        "127.0.0.1:8720",
        listen_address,
        "Where the pages and the API are served, HOST:PORT (behind the front door that signs people in).",
        metavar="HOST:PORT",
    )
    state_dir: Path = setting(  # noqa: RUF009 - setting() returns a dataclasses.field
        Path("/var/lib/se-bridge/console"),
        path,
        "Directory for the stream readers' own positions and consumer group id.",
        metavar="DIR",
    )
    group: str = setting(
        "se-bridge-console", text, "Consumer group prefix of the events readers.", metavar="NAME"
    )
    silent_after: float = setting(
        900.0,
        number(1, 86400),
        "A VM whose agent sent nothing (a heartbeat included) for this long is flagged silent (three "
        "heartbeat intervals by default).",
        metavar="SECONDS",
    )
    history_days: float = setting(30.0, number(1, 366), "Days of closed events kept.", metavar="DAYS")
    decision_ttl: float = setting(
        900.0, number(30, 86400), "Seconds a decision made in the console stays valid.", metavar="SECONDS"
    )
    log_level: str = setting("info", level_name, "debug, info, warning or error.", metavar="LEVEL")


#: The derived tables (read-only views of the dataclasses above; nothing is declared here).
AGENT_SETTINGS: tuple[Setting, ...] = settings_of(AgentConfig)
APPROVER_SETTINGS: tuple[Setting, ...] = settings_of(ApproverConfig)


# -- the command line ----------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser, config_class: type[ConfigBase]) -> None:
    """``--config`` and one flag per setting; defaults stay None so the loader knows what was given."""
    parser.add_argument("--config", metavar="FILE", help=f"TOML configuration file (env: {CONFIG_ENV}).")
    for s in settings_of(config_class):
        parser.add_argument(
            s.flag,
            dest=s.name,
            metavar=s.metavar,
            help=help_text(s),
            action="append" if s.multiple else "store",
            default=None,
        )


def help_text(s: Setting) -> str:
    """The setting's help, its environment variable and its default (when it has one worth showing)."""
    out = f"{s.help} Env: {s.env}."
    if isinstance(s.default, bool):
        return out + f" Default: {str(s.default).lower()}."
    shown = ", ".join(map(s.info.show, s.default)) if s.multiple else s.default
    if shown in ((), "", None):
        return out
    return out + f" Default: {s.info.show(shown) if not s.multiple else shown}."


# -- loading -----------------------------------------------------------------------------------------


def load_agent_config(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> AgentConfig:
    """The agent's configuration (what ``se-bridge agent`` and the installer's validation use)."""
    return load_config(AgentConfig, args, environ)


def load_console_config(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> ConsoleConfig:
    return load_config(ConsoleConfig, args, environ)


def load_approver_config(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> ApproverConfig:
    """The approver's configuration (what ``se-bridge approver`` and the installer's validation use)."""
    return load_config(ApproverConfig, args, environ)


def load_config(
    config_class: type[Config],
    args: argparse.Namespace | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Resolve every setting from defaults, file, environment and flags (in that order), parse what
    was given, then refuse an empty required setting; ConfigError names the setting and the source."""
    environ = os.environ if environ is None else environ
    settings = settings_of(config_class)
    raw, sources = _gather(config_class, vars(args) if args is not None else {}, environ)
    values = {s.name: _parsed(s, raw[s.name], sources[s.name]) for s in settings}
    for s in settings:
        if s.info.required and not values[s.name]:
            raise ConfigError(f"{s.name}: {s.info.required}")
    return config_class(**values, sources=sources)


def _gather(
    config_class: type[ConfigBase], given: Mapping[str, Any], environ: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """Each setting's raw value and where it came from, the later source overriding the earlier."""
    settings = settings_of(config_class)
    values: dict[str, Any] = {s.name: s.default for s in settings}
    sources: dict[str, str] = dict.fromkeys(values, "default")
    config_file = given.get("config") or environ.get(CONFIG_ENV)
    if config_file:
        for name, value in _read_toml(Path(config_file), config_class).items():
            values[name], sources[name] = value, f"{config_file}"
    for s in settings:
        if s.env in environ and environ[s.env].strip() != "":
            values[s.name] = environ[s.env].split() if s.multiple else environ[s.env]
            sources[s.name] = f"environment variable {s.env}"
        if given.get(s.name) is not None:
            values[s.name] = given[s.name]
            sources[s.name] = f"flag {s.flag}"
    return values, sources


def _parsed(s: Setting, value: Any, source: str) -> Any:
    """``value`` through the setting's parser; a default is already the value the code wants."""
    if source == "default" or value is None:
        return value
    try:
        if s.multiple:
            items = [value] if isinstance(value, str) else list(value)
            return tuple(s.parse(v) for v in items)
        return s.parse(value)
    except (ValueError, TypeError) as exc:
        shown = "***" if "secret" in s.name or "password" in s.name else repr(value)
        raise ConfigError(f"{s.name}: {exc} (got {shown} from {source})") from None


def _read_toml(file: Path, config_class: type[ConfigBase]) -> dict[str, Any]:
    """The settings ``file`` gives ``config_class``, by name; unknown keys are refused."""
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
    section = config_class.toml_section
    table = data.get(section, {}) if isinstance(data.get(section), dict) else {}
    top = {k: v for k, v in data.items() if not isinstance(v, dict)} if config_class.toml_top_level else {}
    settings = settings_of(config_class)
    names = {s.toml_key: s.name for s in settings}
    names |= {alias: s.name for s in settings for alias in s.info.toml_aliases}
    out: dict[str, Any] = {}
    for key, value in (top | table).items():
        name = names.get(key.replace("-", "_"))
        if name is None:
            known = ", ".join(sorted(s.toml_key for s in settings))
            raise ConfigError(f"config file {file}: unknown setting {key!r} (known: {known})")
        out[name] = value
    return out
