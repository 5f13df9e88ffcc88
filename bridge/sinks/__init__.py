"""Sinks: one module per destination, one interface (:mod:`bridge.sinks.base`).

Heavy transports (Kafka, Event Hubs) are imported only when a spec names them, so an agent that
writes to a file never loads a cloud SDK.
"""

from __future__ import annotations

from bridge.pipeline import Outcome, Sink, SinkError, SynchronousSink
from bridge.sinks.base import scheme_of

__all__ = ["SUPPORTED", "Outcome", "Sink", "SinkError", "SynchronousSink", "create_sink"]

SUPPORTED = {
    "file": "file:///absolute/path.jsonl",
    "stdout": "stdout:",
    "kafka": "kafka://host:port[,host:port]/topic[?options]",
    "eventhubs": "eventhubs://<namespace>.servicebus.windows.net/<hub>[?options]",
    "https": "https://host/path[?query][#options] (webhook; http:// only to loopback unless allowed)",
    "azuremonitor": "azuremonitor://<logs ingestion endpoint host>/<dcr-immutable-id>[?options]",
}

# scheme -> (module, class); imported on first use so an unused transport costs nothing.
_REGISTRY = {
    "file": ("bridge.sinks.file", "FileSink"),
    "stdout": ("bridge.sinks.stdout", "StdoutSink"),
    "kafka": ("bridge.sinks.kafka", "KafkaSink"),
    "eventhubs": ("bridge.sinks.eventhubs", "EventHubsSink"),
    "https": ("bridge.sinks.webhook", "WebhookSink"),
    "http": ("bridge.sinks.webhook", "WebhookSink"),
    "azuremonitor": ("bridge.sinks.logsingestion", "LogsIngestionSink"),
}


def create_sink(spec: str) -> Sink:
    """Build the sink a spec names; :class:`SinkError` (permanent) for an unknown or malformed spec."""
    import importlib

    scheme = scheme_of(spec)
    target = _REGISTRY.get(scheme)
    if target is None:
        supported = ", ".join(SUPPORTED.values())
        raise SinkError(f"unsupported sink {spec!r}: expected one of {supported}", retryable=False)
    try:
        module = importlib.import_module(target[0])
    except ImportError as exc:
        extra = {"kafka": "kafka", "eventhubs": "eventhubs", "azuremonitor": "monitor"}.get(scheme)
        hint = f" (install the extra: pip install 'scheduled-events-bridge[{extra}]')" if extra else ""
        raise SinkError(f"the {scheme} sink is not available: {exc}{hint}", retryable=False) from None
    sink: Sink = getattr(module, target[1])(spec)
    return sink
