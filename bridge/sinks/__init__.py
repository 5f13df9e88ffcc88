"""Sinks: one module per destination, one interface (:mod:`bridge.sinks.base`).

Heavy transports (Kafka, Event Hubs) are imported only when a spec names them, so an agent that
writes to a file never loads a cloud SDK.
"""

from __future__ import annotations

from bridge.sinks.base import Outcome, Sink, SinkError, SynchronousSink, scheme_of

__all__ = ["SUPPORTED", "Outcome", "Sink", "SinkError", "SynchronousSink", "create_sink"]

SUPPORTED = {
    "file": "file:///absolute/path.jsonl",
    "stdout": "stdout:",
}


def create_sink(spec: str) -> Sink:
    """Build the sink a spec names; :class:`SinkError` (permanent) for an unknown or malformed spec."""
    scheme = scheme_of(spec)
    if scheme == "file":
        from bridge.sinks.file import FileSink

        return FileSink(spec)
    if scheme == "stdout":
        from bridge.sinks.stdout import StdoutSink

        return StdoutSink(spec)
    supported = ", ".join(SUPPORTED.values())
    raise SinkError(f"unsupported sink {spec!r}: expected one of {supported}", permanent=True)
