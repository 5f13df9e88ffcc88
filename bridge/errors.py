"""The bridge's errors: one vocabulary for failures that cross a boundary, and a map of all of them.

:class:`BridgeError` is what a component reports to another when talking to the outside failed:
``kind`` is a short label (metric labels, log fields: ``timeout``, ``connection``, ``http_429``,
``auth``, ``config``, ``too_large`` ...; a lower-case word, checked here, so a label never carries a
message), ``retryable`` whether trying the same thing again later can succeed (a broker outage,
IMDS's 429) or never will (a refused credential, a record too large, a malformed spec): callers back
off and retry the first, and stop, dead-letter or refuse to start on the second. Messages are
redacted on the way in, so an error can be logged or stored as it is.

The other exceptions are not failures of the outside world: a refusal with its reason (what the
caller audits or answers), a configuration refused at start, or control flow inside one module.
Every exception class of ``bridge/`` (the emulator aside) is on this map; tests/unit/test_errors.py
checks that none is missing::

    BridgeError                    talking to the outside failed: kind + retryable
      ImdsError                      IMDS (imds/client)
      SinkError                      a sink's destination (pipeline/sink)
      SourceError                    a decision source (streams/base)
      SecretError                    a secret named by *_env / *_file (transports/secrets)
      GraphUnavailable               a Resource Graph poll that could not finish (azure/graph)
    refusals: the caller answers, audits or counts them (a reason word, never retried as they are)
      DecisionRefused                a decision not proven valid (decisions)
      RelayRequestError (ValueError) a relay request the agent cannot read: 400 (relay_api)
      RelayAnswerError (ValueError)  an agent's answer the approver cannot read: audited failed (relay_api)
      DocumentError (ValueError)     an IMDS answer that is no document (imds/document)
      RecordInvalid (ValueError)     a record that breaks its schema; becomes a Refused (records/fields)
      ClaimRefused                   a record's claim the fleet view does not believe (approver/fleet)
      ScopeRefused (ValueError)      a resource id outside the ARM scopes (azure_ids)
      AzureEventRefused (ValueError) a delivery of Azure's channel that is no usable event (azure/events)
      IdentityUnproven               a request whose ID token the console cannot prove: 401 (console/identity)
      BodyTooLarge (ValueError)      a console request body over its cap: 413 (console/app)
    configuration refused at start (one line, exit 2)
      ConfigError (ValueError)       a setting (settings)
      TopologyRefused (ValueError)   a source/group layout that would lose decisions (streams/topology)
      KeyVaultError                  a key that cannot be read from Key Vault (transports/keyvault)
    the disk and the state directory
      OutboxFull                     the outbox holds its limit (pipeline/outbox; policies: pipeline/storing)
      OutboxWriteError (OSError)     a frame the disk did not keep (pipeline/outbox)
      OutboxLocked, DirectoryLocked  another process holds the state directory (pipeline/outbox, fsutil)
    control flow inside one module (never leave it as such)
      RelayUnavailable               no agent answered; becomes an Unreached (approver/routing)
      TokenUnavailable               no Entra token in librdkafka's callback: transient (transports/kafka)
      Abandoned                      a call the watchdog gave up on (transports/eventhubs)
      _TooLarge                      an answer over the cap; becomes an ImdsError (imds/client)
"""

from __future__ import annotations

import re

from bridge.support.redaction import redact

_KIND = re.compile(r"[a-z][a-z0-9_]{0,31}")  # a metric label value: bounded, no message text


class BridgeError(Exception):
    """Base of :class:`~bridge.pipeline.sink.SinkError`, :class:`~bridge.imds.client.ImdsError` and
    the decision sources' ``SourceError``."""

    def __init__(
        self, message: str, *, kind: str = "error", retryable: bool = True, retry_after: float | None = None
    ) -> None:
        if not _KIND.fullmatch(kind):
            raise ValueError(f"error kind must be a short lower-case word, got {kind[:40]!r}")
        super().__init__(redact(message))
        self.kind = kind
        self.retryable = retryable
        self.retry_after = retry_after  # seconds a server asked us to wait, already bounded
