"""``se-bridge agent``'s configuration: every setting declared once, on its field (flag, variable,
TOML key, parser, help, default: :mod:`bridge.settings`); the settings several services share come
from its mixins there. Beside the service it configures (issue 32)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from bridge.imds.client import DEFAULT_IMDS_URL
from bridge.imds.document import API_VERSIONS, DEFAULT_API_VERSION
from bridge.settings import (
    ENV_PREFIX,
    CoordinationDeadlineSettings,
    LogSettings,
    ReadTokenSettings,
    Setting,
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
    optional_text,
    path,
    peer_spec,
    setting,
    settings_of,
    size,
    text,
)


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


#: The agent's settings (a read-only view of the dataclass above; nothing is declared here).
AGENT_SETTINGS: tuple[Setting, ...] = settings_of(AgentConfig)


def load_agent_config(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> AgentConfig:
    """The agent's configuration (what ``se-bridge agent`` and the installer's validation use)."""
    return load_config(AgentConfig, args, environ)
