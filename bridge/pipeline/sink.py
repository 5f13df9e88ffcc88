"""The sink contract: where records go, with end-to-end acknowledgement.

A sink is driven by one delivery worker (:mod:`bridge.pipeline.delivery`) that owns that sink's
cursor in the outbox. The interface is asynchronous because the transports are: a Kafka producer or
an Event Hubs batch confirms records some time after they were handed over, in order, and several can
be in flight. So a sink has two halves:

* :meth:`Sink.submit` hands one record to the transport (non-blocking where the transport allows);
* :meth:`Sink.poll` returns the :class:`Outcome` of earlier submissions, confirmed or failed.

A record counts as delivered only when an ``Outcome`` without error comes back for it; only then
does the worker move the cursor, and only when every sink's cursor has passed a record does the
outbox drop it. Transports whose write is synchronous (a file, stdout, an HTTP POST) derive from
:class:`SynchronousSink` and implement only :meth:`SynchronousSink.deliver`.

Failures are :class:`SinkError`: ``retryable=False`` for what no retry can fix (auth refused, record
too large, a 4xx other than 408/429), which the worker moves to a dead-letter file; anything else is
retried with backoff, forever, within the outbox limits.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass

from bridge.errors import BridgeError
from bridge.pipeline.entry import Entry
from bridge.support.observability import redact


class SinkError(BridgeError):
    """A delivery failure. ``retryable=False`` for what no retry can fix (the record is dead-lettered,
    or the start is refused); ``kind`` is a short bounded label (``io``, ``timeout``, ``auth`` ...)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    seq: int
    error: SinkError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class Sink(ABC):
    """One destination. Subclasses set ``scheme`` and implement submit/poll (or ``deliver``)."""

    scheme: str = ""
    #: How many records may be submitted before the first of them is confirmed.
    max_in_flight: int = 1

    def __init__(self, spec: str) -> None:
        self.spec = spec
        #: Human-readable and safe to log: secrets are masked.
        self.name = redact(spec)
        #: Stable identifier of this destination (cursor file name, metric label): the scheme and a
        #: hash of the *redacted* spec, so rotating a secret keeps the sink's progress.
        self.id = f"{self.scheme or 'sink'}-{hashlib.sha256(self.name.encode()).hexdigest()[:12]}"

    def open(self) -> None:  # noqa: B027 - optional hook
        """Connect or prepare. Raise ``SinkError(retryable=False)`` for a configuration that can never
        work (start-up then fails fast); a transient error is retried by the worker."""

    @abstractmethod
    def submit(self, entry: Entry) -> None:
        """Hand ``entry`` to the transport. Its outcome comes back through :meth:`poll`."""

    @abstractmethod
    def poll(self, timeout: float) -> list[Outcome]:
        """Outcomes observed since the last call, waiting up to ``timeout`` seconds for one."""

    def close(self, timeout: float = 5.0) -> None:  # noqa: B027 - optional hook
        """Flush what is in flight (up to ``timeout``) and release the transport."""


class SynchronousSink(Sink):
    """A sink whose write returns only once the record is confirmed (file, stdout, HTTP)."""

    def __init__(self, spec: str) -> None:
        super().__init__(spec)
        self._outcomes: list[Outcome] = []

    @abstractmethod
    def deliver(self, entry: Entry) -> None:
        """Deliver one record; return when it is confirmed, raise :class:`SinkError` otherwise."""

    def submit(self, entry: Entry) -> None:
        try:
            self.deliver(entry)
        except SinkError as err:
            self._outcomes.append(Outcome(entry.seq, err))
        except OSError as err:
            self._outcomes.append(Outcome(entry.seq, SinkError(f"{type(err).__name__}: {err}", kind="io")))
        else:
            self._outcomes.append(Outcome(entry.seq))

    def poll(self, timeout: float) -> list[Outcome]:
        out, self._outcomes = self._outcomes, []
        return out
