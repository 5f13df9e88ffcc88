"""``se-bridge approver``'s configuration: every setting declared once, on its field; the settings
several services share come from the mixins in :mod:`bridge.settings`. Beside the service (issue 32)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from bridge.settings import (
    ENV_PREFIX,
    ArmSettings,
    AzureKeySettings,
    CoordinationDeadlineSettings,
    LogSettings,
    ReadTokenSettings,
    RecordSigningSettings,
    Setting,
    arm_scope_spec,
    boolean,
    choice,
    key_spec,
    listen_address,
    load_config,
    number,
    optional_key_spec,
    optional_text,
    path,
    setting,
    settings_of,
    text,
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


#: The approver's settings (a read-only view of the dataclass above).
APPROVER_SETTINGS: tuple[Setting, ...] = settings_of(ApproverConfig)


def load_approver_config(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> ApproverConfig:
    """The approver's configuration (what ``se-bridge approver`` and the installer's validation use)."""
    return load_config(ApproverConfig, args, environ)
