"""``se-bridge azure-channel``'s configuration, beside the service (issue 32); shared settings are
the mixins in :mod:`bridge.settings`."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from bridge.settings import (
    ENV_PREFIX,
    ArmSettings,
    LogSettings,
    ReadTokenSettings,
    RecordSigningSettings,
    guid_text,
    listen_address,
    load_config,
    number,
    path,
    setting,
    text,
)


@dataclass(frozen=True)
class AzureChannelConfig(RecordSigningSettings, ArmSettings, ReadTokenSettings, LogSettings):
    """``se-bridge azure-channel``: flags, ``SE_BRIDGE_AZURE_<NAME>`` or the ``[azure_channel]`` table."""

    env_prefix: ClassVar[str] = ENV_PREFIX + "AZURE_"
    toml_section: ClassVar[str] = "azure_channel"

    source: tuple[str, ...] = setting(
        (),
        text,
        "Where Azure's channel arrives: the Event Hub the Event Grid system topic delivers to "
        "(eventhubs://...?consumer_group=...&checkpoint_store=...) or a file of Event Grid events "
        "(file:///path.jsonl); repeat for several.",
        metavar="SPEC",
        multiple=True,
        required="a source is required (--source 'eventhubs://ns.servicebus.windows.net/se-azure-events?...')",
    )
    events_source: tuple[str, ...] = setting(
        (),
        text,
        "The agents' events stream, to reconcile Azure's events with what the agents reported (the "
        "specs of se-bridge console --events-source); repeat. None: no reconciliation findings.",
        metavar="SPEC",
        multiple=True,
    )
    sink: tuple[str, ...] = setting(
        (),
        text,
        "Where the azureScheduledEvent and reconciliation records go (the agent's sink specs); repeat.",
        metavar="SPEC",
        multiple=True,
        required="a sink is required (--sink eventhubs://..., --sink file:///path.jsonl, ...)",
    )
    grace: float = setting(
        120.0,
        number(1, 86400),
        "Seconds an agent has to report an event Azure published (and Azure to publish one an agent "
        "reported) before a VM is found unwatched (or the event agent-only).",
        metavar="SECONDS",
    )
    listen: str = setting(
        "127.0.0.1:8730",
        listen_address,
        "Where /healthz, /readyz, /metrics and /v1/unwatched are served, HOST:PORT, or off.",
        metavar="HOST:PORT",
    )
    state_dir: Path = setting(  # noqa: RUF009 - setting() returns a dataclasses.field
        Path("/var/lib/se-bridge/azure-channel"),
        path,
        "Directory for the outbox, the dead letters and the readers' positions.",
        metavar="DIR",
    )
    group: str = setting(
        "se-bridge-azure-channel", text, "Consumer group prefix of the events readers.", metavar="NAME"
    )
    graph_subscription: tuple[str, ...] = setting(
        (),
        guid_text,
        "Poll Resource Graph's maintenanceresources for these subscriptions (a GUID; repeat): the second "
        "input, or the only one without Event Grid. None: no polling.",
        metavar="ID",
        multiple=True,
    )
    graph_interval: float = setting(
        60.0,
        number(10, 3600),
        "Seconds between two Resource Graph polls, from 10 to 3600 (refused at start otherwise; Resource "
        "Graph allows 15 queries per 5 s per user).",
        metavar="SECONDS",
    )


def load_azure_channel_config(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> AzureChannelConfig:
    return load_config(AzureChannelConfig, args, environ)
