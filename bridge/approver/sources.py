"""Decision sources: where the approver reads decisions (and, in fleet mode, event records) from.

Every source hands out :class:`Message` s in order and is told to :meth:`DecisionSource.commit` a
message only once its outcome is final (audit record durable). A crash before the commit means the
message is read again after the restart, which the decision store recognises (see
:mod:`bridge.approver.store`). Transports:

* ``file:///path.jsonl``: follows a JSON Lines file as it grows; the committed line is kept in the
  state directory. ``stdin:`` reads standard input (no resume: for pipes and labs).
* ``kafka://host:port/topic?group=...``: a consumer group, offsets committed after each final outcome
  (:mod:`bridge.approver.kafka_source`).
* ``eventhubs://<namespace>/<hub>?...``: ``EventHubConsumerClient`` with the Blob checkpoint store
  (:mod:`bridge.approver.eventhubs_source`).
"""

from __future__ import annotations

import hashlib
import sys
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from bridge.errors import BridgeError
from bridge.fsutil import ensure_private_dir, write_atomic
from bridge.observability import redact


@dataclass(frozen=True, slots=True)
class Message:
    payload: bytes
    position: str  # where the message sits in its source: stable across re-reads


class SourceError(BridgeError):
    """A source that cannot be used (configuration: ``retryable=False``, the approver exits 2) or is
    unavailable for now (``retryable=True``: waited for)."""

    def __init__(self, message: str, retryable: bool = False, kind: str = "source") -> None:
        super().__init__(message, kind=kind, retryable=retryable)


class DecisionSource(ABC):
    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.name = redact(spec)

    def open(self) -> None:  # noqa: B027 - optional hook
        """Connect; raise :class:`SourceError` when the configuration can never work."""

    @abstractmethod
    def poll(self, timeout: float) -> list[Message]:
        """Messages not handed out before, oldest first, waiting up to ``timeout`` for one."""

    @abstractmethod
    def commit(self, message: Message) -> None:
        """The message's outcome is final: never hand it out again, even after a restart."""

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


class FileSource(DecisionSource):
    """Follows a JSON Lines file; position ``line:<n>``; committed line persisted in the state dir."""

    def __init__(self, spec: str, state_dir: Path) -> None:
        super().__init__(spec)
        parts = urlsplit(spec)
        self.path = Path(unquote(parts.path))
        digest = hashlib.sha256(str(self.path).encode()).hexdigest()[:12]
        ensure_private_dir(state_dir)
        self._cursor_path = state_dir / f"source-file-{digest}.cursor"
        try:
            self._committed = int(self._cursor_path.read_text().strip())
        except (FileNotFoundError, ValueError):
            self._committed = 0
        self._handed = self._committed
        self._wake = threading.Event()

    def poll(self, timeout: float) -> list[Message]:
        out = self._read()
        if not out:
            self._wake.wait(timeout)
            out = self._read()
        return out

    def _read(self) -> list[Message]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        lines = data.split(b"\n")
        complete = lines[:-1]  # the last piece has no newline yet: a writer is mid-line
        out = []
        for number in range(self._handed + 1, len(complete) + 1):
            line = complete[number - 1].strip()
            if line:
                out.append(Message(line, f"line:{number}"))
            self._handed = number
        return out

    def commit(self, message: Message) -> None:
        self._committed = int(message.position.split(":", 1)[1])
        write_atomic(self._cursor_path, b"%d\n" % self._committed)


class StdinSource(DecisionSource):
    def __init__(self, spec: str) -> None:
        super().__init__(spec)
        self._line = 0
        self._eof = False

    def poll(self, timeout: float) -> list[Message]:
        if self._eof:
            threading.Event().wait(timeout)
            return []
        line = sys.stdin.buffer.readline()
        if not line:
            self._eof = True
            return []
        self._line += 1
        return [Message(line.strip(), f"stdin:{self._line}")] if line.strip() else []

    def commit(self, message: Message) -> None:
        pass

    @property
    def exhausted(self) -> bool:
        return self._eof


def create_source(spec: str, state_dir: Path, group: str = "se-bridge-approver") -> DecisionSource:
    scheme = spec.split(":", 1)[0].lower()
    if scheme == "file":
        return FileSource(spec, state_dir)
    if scheme == "stdin":
        return StdinSource(spec)
    if scheme == "kafka":
        try:
            from bridge.approver.kafka_source import KafkaSource
        except ImportError as exc:
            raise SourceError(f"the kafka source needs the 'kafka' extra: {exc}") from None
        return KafkaSource(spec, group)
    if scheme == "eventhubs":
        try:
            from bridge.approver.eventhubs_source import EventHubsSource
        except ImportError as exc:
            raise SourceError(f"the eventhubs source needs the 'eventhubs' extra: {exc}") from None
        return EventHubsSource(spec, state_dir, group=group)
    raise SourceError(
        f"unsupported source {redact(spec)!r}: expected kafka://host:port/topic, "
        "eventhubs://<namespace>/<hub>, file:///path.jsonl or stdin:"
    )
