"""The one error vocabulary of the bridge: every failure says what it was and whether to try again.

``kind`` is a short label from a closed set per component (metric labels, log fields): ``timeout``,
``connection``, ``http_429``, ``auth``, ``config``, ``too_large`` ... ``retryable`` says whether
trying the same thing again later can succeed (a broker outage, IMDS's 429) or never will (a
refused credential, a record too large, a malformed spec): callers back off and retry the first,
and stop, dead-letter or refuse to start on the second. Messages are redacted on the way in, so an
error can be logged or stored as it is.
"""

from __future__ import annotations

from bridge.redaction import redact


class BridgeError(Exception):
    """Base of :class:`~bridge.pipeline.sink.SinkError`, :class:`~bridge.imds.client.ImdsError` and
    the decision sources' ``SourceError``."""

    def __init__(
        self, message: str, *, kind: str = "error", retryable: bool = True, retry_after: float | None = None
    ) -> None:
        super().__init__(redact(message))
        self.kind = kind
        self.retryable = retryable
        self.retry_after = retry_after  # seconds a server asked us to wait, already bounded
