"""How a setting is declared, parsed and loaded: the machinery under each service's configuration class.

Each service's ``config`` module declares every setting once, as a field of its configuration class;
this module is what turns such a field into a flag, an environment variable, a TOML key, ``--help``
and a refusal naming the setting (:func:`setting`, :func:`settings_of`), the value parsers
(:func:`number`, :func:`choice`, ...), and the loader (:func:`load_config`: defaults < TOML file <
environment < flag).
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from bridge.http.netaddr import parse_listen
from bridge.imds.document import API_VERSIONS
from bridge.rules import ApprovalRule

ENV_PREFIX = "SE_BRIDGE_"
#: The environment variable naming the TOML file, for every command (``--config`` wins over it).
CONFIG_ENV = ENV_PREFIX + "CONFIG"
#: Key of a setting's :class:`SettingInfo` in its dataclass field's metadata.
_METADATA_KEY = "se_bridge_setting"


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message says which and from where."""


# -- value parsers (raise ValueError with a short explanation) ---------------------------------------


def number(low: float, high: float) -> Callable[[object], float]:
    def parse(value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError("expected a number")
        v = float(value)
        if not low <= v <= high:
            raise ValueError(f"expected a number from {low:g} to {high:g}")
        return v

    return parse


def integer(low: int, high: int) -> Callable[[object], int]:
    def parse(value: object) -> int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError("expected a whole number")
        if not isinstance(value, int | float | str):
            raise ValueError("expected a whole number")
        v = int(value)
        if not low <= v <= high:
            raise ValueError(f"expected a whole number from {low} to {high}")
        return v

    return parse


def size(value: object) -> int:
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


def known_api_version(value: object) -> str:
    v = str(value).strip()
    if v not in API_VERSIONS:
        raise ValueError(f"expected one of {', '.join(API_VERSIONS)}")
    return v


def imds_base_url(value: object) -> str:
    v = str(value).strip().rstrip("/")
    if not v.startswith("http://") or len(v) <= len("http://"):
        raise ValueError("expected http://host[:port] (IMDS is plain HTTP on a link-local address)")
    return v


def listen_address(value: object) -> str:
    v = str(value).strip()
    if v in ("", "off", "none"):
        return ""
    if v.startswith("unix:"):
        if not v[len("unix:") :].startswith("/"):
            raise ValueError("expected unix:/absolute/path.sock")
        return v
    parse_listen(v)
    return v


def level_name(value: object) -> str:
    v = str(value).strip().lower()
    if v not in ("debug", "info", "warning", "error"):
        raise ValueError("expected debug, info, warning or error")
    return v


def boolean(value: object) -> bool:
    if isinstance(value, bool):
        return value
    v = str(value).strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def choice(*allowed: str) -> Callable[[object], str]:
    def parse(value: object) -> str:
        v = str(value).strip().lower()
        if v not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return v

    return parse


def key_spec(value: object) -> str:
    v = text(value)
    key_id, sep, file = v.partition("=")
    if not sep or not key_id or not file:
        raise ValueError("expected KEYID=PATH (a file holding the shared secret)")
    return v


def optional_key_spec(value: object) -> str | None:
    return key_spec(value) if optional_text(value) else None


def auto_approve_rule(value: object) -> str:
    """The rule's text, once :class:`bridge.rules.ApprovalRule` could parse it (the agent parses it
    again when it builds its policy; refusing here names the setting and the source)."""
    ApprovalRule.parse(text(value))
    return text(value)


def peer_spec(value: object) -> str:
    name, sep, url = text(value).partition("=")
    if not sep or not name.strip() or not url.startswith(("http://", "https://")):
        raise ValueError("expected NAME=URL with an http:// or https:// URL")
    return f"{name.strip().lower()}={url.strip()}"


def https_url(value: object) -> str:
    v = str(value).strip().rstrip("/")
    if not v.startswith("https://") or len(v) <= len("https://"):
        raise ValueError("expected https://host[:port] (ARM is only spoken over TLS)")
    return v


def arm_scope_spec(value: object) -> str:
    from bridge.azure_ids import parse_allowed_scope

    parse_allowed_scope(text(value))
    return text(value).rstrip("/")


def guid_text(value: object) -> str:
    """A subscription id: a GUID, lower case (it reaches a request body, never unchecked)."""
    import re

    from bridge.azure_ids import GUID_TEXT

    v = text(value).lower()
    if not re.fullmatch(GUID_TEXT, v):
        raise ValueError("expected a subscription id (a GUID)")
    return v


def optional_text(value: object) -> str | None:
    v = str(value).strip() if value is not None else ""
    return v or None


def text(value: object) -> str:
    v = str(value).strip()
    if not v:
        raise ValueError("must not be empty")
    return v


def path(value: object) -> Path:
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


#: Every service's TOML table (each configuration class adds its own): a table named otherwise in a
#: config file is a typo (``[agnet]``), refused by name rather than read as "no settings" (issue 33).
TOML_TABLES: set[str] = set()


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

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.toml_section:
            TOML_TABLES.add(cls.toml_section)


# -- settings several services share ----------------------------------------------------------------
# Declared once, as mixins the services' configuration classes inherit (issue 32: 19 setting names were
# declared in 2 to 4 classes, and the copies drifted). A mixin has no TOML table of its own: its
# settings are read from the table of the class that inherits it.


@dataclass(frozen=True)
class LogSettings(ConfigBase):
    """Every service's."""

    log_level: str = setting("info", level_name, "debug, info, warning or error.", metavar="LEVEL")


@dataclass(frozen=True)
class ReadTokenSettings(ConfigBase):
    """Every service's read paths (``/metrics``; the agent's ``/v1/document``, Azure's channel's
    ``/v1/unwatched``) for callers that are not local."""

    read_token_file: str | None = setting(
        None,
        optional_text,
        "File holding a token (at least 32 bytes) that remote callers of the read paths (/metrics, and "
        "the agent's /v1/document or Azure's channel's /v1/unwatched) send as 'Authorization: Bearer "
        "<token>' (Prometheus: authorization.credentials_file). Without one, only local callers read "
        "them (the console: a signed-in person).",
        metavar="PATH",
    )


@dataclass(frozen=True)
class ArmSettings(ConfigBase):
    """The approver's (acknowledgements) and Azure's channel's (Resource Graph)."""

    arm_endpoint: str = setting(
        "https://management.azure.com",
        https_url,
        "ARM endpoint (sovereign clouds: https://management.usgovcloudapi.net, ...).",
        metavar="URL",
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
    arm_ca_file: str | None = setting(
        None,
        optional_text,
        "CA bundle for the ARM endpoint (a private endpoint's proxy); default: system CAs.",
        metavar="PATH",
    )


@dataclass(frozen=True)
class CoordinationDeadlineSettings(ConfigBase):
    """The agent's and the fleet approver's (both coordinate: bridge.coordination)."""

    coordinate_deadline: float = setting(
        120.0,
        number(0, 86400),
        "Seconds before the event's NotBefore when a coordinator stops waiting for unprepared VMs "
        "(then --coordinate-on-deadline applies).",
        metavar="SECONDS",
    )
    coordinate_on_deadline: str = setting(
        "platform",
        choice("platform", "approve"),
        "At the deadline with VMs not prepared: 'platform' approves nothing (the platform starts the "
        "event at NotBefore, every VM gets its full notice); 'approve' approves anyway.",
        metavar="POLICY",
    )


@dataclass(frozen=True)
class RecordSigningSettings(ConfigBase):
    """The approver's (its audits) and Azure's channel's (its events and findings)."""

    sign_key: str | None = setting(
        None,
        optional_key_spec,
        "KEYID=PATH: sign every record this service publishes (HMAC-SHA256, bridge.signing.sign_record). "
        "A reader given the same key believes them (the console's --approver-key for the approvers' "
        "audits; the fleet approvers' and the console's --azure-key for Azure's channel); unsigned ones "
        "are never acted on, since any agent can write the events stream.",
        metavar="KEYID=PATH",
    )


@dataclass(frozen=True)
class AzureKeySettings(ConfigBase):
    """The fleet approver's and the console's: Azure's channel believed only when it signed."""

    azure_key: tuple[str, ...] = setting(
        (),
        key_spec,
        "KEYID=PATH of se-bridge azure-channel's --sign-key: its records on the events stream (an "
        "event's parent, VMs nobody watches, Azure's outcomes) count only when they verify with one of "
        "these keys (any agent can write the stream). None: Azure's channel is not used. Repeat for "
        "several.",
        metavar="KEYID=PATH",
        multiple=True,
    )


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


# -- loading -------------------------------------------------------------------------------------


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
    unknown_tables = sorted(k for k, v in data.items() if isinstance(v, dict) and k not in TOML_TABLES)
    if unknown_tables:
        raise ConfigError(
            f"config file {file}: unknown table [{unknown_tables[0][:64]}] "
            f"(known: {', '.join(f'[{t}]' for t in sorted(TOML_TABLES))})"
        )
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
