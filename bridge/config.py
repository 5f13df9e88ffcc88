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
(:mod:`bridge.commands.install_config`) go through the same loaders, so a file the installer accepts is a file
the service starts with.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from bridge.config_central import (
    AzureChannelConfig,
    ConsoleConfig,
    load_azure_channel_config,
    load_console_config,
)
from bridge.imds.client import DEFAULT_IMDS_URL
from bridge.imds.document import API_VERSIONS, DEFAULT_API_VERSION
from bridge.settings import (
    CONFIG_ENV,
    ENV_PREFIX,
    ArmSettings,
    AzureKeySettings,
    ConfigBase,
    ConfigError,
    CoordinationDeadlineSettings,
    LogSettings,
    ReadTokenSettings,
    RecordSigningSettings,
    Setting,
    add_arguments,
    arm_scope_spec,
    auto_approve_rule,
    boolean,
    choice,
    format_size,
    imds_base_url,
    integer,
    key_spec,
    known_api_version,
    listen_address,
    load_config,
    number,
    optional_key_spec,
    optional_text,
    path,
    peer_spec,
    setting,
    settings_of,
    size,
    text,
)

__all__ = [
    "CONFIG_ENV",
    "AgentConfig",
    "ApproverConfig",
    "AzureChannelConfig",
    "ConfigBase",
    "ConfigError",
    "ConsoleConfig",
    "Setting",
    "add_arguments",
    "load_agent_config",
    "load_approver_config",
    "load_azure_channel_config",
    "load_config",
    "load_console_config",
    "settings_of",
]


@dataclass(frozen=True)
class AgentConfig(CoordinationDeadlineSettings, ReadTokenSettings, LogSettings):
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
        "IMDS requests per second this agent sends, StartRequests first (IMDS allows about 5 for the "
        "whole VM; the default keeps a margin for jitter and other IMDS users). While StartRequests use "
        "all of it, a poll held 2 s goes as one request more, within IMDS's 5.",
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
    heartbeat_interval: float = setting(
        300.0,
        number(0, 86400),
        "Seconds between heartbeat records (the agent is alive and watching; records otherwise come "
        "only with changes): what tells a console or an alert a quiet VM from a dead agent. 0: none.",
        metavar="SECONDS",
    )
    boot_id_file: Path = setting(  # noqa: RUF009 - setting() returns a dataclasses.field
        Path("/proc/sys/kernel/random/boot_id"),
        path,
        "Where the kernel's boot id is read: a changed one tells the agent the VM rebooted (the impact "
        "record of an event, docs/operations.md). Change only where /proc hides it (a container).",
        metavar="PATH",
    )
    relay_key: tuple[str, ...] = setting(
        (),
        key_spec,
        "Key that relay requests must be signed with, loopback callers included (the local and fleet "
        "approvers hold it); repeat to rotate.",
        metavar="KEYID=PATH",
        multiple=True,
    )
    decision_key: tuple[str, ...] = setting(
        (),
        key_spec,
        "Ed25519 public key (PEM) that proves the decisions this agent acts on: every relayed "
        "decision is verified here again before a StartRequest is posted (the signers hold the private "
        "keys: se-bridge keygen); repeat to rotate. An HMAC or private key is refused.",
        metavar="KEYID=PATH",
        multiple=True,
    )
    relay_legacy_until: str | None = setting(
        None,
        optional_text,
        "Migration from shared keys only (docs/security.md): until this RFC 3339 time, a relay request "
        "that carries no signed decision is still acted on (each is counted and logged); at most 31 "
        "days ahead. After it, such requests are refused.",
        metavar="TIME",
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
    coordinate_takeover: float = setting(
        10.0,
        number(1, 600),
        "Seconds the coordinating VM's agent must stay unreachable before the next VM of the event "
        "takes over (coordinate=peers).",
        metavar="SECONDS",
    )


@dataclass(frozen=True)
class ApproverConfig(
    RecordSigningSettings,
    ArmSettings,
    AzureKeySettings,
    CoordinationDeadlineSettings,
    ReadTokenSettings,
    LogSettings,
):
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
    arm: str = setting(
        "off",
        choice("off", "fallback", "only"),
        "Approve through Azure Resource Manager (docs/approvals.md): off; fallback, when no agent of the "
        "event could be reached; only, for VMs without the agent.",
        metavar="MODE",
    )
    arm_api_version: str = setting(
        "2025-11-01", text, "api-version of ScheduledEvents_Acknowledge.", metavar="V"
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
    coordinate: bool = setting(
        False,
        boolean,
        "Fleet mode: approve each Scheduled event once every VM it names that runs the agent reported "
        "prepared (agents run with coordinate=fleet), or at the deadline (docs/approvals.md).",
        metavar="BOOL",
    )
    coordinate_key: str | None = setting(
        None,
        optional_key_spec,
        "Fleet mode with --coordinate: the Ed25519 private key (PEM) that signs the coordinator's "
        "approvals, so that the agents prove them like any decision (give its public half to the agents' "
        "--decision-key). Required with --coordinate.",
        metavar="KEYID=PATH",
    )


#: The derived tables (read-only views of the dataclasses above; nothing is declared here).
AGENT_SETTINGS: tuple[Setting, ...] = settings_of(AgentConfig)
APPROVER_SETTINGS: tuple[Setting, ...] = settings_of(ApproverConfig)


# -- loading -----------------------------------------------------------------------------------------


def load_agent_config(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> AgentConfig:
    """The agent's configuration (what ``se-bridge agent`` and the installer's validation use)."""
    return load_config(AgentConfig, args, environ)


def load_approver_config(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> ApproverConfig:
    """The approver's configuration (what ``se-bridge approver`` and the installer's validation use)."""
    return load_config(ApproverConfig, args, environ)
