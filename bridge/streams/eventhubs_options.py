"""The Event Hubs decision source's spec: the options it adds to the hub's, checked once.

A source spec is the hub's (:func:`bridge.transports.eventhubs.parse_spec`, shared with the sink)
plus the consumer group and the checkpoint store (Blob Storage: a URL with the hub's Entra ID
credential, or a connection string named by ``*_env`` / ``*_file``, never in the spec). Every
mistake is a :class:`~bridge.streams.base.SourceError` naming the option, never a value.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

from bridge.streams.base import owner
from bridge.transports import eventhubs
from bridge.transports.base import numeric_option
from bridge.transports.eventhubs import EventHubsOptions
from bridge.transports.secrets import SecretRef

#: Who speaks in this source's refusals ("eventhubs source: ...").
OWNER = owner("eventhubs source")

#: The options the source adds to the hub's (see :data:`bridge.transports.eventhubs.OPTIONS`).
SOURCE_OPTIONS: dict[str, str] = {
    "consumer_group": "the hub's consumer group (default $Default)",
    "checkpoint_url": "https://<account>.blob.core.windows.net/<container> (the hub's Entra ID credential)",
    "checkpoint_connection_string_env": "environment variable holding the storage connection string",
    "checkpoint_connection_string_file": "absolute path of a file holding the storage connection string",
    "checkpoint_container": "the container, with checkpoint_connection_string_*",
    "load_balancing_interval": "seconds between the SDK's ownership rounds (default 30)",
    "ownership_expiration": "seconds after which a silent instance's partitions are taken over "
    "(default 6 x load_balancing_interval)",
}
DEFAULT_CONSUMER_GROUP = "$Default"

_CONTAINER = re.compile(r"^(?=.{3,63}$)[a-z0-9]+(?:-[a-z0-9]+)*$")
_CONSUMER_GROUP = re.compile(r"^(?:\$Default|[A-Za-z0-9][A-Za-z0-9._-]{0,49})$")
_SECRETISH = re.compile(r"(?i)(key|sas|secret|token|password|connection_?string$|signature)")
_CHECKPOINT_SECRET_HINT = (
    "checkpoint_connection_string_env=VARIABLE, checkpoint_connection_string_file=/path or "
    "checkpoint_url with credential=managed|default"
)


class SourceOptions:
    """What the source adds to an ``eventhubs://`` spec, validated. Holds no secret."""

    def __init__(self, values: dict[str, str], hub: EventHubsOptions, group: str | None) -> None:
        self.consumer_group = values.get("consumer_group") or group or DEFAULT_CONSUMER_GROUP
        if not _CONSUMER_GROUP.match(self.consumer_group):
            raise OWNER.refuse("consumer_group must be $Default or 1-50 letters, digits, '.', '_', '-'")
        self.checkpoint_url = values.get("checkpoint_url") or None
        #: The storage account's connection string (checkpoint_connection_string_env / _file).
        self.checkpoint: SecretRef | None = SecretRef.from_options(
            OWNER,
            "checkpoint_connection_string",
            values.get("checkpoint_connection_string_env") or None,
            values.get("checkpoint_connection_string_file") or None,
        )
        self.container = values.get("checkpoint_container") or None
        self.account_url: str | None = None
        by_string = self.checkpoint is not None
        if self.checkpoint_url and (by_string or self.container):
            raise OWNER.refuse(
                "checkpoint_url names the container itself; it excludes "
                "checkpoint_connection_string_* and checkpoint_container"
            )
        if self.checkpoint_url:
            self._parse_url(self.checkpoint_url, hub)
        elif by_string:
            if not self.container:
                raise OWNER.refuse("checkpoint_connection_string_* needs checkpoint_container=NAME")
        elif self.container:
            raise OWNER.refuse(
                "checkpoint_container needs checkpoint_connection_string_env or _file "
                "(or use checkpoint_url=https://<account>.blob.core.windows.net/<container>)"
            )
        if self.container is not None and not _CONTAINER.match(self.container):
            raise OWNER.refuse(
                "the checkpoint container must be a blob container name "
                "(3-63 lower-case letters, digits and single hyphens)"
            )
        interval = _seconds(values, "load_balancing_interval", 30.0, 1.0, 3600.0)
        expiration = _seconds(values, "ownership_expiration", 6 * interval, 2.0, 86_400.0)
        if expiration <= interval:
            raise OWNER.refuse("ownership_expiration must be longer than load_balancing_interval")
        self.load_balancing_interval = interval
        self.ownership_expiration = expiration

    def _parse_url(self, url: str, hub: EventHubsOptions) -> None:
        parts = urlsplit(url)
        if parts.query or parts.fragment or "@" in parts.netloc:
            raise OWNER.refuse(
                "no SAS token or credentials in checkpoint_url; it uses the hub's Entra "
                "ID credential (or use checkpoint_connection_string_env/_file)"
            )
        if parts.scheme.lower() != "https" or not parts.hostname:
            raise OWNER.refuse(
                "checkpoint_url must be "
                "https://<account>.blob.core.windows.net/<container> (Entra ID tokens are only sent over TLS)"
            )
        segments = [s for s in parts.path.split("/") if s]
        if not segments:
            raise OWNER.refuse(
                "checkpoint_url names no container: https://<account>.blob.core.windows.net/<container>"
            )
        if hub.uses_connection_string:
            raise OWNER.refuse(
                "checkpoint_url uses the hub's Entra ID credential (credential=managed or "
                "default); with connection_string_* give checkpoint_connection_string_env/_file and "
                "checkpoint_container"
            )
        self.container = segments[-1]
        path = "/".join(segments[:-1])
        self.account_url = urlunsplit((parts.scheme, parts.netloc, f"/{path}" if path else "", "", ""))

    @property
    def has_store(self) -> bool:
        return bool(self.checkpoint_url or self.checkpoint)


def _seconds(values: dict[str, str], name: str, default: float, low: float, high: float) -> float:
    raw = values.get(name)
    if raw is None or raw == "":
        return default
    return float(numeric_option(OWNER, name, raw, low, high))


def parse_source_spec(spec: str, group: str | None = None) -> tuple[EventHubsOptions, SourceOptions]:
    """An ``eventhubs://`` source spec: the hub part (:func:`bridge.transports.eventhubs.parse_spec`,
    shared with the sink) and the source's own options. Every mistake is a :class:`SourceError`
    naming the option, never a value."""
    hub, own = eventhubs.parse_spec(spec, OWNER, SOURCE_OPTIONS, _secret_hint)
    return hub, SourceOptions(own, hub, group)


def _secret_hint(name: str) -> str | None:
    """A ``checkpoint_*`` name that looks like a secret's is refused with the checkpoint's ways of
    giving one; any other name as the hub's would be."""
    if name.startswith("checkpoint_") and _SECRETISH.search(name):
        return _CHECKPOINT_SECRET_HINT
    return eventhubs.secret_hint(name)
