"""``se-bridge console``'s configuration, beside the service (issue 32); shared settings are the
mixins in :mod:`bridge.settings`."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from bridge.settings import (
    ENV_PREFIX,
    AzureKeySettings,
    LogSettings,
    ReadTokenSettings,
    choice,
    key_spec,
    listen_address,
    load_config,
    number,
    optional_text,
    path,
    setting,
    text,
)


@dataclass(frozen=True)
class ConsoleConfig(AzureKeySettings, ReadTokenSettings, LogSettings):
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
    public_host: tuple[str, ...] = setting(
        (),
        text,
        "The name(s) people reach the console by (its front door's host name, e.g. "
        "console.contoso.com): a request with another Host is refused (DNS rebinding). Required with "
        "--auth entra or oauth2-proxy; lab mode allows the listen address and localhost. Repeat for several.",
        metavar="NAME",
        multiple=True,
    )
    oidc_issuer: str | None = setting(
        None,
        optional_text,
        "The issuer of the ID tokens the front door passes, e.g. https://login.microsoftonline.com/"
        "<tenant id>/v2.0: the console proves each person from that token (required unless --auth lab).",
        metavar="URL",
    )
    oidc_audience: str | None = setting(
        None,
        optional_text,
        "The console's app registration (client id): the ID tokens' aud (required unless --auth lab).",
        metavar="CLIENT_ID",
    )
    oidc_jwks_url: str | None = setting(
        None,
        optional_text,
        "Where the issuer's signing keys are (default: jwks_uri of "
        "<issuer>/.well-known/openid-configuration).",
        metavar="URL",
    )
    oidc_ca_file: str | None = setting(
        None,
        optional_text,
        "CA bundle for the identity provider's TLS (default: the system CAs).",
        metavar="PATH",
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
    approver_key: tuple[str, ...] = setting(
        (),
        key_spec,
        "KEYID=PATH of the approvers' --sign-key: their audit records (approved, refused) are shown only "
        "when they verify (any agent can write the stream). None: no approver's audit is shown. Repeat.",
        metavar="KEYID=PATH",
        multiple=True,
    )
    decision_ttl: float = setting(
        900.0, number(30, 86400), "Seconds a decision made in the console stays valid.", metavar="SECONDS"
    )


def load_console_config(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> ConsoleConfig:
    return load_config(ConsoleConfig, args, environ)
