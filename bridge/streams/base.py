"""The decision source contract: where the approver reads decisions (and, in fleet mode, event
records) from, with a commit only once an outcome is final.

Every source hands out :class:`Message` s in order and is told to :meth:`DecisionSource.commit` a
message only once its outcome is final (audit record durable). A crash before the commit means the
message is read again after the restart, which the decision store recognises (see
:mod:`bridge.approver.store`). This module is the interface alone, like :mod:`bridge.pipeline.sink`
for sinks, so the transports a source is built on (:mod:`bridge.transports`) and the approver that
drives it import it without importing each other.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from bridge.errors import BridgeError
from bridge.support.redaction import redact
from bridge.transports.base import Owner


@dataclass(frozen=True, slots=True)
class Position:
    """Where a message sits in its source, stable across re-reads; made once by the source that read
    it and never parsed again. ``stream``: a partition (Kafka ``topic/partition``, an Event Hubs
    partition id) or, for a source read in one line, its kind (``line``, ``stdin``); ``number``: the
    offset, sequence number or line, cumulative within its stream. Its text is what the decision store
    keeps and what a refusal's ``recordId`` hashes: ``decisions/3@17``, ``0@17``, ``line:17``."""

    stream: str
    number: int
    partitioned: bool = True

    @property
    def partition(self) -> str:
        """What commits are ordered within: the partition, ``""`` for a source read in one line."""
        return self.stream if self.partitioned else ""

    def __str__(self) -> str:
        return f"{self.stream}@{self.number}" if self.partitioned else f"{self.stream}:{self.number}"


@dataclass(frozen=True, slots=True)
class Message:
    payload: bytes
    position: Position  # where the message sits in its source: stable across re-reads


class SourceError(BridgeError):
    """A source that cannot be used (configuration: ``retryable=False``, the approver exits 2) or is
    unavailable for now (``retryable=True``: waited for)."""

    def __init__(self, message: str, retryable: bool = False, kind: str = "source") -> None:
        super().__init__(message, kind=kind, retryable=retryable)


def owner(label: str) -> Owner:
    """A source as the transport helpers speak for it: messages start with ``label`` ("kafka
    source"), refusals are permanent :class:`SourceError` s (the approver exits 2)."""
    return Owner(label, SourceError)


class DecisionSource(ABC):
    #: Whether instances share the source by partitions (Kafka, Event Hubs): then the reader of
    #: partition 0 is the one that coordinates (bridge.approver.coordinator).
    partitioned: bool = False

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.name = redact(spec)
        #: May the source hold more in memory to read a backlog faster? The fleet approver's RSS
        #: budget (200 MB at 100 000 VMs, issue 33) wants its readers lean; the console, a central
        #: service with a 1 GB budget that a person waits on after a restart, reads in bulk.
        self.bulk = False

    @classmethod
    def create(cls, spec: str, state_dir: Path, group: str) -> DecisionSource:
        """Build the source ``spec`` names (what :func:`bridge.streams.create_source` calls).
        ``state_dir`` keeps what the source must remember locally, ``group`` is the consumer group of
        sources that have one; a source that needs neither ignores them."""
        return cls(spec)

    def open(self) -> None:  # noqa: B027 - optional hook
        """Connect; raise :class:`SourceError` when the configuration can never work."""

    @abstractmethod
    def poll(self, timeout: float) -> list[Message]:
        """Messages not handed out before, oldest first, waiting up to ``timeout`` for one."""

    @abstractmethod
    def commit(self, message: Message) -> None:
        """The message's outcome is final: never hand it out again, even after a restart."""

    def commit_many(self, messages: list[Message]) -> None:
        """Commit finished messages, in read order. Sources whose positions are cumulative (a Kafka
        offset per partition) commit each partition's last one in a single request."""
        for message in messages:
            self.commit(message)

    @property
    def exhausted(self) -> bool:
        """True once the source can never hand out another message (standard input at its end): the
        approver then stops. A stream (a file followed as it grows, a topic, a hub) never is."""
        return False

    def leads(self) -> bool:
        """Whether this instance is the one of its group that coordinates: it reads partition 0 (a
        source without partitions has a single reader)."""
        if not self.partitioned:
            return True
        return any(key == "0" or key.endswith("/0") for key in self.ownership())

    def ownership(self) -> dict[str, int | None]:
        """The partitions this instance reads now, each with its lag (messages not yet read, None when
        unknown): what ``/metrics`` shows of a fleet approver's share. Sources without partitions
        report ``{}``. Read from the HTTP thread: implementations return a snapshot."""
        return {}

    def behind(self) -> int | None:
        """Messages known to be waiting beyond what was read (0: at the end), None when the source
        cannot tell: a reader is caught up only when a poll finds nothing *and* this is not above 0
        (issue 33: an empty poll while a Kafka consumer fetched made a fleet approver with a 1.1 M
        record backlog "ready" after 7 s, 108 s before it had read it)."""
        return None

    def missing(self) -> str | None:
        """Why no decision published now could be read at all (a decisions file that does not exist:
        a typo in the spec), or None. The approver is not ready while it says so (issue 33)."""
        return None

    def assigned(self) -> bool:
        """Whether the group gave this instance its share (it may be none) at least once: before, a
        decision on the topic has no reader here yet, so the approver is not ready (``/readyz``)."""
        return True

    def standby(self, instance: str, state_dir: Path) -> DecisionSource | None:
        """A second reader of every partition, for :mod:`bridge.approver.standby`: it starts where
        the group's positions are, never commits and never joins the group. None for a source
        without partitions (it has a single reader, nothing to stand by for)."""
        return None

    def group_progress(self) -> dict[str, int]:
        """Per partition, the number (offset, sequence) of the last message the group finished: what
        its owners committed. Asked by the standby, from its own thread."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


def lag_of(sources: list[DecisionSource] | tuple[DecisionSource, ...]) -> float:
    """Messages the readers of ``sources`` know they have not read yet (the partitions' lags, as each
    source last measured them; sources that cannot tell count 0): an events reader's lag metric."""
    return float(sum(lag for source in sources for lag in source.ownership().values() if lag))
