"""The durable core every service is built on: entries, the outbox, the sink contract, delivery.

Sources of records (the agent's poller and relay, the approver) append an :class:`Entry` to an
:class:`Outbox`; one :class:`DeliveryWorker` per :class:`Sink` moves that sink's cursor through it
with end-to-end acknowledgement; :class:`Health` says which long-running component failed.

This package is the bottom layer: the agent, the approver, ``se-bridge decide`` and every sink import
it, and it imports none of them (checked by the import contracts in ``pyproject.toml``).
"""

from bridge.pipeline.delivery import DeliveryWorker
from bridge.pipeline.entry import CONTENT_TYPE, Entry, RecordMeta
from bridge.pipeline.health import Health
from bridge.pipeline.metrics import PipelineMetrics
from bridge.pipeline.outbox import Outbox, OutboxFull, OutboxLocked, OutboxWriteError
from bridge.pipeline.sink import Outcome, Sink, SinkError, SynchronousSink

__all__ = [
    "CONTENT_TYPE",
    "DeliveryWorker",
    "Entry",
    "Health",
    "Outbox",
    "OutboxFull",
    "OutboxLocked",
    "OutboxWriteError",
    "Outcome",
    "PipelineMetrics",
    "RecordMeta",
    "Sink",
    "SinkError",
    "SynchronousSink",
]
