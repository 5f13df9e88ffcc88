"""Decision sources: one module per transport, one interface (:mod:`bridge.streams.base`).

Mirrors :mod:`bridge.sinks`: the registry below names each source's module, imported only when a
spec uses it, so an approver reading a file never loads librdkafka or an Azure SDK. What a source
shares with the sink of the same transport (spec options, credentials, error classification) is in
:mod:`bridge.transports`, not in the sink: sources and sinks never import each other. Transports:

* ``file:///path.jsonl`` (:mod:`~bridge.streams.file`): follows a JSON Lines file as it
  grows; the committed line is kept in the state directory.
* ``stdin:`` (:mod:`~bridge.streams.stdin`): reads standard input (no resume: for pipes
  and labs); exhausted at its end.
* ``kafka://host:port/topic?...`` (:mod:`~bridge.streams.kafka`): a consumer group, offsets
  committed after each final outcome.
* ``eventhubs://<namespace>/<hub>?...`` (:mod:`~bridge.streams.eventhubs`):
  ``EventHubConsumerClient`` with the Blob checkpoint store.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from bridge.streams.base import DecisionSource, Message, Position, SourceError
from bridge.support.redaction import redact

__all__ = ["DecisionSource", "Message", "Position", "SourceError", "create_source"]

# scheme -> (module, class); imported on first use so an unused transport costs nothing.
_REGISTRY = {
    "file": ("bridge.streams.file", "FileSource"),
    "stdin": ("bridge.streams.stdin", "StdinSource"),
    "kafka": ("bridge.streams.kafka", "KafkaSource"),
    "eventhubs": ("bridge.streams.eventhubs", "EventHubsSource"),
}
_EXTRAS = {"kafka": "kafka", "eventhubs": "eventhubs"}


def create_source(
    spec: str, state_dir: Path, group: str = "se-bridge-approver", *, bulk: bool = False
) -> DecisionSource:
    """Build the source a spec names; a permanent :class:`SourceError` for an unknown spec or a
    transport whose extra is not installed. ``bulk``: the reader may trade memory for backlog speed
    (:attr:`DecisionSource.bulk`)."""
    scheme = spec.split(":", 1)[0].lower()
    target = _REGISTRY.get(scheme)
    if target is None:
        raise SourceError(
            f"unsupported source {redact(spec)!r}: expected kafka://host:port/topic, "
            "eventhubs://<namespace>/<hub>, file:///path.jsonl or stdin:"
        )
    try:
        module = importlib.import_module(target[0])
    except ImportError as exc:
        raise SourceError(
            f"the {scheme} source needs the '{_EXTRAS.get(scheme, scheme)}' extra: {exc}"
        ) from None
    source: DecisionSource = getattr(module, target[1]).create(spec, state_dir, group)
    source.bulk = bulk
    return source
